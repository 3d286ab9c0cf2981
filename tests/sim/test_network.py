"""The simulated network and cluster themselves: fault semantics and determinism."""

from __future__ import annotations

import random

from raftlet.consensus.core import Message, MessageType
from tests.sim.cluster import SimCluster, SimConfig
from tests.sim.network import NetConfig, Network
from tests.sim.scenarios import RandomParams, run_random

IDS = ("a", "b", "c", "d", "e")


def net(config: NetConfig | None = None) -> Network:
    return Network(IDS, random.Random(1), config or NetConfig())


def msg(src: str, dst: str) -> Message:
    return Message(MessageType.HEARTBEAT, src, dst, 1)


def drain(n: Network) -> list[Message]:
    out = []
    while n.next_due() is not None:
        got = n.pop()
        if got is not None:
            out.append(got[1])
    return out


def test_partition_groups_and_unlisted_nodes() -> None:
    n = net()
    n.partition([["a", "b"], ["c", "d"]])
    assert n.connected("a", "b")
    assert n.connected("c", "d")
    assert not n.connected("a", "c")
    assert not n.connected("b", "d")
    assert not n.connected("e", "a")
    assert not n.connected("e", "d")
    n.heal()
    assert all(n.connected(x, y) for x in IDS for y in IDS)


def test_isolate_and_reconnect() -> None:
    n = net()
    n.partition([["a", "b", "c"], ["d", "e"]])
    n.isolate("a")
    assert not n.connected("a", "b")
    assert n.connected("b", "c")
    n.reconnect("a")
    assert n.connected("a", "b")
    assert n.connected("a", "e")
    assert not n.connected("b", "d")  # other cuts stay


def test_bridge_is_not_transitive() -> None:
    n = net()
    n.bridge("c", ["a", "b"], ["d", "e"])
    assert n.connected("c", "a")
    assert n.connected("c", "e")
    assert n.connected("a", "b")
    assert n.connected("d", "e")
    assert not n.connected("a", "d")
    assert not n.connected("b", "e")


def test_partition_stops_messages_already_in_flight() -> None:
    n = net()
    n.send(msg("a", "b"), now=0)
    n.isolate("b")
    assert drain(n) == []
    assert n.blocked == 1


def test_drop_and_duplicate_rates() -> None:
    n = net(NetConfig(drop=0.5))
    for _ in range(1000):
        n.send(msg("a", "b"), now=0)
    assert 400 < len(drain(n)) < 600
    n = net(NetConfig(dup=0.5))
    for _ in range(1000):
        n.send(msg("a", "b"), now=0)
    assert 1400 < len(drain(n)) < 1600


def test_delays_reorder_messages() -> None:
    n = net(NetConfig(min_delay=1, max_delay=50))
    sent = [Message(MessageType.HEARTBEAT, "a", "b", t) for t in range(100)]
    for m in sent:
        n.send(m, now=0)
    got = drain(n)
    assert sorted(got, key=lambda m: m.term) == sent
    assert got != sent


def test_crash_drops_traffic_to_and_from_the_node() -> None:
    n = net()
    for src, dst in [("a", "b"), ("b", "c"), ("c", "d")]:
        n.send(msg(src, dst), now=0)
    n.drop_node("b")
    assert [(m.src, m.dst) for m in drain(n)] == [("c", "d")]


def test_same_seed_same_run() -> None:
    """All randomness comes from the seed: two runs are identical, event for event."""
    p = RandomParams(
        nodes=5,
        steps=150,
        drop=0.1,
        dup=0.05,
        long_delay=0.05,
        persist_delay=5,
        partition_rate=0.05,
        crash_rate=0.03,
        propose_rate=0.5,
    )
    a, b = run_random(99, p), run_random(99, p)
    assert a == b
    assert a.crashes
    assert a.partitions
    assert a.dropped
    assert a.commits


def test_crash_loses_unpersisted_state_only() -> None:
    c = SimCluster(3, SimConfig(nodes=3, persist_delay=20))
    c.run_until(lambda: c.stable_leader() is not None, 100)
    lead = c.stable_leader()
    assert lead is not None
    durable = c.nodes[lead].storage.last_index()
    c.propose(lead, b"x")
    assert c.nodes[lead].node().raft.log.last_index() == durable + 1
    c.crash(lead)  # before its disk write of b"x" completed
    assert c.nodes[lead].storage.last_index() == durable
    c.restart(lead)
    assert c.nodes[lead].node().raft.log.last_index() == durable
    assert c.nodes[lead].applied == []  # the state machine starts empty
