"""Log GC in the core: ``all_replicated`` (every voter holds every entry up to it) is
computed by the leader, carried on appends and heartbeats, learned by followers (never
above their commit), and a log whose prefix was discarded below it still brings every
follower up -- after a leader change too, where probing would otherwise reach entries that
are gone."""

from __future__ import annotations

from raftlet.consensus.core import MessageType, Role
from tests.unit.raft_harness import Network


def _write(net: Network, n: int, start: int = 0, leader: str = "a") -> None:
    for i in range(start, start + n):
        net.propose(leader, f"w{i}".encode())
        net.run()


def _compact(net: Network, node: str) -> None:
    """What the driver does: discard entries below min(all_replicated, applied)."""
    r = net[node].raft
    point = min(r.all_replicated, r.log.applied)
    net[node].storage.compact(point - 1)


def test_the_leader_carries_all_replicated_and_followers_learn_it() -> None:
    net = Network.create()
    net.campaign("a")
    net.run()
    _write(net, 5)
    net.tick("a")  # a heartbeat round carries the latest value
    net.run()
    last = net["a"].raft.log.last_index()
    for node in "abc":
        assert net[node].raft.all_replicated == last, node
    # A follower cut off holds the leader's all_replicated back; the others still learn
    # no more than what it holds.
    net.isolate("c")
    _write(net, 5, start=5)
    net.tick("a")
    net.run()
    assert net["a"].raft.all_replicated == last
    assert net["b"].raft.all_replicated == last


def test_followers_never_take_all_replicated_above_their_commit() -> None:
    net = Network.create()
    net.campaign("a")
    net.run()
    _write(net, 3)

    def inflate(m):  # type: ignore[no-untyped-def]
        if m.type in (MessageType.APPEND, MessageType.HEARTBEAT):
            from dataclasses import replace

            return replace(m, all_replicated=10**9)
        return m

    net.transform = inflate
    net.tick("a")
    net.run()
    for node in "bc":
        r = net[node].raft
        assert r.all_replicated == r.log.committed


def test_a_new_leader_with_a_discarded_prefix_brings_a_lagging_follower_up() -> None:
    net = Network.create()
    net.campaign("a")
    net.run()
    _write(net, 20)
    net.tick("a")
    net.run()
    # c falls behind; a and b go on, all_replicated stays where c is.
    net.isolate("c")
    _write(net, 20, start=20)
    net.tick("a")
    net.run()
    held = net["a"].raft.all_replicated
    for node in "abc":
        _compact(net, node)
    assert net["a"].raft.log.first_index() == held
    assert net["b"].raft.log.first_index() == held
    # b leads now, from a log that starts at `held`; c must be probed without the entries
    # (or terms) below it.
    net.heal()
    net.isolate("a")
    net.tick("b", 30)  # b's election timeout passes; c's not yet (paper defaults)
    net.campaign("b")
    net.run()
    assert net["b"].raft.role is Role.LEADER
    _write(net, 3, start=40, leader="b")
    net.tick("b")
    net.run()
    b, c = net["b"].raft, net["c"].raft
    assert c.log.last_index() == b.log.last_index()
    assert c.log.committed == b.log.committed
    assert [e.data for e in net["c"].applied][-3:] == [b"w40", b"w41", b"w42"]


def test_a_follower_behind_the_discarded_prefix_is_not_sent_what_is_gone() -> None:
    net = Network.create()
    net.campaign("a")
    net.run()
    _write(net, 10)
    net.tick("a")
    net.run()
    net.isolate("c")
    _write(net, 10, start=10)
    # Against the rule (c does not hold these), as a driver bug or a lost disk would: the
    # leader must not crash and must not send c entries it no longer has.
    net["a"].storage.compact(net["a"].raft.log.applied - 1)
    net.heal()
    net.tick("a")
    net.run()
    assert net.leader().id == "a"
    assert net["c"].raft.log.last_index() < net["a"].raft.log.first_index()
    # What it gets instead is a request for a copy of the state (test_core_snapshot.py).
    asked = [m for m in net.delivered if m.type is MessageType.SNAPSHOT]
    assert [(m.dst, m.index) for m in asked] == [("c", net["a"].raft.log.first_index())]
