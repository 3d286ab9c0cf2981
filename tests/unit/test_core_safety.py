"""The Raft paper, §5.4 (safety), sentence by sentence: the election restriction
(§5.4.1), committing entries from previous terms (§5.4.2, Figure 8) and the
properties of Figure 3.  Pre-vote and check-quorum are off.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from raftlet.consensus.core import Entry, Message, MessageType, ProposalDropped, Role
from tests.unit.raft_harness import (
    IDS5,
    Network,
    Node,
    accept,
    data_entries,
    new_node,
)

A = MessageType.APPEND
AR = MessageType.APPEND_RESPONSE
V = MessageType.VOTE
VR = MessageType.VOTE_RESPONSE


def _assert_state_machine_safety(net: Network) -> None:
    """Figure 3, State Machine Safety: "if a server has applied a log entry at a given
    index to its state machine, no other server will ever apply a different log entry
    for the same index." """
    by_index: dict[int, Entry] = {}
    for n in net.nodes.values():
        indexes = [e.index for e in n.applied]
        if indexes:
            assert indexes == list(range(indexes[0], indexes[0] + len(indexes)))
        for e in n.applied:
            assert by_index.setdefault(e.index, e) == e, f"{n.id} applied {e} at {e.index}"


# --- §5.4.1 election restriction ---------------------------------------------------------

_VOTER_CASES = [
    # voter's log terms, candidate (last log term, last index), reject?
    # same last term: the longer log is more up-to-date
    ([1], (1, 1), False),
    ([1], (1, 2), False),
    ([1, 1], (1, 1), True),
    # the candidate's last term is later
    ([1], (2, 1), False),
    ([1], (2, 2), False),
    ([1, 1], (2, 1), False),
    # the voter's last term is later
    ([2], (1, 1), True),
    ([2], (1, 2), True),
    ([2, 2], (1, 1), True),
    ([1, 2], (1, 5), True),
    # empty candidate log against a non-empty voter
    ([1], (0, 0), True),
]


@pytest.mark.parametrize(("voter_log", "cand", "reject"), _VOTER_CASES)
def test_voter_denies_vote_to_less_up_to_date_candidate(
    voter_log: list[int], cand: tuple[int, int], reject: bool
) -> None:
    """§5.4.1: "the voter denies its vote if its own log is more up-to-date than that of
    the candidate ... If the logs have last entries with different terms, then the log
    with the later term is more up-to-date.  If the logs end with the same term, then
    whichever log is longer is more up-to-date." """
    node = new_node("a", ("a", "b"), terms=voter_log)
    log_term, index = cand
    out = node.step(Message(V, src="b", dst="a", term=3, log_term=log_term, index=index))
    assert [(m.type, m.dst, m.term, m.reject) for m in out] == [(VR, "b", 3, reject)]
    assert node.term == 3  # the term is adopted even when the vote is refused
    assert node.raw.hard_state().vote == ("" if reject else "b")


def test_candidate_with_stale_log_cannot_win() -> None:
    """§5.4.1: "A candidate must contact a majority of the cluster in order to be
    elected, which means that every committed entry must be present in at least one of
    those servers.  If the candidate's log is at least as up-to-date as any other log in
    that majority ... then it will hold all the committed entries." """
    net = Network.create(logs={"a": [1], "b": [1, 1], "c": [1, 1]})
    net.campaign("a")
    assert net["a"].role is not Role.LEADER
    assert net.leaders() == []
    assert net["b"].raw.hard_state().vote == ""
    net.campaign("b")
    assert net.leaders() == ["b"]
    assert net["a"].log_terms() == net["b"].log_terms() == [1, 1, 3]


def test_lagging_server_cannot_become_leader_after_the_leader_fails() -> None:
    """§5.4: "the leader for any given term contains all of the entries committed in
    previous terms (the Leader Completeness Property)" — a server that missed committed
    entries is refused by the servers that hold them."""
    net = Network.create()
    net.campaign("a")
    net.isolate("c")
    for i in range(3):
        net.propose("a", f"x{i}".encode())
    committed = net["a"].raft.log.committed
    assert committed == 4
    net.crash("a")
    net.heal()
    net.campaign("c")
    assert net.leaders() == []
    net.campaign("b")
    assert net.leaders() == ["b"]
    net.tick("b")
    b_log = net["b"].raft.log.all_entries()
    assert b_log[:committed] == net["a"].storage.all_entries()[:committed]
    assert data_entries(net["c"].applied) == [b"x0", b"x1", b"x2"]
    _assert_state_machine_safety(net)


def test_new_leader_holds_all_committed_entries() -> None:
    """§5.4: "the leader for any given term contains all of the entries committed in
    previous terms." — after each of several leader changes."""
    net = Network.create(IDS5)
    net.campaign("a")
    committed_so_far: list[Entry] = []
    for round_, (old, new) in enumerate([("a", "b"), ("b", "c"), ("c", "d"), ("d", "e")]):
        net.propose(old, f"r{round_}".encode())
        net.tick(old)
        old_node = net[old]
        committed_so_far = old_node.raft.log.all_entries()[: old_node.raft.log.committed]
        net.crash(old)
        net.campaign(new)
        assert net.leaders() == [new]
        assert net[new].raft.log.all_entries()[: len(committed_so_far)] == committed_so_far
        net.restart(old)
    assert data_entries(committed_so_far) == [b"r0", b"r1", b"r2", b"r3"]
    _assert_state_machine_safety(net)


# --- §5.4.2 committing entries from previous terms -----------------------------------------

_CURRENT_TERM_CASES = [(1, 0), (2, 0), (3, 3)]


@pytest.mark.parametrize(("acked", "want_commit"), _CURRENT_TERM_CASES)
def test_leader_commits_only_by_counting_replicas_of_current_term_entries(
    acked: int, want_commit: int
) -> None:
    """§5.4.2: "Raft never commits log entries from previous terms by counting replicas.
    Only log entries from the leader's current term are committed by counting replicas;
    once an entry from the current term has been committed in this way, then all prior
    entries are committed indirectly because of the Log Matching Property." """
    leader = new_node("a", ("a", "b"), terms=[1, 2], term=2)
    leader.elect()
    assert leader.term == 3
    leader.step(Message(AR, src="b", dst="a", term=3, index=acked))
    assert leader.raft.log.committed == want_commit
    assert [(e.index, e.term) for e in leader.applied] == [(1, 1), (2, 2), (3, 3)][:want_commit]


def test_figure8_previous_term_entry_on_majority_is_not_committed() -> None:
    """§5.4.2, Figure 8 (c)/(e): "a log entry from term 2 has been replicated on a
    majority of the servers, but it is not committed" — the leader of term 4 commits it
    only together with an entry of its own term."""
    leader = new_node("a", IDS5, terms=[1, 2], term=3, commit=1, applied=1)
    leader.elect()
    assert (leader.term, leader.log_terms()) == (4, [1, 2, 4])
    # S2 and S3 hold index 2 (term 2): with S1 that is 3 of 5 servers.
    leader.step(Message(AR, src="b", dst="a", term=4, index=2))
    leader.step(Message(AR, src="c", dst="a", term=4, index=2))
    assert leader.raft.log.committed == 1
    assert [e.index for e in leader.applied] == []  # index 1 was applied before the start
    assert leader.raw.soft_state().leader_ready is False
    # Figure 8 (e): the term-4 entry reaches the same majority; both are now committed.
    leader.step(Message(AR, src="b", dst="a", term=4, index=3))
    assert leader.raft.log.committed == 1
    leader.step(Message(AR, src="c", dst="a", term=4, index=3))
    assert leader.raft.log.committed == 3
    assert [(e.index, e.term) for e in leader.applied] == [(2, 2), (3, 4)]
    assert leader.raw.soft_state().leader_ready is True


def _figure8_state_c() -> Network:
    """Play Figure 8 (a)-(c) on five servers S1..S5 = a..e, every log starting as [1]
    (committed).  Returns the network in state (c): S1 leads term 4, its term-2 entry at
    index 2 is on S1, S2, S3 (a majority) and its term-4 entry at index 3 only on S1."""
    nodes = [new_node(i, IDS5, terms=[1], commit=1, applied=1) for i in IDS5]
    net = Network(nodes)
    # (a) S1 is leader in term 2 and replicates index 2 to S2 only.
    net.transform = lambda m: None if m.type is A and m.src == "a" and m.dst != "b" else m
    net.campaign("a")  # every server starts in term 1
    assert (net["a"].role, net["a"].term) == (Role.LEADER, 2)
    net.crash("a")
    # (b) S1 crashes; S5 is elected in term 3 (votes of S3, S4, S5) and accepts a
    # different entry at index 2.
    net.transform = lambda m: None if m.type is A and m.src == "e" else m
    net.campaign("e")
    assert (net["e"].role, net["e"].term) == (Role.LEADER, 3)
    net.crash("e")
    # (c) S5 crashes; S1 restarts, is elected in term 4 and replicates index 2 — but not
    # its term-4 entry — to S3.
    net.restart("a")

    def only_index_2(m: Message) -> Message | None:
        if m.type is A and m.src == "a":
            if m.dst == "d":
                return None
            return replace(m, entries=tuple(e for e in m.entries if e.index <= 2))
        return m

    net.transform = only_index_2
    for _ in range(3):
        if net["a"].role is Role.LEADER:
            break
        net.campaign("a")
    assert (net["a"].role, net["a"].term) == (Role.LEADER, 4)
    net.tick("a", 3)
    logs = {i: n.log_terms() for i, n in net.nodes.items()}
    assert logs == {
        "a": [1, 2, 4],
        "b": [1, 2],
        "c": [1, 2],
        "d": [1],
        "e": [1, 3],
    }
    return net


def test_figure8_network_uncommitted_previous_term_entry_may_be_overwritten() -> None:
    """§5.4.2, Figure 8: "a leader cannot immediately conclude that an entry from a
    previous term is committed once it is stored on a majority of servers ... (d) If S1
    crashes, S5 could be elected leader ... and overwrite the entry with its own entry from
    term 3."  So the term-2 entry must not have been committed (or applied) in (c)."""
    net = _figure8_state_c()
    assert net["a"].raft.log.committed == 1
    assert all(n.applied == [] for n in net.nodes.values())
    # (d) S1 crashes; S5 restarts and wins with the votes of S2, S3 and S4.
    net.transform = None
    net.crash("a")
    net.restart("e")
    for _ in range(3):
        if net["e"].role is Role.LEADER:
            break
        net.campaign("e")
    assert (net["e"].role, net["e"].term) == (Role.LEADER, 5)
    net.tick("e")
    for i in "bcde":
        assert net[i].durable_terms() == [1, 3, 5]
    assert all((e.index, e.term) != (2, 2) for n in net.nodes.values() for e in n.applied)
    _assert_state_machine_safety(net)


def test_figure8_network_current_term_entry_commits_the_previous_one() -> None:
    """§5.4.2, Figure 8 (e): "if S1 replicates an entry from its current term on a
    majority of the servers before crashing, as in (e), then this entry is committed (S5
    cannot win an election).  At this point all preceding entries in the log are
    committed as well." """
    net = _figure8_state_c()
    net.transform = None
    net.tick("a", 3)
    assert net["a"].raft.log.committed == 3
    assert [(e.index, e.term) for e in net["a"].applied] == [(2, 2), (3, 4)]
    net.crash("a")
    net.restart("e")
    for _ in range(3):
        net.campaign("e")
        assert net["e"].role is not Role.LEADER
    for i in "bcd":
        assert net[i].durable_terms()[:3] == [1, 2, 4]
    _assert_state_machine_safety(net)


# --- Figure 3 properties under a scripted run --------------------------------------------


def test_election_safety_and_state_machine_safety_under_partitions() -> None:
    """Figure 3: "Election Safety: at most one leader can be elected in a given term."
    "Log Matching: if two logs contain an entry with the same index and term, then the
    logs are identical in all entries up through the given index."  "State Machine
    Safety" — checked after every round of a deterministic run with partitions."""
    net = Network.create(IDS5)
    rng = random.Random(7)
    leaders_by_term: dict[int, set[str]] = {}
    proposed = 0
    for _ in range(30):
        net.heal()
        if rng.random() < 0.6:
            minority = rng.sample(IDS5, rng.choice([1, 2]))
            net.partition(minority, [i for i in IDS5 if i not in minority])
        net.tick_all(rng.randrange(5, 25))
        for node_id in net.leaders():
            leaders_by_term.setdefault(net[node_id].term, set()).add(node_id)
            try:
                net.propose(node_id, f"p{proposed}".encode())
                proposed += 1
            except ProposalDropped:  # a leader may refuse, but only in this typed way
                pass
        assert all(len(ids) == 1 for ids in leaders_by_term.values()), leaders_by_term
        _assert_state_machine_safety(net)
        logs = [n.raft.log.all_entries() for n in net.nodes.values()]
        for x in logs:
            for y in logs:
                common = [i for i in range(min(len(x), len(y))) if x[i].term == y[i].term]
                if common:
                    k = common[-1] + 1
                    assert x[:k] == y[:k]
    net.heal()
    net.tick_all(3 * 10)
    assert len(net.leaders()) == 1
    applied = [data_entries(n.applied) for n in net.nodes.values()]
    assert all(a == applied[0] for a in applied)
    assert len(applied[0]) > 5
    assert len(leaders_by_term) >= 3  # the run did change leaders


def test_leader_completeness_follower_never_loses_committed_entries() -> None:
    """§5.4.3: "Leader Completeness ... Every entry committed by a leader is present in
    the logs of all future leaders" — so a follower is never asked to drop one: after a
    change of leader its committed prefix is unchanged."""
    net = Network.create()
    net.campaign("a")
    for i in range(3):
        net.propose("a", f"x{i}".encode())
    net.tick("a")
    before = {i: n.raft.log.all_entries()[: n.raft.log.committed] for i, n in net.nodes.items()}
    net.crash("a")
    net.campaign("c")
    net.propose("c", b"y")
    net.tick("c")
    for node_id in ("b", "c"):
        node: Node = net[node_id]
        assert node.raft.log.all_entries()[: len(before[node_id])] == before[node_id]
    assert data_entries(net["b"].applied) == [b"x0", b"x1", b"x2", b"y"]


def test_leader_does_not_commit_on_acknowledgement_of_unpersisted_self() -> None:
    """§5.3/§5.4.2: "A log entry is committed once the leader that created the entry has
    replicated it on a majority of the servers" — a 2-server cluster needs both copies:
    the follower's acknowledgement alone is not a majority."""
    leader = new_node("a", ("a", "b"))
    leader.elect_and_commit_noop()
    leader.raw.propose(b"x")
    rd = leader.raw.ready()
    (app,) = [m for m in rd.messages if m.type is A]
    leader.raw.step(accept(app))
    assert leader.raft.log.committed == 1
    leader.persist(rd)
    leader.raw.on_persisted(rd)
    assert leader.raft.log.committed == 2


def test_a_durability_report_does_not_cover_entries_a_later_batch_rewrote() -> None:
    """Three leaders in turn while a follower's first batch is being synced: A (term 1)
    writes 8..10, B (term 2) overwrites 9..10, C (term 3, holding A's entries) writes 9..10
    back as A had them and commits 11. When A is reported durable, the disk may hold B's
    entries at 9..10 (the log writes B before A's report comes) and C not yet: only 8 is
    durable and ours. Matching the reported (index, term) alone counted 9..10 durable, so the
    commit index saved with a vote, and what was applied, ran ahead of the durable log."""
    from raftlet.consensus.core.raft_log import RaftLog
    from raftlet.consensus.core.storage import MemoryStorage

    disk = MemoryStorage()
    disk.append([Entry(1, i) for i in range(1, 8)])
    log = RaftLog(disk, committed=7, applied=7)
    batches = []
    for prev, commit, entries in (
        (7, 7, [Entry(1, 8), Entry(1, 9), Entry(1, 10)]),  # A
        (8, 7, [Entry(2, 9), Entry(2, 10)]),  # B
        (8, 11, [Entry(1, 9), Entry(1, 10), Entry(3, 11)]),  # C
    ):
        assert log.maybe_append(prev, 1, commit, entries) == entries[-1].index
        batch = log.unstable_to_persist()
        disk.append(batch)
        batches.append(batch[-1])
    a, b, c = batches
    assert log.stable_to(a.index, a.term)
    assert log.stable_index() == 8
    assert [e.index for e in log.committed_to_apply()] == [8]
    assert not log.stable_to(b.index, b.term)  # rewritten by C: nothing more is ours yet
    assert log.stable_index() == 8
    assert log.stable_to(c.index, c.term)
    assert log.stable_index() == 11
    assert [(e.index, e.term) for e in log.committed_to_apply()] == [(9, 1), (10, 1), (11, 3)]


def test_a_report_covers_the_batches_before_it_and_one_of_no_batch_is_ignored() -> None:
    from raftlet.consensus.core.raft_log import RaftLog
    from raftlet.consensus.core.storage import MemoryStorage

    log = RaftLog(MemoryStorage(), committed=0, applied=0)
    log.append([Entry(1, 1)])
    first = log.unstable_to_persist()
    log.append([Entry(1, 2), Entry(1, 3)])
    second = log.unstable_to_persist()
    assert not log.stable_to(2, 1)  # the end of no batch
    assert log.stable_index() == 0
    assert log.stable_to(second[-1].index, second[-1].term)  # the log writes in order
    assert log.stable_index() == 3
    assert not log.stable_to(first[-1].index, first[-1].term)  # covered already
