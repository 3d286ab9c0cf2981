"""The core's extensions beyond paper §5, each checked against the sentence (paper,
thesis or docs/core API) that defines it: pre-vote, check-quorum and the leader lease,
the new leader's no-op and ``leader_ready``, bound proposals, leadership transfer,
fast log backtracking, per-follower flow control, the ``Ready`` contract, restart
from storage and ``Config.validate``.
"""

from __future__ import annotations

from typing import Any

import pytest

from raftlet.consensus.core import (
    NO_NODE,
    Config,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    NotLeaderError,
    ProgressState,
    ProposalDropped,
    RaftConfigError,
    RawNode,
    Role,
    TermMismatch,
)
from tests.unit.raft_harness import (
    Network,
    Node,
    accept,
    data_entries,
    make_config,
    make_storage,
    new_node,
)

A = MessageType.APPEND
AR = MessageType.APPEND_RESPONSE
HB = MessageType.HEARTBEAT
HBR = MessageType.HEARTBEAT_RESPONSE
V = MessageType.VOTE
VR = MessageType.VOTE_RESPONSE
PV = MessageType.PRE_VOTE
PVR = MessageType.PRE_VOTE_RESPONSE
TN = MessageType.TIMEOUT_NOW
ET = 10

SEND_NOW = {A, HB, TN}


def _to(msgs: list[Message], dst: str, kind: MessageType = A) -> list[Message]:
    return [m for m in msgs if m.type is kind and m.dst == dst]


# --- pre-vote (thesis §9.6) ---------------------------------------------------------------


def test_prevote_does_not_change_term_or_vote() -> None:
    """Thesis §9.6 (paraphrased): a pre-candidate first asks whether the others would
    vote for it; only if a majority would does it increment its term and start a normal
    election — asking changes neither its term nor its vote."""
    node = new_node("a", terms=[1, 2], term=2, pre_vote=True)
    out = node.campaign()
    assert (node.role, node.term) == (Role.PRE_CANDIDATE, 2)
    assert node.storage.initial_state() == HardState(term=2, vote=NO_NODE, commit=0)
    assert sorted((m.type, m.dst, m.term, m.index, m.log_term) for m in out) == [
        (PV, "b", 3, 2, 2),
        (PV, "c", 3, 2, 2),
    ]


def test_prevote_majority_starts_the_real_election() -> None:
    """Thesis §9.6 (paraphrased): only once a majority would vote for it does the
    pre-candidate increment its term and start a normal election."""
    node = new_node("a", term=2, pre_vote=True)
    node.campaign()
    out = node.step(Message(PVR, src="b", dst="a", term=3))
    assert (node.role, node.term) == (Role.CANDIDATE, 3)
    assert sorted((m.type, m.dst, m.term) for m in out) == [(V, "b", 3), (V, "c", 3)]
    node.step(Message(VR, src="c", dst="a", term=3))
    assert (node.role, node.term) == (Role.LEADER, 3)


def test_prevote_refused_by_majority_returns_to_follower_in_same_term() -> None:
    """Thesis §9.6: a pre-candidate that cannot get a majority does not increment its
    term, so it cannot disrupt the cluster."""
    node = new_node("a", term=2, pre_vote=True)
    node.campaign()
    node.step(Message(PVR, src="b", dst="a", term=2, reject=True))
    node.step(Message(PVR, src="c", dst="a", term=2, reject=True))
    assert (node.role, node.term) == (Role.FOLLOWER, 2)
    assert node.raw.hard_state().vote == NO_NODE


@pytest.mark.parametrize(("cand_last", "reject"), [((2, 2), False), ((1, 5), True)])
def test_prevote_voter_answers_without_changing_its_state(
    cand_last: tuple[int, int], reject: bool
) -> None:
    """Thesis §9.6 (paraphrased): servers answer a pre-vote as they would a vote (the
    §5.4.1 up-to-date rule), but answering changes neither the receiver's term nor vote."""
    node = new_node("b", terms=[1, 2], term=2, vote="c", pre_vote=True)
    log_term, index = cand_last
    out = node.step(Message(PV, src="a", dst="b", term=3, index=index, log_term=log_term))
    assert [(m.type, m.dst, m.reject) for m in out] == [(PVR, "a", reject)]
    assert not reject or out[0].term == 2
    assert reject or out[0].term == 3
    assert node.raw.hard_state() == HardState(term=2, vote="c", commit=0)


@pytest.mark.parametrize("pre_vote", [True, False])
def test_rejoining_partitioned_server_disrupts_only_without_prevote(pre_vote: bool) -> None:
    """Thesis §9.6 (paraphrased): a partitioned server keeps timing out and incrementing
    its term; when the partition heals, its higher term deposes the leader.  The
    pre-vote phase prevents this."""
    net = Network.create(pre_vote=pre_vote)
    net.campaign("a")
    net.isolate("c")
    net.tick("c", 10 * ET)
    assert (net["c"].term > 1) is not pre_vote
    net.heal()
    net.tick_all(3 * ET)
    if pre_vote:
        assert net.leaders() == ["a"]
        assert {n.term for n in net.nodes.values()} == {1}
    else:
        assert net["a"].term > 1  # the leader of term 1 was deposed


# --- check-quorum and the leader lease (thesis §6.2) --------------------------------------


def test_check_quorum_leader_steps_down_when_cut_off() -> None:
    """Thesis §6.2 (paraphrased): a leader steps down if an election timeout elapses
    without a successful round of heartbeats to a majority of its cluster."""
    net = Network.create(check_quorum=True, pre_vote=True)
    net.campaign("a")
    net.isolate("a")
    ticks = 0
    while net["a"].role is Role.LEADER:
        net.tick("a")
        ticks += 1
        assert ticks <= 2 * ET, "an isolated leader must step down within two timeouts"
    assert ticks > ET - 1
    assert (net["a"].role, net["a"].term) == (Role.FOLLOWER, 1)


def test_check_quorum_leader_keeps_leadership_with_a_majority() -> None:
    """Thesis §6.2 (paraphrased): the leader steps down only without a successful round
    of heartbeats to a majority — losing one of three servers is not that."""
    net = Network.create(check_quorum=True, pre_vote=True)
    net.campaign("a")
    net.isolate("c")
    net.tick_all(6 * ET)
    assert net.leaders() == ["a"]
    assert net["a"].term == 1


def _lease_net() -> Network:
    net = Network.create(check_quorum=True, pre_vote=False)
    net.campaign("a")
    net.tick("a")
    return net


def test_lease_follower_ignores_vote_request_while_leader_is_recent() -> None:
    """Paper §6: "if a server receives a RequestVote request within the minimum election
    timeout of hearing from a current leader, it does not update its term or grant its
    vote." """
    net = _lease_net()
    b = net["b"]
    before = b.raw.hard_state()
    out = b.step(Message(V, src="c", dst="b", term=2, index=1, log_term=1))
    assert out == []
    assert b.raw.hard_state() == before == HardState(term=1, vote="a", commit=1)


def test_lease_is_bypassed_by_a_transfer_vote() -> None:
    """Thesis §3.10 / §4.2.3 (paraphrased): a RequestVote sent because the leader asked
    for a leadership transfer carries a flag so that voters do not ignore it.  Here the flag
    counts only for the transferee the leader announced to this voter (its heartbeats and
    appends name it), one term up; test_core_validation covers the flag alone."""
    net = _lease_net()
    b = net["b"]
    b.step(Message(HB, src="a", dst="b", term=1, transferee="c"))
    out = b.step(Message(V, src="c", dst="b", term=2, index=1, log_term=1, transfer=True))
    assert [(m.type, m.dst, m.term, m.reject) for m in out] == [(VR, "c", 2, False)]
    assert b.raw.hard_state().vote == "c"


def test_lease_expires_after_an_election_timeout_of_silence() -> None:
    """Paper §6: the vote is ignored only "within the minimum election timeout of
    hearing from a current leader"."""
    net = _lease_net()
    b = net["b"]
    assert b.raft.randomized_election_timeout > ET  # b will not campaign itself first
    b.tick(ET)
    assert b.role is Role.FOLLOWER
    out = b.step(Message(V, src="c", dst="b", term=2, index=1, log_term=1))
    assert [(m.type, m.term, m.reject) for m in out] == [(VR, 2, False)]


# --- the leader's no-op and leader_ready ------------------------------------------------


def test_new_leader_appends_a_noop_of_its_term() -> None:
    """§8 / §5.4.2: "Raft handles this by having each leader commit a blank no-op entry
    into the log at the start of its term." """
    node = new_node("a", terms=[1, 1], term=1)
    sent = node.elect()
    noop = Entry(2, 3, EntryType.NO_OP, b"")
    assert node.raft.log.all_entries()[-1] == noop
    assert {m.dst for m in sent if m.type is A and m.entries == (noop,)} == {"b", "c"}


def test_leader_ready_only_once_the_noop_is_committed() -> None:
    """docs/core API: "A new leader appends a NO_OP entry of its term immediately.
    soft_state.leader_ready becomes True when that no-op is committed." """
    node = new_node("a", terms=[1], term=1)
    sent = node.elect()
    assert node.raw.soft_state().leader_ready is False
    node.step(accept(_to(sent, "b")[0]))
    assert node.raw.soft_state().leader_ready is True
    assert node.applied[-1].type is EntryType.NO_OP
    node.step(Message(AR, src="c", dst="a", term=9, reject=True))
    assert node.raw.soft_state() == node.raw.soft_state().__class__(
        role=Role.FOLLOWER, term=9, leader_id=NO_NODE, leader_ready=False
    )


def test_followers_are_never_leader_ready() -> None:
    """docs/core API: leader_ready is "Always False off-leader"."""
    net = Network.create()
    net.campaign("a")
    assert [n.raw.soft_state().leader_ready for n in net.nodes.values()] == [True, False, False]


# --- proposals ----------------------------------------------------------------------------


def test_propose_bound_to_an_old_term_raises_term_mismatch() -> None:
    """The lock-free check's invariant: "a write bound to term T is appended only if the
    leader is still in term T ... otherwise it fails" — propose(expected_term=...) raises
    TermMismatch."""
    node = new_node("a", term=1)
    node.elect_and_commit_noop()
    last = node.raft.log.last_index()
    with pytest.raises(TermMismatch) as err:
        node.raw.propose(b"x", expected_term=1)
    assert (err.value.expected_term, err.value.current_term, err.value.leader_id) == (1, 2, "a")
    assert isinstance(err.value, ProposalDropped)
    assert node.raft.log.last_index() == last
    assert not node.raw.has_ready()
    assert node.raw.propose(b"y", expected_term=2) == Entry(2, last + 1, EntryType.NORMAL, b"y")


def test_deposed_leader_refuses_a_proposal_bound_to_its_old_term() -> None:
    """The KUDU-2727 lesson: a write whose leadership check read term T must
    not be appended once the node has moved on from T."""
    node = new_node("a")
    node.elect_and_commit_noop()
    bound = node.raw.soft_state().term
    node.step(Message(A, src="b", dst="a", term=bound + 1))
    last = node.raft.log.last_index()
    with pytest.raises(ProposalDropped):
        node.raw.propose(b"x", expected_term=bound)
    assert node.raft.log.last_index() == last


def test_propose_on_follower_raises_not_leader_with_leader_hint() -> None:
    """§8: "If the client's first choice is not the leader, that server will reject the
    client's request and supply information about the most recent leader it has heard
    from." """
    node = new_node("a")
    node.step(Message(A, src="b", dst="a", term=3))
    with pytest.raises(NotLeaderError) as err:
        node.raw.propose(b"x")
    assert (err.value.leader_id, err.value.term) == ("b", 3)
    assert node.log_terms() == []


def test_propose_on_candidate_raises_not_leader_without_hint() -> None:
    """§8: a server that knows no leader rejects the request with no hint."""
    node = new_node("a")
    node.campaign()
    with pytest.raises(NotLeaderError) as err:
        node.raw.propose_batch([b"x", b"y"])
    assert (err.value.leader_id, err.value.term) == (NO_NODE, 1)


def test_propose_batch_appends_consecutive_entries_in_one_append() -> None:
    """§5.3: "AppendEntries ... (may send more than one for efficiency)" — a batch of
    proposals is one run of consecutive entries of the leader's term in one RPC."""
    node = new_node("a")
    node.elect_and_commit_noop()
    ents = node.raw.propose_batch([b"x", b"y", b"z"])
    assert [(e.term, e.index, e.data) for e in ents] == [(1, 2, b"x"), (1, 3, b"y"), (1, 4, b"z")]
    out = node.drain()
    for dst in "bc":
        (m,) = _to(out, dst)
        assert m.entries == tuple(ents)


# --- leadership transfer (thesis §3.10) --------------------------------------------------


def test_transfer_leadership_to_an_up_to_date_follower() -> None:
    """Thesis §3.10 (paraphrased): once the target is caught up, the prior leader sends
    it a TimeoutNow request, which has the same effect as the target's election timer
    firing: the target starts a new election (here without a pre-vote round)."""
    net = Network.create(check_quorum=True, pre_vote=True)
    net.campaign("a")
    net["a"].raw.transfer_leadership("b")
    net.deliver(net["a"].drain())
    assert net.sent(TN, "a", "b") == 1
    assert (net["b"].role, net["b"].term) == (Role.LEADER, 2)
    assert (net["a"].role, net["a"].raw.soft_state().leader_id) == (Role.FOLLOWER, "b")
    votes = [m for m in net.delivered if m.type is V and m.src == "b"]
    assert votes
    assert all(m.transfer for m in votes)
    assert net.sent(PV, "b") == 0  # no pre-vote round: the leader asked
    assert any(m.type is TN for rd in net["a"].readies for m in rd.messages)


def test_transfer_waits_until_the_target_has_caught_up() -> None:
    """Thesis §3.10 (paraphrased): the prior leader first brings the target's log up to
    date, then sends TimeoutNow; during the transfer it stops accepting client requests."""
    net = Network.create(check_quorum=True, pre_vote=True)
    net.campaign("a")
    net.isolate("c")
    for i in range(3):
        net.propose("a", f"x{i}".encode())
    a = net["a"]
    a.raw.transfer_leadership("c")
    net.deliver(a.drain())
    assert a.raw.soft_state().transferring is True
    assert all(m.type is not TN for m in net.dropped + net.delivered)
    with pytest.raises(ProposalDropped):
        a.raw.propose(b"refused")
    net.heal()
    net.tick("a")
    assert net.sent(TN, "a", "c") == 1
    assert net.leaders() == ["c"]
    assert data_entries(net["c"].raft.log.all_entries()) == [b"x0", b"x1", b"x2"]


def test_a_lost_timeout_now_is_sent_again_when_the_target_answers_a_heartbeat() -> None:
    """A TIMEOUT_NOW to a caught-up target can be lost (a link to a server just restarted
    was still down); the target's next heartbeat answer brings another, and the transfer
    completes instead of being abandoned after an election timeout (CI: a step-down to a
    server that had just restarted never happened)."""
    net = Network.create(check_quorum=True, pre_vote=True)
    net.campaign("a")
    a = net["a"]
    a.raw.transfer_leadership("b")
    first = a.drain()
    assert len(_to(first, "b", TN)) == 1
    net.deliver(m for m in first if m.type is not TN)
    assert net.leaders() == ["a"]
    assert a.raw.soft_state().transferring is True
    net.tick("a")  # a heartbeat, answered by b
    assert net.sent(TN, "a", "b") == 1
    assert (net.leaders(), net["b"].term) == (["b"], 2)


def test_transfer_to_unreachable_target_is_abandoned_after_an_election_timeout() -> None:
    """Thesis §3.10 (paraphrased): if the transfer does not complete within an election
    timeout, the prior leader aborts it and resumes accepting client requests."""
    net = Network.create(check_quorum=True, pre_vote=True)
    net.campaign("a")
    net.isolate("c")
    net.propose("a", b"x")
    a = net["a"]
    a.raw.transfer_leadership("c")
    net.deliver(a.drain())
    net.tick("a", ET)
    assert a.role is Role.LEADER
    assert a.raw.soft_state().transferring is False
    assert net.propose("a", b"y").data == b"y"


def test_the_answering_successor_is_the_longest_log_among_voters_that_answer() -> None:
    """What a stopping server hands leadership to: TIMEOUT_NOW to a voter that stopped
    answering would be lost, and the tablet would wait out the abandoned transfer."""
    net = Network.create(check_quorum=True, pre_vote=True)
    net.campaign("a")
    a = net["a"]
    assert net["b"].raw.answering_successor(2) == NO_NODE  # a follower hands nothing over
    assert a.raw.answering_successor(2) in ("b", "c")
    net.isolate("b")
    net.propose("a", b"x")  # c's log is now the longer, b's answers stop
    net.tick("a", 3)
    assert a.raw.answering_successor(2) == "c"
    net.heal()
    net.isolate("c")
    net.tick("a", 3)  # b answers the heartbeats and catches up; c has not answered for 3
    assert a.raw.answering_successor(2) == "b"
    net.isolate("b")
    net.tick("a", 3)
    assert a.raw.answering_successor(2) == NO_NODE


# --- fast backtracking (§5.3 "optimization") ---------------------------------------------

_BACKTRACK_CASES = {
    "same-length-conflict": [1] + [2] * 50,
    "longer-conflict": [1] + [2] * 100,
    "missing-entries": [1],
}


@pytest.mark.parametrize("case", sorted(_BACKTRACK_CASES))
def test_fast_backtracking_repairs_a_50_entry_conflict_in_few_round_trips(case: str) -> None:
    """§5.3: "If desired, the protocol can be optimized to reduce the number of rejected
    AppendEntries RPCs.  For example, when rejecting an AppendEntries request, the
    follower can include the term of the conflicting entry and the first index it stores
    for that term.  With this information, the leader can decrement nextIndex to bypass
    all of the conflicting entries in that term; one AppendEntries RPC will be required
    for each term with conflicting entries, rather than one RPC per entry." """
    leader_log = [1] + [3] * 50
    net = Network.create(
        ("l", "f", "x"), logs={"l": leader_log, "f": _BACKTRACK_CASES[case], "x": leader_log}
    )
    net.campaign("l")
    assert (net["l"].role, net["l"].term) == (Role.LEADER, 4)
    rejections = [m for m in net.delivered if m.type is AR and m.src == "f" and m.reject]
    appends = net.sent(A, "l", "f")
    assert len(rejections) <= 1, rejections
    assert appends <= 3
    assert net["f"].storage.all_entries() == net["l"].storage.all_entries()
    assert [e.term for e in net["f"].storage.all_entries()] == [*leader_log, 4]


def test_rejection_hint_points_at_followers_last_entry_when_log_is_short() -> None:
    """Figure 2 / §5.3: "If the follower does not find an entry in its log with the same
    index and term, then it refuses the new entries" — telling the leader where its log
    ends (reject_hint, log_term) so the leader need not probe index by index."""
    node = new_node("a", terms=[1, 1, 2], term=2)
    out = node.step(Message(A, src="b", dst="a", term=3, index=40, log_term=3))
    assert [(m.reject, m.index, m.reject_hint, m.log_term) for m in out] == [(True, 40, 3, 2)]


# --- per-follower progress and flow control -----------------------------------------------


def test_probe_state_sends_one_append_and_pauses_until_answered() -> None:
    """docs/core API / etcd progress: in PROBE state the leader "sends one APPEND at a time
    (probe_sent) and backs next off on rejection" — it resumes on a response or a
    heartbeat response."""
    node = new_node("a")
    sent = node.elect()
    assert len(_to(sent, "b")) == 1
    pr = node.raft.prs["b"]
    assert (pr.state, pr.probe_sent) == (ProgressState.PROBE, True)
    out: list[Message] = []
    for i in range(3):
        node.raw.propose(f"x{i}".encode())
        out += node.drain()
    assert _to(out, "b") == []  # paused
    out = node.step(Message(HBR, src="b", dst="a", term=1))
    (resumed,) = _to(out, "b")
    assert [e.index for e in resumed.entries] == [1, 2, 3, 4]
    node.raw.propose(b"x3")
    assert _to(node.drain(), "b") == []  # paused again until this probe is answered
    out = node.step(accept(resumed))
    assert node.raft.prs["b"].state is ProgressState.REPLICATE
    assert node.raft.prs["b"].match == 4
    assert [[e.index for e in m.entries] for m in _to(out, "b") if m.entries] == [[5]]


def test_replicate_state_pipelines_up_to_max_inflight_then_pauses() -> None:
    """docs/core API: in REPLICATE state "the leader streams APPENDs optimistically ...
    at most max_inflight unacknowledged" and resumes as acknowledgements free the window."""
    node = new_node("a", max_inflight_msgs=3)
    node.elect_and_commit_noop()
    assert node.raft.prs["b"].state is ProgressState.REPLICATE
    out: list[Message] = []
    for i in range(5):
        node.raw.propose(f"x{i}".encode())
        out += node.drain()
    to_b = _to(out, "b")
    assert [[e.index for e in m.entries] for m in to_b] == [[2], [3], [4]]
    assert node.raft.prs["b"].is_paused()
    more = node.step(accept(to_b[0]))
    assert [[e.index for e in m.entries] for m in _to(more, "b")] == [[5, 6]]
    assert _to(more, "c") == []  # c's window is still full


def test_replicate_state_pauses_once_max_inflight_bytes_are_in_flight() -> None:
    """A follower far behind was sent max_inflight_msgs messages of up to max_size_per_msg
    as answers came, each read from the log and encoded under the driver's lock. With a
    byte cap, the message that reaches it is the last until answers free some."""
    node = new_node("a", max_inflight_msgs=64, max_inflight_bytes=250)
    node.elect_and_commit_noop()
    out: list[Message] = []
    for _ in range(10):
        node.raw.propose(b"x" * 16)  # 40 bytes by Entry.size
        out += node.drain()
    to_b = _to(out, "b")
    assert [[e.index for e in m.entries] for m in to_b] == [[i] for i in range(2, 9)]
    pr = node.raft.prs["b"]
    assert (pr.is_paused(), pr.inflights.bytes) == (True, 7 * 40)
    more = node.step(accept(to_b[1]))  # frees two: 200 bytes left, 50 to go
    assert [[e.index for e in m.entries] for m in _to(more, "b")] == [[9, 10, 11]]
    assert pr.is_paused()


def test_a_burst_of_heartbeat_answers_sends_one_append_a_tick() -> None:
    """A follower back from a pause answers every heartbeat queued for it at once. Each
    answer freed a slot of its full window and sent one more APPEND of up to
    max_size_per_msg, read from the log and encoded under the consensus lock: ~80 answers
    held a leader's lock for 14.6 s (review r26a). One a tick still unsticks a window
    whose messages were all lost."""
    node = new_node("a", max_inflight_msgs=3)
    node.elect_and_commit_noop()
    for i in range(10):
        node.raw.propose(f"x{i}".encode())
        node.drain()
    assert node.raft.prs["b"].is_paused()
    burst: list[Message] = []
    for _ in range(20):
        burst += node.step(Message(HBR, src="b", dst="a", term=1))
    assert [[e.index for e in m.entries] for m in _to(burst, "b")] == [[5, 6, 7, 8, 9, 10, 11]]
    node.tick()
    more = node.step(Message(HBR, src="b", dst="a", term=1))
    more += node.step(Message(HBR, src="b", dst="a", term=1))
    assert len(_to(more, "b")) == 1  # the next tick's first answer: the next resend


def test_append_batches_entries_up_to_max_size_per_msg() -> None:
    """docs/core API: "Cap on the entry bytes of one APPEND message (at least one entry is
    sent)" — a follower that is behind is caught up with several entries per APPEND."""
    net = Network.create(max_size_per_msg=100)
    net.campaign("a")
    net.isolate("c")
    datas = [bytes([65 + i]) * 16 for i in range(10)]  # 40 bytes each by Entry.size
    for d in datas:
        net.propose("a", d)
    net.heal()
    mark = len(net.delivered)
    net.tick("a")
    catch_up = [m for m in net.delivered[mark:] if m.type is A and m.dst == "c" and m.entries]
    sizes = [sum(e.size() for e in m.entries) for m in catch_up]
    assert max(len(m.entries) for m in catch_up) == 2
    assert all(s <= 100 for s in sizes), sizes
    assert len(catch_up) == 5
    assert data_entries(net["c"].storage.all_entries()) == datas


def test_append_carries_at_least_one_entry_even_above_max_size() -> None:
    """docs/core API: "Cap on the entry bytes of one APPEND message (at least one entry
    is sent)." """
    net = Network.create(max_size_per_msg=1)
    net.campaign("a")
    net.isolate("c")
    a = net["a"]
    a.raw.propose_batch([b"x" * 100, b"y" * 100, b"z" * 100])
    net.deliver(a.drain())
    net.heal()
    net.tick("a", 2)
    with_entries = [m for m in net.delivered if m.type is A and m.entries]
    assert with_entries
    assert all(len(m.entries) == 1 for m in with_entries)
    assert net["c"].storage.all_entries() == a.storage.all_entries()
    assert a.raft.log.committed == 4


# --- the Ready contract ------------------------------------------------------------------


def test_ready_sends_replication_now_and_everything_else_after_persistence() -> None:
    """docs/core API: "APPEND/HEARTBEAT/TIMEOUT_NOW go to rd.messages; everything else
    (votes, responses) goes to rd.persisted_messages." — over a run that exercises every
    message type."""
    net = Network.create(check_quorum=True, pre_vote=True)
    net.tick_all(2 * ET)
    leader = net.leader()
    net.propose(leader.id, b"x")
    other = next(i for i in net.nodes if i != leader.id)
    leader.raw.transfer_leadership(other)
    net.deliver(leader.drain())
    net.tick_all(2)
    now: set[MessageType] = set()
    later: set[MessageType] = set()
    for n in net.nodes.values():
        for rd in n.readies:
            now |= {m.type for m in rd.messages}
            later |= {m.type for m in rd.persisted_messages}
    assert now == SEND_NOW
    assert later == {AR, HBR, V, VR, PV, PVR}


def test_append_response_waits_for_the_entries_to_be_durable() -> None:
    """Figure 2: "Updated on stable storage before responding to RPCs" — a follower's
    acknowledgement is in persisted_messages, in the Ready that holds the entries."""
    node = new_node("a")
    ents = (Entry(1, 1, data=b"x"), Entry(1, 2, data=b"y"))
    node.raw.step(Message(A, src="b", dst="a", term=1, entries=ents, commit=2))
    rd = node.raw.ready()
    assert rd.entries == ents
    assert rd.must_sync
    assert rd.messages == ()
    assert [(m.type, m.index) for m in rd.persisted_messages] == [(AR, 2)]
    # Committed, but not durable yet: nothing to apply.
    assert rd.committed_entries == ()
    node.persist(rd)
    node.raw.on_persisted(rd)
    rd2 = node.raw.ready()
    assert rd2.committed_entries == ents


def test_leader_applies_nothing_it_has_not_persisted_itself() -> None:
    """docs/core API: "committed_entries only ever contain entries that are durable
    locally (persisted + on_persisted called)" — even when the followers' acknowledgements
    alone make the entry committed."""
    node = new_node("a")
    node.elect_and_commit_noop()
    entry = node.raw.propose(b"x")
    rd = node.raw.ready()
    for m in rd.messages:
        node.raw.step(accept(m))
    assert node.raft.log.committed == entry.index  # b and c: a majority
    rd2 = node.raw.ready()
    assert entry not in rd2.committed_entries
    node.persist(rd)
    node.raw.on_persisted(rd)
    node.persist(rd2)
    node.raw.on_persisted(rd2)
    assert node.raw.ready().committed_entries == (entry,)


def test_ready_never_hands_out_the_same_entries_twice() -> None:
    """docs/core API: "ready() hands out everything pending (never twice)" — entries to
    persist, messages and committed entries alike, even before the previous Ready is
    acknowledged."""
    node = new_node("a")
    node.elect_and_commit_noop()
    x = node.raw.propose(b"x")
    rd1 = node.raw.ready()
    y = node.raw.propose(b"y")
    rd2 = node.raw.ready()
    assert (rd1.entries, rd2.entries) == ((x,), (y,))
    assert [m.entries for m in rd2.messages if m.type is A] == [(y,), (y,)]
    assert not node.raw.has_ready()
    for rd in (rd1, rd2):
        node.persist(rd)
        node.raw.on_persisted(rd)
    for m in rd1.messages + rd2.messages:
        node.raw.step(accept(m))
    rd3 = node.raw.ready()
    assert rd3.committed_entries == (x, y)
    z = node.raw.propose(b"z")
    rd4 = node.raw.ready()  # rd3 not applied yet
    assert rd4.entries == (z,)
    assert rd4.committed_entries == ()


def test_ready_replaces_a_suffix_handed_out_but_not_yet_persisted() -> None:
    """types.Ready: "entries[0].index may be at or below an index handed out before: the
    log's suffix from there is replaced" — a follower whose unpersisted entries are
    overwritten by a newer leader hands out only the replacement, and acknowledging the
    stale Ready does not count the overwritten entries as durable."""
    node = new_node("a", terms=[1], term=1)
    node.raw.step(
        Message(
            A, src="b", dst="a", term=1, index=1, log_term=1, entries=(Entry(1, 2), Entry(1, 3))
        )
    )
    rd1 = node.raw.ready()
    assert [(e.index, e.term) for e in rd1.entries] == [(2, 1), (3, 1)]
    node.raw.step(
        Message(A, src="c", dst="a", term=2, index=2, log_term=1, entries=(Entry(2, 3),), commit=3)
    )
    rd2 = node.raw.ready()
    assert [(e.index, e.term) for e in rd2.entries] == [(3, 2)]
    # Only what was durable before either Ready may be applied yet.
    assert [(e.index, e.term) for e in rd2.committed_entries] == [(1, 1)]
    node.persist(rd1)
    node.raw.on_persisted(rd1)
    # (2, 1) is durable and ours; (3, 1) was durable, but (3, 2) is ours and is not.
    assert [(e.index, e.term) for e in node.raw.ready().committed_entries] == [(2, 1)]
    node.persist(rd2)
    node.raw.on_persisted(rd2)
    assert node.durable_terms() == [1, 1, 2]
    assert [(e.index, e.term) for e in node.raw.ready().committed_entries] == [(3, 2)]


def test_commit_only_ready_needs_no_sync() -> None:
    """types.Ready: must_sync is "True when term or vote changed or entries are appended
    ... A commit-only change need not be synced." """
    node = new_node("a", terms=[1], term=1)
    node.step(Message(HB, src="b", dst="a", term=1))
    node.raw.step(Message(HB, src="b", dst="a", term=1, commit=1))
    rd = node.raw.ready()
    assert rd.hard_state == HardState(term=1, vote=NO_NODE, commit=1)
    assert rd.must_sync is False
    assert rd.committed_entries == tuple(node.storage.all_entries())


# --- restart from storage -----------------------------------------------------------------


def _committed_net() -> Network:
    net = Network.create()
    net.campaign("a")
    for i in range(3):
        net.propose("a", f"x{i}".encode())
    net.tick("a")
    return net


def test_restart_restores_term_vote_and_log_from_storage() -> None:
    """Figure 2: "Persistent state on all servers: currentTerm, votedFor, log[]" — a node
    restarted from its storage has them back, and starts as a follower (§5.2)."""
    net = _committed_net()
    b = net["b"]
    restarted = RawNode(b.config, b.storage)
    assert restarted.hard_state() == b.storage.initial_state() == HardState(1, "a", 4)
    assert restarted.raft.log.all_entries() == b.storage.all_entries()
    assert restarted.soft_state().role is Role.FOLLOWER
    assert restarted.soft_state().leader_id == NO_NODE


@pytest.mark.parametrize(("applied", "redelivered"), [(0, [1, 2, 3, 4]), (2, [3, 4]), (4, [])])
def test_restart_redelivers_committed_entries_after_applied(
    applied: int, redelivered: list[int]
) -> None:
    """§5.3: committed entries are applied "in log order" — after a restart, from the
    state machine's durable applied index + 1 (Config.applied)."""
    net = _committed_net()
    b = net.restart("b", applied=applied)
    assert [e.index for e in b.applied] == redelivered


def test_restart_never_reapplies_entries_the_state_machine_already_applied() -> None:
    """Figure 2: "lastApplied: index of highest log entry applied to state machine
    (initialized to 0, increases monotonically)" — restarted with Config.applied = the
    store's durable applied index, the core must not hand those entries out again.

    This is reachable: Ready.must_sync is False for a commit-only change, so the
    persisted HardState.commit may lag the applied index the store made durable in the
    same transaction as the rows.  An applied entry was committed and
    durable, so committed >= applied after the restart.
    """
    storage = make_storage([1, 1, 1, 1], term=1, commit=2)  # commit 4 was never fsynced
    config = make_config("a", applied=4)
    node = Node(RawNode(config, storage), storage, config)
    node.drain()
    # The leader (re-)advertises commit 4: there is still nothing to apply.
    node.step(Message(A, src="b", dst="a", term=1, index=4, log_term=1, commit=4))
    assert [e.index for e in node.applied] == []
    assert node.raw.status().applied == 4


def test_restart_remembers_the_vote() -> None:
    """§5.2: "each server will vote for at most one candidate in a given term" — also
    across a crash, because votedFor is persistent (Figure 2)."""
    node = new_node("b")
    node.step(Message(V, src="c", dst="b", term=5))
    again = Node(RawNode(node.config, node.storage), node.storage, node.config)
    out = again.step(Message(V, src="a", dst="b", term=5))
    assert [(m.type, m.reject) for m in out] == [(VR, True)]
    assert again.raw.hard_state() == HardState(term=5, vote="c", commit=0)


def test_whole_cluster_restart_keeps_committed_entries() -> None:
    """§5.4 Leader Completeness across crashes: after every server restarts from storage,
    the new leader still has (and everyone applies) every committed entry."""
    net = _committed_net()
    for i in list(net.nodes):
        net.crash(i)
    for i in list(net.nodes):
        net.restart(i)
    net.campaign("c")
    assert (net["c"].role, net["c"].term) == (Role.LEADER, 2)
    net.propose("c", b"after")
    net.tick("c")
    for n in net.nodes.values():
        assert data_entries(n.applied) == [b"x0", b"x1", b"x2", b"after"]


# --- Config.validate ---------------------------------------------------------------------

_BAD_CONFIGS: list[dict[str, Any]] = [
    {"id": ""},
    # A node need not be a member (a learner, a replica created to join, a removed one), but
    # a membership must make sense.
    {"learners": ("c",)},
    {"voters": ()},
    {"config_index": -1},
    {"voters": ("a", "a", "b")},
    {"heartbeat_tick": 0},
    {"election_tick": 1, "heartbeat_tick": 1},
    {"election_tick": 2, "heartbeat_tick": 3},
    {"max_inflight_msgs": 0},
    {"max_size_per_msg": 0},
    {"applied": -1},
]


@pytest.mark.parametrize("bad", _BAD_CONFIGS)
def test_config_validate_rejects(bad: dict[str, Any]) -> None:
    """config.Config.validate: an inconsistent configuration is a RaftConfigError (a
    ValueError), raised by validate() and by building a node with it."""
    kwargs: dict[str, Any] = {"id": "a", "voters": ("a", "b", "c"), **bad}
    config = Config(**kwargs)
    with pytest.raises(RaftConfigError):
        config.validate()
    with pytest.raises(ValueError, match=r"."):
        RawNode(config, MemoryStorage())


def test_config_validate_accepts_a_sane_config() -> None:
    """config.Config.validate: the defaults and a single-voter group are valid."""
    Config(id="a", voters=("a",)).validate()
    config = make_config("a", election_tick=2, heartbeat_tick=1, max_size_per_msg=1)
    config.validate()
    assert RawNode(config, MemoryStorage()).soft_state().role is Role.FOLLOWER


# --- odds and ends ---------------------------------------------------------------------


def test_single_server_commits_only_what_it_has_persisted() -> None:
    """§5.3: "A log entry is committed once the leader that created the entry has
    replicated it on a majority of the servers" — for one server, once its own copy is
    durable (docs/core API: "The leader counts itself toward a commit only after
    on_persisted() for its own entries")."""
    node = new_node("a", ("a",))
    node.elect_and_commit_noop()
    entry = node.raw.propose(b"x")
    rd = node.raw.ready()
    assert rd.entries == (entry,)
    assert rd.committed_entries == ()
    assert node.raft.log.committed == entry.index - 1
    node.persist(rd)
    node.raw.on_persisted(rd)
    assert node.raft.log.committed == entry.index
    assert node.raw.ready().committed_entries == (entry,)


def test_messages_for_other_nodes_or_from_non_members_are_dropped() -> None:
    """errors.py: a peer's bad message is "answered or dropped, because a remote node
    must not crash us" — one not addressed to us, or from outside the group, changes
    nothing."""
    node = new_node("a", terms=[1], term=1)
    for m in (
        Message(A, src="b", dst="z", term=9, entries=(Entry(9, 2),)),
        Message(A, src="z", dst="a", term=9, entries=(Entry(9, 2),)),
        Message(V, src="a", dst="a", term=9),
    ):
        assert node.step(m) == []
    assert node.raw.hard_state() == HardState(term=1, vote=NO_NODE, commit=0)
    assert node.log_terms() == [1]


def test_cluster_recovers_from_leader_crash_with_prevote_and_check_quorum() -> None:
    """§5.2 with the thesis extensions on: after the leader fails, followers stop
    hearing heartbeats, their leases expire and one of them is elected — in the next
    term, not later (pre-votes never bump terms)."""
    net = Network.create(check_quorum=True, pre_vote=True)
    net.campaign("a")
    net.propose("a", b"x")
    net.crash("a")
    net.tick_all(3 * ET)
    leader = net.leader()
    assert leader.id in ("b", "c")
    assert leader.term == 2
    net.propose(leader.id, b"y")
    assert data_entries(net["b"].applied) == data_entries(net["c"].applied) == [b"x", b"y"]
