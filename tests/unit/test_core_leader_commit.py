"""A follower learns its leader's commit index as the leader has it -- on appends, and on
heartbeats, whose ``commit`` is capped at the follower's match -- so it can tell that it is
still catching up (a server's readiness, ``tserver.readiness``)."""

from __future__ import annotations

from raftlet.consensus.core import NO_NODE, MessageType
from tests.unit.raft_harness import Network


def _write(net: Network, n: int, leader: str = "a") -> None:
    for i in range(n):
        net.propose(leader, f"w{i}".encode())
        net.run()


def test_a_follower_cut_off_hears_how_far_behind_it_is_from_heartbeats() -> None:
    net = Network.create()
    net.campaign("a")
    net.run()
    _write(net, 3)
    net.tick("a")
    net.run()
    committed = net["a"].raft.log.committed
    for node in "bc":
        assert net[node].raft.leader_commit == committed, node
    # c misses five writes' appends, then hears only heartbeats: their commit is capped
    # at its match, their leader_commit is not.
    net.drop("a", "c")
    _write(net, 5)
    behind = net["c"].raft.log.last_index()
    net.heal()
    heartbeats = [m for m in net["a"].tick(net["a"].raft.config.heartbeat_tick) if m.dst == "c"]
    beat = next(m for m in heartbeats if m.type is MessageType.HEARTBEAT)
    assert beat.commit <= behind < beat.leader_commit == net["a"].raft.log.committed
    net["c"].step(beat)
    assert net["c"].raft.leader_commit - net["c"].raft.log.last_index() == 5
    net.run()  # the leader catches it up
    _write(net, 1)
    net.tick("a")
    net.run()
    assert net["c"].raft.leader_commit == net["c"].raft.log.last_index()


def test_a_new_term_forgets_the_old_leaders_word() -> None:
    net = Network.create()
    net.campaign("a")
    net.run()
    _write(net, 3)
    c = net["c"].raft
    assert c.leader_commit > 0
    c.become_follower(c.term + 1, NO_NODE)  # a vote of a new term came, no leader yet
    assert c.leader_commit == 0
    net.campaign("b")
    net.run()
    assert (c.lead, c.leader_commit) == ("b", net["b"].raft.log.committed)
