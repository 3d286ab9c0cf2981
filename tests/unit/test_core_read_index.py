"""ReadIndex (thesis §6.4): a leader serves a read at the commit index it held when the read
arrived, only once a quorum has confirmed -- by answering a heartbeat sent after the read --
that no other leader has taken over; a leader cut off from the quorum never answers, and a
leader that loses its leadership fails its waiting reads."""

from __future__ import annotations

import pytest

from raftlet.consensus.core import (
    Message,
    MessageType,
    NotLeaderError,
    ProposalDropped,
    ReadState,
    Role,
)
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


# --- batching: at most one read round in flight ------------------------------------------


def _heartbeats(msgs: list[Message]) -> list[Message]:
    return [m for m in msgs if m.type is MessageType.HEARTBEAT]


def _leader_with_commit(**overrides: bool) -> Network:
    net = Network.create(**(overrides or {"check_quorum": True, "pre_vote": True}))
    net.campaign("a")
    net.propose("a", b"x")
    net.run()
    return net


def test_reads_during_an_outstanding_round_cost_exactly_one_more_broadcast() -> None:
    net = _leader_with_commit()
    a = net["a"]
    a.raw.read_index(1)
    first = _heartbeats(a.drain())
    assert len(first) == 2  # round 1 to b and c, held back (outstanding)
    round1 = first[0].context
    for token in range(2, 52):  # 50 reads arrive while round 1 is outstanding
        a.raw.read_index(token)
    assert _heartbeats(a.drain()) == []  # no broadcast of their own
    net.deliver(first)  # round 1 confirmed: read 1 released, the next round leaves once
    assert [s.token for s in _read_states(net, "a")] == list(range(1, 52))
    second = [m for m in net.delivered if m.type is MessageType.HEARTBEAT and m not in first]
    assert len(second) == 2
    assert {m.context for m in second} == {round1 + 1}


def test_each_batched_read_is_released_at_the_commit_index_it_arrived_at() -> None:
    net = _leader_with_commit()
    a = net["a"]
    at_first = a.raft.log.committed
    a.raw.read_index(1)
    held = a.drain()  # round 1 outstanding
    # A write commits (its appends travel; the held heartbeats do not), then a read arrives.
    net.propose("a", b"y")
    at_second = a.raft.log.committed
    assert at_second > at_first
    a.raw.read_index(2)
    assert _heartbeats(a.drain()) == []
    net.deliver(held)
    assert _read_states(net, "a") == [ReadState(1, at_first), ReadState(2, at_second)]


def test_a_batched_read_is_never_confirmed_by_a_round_sent_before_it_arrived() -> None:
    net = _leader_with_commit()
    a = net["a"]
    a.raw.read_index(1)
    held = a.drain()  # round 1's heartbeats, sent before read 2 arrives
    a.raw.read_index(2)
    a.drain()
    net.transform = lambda m: None if m.type is MessageType.HEARTBEAT and m.context > 1 else m
    net.deliver(held)  # both followers answer round 1: only read 1 goes
    assert [s.token for s in _read_states(net, "a")] == [1]
    net.tick("a", 5)  # every later heartbeat (round 2) is lost: read 2 waits
    assert [s.token for s in _read_states(net, "a")] == [1]
    net.transform = None
    net.tick("a", 1)
    assert [s.token for s in _read_states(net, "a")] == [1, 2]


def test_a_lost_round_does_not_stall_reads_the_next_heartbeat_starts_the_waiting_round() -> None:
    net = _leader_with_commit()
    a = net["a"]
    a.raw.read_index(1)
    a.drain()  # round 1 lost
    a.raw.read_index(2)  # waits for round 2
    a.drain()
    rounds_before = a.raft.read_round
    net.tick("a", 1)  # heartbeat tick: round 2 goes out now, and its answers confirm both
    assert a.raft.read_round == rounds_before + 1
    assert [s.token for s in _read_states(net, "a")] == [1, 2]


def test_losing_leadership_fails_every_pending_read_of_every_round() -> None:
    net = _leader_with_commit(check_quorum=False)
    a = net["a"]
    a.raw.read_index(1)
    a.drain()  # round 1 outstanding, never answered
    for token in (2, 3):
        a.raw.read_index(token)  # next round
    a.drain()
    net.isolate("a")
    net.campaign("b")
    net.propose("b", b"newer")
    net.heal()
    net.tick("a", 1)  # its heartbeat meets the new term
    assert a.role is Role.FOLLOWER
    assert _read_states(net, "a") == [ReadState(t, 0, ok=False) for t in (1, 2, 3)]


def test_heartbeat_rounds_confirm_rounds_without_reads() -> None:
    net = Network.create(check_quorum=True, pre_vote=True, heartbeat_read_rounds=True)
    net.campaign("a")
    a = net["a"]
    before = a.raft.read_round_confirmed
    net.tick("a", 1)
    assert a.raft.read_round_confirmed == a.raft.read_round > before
    confirmed = [rd.read_round_confirmed for rd in a.readies]
    assert confirmed[-1] == a.raft.read_round  # the driver sees it in a ready


def test_a_leader_waking_from_a_long_stall_rechecks_its_quorum_on_fresh_answers() -> None:
    """Stalled an election timeout: answers from before the stall no longer count; a leader
    cut off now steps down two heartbeats later instead of up to two timeouts later."""
    net = _leader_with_commit()
    a = net["a"]
    net.tick("a", 3)  # followers answered: marked active
    net.isolate("a")
    a.raw.on_stall(a.config.election_tick)
    net.send(a.drain())
    net.run()
    net.tick("a", 2 * a.config.heartbeat_tick)
    assert a.role is Role.FOLLOWER


def test_a_leader_that_hears_its_quorum_after_a_stall_keeps_leading() -> None:
    net = _leader_with_commit()
    a = net["a"]
    a.raw.on_stall(10 * a.config.election_tick)
    net.send(a.drain())  # the heartbeat it sends on waking is answered
    net.run()
    net.tick("a", 3 * a.config.election_tick)
    assert a.role is Role.LEADER


def test_a_short_stall_changes_nothing() -> None:
    net = _leader_with_commit()
    a = net["a"]
    net.tick("a", 1)
    net.isolate("a")
    elapsed = a.raft.election_elapsed
    a.raw.on_stall(a.config.election_tick - 1)
    assert a.drain() == []
    assert a.raft.election_elapsed == elapsed
