"""ReadIndex (thesis §6.4): a leader serves a read at the commit index it held when the read
arrived, only once a quorum has confirmed -- by answering a heartbeat sent after the read --
that no other leader has taken over; a leader cut off from the quorum never answers, and a
leader that loses its leadership fails its waiting reads."""

from __future__ import annotations

import pytest

from raftlet.consensus.core import MessageType, NotLeaderError, ProposalDropped, ReadState, Role
from tests.unit.raft_harness import Network


def _read_states(net: Network, node_id: str) -> list[ReadState]:
    return [s for rd in net[node_id].readies for s in rd.read_states]


def _read(net: Network, node_id: str, token: int) -> None:
    node = net[node_id]
    node.raw.read_index(token)
    net.send(node.drain())
    net.run()


def test_a_read_is_confirmed_by_a_quorum_at_the_commit_index_it_arrived_at() -> None:
    net = Network.create(check_quorum=True, pre_vote=True)
    net.campaign("a")
    net.propose("a", b"x")
    net.run()
    commit = net["a"].raft.log.committed
    _read(net, "a", 7)
    assert _read_states(net, "a") == [ReadState(7, commit)]


def test_a_leader_cut_off_from_the_quorum_answers_no_read() -> None:
    """The stale-read case: b and c elect b and commit a write; a, isolated, still thinks it
    leads -- its read is never confirmed, and fails when it learns of the new term."""
    net = Network.create()
    net.campaign("a")
    net.isolate("a")
    _read(net, "a", 1)
    net.tick("a", 2)  # heartbeats go nowhere
    assert _read_states(net, "a") == []
    net.campaign("b")
    net.propose("b", b"newer")
    net.run()
    assert net["a"].role is Role.LEADER  # it has not noticed yet
    net.heal()
    net.tick("a", 3)  # its next heartbeat meets the new term
    assert net["a"].role is Role.FOLLOWER
    assert _read_states(net, "a") == [ReadState(1, 0, ok=False)]


def test_reads_are_released_in_order_and_one_answer_confirms_every_earlier_round() -> None:
    net = Network.create()
    net.campaign("a")
    net.isolate("a")
    net["a"].raw.read_index(1)
    net["a"].raw.read_index(2)
    net["a"].drain()  # both rounds' heartbeats are lost
    net.heal()
    net.tick("a", 3)  # the next heartbeat carries round 2 and confirms both
    net.run()
    assert [s.token for s in _read_states(net, "a")] == [1, 2]
    assert all(s.ok for s in _read_states(net, "a"))


def test_a_single_voter_reads_at_once() -> None:
    net = Network.create(ids=["a"])
    net.campaign("a")
    net.run()
    _read(net, "a", 3)
    assert _read_states(net, "a") == [ReadState(3, net["a"].raft.log.committed)]


def test_reads_are_refused_off_leader_and_before_the_leader_commits_in_its_term() -> None:
    net = Network.create()
    with pytest.raises(NotLeaderError):
        net["a"].raw.read_index(1)
    # Votes arrive but the new leader's NO_OP does not: its commit index is not current.
    net.transform = lambda m: None if m.type is MessageType.APPEND else m
    net.campaign("a")
    assert net["a"].role is Role.LEADER
    with pytest.raises(ProposalDropped):
        net["a"].raw.read_index(2)


def test_an_answer_to_a_heartbeat_sent_before_the_read_does_not_confirm_it() -> None:
    net = Network.create()
    net.campaign("a")
    _read(net, "a", 1)  # round 1, confirmed
    early = net["a"].tick(3)  # heartbeats of round 1, held back
    assert early
    net["a"].raw.read_index(2)  # round 2 ...
    net["a"].drain()  # ... whose own heartbeats are lost
    net.send(early)
    net.run()
    assert [s.token for s in _read_states(net, "a")] == [1]  # round-1 answers: not enough
    net.tick("a", 3)  # a heartbeat of round 2
    net.run()
    assert [s.token for s in _read_states(net, "a")] == [1, 2]
