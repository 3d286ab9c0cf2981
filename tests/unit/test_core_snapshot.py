"""Snapshots in the core (etcd's MsgSnap semantics): a leader that cannot catch a follower
up from its log -- log GC discarded what it needs -- asks its driver for a copy of the state
(a SNAPSHOT message), sends that follower nothing until the copy is reported, and resumes
from the copy's index; a follower that installed a copy ``restore``s from it.  The copy
itself is the driver's (tablet copy); here a test plays the driver."""

from __future__ import annotations

from raftlet.consensus.core import HardState, MemoryStorage, Message, MessageType, RawNode, Role
from raftlet.consensus.core.progress import ProgressState
from tests.unit.raft_harness import Network, Node


def _write(net: Network, n: int, start: int = 0, leader: str = "a") -> None:
    for i in range(start, start + n):
        net.propose(leader, f"w{i}".encode())
        net.run()


def _lagging_c(net: Network) -> None:
    """a leads; c missed 10 writes, which a then discarded (as a retention cap would)."""
    net.campaign("a")
    net.run()
    _write(net, 5)
    net.isolate("c")
    _write(net, 10, start=5)
    a = net["a"]
    a.storage.compact(a.raft.log.applied - 1)
    assert a.raft.log.first_index() > net["c"].raft.log.last_index() + 1


def _snapshots(net: Network) -> list[Message]:
    return [m for m in net.delivered if m.type is MessageType.SNAPSHOT]


def _install(net: Network, src: str, dst: str) -> int:
    """The driver's copy: ``dst`` takes ``src``'s applied state and log point."""
    s, d = net[src], net[dst]
    index = s.raft.log.applied
    term = s.raft.log.term(index)
    d.storage.apply_snapshot(index, term)
    d.applied = list(s.applied)
    assert d.raw.restore(index, term)
    net.send(d.drain())
    return index


def test_a_follower_behind_the_log_start_is_asked_for_a_copy_and_sent_nothing_else() -> None:
    net = Network.create()
    _lagging_c(net)
    net.heal()
    net.tick("a")
    net.run()
    asked = _snapshots(net)
    first = net["a"].raft.log.first_index()
    assert [(m.src, m.dst, m.index) for m in asked] == [("a", "c", first)]
    pr = net["a"].raft.prs["c"]
    assert pr.state is ProgressState.SNAPSHOT
    assert pr.pending_snapshot == first
    # While the copy is under way, heartbeats flow but no append and no second request.
    before = len(net.delivered)
    _write(net, 3, start=15)
    net.tick("a", 3)
    net.run()
    to_c = [m for m in net.delivered[before:] if m.dst == "c"]
    assert to_c
    assert all(m.type is MessageType.HEARTBEAT for m in to_c)
    assert len(_snapshots(net)) == 1


def test_a_reported_copy_resumes_replication_from_its_index() -> None:
    net = Network.create()
    _lagging_c(net)
    net.heal()
    net.tick("a")
    net.run()
    _write(net, 3, start=15)  # writes go on during the copy
    index = _install(net, "a", "c")
    net.run()
    net["a"].raw.report_snapshot("c", True, index)
    net.send(net["a"].drain())
    net.run()
    a, c = net["a"].raft, net["c"].raft
    assert a.prs["c"].state is ProgressState.REPLICATE
    assert c.log.last_index() == a.log.last_index()
    assert c.log.committed == a.log.committed
    _write(net, 2, start=18)
    assert [e.data for e in net["c"].applied] == [e.data for e in net["a"].applied]


def test_a_failed_copy_is_asked_for_again_after_the_next_heartbeat_answer() -> None:
    net = Network.create()
    _lagging_c(net)
    net.heal()
    net.tick("a")
    net.run()
    net["a"].raw.report_snapshot("c", False)
    net.send(net["a"].drain())
    net.run()
    assert len(_snapshots(net)) == 1  # paced: not at once
    net.tick("a")
    net.run()
    assert len(_snapshots(net)) == 2


def test_lost_and_duplicated_reports_are_harmless() -> None:
    net = Network.create()
    _lagging_c(net)
    net.heal()
    net.tick("a")
    net.run()
    index = _install(net, "a", "c")
    net.run()
    # The first report is lost: c's answers to heartbeats do not resume it by themselves...
    net.tick("a", 2)
    net.run()
    assert net["a"].raft.prs["c"].state is ProgressState.SNAPSHOT
    # ...until one arrives; a duplicate, or a late failure of an older attempt, changes
    # nothing afterwards.
    for ok in (True, True, False):
        net["a"].raw.report_snapshot("c", ok, index)
        net.send(net["a"].drain())
        net.run()
    assert net["a"].raft.prs["c"].state is ProgressState.REPLICATE
    assert net["c"].raft.log.committed == net["a"].raft.log.committed
    # A copy older than what was asked is not taken as done.
    net["a"].raft.prs["c"].become_snapshot(index + 100)
    net["a"].raw.report_snapshot("c", True, index)
    assert net["a"].raft.prs["c"].state is ProgressState.PROBE


def test_restore_never_takes_back_what_is_committed_and_a_leader_never_restores() -> None:
    net = Network.create()
    net.campaign("a")
    net.run()
    _write(net, 5)
    b = net["b"]
    committed = b.raft.log.committed
    assert not b.raw.restore(committed, b.raft.log.term(committed))
    assert b.raft.log.committed == committed
    a = net["a"]
    assert a.role is Role.LEADER
    assert not a.raw.restore(committed + 5, a.raft.term)


def test_snapshot_messages_are_never_stepped_by_a_core() -> None:
    net = Network.create()
    net.campaign("a")
    net.run()
    c = net["c"]
    term = c.raft.term
    c.raw.step(Message(MessageType.SNAPSHOT, "a", "c", term + 5, index=1))
    assert c.raft.term == term
    assert not c.raw.has_ready()


def test_an_idle_leader_learns_that_a_follower_lost_its_log_and_copies_it_back() -> None:
    """A follower whose replica was wiped comes back with an empty log while the leader,
    with nothing to write, believes it holds everything: its heartbeat answer says where
    its log ends, and the leader asks for a copy (its own log no longer reaches back)."""
    net = Network.create()
    net.campaign("a")
    net.run()
    _write(net, 10)
    net.tick("a")
    net.run()
    a = net["a"]
    a.storage.compact(a.raft.log.applied - 1)
    assert a.raft.prs["c"].match == a.raft.log.last_index()
    # c loses everything and starts afresh, in its old term (it kept nothing else either).
    fresh = MemoryStorage()
    fresh.set_hard_state(HardState(term=net["c"].term))
    config = net["c"].config
    net.nodes["c"] = Node(RawNode(config, fresh), fresh, config)
    net.tick("a")  # a heartbeat, and nothing else
    net.run()
    pr = a.raft.prs["c"]
    assert pr.match == 0
    assert pr.state is ProgressState.SNAPSHOT
    assert [m.dst for m in _snapshots(net)] == ["c"]
