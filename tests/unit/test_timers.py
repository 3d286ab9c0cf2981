"""One thread per server for callbacks at a deadline (consensus.timers)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from raftlet.consensus.timers import Timers
from raftlet.consensus.workers import WorkerPool
from tests.unit.test_workers import wait_until


@pytest.fixture
def timers() -> Iterator[Timers]:
    t = Timers("test-timers")
    yield t
    t.stop()


def _threads_named(name: str) -> int:
    return sum(t.name == name for t in threading.enumerate())


def test_callbacks_run_in_deadline_order_and_not_before_it(timers: Timers) -> None:
    ran: list[tuple[str, float]] = []
    due: dict[str, float] = {}
    for name, delay in (("late", 0.06), ("early", 0.02), ("middle", 0.04)):
        due[name] = time.monotonic() + delay
        timers.call_later(delay, lambda n=name: ran.append((n, time.monotonic())))
    wait_until(lambda: len(ran) == 3)
    assert [n for n, _ in ran] == ["early", "middle", "late"]
    assert all(at >= due[n] for n, at in ran)
    assert timers.pending() == 0


def test_an_earlier_deadline_wakes_a_thread_asleep_until_a_later_one(timers: Timers) -> None:
    ran = threading.Event()
    timers.call_later(3600, lambda: None)
    wait_until(lambda: _threads_named("test-timers") == 1)
    timers.call_later(0.01, ran.set)
    assert ran.wait(10), "the earlier callback waited for the later deadline"
    assert timers.pending() == 1


def test_a_failing_callback_does_not_end_the_thread(timers: Timers) -> None:
    ran = threading.Event()

    def fail() -> None:
        raise RuntimeError("boom")

    timers.call_later(0, fail)
    timers.call_later(0.01, ran.set)
    assert ran.wait(10)


def test_no_thread_until_used_and_none_after_stop() -> None:
    timers = Timers("test-timers-lazy")
    assert _threads_named("test-timers-lazy") == 0
    ran: list[int] = []
    timers.call_later(3600, lambda: ran.append(1))
    assert _threads_named("test-timers-lazy") == 1
    timers.stop()
    assert _threads_named("test-timers-lazy") == 0
    assert timers.pending() == 0
    assert ran == []
    assert timers.call_later(0, lambda: ran.append(2)) is False
    assert ran == []


def test_a_worker_pools_timers_stop_with_it() -> None:
    pool = WorkerPool("test-pool", min_threads=1)
    ran = threading.Event()
    pool.timers.call_later(0, ran.set)
    assert ran.wait(10)
    pool.stop()
    assert _threads_named("test-pool-timers") == 0
    assert pool.timers.call_later(0, ran.set) is False
