"""The Raft paper, §5.1 (basics, terms) and §5.2 (leader election), sentence by sentence.

Ongaro & Ousterhout, "In Search of an Understandable Consensus Algorithm"
(extended version).  Each test's docstring quotes the sentence it checks.  These
tests run the bare algorithm of the paper: pre-vote and check-quorum are off
unless a test says otherwise (see tests/unit/test_core_features.py for those).
"""

from __future__ import annotations

import pytest

from raftlet.consensus.core import NO_NODE, Entry, HardState, Message, MessageType, Role
from tests.unit.raft_harness import IDS3, IDS5, Network, Node, new_node

A = MessageType.APPEND
AR = MessageType.APPEND_RESPONSE
HB = MessageType.HEARTBEAT
V = MessageType.VOTE
VR = MessageType.VOTE_RESPONSE
ET = 10  # election_tick used throughout


def _put_in_role(node: Node, role: Role) -> None:
    if role is Role.CANDIDATE:
        node.campaign()
    elif role is Role.LEADER:
        node.elect()
    assert node.role is role


def _follower_of(leader: str, term: int, node_id: str = "a") -> Node:
    """A follower that has heard from ``leader`` in ``term`` (via an empty APPEND)."""
    node = new_node(node_id)
    node.step(Message(A, src=leader, dst=node_id, term=term))
    assert node.raw.soft_state().leader_id == leader
    return node


# --- §5.1 ------------------------------------------------------------------------------


def test_servers_start_as_followers() -> None:
    """§5.2: "When servers start up, they begin as followers." """
    node = new_node("a", terms=[1, 1], term=3, vote="b")
    assert node.role is Role.FOLLOWER
    assert node.raw.soft_state().leader_id == NO_NODE
    assert node.raw.hard_state() == HardState(term=3, vote="b", commit=0)


@pytest.mark.parametrize("role", [Role.FOLLOWER, Role.CANDIDATE, Role.LEADER])
def test_update_term_from_message(role: Role) -> None:
    """§5.1: "if one server's current term is smaller than the other's, then it updates
    its current term to the larger value.  If a candidate or leader discovers that its
    term is out of date, it immediately reverts to follower state." """
    node = new_node("a")
    _put_in_role(node, role)
    node.step(Message(A, src="b", dst="a", term=5))
    assert node.term == 5
    assert node.role is Role.FOLLOWER
    assert node.raw.soft_state().leader_id == "b"
    # The new term is durable (Figure 2: "updated on stable storage before responding").
    assert node.storage.initial_state().term == 5


@pytest.mark.parametrize("kind", [AR, VR, MessageType.HEARTBEAT_RESPONSE])
def test_leader_reverts_to_follower_on_higher_term_response(kind: MessageType) -> None:
    """§5.1: "Current terms are exchanged whenever servers communicate ... If a
    candidate or leader discovers that its term is out of date, it immediately reverts
    to follower state." — responses carry terms too."""
    node = new_node("a")
    node.elect()
    node.step(Message(kind, src="c", dst="a", term=7, reject=True))
    assert (node.role, node.term) == (Role.FOLLOWER, 7)
    assert node.raw.soft_state().leader_id == NO_NODE
    assert node.raw.hard_state().vote == NO_NODE


@pytest.mark.parametrize("kind", [A, HB])
def test_reject_stale_term_append(kind: MessageType) -> None:
    """§5.1: "If a server receives a request with a stale term number, it rejects the
    request." — and answers with its own term so the stale sender learns it."""
    node = new_node("a", terms=[1], term=3)
    out = node.step(
        Message(kind, src="b", dst="a", term=2, index=1, log_term=1, entries=(Entry(2, 2),))
    )
    assert node.log_terms() == [1]
    assert node.term == 3
    assert node.raw.soft_state().leader_id == NO_NODE
    assert [(m.type, m.dst, m.term) for m in out] == [(AR, "b", 3)]


def test_reject_stale_term_vote() -> None:
    """§5.1: "If a server receives a request with a stale term number, it rejects the
    request." (Figure 2, RequestVote: "Reply false if term < currentTerm".)"""
    node = new_node("a", term=3)
    out = node.step(Message(V, src="b", dst="a", term=2))
    assert node.raw.hard_state() == HardState(term=3, vote=NO_NODE, commit=0)
    granted = [m for m in out if m.type is VR and not m.reject]
    assert granted == []
    assert all(m.term == 3 for m in out)


def test_deposed_leader_steps_down_when_answered_with_newer_term() -> None:
    """§5.1: "If a candidate or leader discovers that its term is out of date, it
    immediately reverts to follower state." — a leader cut off while the others elected
    a new one learns the new term from the answer to its next heartbeat."""
    net = Network.create()
    net.campaign("a")
    net.isolate("a")
    net.campaign("b")
    assert (net["b"].role, net["b"].term) == (Role.LEADER, 2)
    assert net["a"].role is Role.LEADER  # still believes it leads term 1
    net.heal()
    net.tick("a")  # heartbeat at term 1
    assert (net["a"].role, net["a"].term) == (Role.FOLLOWER, 2)
    assert net.leaders() == ["b"]


# --- §5.2: heartbeats and the election timeout ------------------------------------------


def test_leader_broadcasts_heartbeats() -> None:
    """§5.2: "Leaders send periodic heartbeats (AppendEntries RPCs that carry no log
    entries) to all followers in order to maintain their authority." """
    node = new_node("a", heartbeat_tick=2)
    node.elect_and_commit_noop()
    assert node.tick() == []  # heartbeat_tick is 2
    out = node.tick()
    assert sorted((m.type, m.dst, m.term, m.entries) for m in out) == [
        (HB, "b", 1, ()),
        (HB, "c", 1, ()),
    ]
    # Heartbeats go in Ready.messages: they need not wait for local persistence.
    assert {m.type for m in node.readies[-1].messages} == {HB}


@pytest.mark.parametrize("role", [Role.FOLLOWER, Role.CANDIDATE])
def test_nonleader_starts_election_on_timeout(role: Role) -> None:
    """§5.2: "If a follower receives no communication over a period of time called the
    election timeout, then it assumes there is no viable leader and begins an election
    ... a follower increments its current term and transitions to candidate state.  It
    then votes for itself and issues RequestVote RPCs in parallel to each of the other
    servers."  And: "each candidate will time out and start a new election by
    incrementing its term and initiating another round of RequestVote RPCs." """
    if role is Role.FOLLOWER:
        node = _follower_of("b", 1)
        node.step(Message(A, src="b", dst="a", term=1, entries=(Entry(1, 1),)))
        want_index, want_log_term = 1, 1
    else:
        node = new_node("a")
        node.campaign()
        want_index, want_log_term = 0, 0
    assert node.term == 1
    out = node.tick(2 * ET - 1)  # the timeout is < 2 * election_tick
    assert (node.role, node.term) == (Role.CANDIDATE, 2)
    assert node.raw.hard_state().vote == "a"
    votes = sorted((m.dst, m.term, m.index, m.log_term) for m in out if m.type is V)
    assert votes == [("b", 2, want_index, want_log_term), ("c", 2, want_index, want_log_term)]


def test_vote_request_is_sent_only_after_term_and_vote_are_durable() -> None:
    """§5.2 / Figure 2: currentTerm and votedFor are "Persistent state on all servers
    (Updated on stable storage before responding to RPCs)" — a candidate's self-vote
    is in the same Ready as its RequestVotes, which wait for persistence."""
    node = new_node("a", terms=[1, 1], term=1)
    node.raw.campaign()
    rd = node.raw.ready()
    assert rd.hard_state == HardState(term=2, vote="a", commit=0)
    assert rd.must_sync
    assert rd.messages == ()
    assert sorted((m.type, m.dst) for m in rd.persisted_messages) == [(V, "b"), (V, "c")]


def test_follower_remains_follower_while_hearing_from_leader() -> None:
    """§5.2: "A server remains in follower state as long as it receives valid RPCs
    from a leader or candidate." """
    node = _follower_of("b", 1)
    for _ in range(5 * ET):
        node.tick()
        node.step(Message(HB, src="b", dst="a", term=1))
    assert (node.role, node.term) == (Role.FOLLOWER, 1)
    assert node.raw.soft_state().leader_id == "b"


def test_granting_a_vote_resets_the_election_timer() -> None:
    """Figure 2, Followers: "If election timeout elapses without receiving
    AppendEntries RPC from current leader or granting vote to candidate: convert to
    candidate." """
    node = new_node("a")
    node.tick(ET - 1)
    assert node.raft.election_elapsed == ET - 1
    out = node.step(Message(V, src="b", dst="a", term=1))
    assert [(m.type, m.reject) for m in out] == [(VR, False)]
    assert node.raft.election_elapsed == 0


@pytest.mark.parametrize("role", [Role.FOLLOWER, Role.CANDIDATE])
def test_election_timeout_is_randomized(role: Role) -> None:
    """§5.2: "Raft uses randomized election timeouts ... election timeouts are chosen
    randomly from a fixed interval" — here [election_tick, 2 * election_tick)."""
    node = new_node("a")
    seen: set[int] = set()
    for _ in range(300):
        if role is Role.FOLLOWER:
            node.raft.become_follower(node.raft.term + 1, "b")
        else:
            node.raft.become_follower(node.raft.term, NO_NODE)
            node.raft.become_candidate()
        node.drain()
        start_term = node.raft.term
        ticks = 0
        while node.raft.term == start_term:
            node.tick()
            ticks += 1
            assert ticks < 2 * ET, "no election within 2 * election_tick"
        seen.add(ticks)
    assert seen == set(range(ET, 2 * ET))


def test_election_timeouts_rarely_coincide() -> None:
    """§5.2: "election timeouts are chosen randomly ... This spreads out the servers
    so that in most cases only a single server will time out." """
    nodes = [new_node(i, IDS5) for i in IDS5]
    rounds, conflicts = 300, 0
    for _ in range(rounds):
        for n in nodes:
            n.raft.become_follower(n.raft.term + 1, NO_NODE)
        timed_out = 0
        while timed_out == 0:
            for n in nodes:
                before = n.raft.term
                n.raft.tick()
                if n.raft.term != before:
                    timed_out += 1
        conflicts += timed_out > 1
        for n in nodes:
            n.drain()
    assert conflicts / rounds <= 0.3


# --- §5.2: votes -------------------------------------------------------------------------

_ONE_ROUND_CASES = [
    # "A candidate wins an election if it receives votes from a majority"
    (1, {}, Role.LEADER),
    (3, {"b": True, "c": True}, Role.LEADER),
    (3, {"b": True}, Role.LEADER),
    (5, {"b": True, "c": True, "d": True, "e": True}, Role.LEADER),
    (5, {"b": True, "c": True}, Role.LEADER),
    # a majority refused: it cannot win this term
    (3, {"b": False, "c": False}, Role.FOLLOWER),
    (5, {"b": True, "c": False, "d": False, "e": False}, Role.FOLLOWER),
    # "(c) a period of time goes by with no winner": still a candidate
    (3, {}, Role.CANDIDATE),
    (3, {"b": False}, Role.CANDIDATE),
    (5, {"b": True}, Role.CANDIDATE),
    (5, {"b": False, "c": False}, Role.CANDIDATE),
]


@pytest.mark.parametrize(("size", "votes", "want"), _ONE_ROUND_CASES)
def test_election_in_one_round(size: int, votes: dict[str, bool], want: Role) -> None:
    """§5.2: "A candidate wins an election if it receives votes from a majority of the
    servers in the full cluster for the same term." ... "a candidate continues in this
    state until ... (a) it wins the election, (b) another server establishes itself as
    leader, or (c) a period of time goes by with no winner." """
    node = new_node("a", IDS5[:size])
    node.campaign()
    for voter, granted in votes.items():
        node.step(Message(VR, src=voter, dst="a", term=1, reject=not granted))
    assert node.role is want
    assert node.term == 1


def test_vote_from_same_voter_counts_once() -> None:
    """§5.2: "A candidate wins an election if it receives votes from a majority of the
    servers" — servers, not messages: a duplicated grant is one vote."""
    node = new_node("a", IDS5)
    node.campaign()
    for _ in range(3):
        node.step(Message(VR, src="b", dst="a", term=1))
    assert node.role is Role.CANDIDATE
    node.step(Message(VR, src="c", dst="a", term=1))
    assert node.raw.soft_state().role is Role.LEADER


def test_stale_vote_responses_are_not_counted() -> None:
    """§5.1: "If a server receives a request with a stale term number, it rejects the
    request." — grants for an earlier term do not elect a candidate of a later one."""
    node = new_node("a", term=1)
    node.campaign()
    assert node.term == 2
    node.step(Message(VR, src="b", dst="a", term=1))
    node.step(Message(VR, src="c", dst="a", term=1))
    assert (node.role, node.term) == (Role.CANDIDATE, 2)


_FOLLOWER_VOTE_CASES = [
    (NO_NODE, "b", False),
    (NO_NODE, "c", False),
    ("b", "b", False),
    ("c", "c", False),
    ("b", "c", True),
    ("c", "b", True),
]


@pytest.mark.parametrize(("voted", "candidate", "reject"), _FOLLOWER_VOTE_CASES)
def test_follower_votes_at_most_once_per_term(voted: str, candidate: str, reject: bool) -> None:
    """§5.2: "Each server will vote for at most one candidate in a given term, on a
    first-come-first-served basis." """
    node = new_node("a", term=1, vote=voted)
    out = node.step(Message(V, src=candidate, dst="a", term=1))
    assert [(m.type, m.dst, m.term, m.reject) for m in out] == [(VR, candidate, 1, reject)]
    assert node.raw.hard_state().vote == (voted or candidate)


def test_first_come_first_served_within_a_term() -> None:
    """§5.2: "Each server will vote for at most one candidate in a given term, on a
    first-come-first-served basis." — and the vote is durable before it is sent."""
    node = new_node("a")
    first = node.step(Message(V, src="b", dst="a", term=1))
    second = node.step(Message(V, src="c", dst="a", term=1))
    assert [(m.dst, m.reject) for m in first] == [("b", False)]
    assert [(m.dst, m.reject) for m in second] == [("c", True)]
    assert node.storage.initial_state().vote == "b"
    grant_ready = next(rd for rd in node.readies if rd.persisted_messages)
    assert grant_ready.hard_state == HardState(term=1, vote="b", commit=0)
    assert grant_ready.must_sync
    assert grant_ready.messages == ()


@pytest.mark.parametrize("term", [1, 2])
def test_candidate_falls_back_to_follower_on_legitimate_leader(term: int) -> None:
    """§5.2: "If the leader's term (included in its RPC) is at least as large as the
    candidate's current term, then the candidate recognizes the leader as legitimate
    and returns to follower state." """
    node = new_node("a")
    node.campaign()
    assert (node.role, node.term) == (Role.CANDIDATE, 1)
    node.step(Message(A, src="b", dst="a", term=term))
    assert (node.role, node.term) == (Role.FOLLOWER, term)
    assert node.raw.soft_state().leader_id == "b"


def test_candidate_rejects_append_from_older_term() -> None:
    """§5.2: "If the term in the RPC is smaller than the candidate's current term, then
    the candidate rejects the RPC and continues in candidate state." """
    node = new_node("a", term=2)
    node.campaign()
    out = node.step(Message(A, src="b", dst="a", term=2, entries=(Entry(2, 1),)))
    assert (node.role, node.term) == (Role.CANDIDATE, 3)
    assert node.log_terms() == []
    assert [(m.type, m.dst, m.term) for m in out] == [(AR, "b", 3)]


def test_single_server_elects_itself() -> None:
    """§5.2: "A candidate wins an election if it receives votes from a majority" — of a
    one-server cluster, its own vote."""
    node = new_node("a", ("a",))
    node.tick(2 * ET)
    assert (node.role, node.term) == (Role.LEADER, 1)


def test_cluster_elects_one_leader_known_to_all() -> None:
    """§5.2: "Once a candidate wins an election, it becomes leader.  It then sends
    heartbeat messages to all of the other servers to establish its authority and
    prevent new elections." """
    net = Network.create()
    net.tick("a", 2 * ET)
    assert net.leaders() == ["a"]
    for n in net.nodes.values():
        assert n.raw.soft_state().leader_id == "a"
        assert n.term == 1


def test_simultaneous_candidates_at_most_one_leader_per_term() -> None:
    """§5.2 / Figure 3, Election Safety: "at most one leader can be elected in a given
    term."  Two candidates of term 1 split the third server's vote first-come-first-served."""
    net = Network.create()
    net.send(net["a"].campaign())
    net.send(net["b"].campaign())
    net.run()
    assert net.leaders() == ["a"]
    assert (net["b"].role, net["b"].term) == (Role.FOLLOWER, 1)
    assert net["c"].raw.hard_state().vote == "a"


def test_split_vote_is_resolved_by_a_later_timeout() -> None:
    """§5.2: "When this happens, each candidate will time out and start a new election
    by incrementing its term ... Raft uses randomized election timeouts to ensure that
    split votes are rare and that they are resolved quickly." """
    net = Network.create(IDS5[:4], {})
    # a and b split the four votes 2-2 in term 1.
    net.partition(["a", "c"], ["b", "d"])
    net.campaign("a")
    net.campaign("b")
    assert net.leaders() == []
    net.heal()
    net.tick_all(4 * ET)
    assert len(net.leaders()) == 1
    assert net.leader().term >= 2


def test_candidate_ids_in_default_cluster() -> None:
    """§5.2: "issues RequestVote RPCs in parallel to each of the other servers in the
    cluster" — every other voter, never itself."""
    node = new_node("b", IDS3)
    out = node.campaign()
    assert sorted(m.dst for m in out if m.type is V) == ["a", "c"]
