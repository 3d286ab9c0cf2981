"""One ticker per server: every registered replica gets each tick; a test can be the clock."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from raftlet.consensus.core import Role
from raftlet.consensus.ticker import ManualTicker, Ticker
from tests.unit.consensus_cluster import Cluster
from tests.waiting import wait_for


def test_every_registered_callback_gets_each_tick_until_unregistered() -> None:
    ticker = ManualTicker()
    seen: list[str] = []
    stop_a = ticker.register(lambda n: seen.append("a" * n))
    ticker.register(lambda n: seen.append("b" * n))
    ticker.tick()
    stop_a()
    ticker.tick()
    assert seen == ["a", "b", "b"]
    batched = ManualTicker(ticks_per_call=3)
    batched.register(lambda n: seen.append("c" * n))
    batched.tick()
    assert seen[-1] == "ccc"


def test_a_failing_callback_does_not_starve_the_others() -> None:
    ticker = ManualTicker()
    seen: list[int] = []

    def broken(_: int) -> None:
        raise RuntimeError("replica gone")

    ticker.register(broken)
    ticker.register(seen.append)
    ticker.tick()
    assert seen == [1]


def test_a_wall_clock_ticker_ticks_on_its_own_thread() -> None:
    ticker = Ticker(0.001, ticks_per_call=3)
    calls = threading.Semaphore(0)
    counts: list[int] = []

    def on_tick(n: int) -> None:
        counts.append(n)
        calls.release()

    ticker.register(on_tick)
    ticker.start()
    try:
        for _ in range(3):
            assert calls.acquire(timeout=10)
    finally:
        ticker.stop()
    assert set(counts) == {3}  # three ticks per call, every third interval
    with pytest.raises(ValueError, match="positive"):
        Ticker(0)
    with pytest.raises(ValueError, match="at least 1"):
        Ticker(0.1, ticks_per_call=0)


def test_replicas_on_a_manual_ticker_elect_only_as_the_test_ticks(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, ticker=ManualTicker())
    try:
        # No tick, no election timeout: every replica stays a follower of term 0.
        assert all(r.consensus.snapshot.term == 0 for r in cluster.replicas.values())
        assert cluster.leader() is None
        leader = cluster.wait_leader()  # ticks while it waits
        followers = [r for r in cluster.replicas.values() if r is not leader]
        assert all(f.consensus.snapshot.role is Role.FOLLOWER for f in followers)
        assert len(cluster.ticker._callbacks) == 3  # type: ignore[union-attr]  # one source, all
        term = leader.consensus.check_leadership_and_bind_term()
        leader.consensus.replicate([b"x"], term)
        cluster.wait_for(  # heartbeats, one per tick, carry the commit index to followers
            lambda: all(r.data() == [b"x"] for r in cluster.replicas.values()),
            what="every replica applies the entry",
        )
    finally:
        cluster.close()


def test_a_follower_steps_its_ticks_with_its_next_message_not_one_by_one(
    tmp_path: Path,
) -> None:
    """A follower's worker is not woken per tick: ticks are counted, and stepped before the
    next message it steps (a heartbeat), or once an election timeout's worth has passed."""
    cluster = Cluster(tmp_path, ticker=ManualTicker())
    try:
        leader = cluster.wait_leader()
        follower = next(r for r in cluster.replicas.values() if r is not leader)
        consensus = follower.consensus
        for other in cluster.replicas:
            if other != follower.node_id:
                cluster.transport.cut(follower.node_id, other)
        ticker = cluster.ticker
        assert ticker is not None
        # Let what was sent before the cut land and the worker finish what it may still be
        # doing (without ticking: a tick would send more), then count from a quiet state.
        wait_for(
            lambda: cluster.transport.idle() and not consensus._tick_queued,
            what="no message in flight and no tick queued",
        )
        stepped = consensus._ticks
        with consensus._tick_lock:
            consensus._pending_ticks = 0
            consensus._quiet_ticks = 0
        election_ticks = consensus.options.election_ticks
        for _ in range(election_ticks - 1):
            ticker.tick()
        assert consensus._pending_ticks == election_ticks - 1
        assert consensus._ticks == stepped  # counted, not stepped: the worker slept
        # A whole (shortest) election timeout with no message: from now on the worker steps
        # every call's ticks, so the randomized timeout fires when it is due.
        ticker.tick()
        wait_for(lambda: consensus._ticks == stepped + election_ticks, what="the ticks stepped")
        for n in range(1, 4):
            ticker.tick()
            wait_for(lambda n=n: consensus._ticks == stepped + election_ticks + n, what="a tick")
    finally:
        cluster.close()
