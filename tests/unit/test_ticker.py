"""One ticker per server: every registered replica gets each tick; a test can be the clock."""

from __future__ import annotations

import itertools
import threading
import time
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


class _JumpingClock:
    """A stall clock a test moves forward by hand, on top of real time."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


def test_a_late_wake_up_is_reported_as_a_stall_once_before_its_ticks() -> None:
    clock = _JumpingClock()
    ticker = Ticker(0.01, stall_margin_s=0.5, clock=clock)
    events: list[str] = []
    stalls: list[float] = []

    def on_stall(seconds: float) -> None:
        stalls.append(seconds)
        events.append("stall")

    ticker.register(lambda _n: events.append("tick"), on_stall)
    ticker.start()
    try:
        wait_for(lambda: events.count("tick") >= 3, what="ticks")
        assert stalls == []
        clock.offset += 5.0  # the process "did not run" for 5 s
        wait_for(lambda: bool(stalls), what="the stall report")
        wait_for(lambda: events[-1] == "tick", what="the ticks after it")
    finally:
        ticker.stop()
    assert len(stalls) == 1
    assert stalls[0] >= 4.5
    assert ticker.stalls == 1
    assert events[events.index("stall") + 1] == "tick"


def test_a_reader_sees_an_overdue_ticker_before_the_ticker_wakes() -> None:
    clock = _JumpingClock()
    ticker = Ticker(10.0, stall_margin_s=0.5, clock=clock)  # will not wake during the test
    ticker.start()
    try:
        assert ticker.is_on_time()
        clock.offset += 11.0
        assert not ticker.is_on_time()
    finally:
        ticker.stop()


def test_ticks_never_come_faster_than_wall_time() -> None:
    """Consecutive calls are at least one call's interval apart (the lease's bound counts on
    it): a late call is not followed by an early one."""
    ticker = Ticker(0.002, ticks_per_call=2)
    times: list[float] = []
    ticker.register(lambda _n: times.append(time.monotonic()))
    ticker.start()
    try:
        wait_for(lambda: len(times) >= 30, what="30 calls")
    finally:
        ticker.stop()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.004 * 0.999
