"""consensus.core: what the core refuses to trust from a peer (issue #15, item 3).

A buggy or compromised member must not wedge a tablet.  Every input refused here is
dropped with no state change: no message, no hard state (term, vote, commit), no log entry,
no role change -- which each test asserts through ``_unchanged``.  The rules are in the
``consensus.core.raft`` module docstring; the wire codec refuses most of the out-of-range
values before they reach the core (tests/unit/test_consensus_rpc_codec.py), and the
handler-level fuzz is tests/unit/test_consensus_handler_fuzz.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest

from raftlet.consensus.core import (
    NO_NODE,
    Message,
    MessageType,
    Role,
)
from raftlet.consensus.core.types import MAX_INDEX, MAX_TERM, MAX_TERM_LEAP
from tests.unit.raft_harness import IDS5, Network, Node, data_entries, new_node

A = MessageType.APPEND
AR = MessageType.APPEND_RESPONSE
HB = MessageType.HEARTBEAT
HBR = MessageType.HEARTBEAT_RESPONSE
V = MessageType.VOTE
VR = MessageType.VOTE_RESPONSE
PV = MessageType.PRE_VOTE
TN = MessageType.TIMEOUT_NOW
ET = 10


@contextmanager
def _unchanged(node: Node) -> Iterator[None]:
    """The block leaves ``node`` as it was: nothing to persist, send or publish."""
    hard, soft = node.raw.hard_state(), node.raw.soft_state()
    log = node.raft.log.all_entries()
    durable = (node.storage.initial_state(), node.storage.all_entries())
    yield
    assert not node.raw.has_ready(), "a refused input produced output"
    assert node.raw.hard_state() == hard
    assert node.raw.soft_state() == soft
    assert node.raft.log.all_entries() == log
    assert (node.storage.initial_state(), node.storage.all_entries()) == durable


def _led(check_quorum: bool = True) -> Network:
    """a leads term 1 of (a, b, c), its NO_OP committed everywhere; b and c hold its lease."""
    net = Network.create(check_quorum=check_quorum, pre_vote=True)
    net.campaign("a")
    net.tick("a")
    assert net.leaders() == ["a"]
    assert net["b"].raw.soft_state().leader_id == "a"
    return net


def _every_request(src: str, dst: str, term: int, **fields: int) -> list[Message]:
    return [
        Message(HB, src, dst, term, **fields),
        Message(A, src, dst, term, **fields),
        Message(V, src, dst, term, **fields),
        Message(V, src, dst, term, transfer=True, **fields),
        Message(PV, src, dst, term, **fields),
        Message(TN, src, dst, term, **fields),
    ]


# --- terms and indexes out of range ---------------------------------------------------------


@pytest.mark.parametrize(
    "term", [MAX_TERM + 1, (1 << 64) - 1, 1 << 80, -1, 1 + MAX_TERM_LEAP + 1], ids=str
)
@pytest.mark.parametrize("lease", [True, False], ids=["in-lease", "no-leader"])
def test_a_term_beyond_int63_or_leaping_too_far_is_dropped(term: int, lease: bool) -> None:
    """The report: one heartbeat of term 2**64 - 1 left every replica a pre-candidate at a
    term it could not campaign past.  Now no request of such a term changes anything --
    in a lease or out of one (a fresh follower that knows no leader)."""
    node = _led()["b"] if lease else new_node("b", check_quorum=True, pre_vote=True)
    for m in _every_request("c", "b", term):
        with _unchanged(node):
            assert node.step(m) == []


@pytest.mark.parametrize("field", ["index", "commit", "log_term", "reject_hint", "context"])
def test_an_index_beyond_int63_is_dropped(field: str) -> None:
    node = _led()["b"]
    for value in (MAX_INDEX + 1, -1):
        for m in _every_request("a", "b", 1):
            with _unchanged(node):
                assert node.step(replace(m, **{field: value})) == []


def test_a_term_leap_within_bounds_is_adopted() -> None:
    """The leap bound is far from anything honest: a fresh node follows a leader 2**32
    terms ahead (the bound itself)."""
    node = new_node("b", check_quorum=True, pre_vote=True)
    out = node.step(Message(A, "a", "b", MAX_TERM_LEAP))
    assert node.term == MAX_TERM_LEAP
    assert [(m.type, m.reject) for m in out] == [(AR, False)]


def test_a_replica_at_a_huge_term_still_elects_and_commits() -> None:
    """A tablet that somehow got near the top of the term space (every replica at
    MAX_TERM - 3) can still campaign -- the pre-vote's term + 1 and the vote's term fit --
    elect, commit, and hand leadership over."""
    top = MAX_TERM - 3
    net = Network.create(terms=dict.fromkeys("abc", top), check_quorum=True, pre_vote=True)
    net.campaign("a")
    assert (net.leaders(), net["a"].term) == (["a"], top + 1)
    net.propose("a", b"x")
    net.tick("a")
    assert all(data_entries(n.applied) == [b"x"] for n in net.nodes.values())
    net["a"].raw.transfer_leadership("b")
    net.deliver(net["a"].drain())
    assert (net.leaders(), net["b"].term) == (["b"], top + 2)


def test_a_node_at_the_maximum_term_does_not_campaign_or_crash() -> None:
    """No campaign can ask for MAX_TERM + 1: a node there stays a follower instead of
    sending a term the wire cannot carry (the old symptom: "does not fit a uint64" at every
    election timeout, forever)."""
    node = new_node("b", term=MAX_TERM, check_quorum=True, pre_vote=True)
    with _unchanged(node):
        assert node.tick(3 * ET) == []
        node.raw.campaign()
        assert node.drain() == []
    assert node.role is Role.FOLLOWER


# --- TimeoutNow ---------------------------------------------------------------------------


def test_timeout_now_from_a_follower_is_ignored() -> None:
    """Only the leader we follow may hand us its leadership: c is a follower of a in term
    1, so its TimeoutNow changes nothing (it moved leadership every time before)."""
    b = _led()["b"]
    with _unchanged(b):
        assert b.step(Message(TN, "c", "b", 1)) == []


@pytest.mark.parametrize("src", ["a", "c"])
def test_timeout_now_from_a_later_term_is_ignored_without_adopting_the_term(src: str) -> None:
    """A leader asks only a follower that acknowledged its log in its term; a TimeoutNow of
    a term we never reached is nobody's, and must not even raise our term."""
    for b in (_led()["b"], new_node("b", check_quorum=True, pre_vote=True)):
        with _unchanged(b):
            assert b.step(Message(TN, src, "b", b.term + 1)) == []


def test_timeout_now_from_a_stale_leader_is_ignored() -> None:
    net = _led()
    b = net["b"]
    b.tick(ET)  # a's lease ends; c leads term 3 now
    b.step(Message(A, "c", "b", 3, index=1, log_term=1, commit=1))
    assert (b.term, b.raw.soft_state().leader_id) == (3, "c")
    with _unchanged(b):
        assert b.step(Message(TN, "a", "b", 1)) == []
        assert b.step(Message(TN, "a", "b", 3)) == []


def test_timeout_now_from_the_leader_in_its_term_starts_an_election() -> None:
    b = _led()["b"]
    out = b.step(Message(TN, "a", "b", 1))
    assert (b.role, b.term) == (Role.CANDIDATE, 2)
    assert {(m.type, m.dst, m.transfer) for m in out} == {(V, "a", True), (V, "c", True)}


# --- transfer votes -----------------------------------------------------------------------


def test_a_transfer_vote_without_the_leaders_announcement_is_an_ordinary_vote() -> None:
    """The report: a forged RequestVote with the transfer flag made a follower persist a
    vote for a server that never asked.  The flag alone vouches for nothing: within the
    lease the vote is ignored like any other, and the hard state stays as it was."""
    b = _led()["b"]
    with _unchanged(b):
        assert b.step(Message(V, "c", "b", 2, index=1, log_term=1, transfer=True)) == []


def test_a_transfer_vote_counts_only_for_the_announced_transferee_one_term_up() -> None:
    b = _led()["b"]
    b.step(Message(HB, "a", "b", 1, commit=1, transferee="c"))
    assert b.raft.lead_transferee == "c"
    with _unchanged(b):
        # Not the announced target; the announced target without the flag (a pre-vote, an
        # ordinary vote); or two terms up (the leader's transfer was of term 1).
        b.step(Message(V, "a", "b", 2, index=1, log_term=1, transfer=True))
        b.step(Message(V, "c", "b", 2, index=1, log_term=1))
        b.step(Message(PV, "c", "b", 2, index=1, log_term=1))
        assert b.step(Message(V, "c", "b", 3, index=1, log_term=1, transfer=True)) == []
    out = b.step(Message(V, "c", "b", 2, index=1, log_term=1, transfer=True))
    assert [(m.type, m.dst, m.reject) for m in out] == [(VR, "c", False)]
    assert b.raw.hard_state().vote == "c"


def test_the_announcement_ends_with_the_leaders_next_message() -> None:
    b = _led()["b"]
    b.step(Message(HB, "a", "b", 1, commit=1, transferee="c"))
    b.step(Message(HB, "a", "b", 1, commit=1))  # the transfer was abandoned
    with _unchanged(b):
        assert b.step(Message(V, "c", "b", 2, index=1, log_term=1, transfer=True)) == []


def test_out_of_lease_a_transfer_vote_is_an_ordinary_vote() -> None:
    node = new_node("b", check_quorum=True, pre_vote=True)
    out = node.step(Message(V, "c", "b", 1, transfer=True))
    assert [(m.type, m.reject) for m in out] == [(VR, False)]


def test_transfer_completes_in_five_nodes_when_one_follower_missed_the_announcement() -> None:
    """The announcement is what lets followers vote under their lease; one that missed it
    holds to its lease until it expires (the old leader stopped heartbeating), then
    follows the new leader."""
    net = Network.create(IDS5, check_quorum=True, pre_vote=True)
    net.campaign("a")
    net.tick("a")
    net.drop("a", "e")
    net["a"].raw.transfer_leadership("b")
    net.deliver(net["a"].drain())
    assert net.leaders() == ["b"]
    assert net["e"].raw.soft_state().leader_id == "a"
    net.heal()
    net.tick_all(2 * ET)
    assert net.leaders() == ["b"]
    assert all(n.raw.soft_state().leader_id == "b" for n in net.nodes.values())
    net.propose("b", b"y")
    net.tick("b")
    assert all(data_entries(n.applied) == [b"y"] for n in net.nodes.values())


# --- would-be leaders ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", [HB, A])
def test_a_higher_term_leader_message_is_ignored_under_the_lease(kind: MessageType) -> None:
    """The report: forged higher-term heartbeats every 0.5 s cut writes twentyfold, each
    one deposing the leader.  A follower that heard from its leader within the election
    timeout no more follows a new leader it has no evidence of than it votes for one: no
    such leader can exist unless a majority lost the current one."""
    net = _led()
    for node in (net["b"], net["c"], net["a"]):
        src = "c" if node.id != "c" else "b"
        with _unchanged(node):
            assert node.step(Message(kind, src, node.id, 2)) == []
            assert node.step(Message(kind, "a" if node.id != "a" else src, node.id, 5)) == []
    assert net.leaders() == ["a"]


def test_the_announced_transferee_is_followed_at_once() -> None:
    b = _led()["b"]
    b.step(Message(HB, "a", "b", 1, commit=1, transferee="c"))
    out = b.step(Message(A, "c", "b", 2, index=1, log_term=1, commit=1))
    assert (b.term, b.raw.soft_state().leader_id) == (2, "c")
    assert [(m.type, m.reject) for m in out] == [(AR, False)]


def test_the_lease_expires_and_a_real_new_leader_is_followed() -> None:
    b = _led()["b"]
    b.tick(ET)
    b.step(Message(HB, "c", "b", 2))
    assert (b.term, b.raw.soft_state().leader_id) == (2, "c")


def test_a_term_raising_heartbeat_that_commits_is_dropped() -> None:
    """A new leader knows no follower's match before that follower answered it in the new
    term, so its heartbeats commit nothing until then; one that does would commit an
    uncommitted tail the real leader may still overwrite."""
    node = new_node("b", terms=[1, 1, 2], term=2, commit=1, check_quorum=True, pre_vote=True)
    with _unchanged(node):
        assert node.step(Message(HB, "c", "b", 3, commit=3)) == []
    node.step(Message(HB, "c", "b", 3))
    assert (node.term, node.raw.hard_state().commit) == (3, 1)


def test_a_second_leader_in_a_known_leaders_term_is_ignored() -> None:
    """One leader per term: once b follows a in term 1, a heartbeat "from c" in term 1 does
    not make c its leader (which would then let c's TimeoutNow through)."""
    net = _led()
    b = net["b"]
    with _unchanged(b):
        assert b.step(Message(HB, "c", "b", 1, commit=1)) == []
        assert b.step(Message(A, "c", "b", 1, index=1, log_term=1, commit=1)) == []
        assert b.step(Message(TN, "c", "b", 1)) == []
    a = net["a"]
    with _unchanged(a):
        assert a.step(Message(HB, "c", "a", 1)) == []


def test_a_candidate_follows_the_leader_of_its_term() -> None:
    node = new_node("b", terms=[1], term=1, check_quorum=True, pre_vote=False)
    node.campaign()
    assert (node.role, node.term, node.raw.soft_state().leader_id) == (Role.CANDIDATE, 2, NO_NODE)
    node.step(Message(HB, "c", "b", 2))
    assert (node.role, node.raw.soft_state().leader_id) == (Role.FOLLOWER, "c")


def test_without_check_quorum_there_is_no_lease_to_keep() -> None:
    """The lease rules belong to check-quorum (without it a leader never steps down on its
    own, so a follower must follow any later term); the range and TimeoutNow rules hold."""
    net = _led(check_quorum=False)
    b = net["b"]
    b.step(Message(HB, "c", "b", 2))
    assert (b.term, b.raw.soft_state().leader_id) == (2, "c")
    with _unchanged(b):
        b.step(Message(TN, "a", "b", 2))
        b.step(Message(HB, "c", "b", MAX_TERM + 1))
