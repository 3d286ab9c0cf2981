"""ProfiledLock: counts contention only when there was a wait; Condition; tracing; RLock.

Threads are ordered with Events, never with sleeps. To know that a waiter has entered the
blocking acquire (its non-blocking try having failed) the tests swap the lock's inner lock
for a wrapper that reports it: the only way to observe that moment without polling. A slow
critical section is a step of a fake clock that the lock reads its wait times from, so the
measured wait is exactly the step, however fast or slow the machine.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raftlet.metrics import Histogram, ProfiledLock, StripedCounter
from raftlet.metrics import profiled_lock as profiled_lock_module
from raftlet.metrics.profiled_lock import (
    _InnerOps,
    get_lock_contention_trace_threshold_ms,
    set_lock_contention_trace_threshold_ms,
)

WAIT = 30.0
LOGGER = "raftlet.metrics.profiled_lock"


class _ReportingInnerLock:
    """Delegates to a real lock; sets ``blocking`` just before a blocking acquire."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.blocking = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if blocking:
            self.blocking.set()
        return bool(self._inner.acquire(blocking, timeout))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _FakeClock:
    """A ``perf_counter_ns`` that moves only when told to."""

    def __init__(self) -> None:
        self._ns = time.perf_counter_ns()

    def __call__(self) -> int:
        return self._ns

    def advance(self, seconds: float) -> None:
        self._ns += round(seconds * 1e9)


def _instrument(lock: ProfiledLock, clock: _FakeClock | None = None) -> _ReportingInnerLock:
    wrapper = _ReportingInnerLock(lock._lock)
    lock._lock = wrapper
    lock._ops = _InnerOps(wrapper.acquire)
    if clock is not None:
        lock._ops.perf_counter_ns = clock
    return wrapper


def _uninstrument(lock: ProfiledLock, wrapper: _ReportingInnerLock) -> None:
    lock._lock = wrapper._inner
    lock._ops = _InnerOps(wrapper._inner.acquire)


def _contend(lock: ProfiledLock, hold_s: float = 0.0) -> threading.Thread:
    """Hold ``lock`` in this thread while another thread blocks on it; return that thread
    (joined). ``hold_s`` is a simulated slow critical section, the wait the trace tests want
    to exceed a threshold: the lock's clock steps that far while the waiter is blocked."""
    clock = _FakeClock() if hold_s else None
    inner = _instrument(lock, clock)
    inner.blocking.clear()
    got_it = threading.Event()

    def waiter() -> None:
        with lock:
            got_it.set()

    with lock:
        t = threading.Thread(target=waiter, name="waiter")
        t.start()
        assert inner.blocking.wait(WAIT), "the waiter never reached the blocking acquire"
        if clock is not None:
            clock.advance(hold_s)
        assert not got_it.is_set()
    t.join(WAIT)
    assert got_it.is_set()
    _uninstrument(lock, inner)
    return t


@pytest.fixture
def restore_threshold() -> Iterator[None]:
    before = get_lock_contention_trace_threshold_ms()
    yield
    set_lock_contention_trace_threshold_ms(before)


@pytest.mark.parametrize("reentrant", [False, True])
def test_uncontended_loop_counts_no_contention(reentrant: bool) -> None:
    lock = ProfiledLock("uncontended", reentrant=reentrant)
    for _ in range(1000):
        with lock:
            pass
    for _ in range(500):
        assert lock.acquire()
        lock.release()
    assert lock.acquisitions() == 1500
    assert lock.contended_acquisitions() == 0
    assert lock.contention_time_us() == 0
    assert lock.wait_histogram.snapshot().count == 0


@pytest.mark.parametrize("reentrant", [False, True])
def test_one_blocked_waiter_is_exactly_one_contended_acquisition(reentrant: bool) -> None:
    counter = StripedCounter()
    hist = Histogram()
    lock = ProfiledLock(
        "consensus_lock", reentrant=reentrant, contention_counter=counter, wait_histogram=hist
    )
    _contend(lock)
    assert lock.acquisitions() == 2
    assert lock.contended_acquisitions() == 1
    assert lock.contention_time_us() > 0
    assert counter.value() == lock.contention_time_us()  # the counter passed in is the one used
    snap = hist.snapshot()
    assert snap.count == 1
    assert snap.max > 0


def test_non_blocking_failure_and_timeout() -> None:
    lock = ProfiledLock("t")
    holding = threading.Event()
    finished = threading.Event()

    def holder() -> None:
        with lock:
            holding.set()
            finished.wait(WAIT)

    t = threading.Thread(target=holder)
    t.start()
    assert holding.wait(WAIT)
    assert lock.acquire(False) is False  # a failed try is not contention: nothing waited
    assert lock.contention_time_us() == 0
    assert lock.acquire(timeout=0.01) is False  # a timed-out wait is lost time, though
    assert lock.contention_time_us() >= 10_000
    assert lock.contended_acquisitions() == 0  # ... but not an acquisition
    assert lock.wait_histogram.snapshot().count == 1
    finished.set()
    t.join(WAIT)
    assert lock.acquisitions() == 1
    with pytest.raises(ValueError, match="non-blocking"):
        lock.acquire(False, 1.0)


def test_lock_semantics_match_threading_lock() -> None:
    lock = ProfiledLock("plain")
    assert not lock.locked()
    assert lock.acquire()
    assert lock.locked()
    assert lock.acquire(False) is False  # not reentrant
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()
    assert lock.name == "plain"
    assert "unlocked" in repr(lock)


def test_rlock_reentrancy() -> None:
    lock = ProfiledLock("rl", reentrant=True)
    with lock, lock:
        assert lock.acquire()
        assert lock.locked()
        other: list[bool] = []
        t = threading.Thread(target=lambda: other.append(lock.acquire(False)))
        t.start()
        t.join(WAIT)
        assert other == [False]  # another thread cannot get it
        lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()
    assert lock.acquisitions() == 3
    assert lock.contended_acquisitions() == 0


@pytest.mark.parametrize("reentrant", [False, True])
def test_condition_wait_and_notify(reentrant: bool) -> None:
    lock = ProfiledLock("cond", reentrant=reentrant)
    # typeshed only admits Lock/RLock here; the drop-in itself is what is under test.
    cond = threading.Condition(lock)  # type: ignore[arg-type]
    items: list[int] = []
    got: list[int] = []
    consumer_waiting = threading.Event()

    def consumer() -> None:
        with cond:
            if reentrant:
                lock.acquire()  # depth 2: wait must release fully and restore it
            consumer_waiting.set()
            assert cond.wait_for(lambda: len(items) == 3, timeout=WAIT)
            got.extend(items)
            if reentrant:
                lock.release()  # back to depth 1: the `with` releases the last level

    t = threading.Thread(target=consumer)
    t.start()
    assert consumer_waiting.wait(WAIT)
    for i in range(3):
        with cond:  # only possible because wait() released the lock
            items.append(i)
            cond.notify()
    t.join(WAIT)
    assert not t.is_alive()
    assert got == [0, 1, 2]
    assert not lock.locked()


@pytest.mark.parametrize("reentrant", [False, True])
def test_condition_requires_the_lock(reentrant: bool) -> None:
    lock = ProfiledLock("cond", reentrant=reentrant)
    cond = lock.condition()  # the typed way to build the same Condition
    with pytest.raises(RuntimeError):
        cond.notify()
    with pytest.raises(RuntimeError):
        cond.wait(0)
    with cond:
        cond.notify_all()
        assert not cond.wait(0)  # times out at once, and re-acquires
        assert lock.locked()
    assert not lock.locked()


def test_many_threads_exclusion_and_counts() -> None:
    lock = ProfiledLock("stress")
    total = [0]
    start = threading.Barrier(8)

    def work() -> None:
        start.wait(WAIT)
        for _ in range(10_000):
            with lock:
                total[0] += 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert total[0] == 80_000
    assert lock.acquisitions() == 80_000
    assert lock.contended_acquisitions() <= 80_000
    assert lock.wait_histogram.snapshot().count == lock.contended_acquisitions()


class _TraceClock:
    """The trace rate limit's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def trace_clock(monkeypatch: pytest.MonkeyPatch) -> _TraceClock:
    # The rate limit is process-wide: a fresh one per test, so that no other test's report
    # holds this one's back.
    clock = _TraceClock()
    monkeypatch.setattr(
        profiled_lock_module, "_trace_limit", profiled_lock_module._TraceLimit(clock)
    )
    return clock


def _trace_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and "Waited" in r.getMessage()]


def _stack_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.DEBUG]


LOOK_AT = (
    "every thread's stack: /stacks on the server's status page; lock wait totals: "
    "`raftlet metrics --filter lock`"
)


def test_trace_is_one_warning_line_and_the_waiters_stack_is_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lock = ProfiledLock("consensus_lock", trace_threshold_ms=1.0)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        _contend(lock, hold_s=0.02)
        _contend(lock, hold_s=0.02)  # within the interval: held back
    (record,) = _trace_records(caplog)
    assert record.levelno == logging.WARNING
    # The holder's acquisition site is in this file and was taken by the main thread.
    assert re.fullmatch(
        re.escape(f"Waited 20 ms on lock consensus_lock (holder when the wait began: {__file__}:")
        + r"\d+"
        + re.escape(f" in thread 'MainThread'; waiter: thread 'waiter'); {LOOK_AT}"),
        record.getMessage(),
    ), record.getMessage()
    (stack,) = _stack_records(caplog)
    lines = stack.getMessage().splitlines()
    assert lines[0] == "stack of thread 'waiter', which waited 20 ms on lock consensus_lock:"
    assert any(line.endswith(", in waiter") for line in lines)  # the waiter's function
    assert caplog.records.index(stack) == caplog.records.index(record) + 1
    assert lock.contended_acquisitions() == 2


def test_trace_is_rate_limited_for_all_locks_together_and_counts_what_it_held_back(
    caplog: pytest.LogCaptureFixture, trace_clock: _TraceClock
) -> None:
    # A lock per tablet: the limit is the process's, not each lock's.
    locks = [ProfiledLock(f"tablet-{i}", trace_threshold_ms=1.0) for i in range(3)]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _contend(locks[0], hold_s=0.02)
        trace_clock.now = 9.999
        _contend(locks[1], hold_s=0.05)
        _contend(locks[2], hold_s=0.03)
        trace_clock.now = 10.0  # the interval is 10 s
        _contend(locks[2], hold_s=0.04)
        _contend(locks[1], hold_s=0.04)
    messages = [r.getMessage() for r in _trace_records(caplog)]
    assert len(messages) == 2, messages
    assert messages[0].startswith("Waited 20 ms on lock tablet-0 (")
    assert messages[0].endswith(f"waiter: thread 'waiter'); {LOOK_AT}")
    assert messages[1].startswith("Waited 40 ms on lock tablet-2 (")
    assert messages[1].endswith(
        "waiter: thread 'waiter'); 2 more waits over the threshold on any lock since the last "
        f"report, the longest 50 ms; {LOOK_AT}"
    )


def test_no_trace_below_threshold_and_default_threshold_is_settable(
    caplog: pytest.LogCaptureFixture, restore_threshold: None
) -> None:
    set_lock_contention_trace_threshold_ms(60_000)  # a minute: never reached here
    lock = ProfiledLock("l")  # no per-lock threshold: uses the module default
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _contend(lock, hold_s=0.005)
        assert _trace_records(caplog) == []
        set_lock_contention_trace_threshold_ms(1.0)  # read at acquire time, not at creation
        _contend(lock, hold_s=0.02)
    assert len(_trace_records(caplog)) == 1
    with pytest.raises(ValueError, match=">= 0"):
        set_lock_contention_trace_threshold_ms(-1)


def test_acquisitions_prove_a_code_path_never_took_the_lock() -> None:
    # How the server shows lock-free term checks: compare acquisitions around the path.
    lock = ProfiledLock("consensus_lock")
    snapshot = (3, "LEADER")

    def lock_free_check() -> tuple[int, str]:
        return snapshot

    before = lock.acquisitions()
    for _ in range(100):
        lock_free_check()
    assert lock.acquisitions() == before

    def locked_check() -> Callable[[], tuple[int, str]]:
        with lock:
            return lock_free_check

    locked_check()
    assert lock.acquisitions() == before + 1


def test_trace_does_not_blame_the_waiter_for_its_own_stale_site(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The holder takes the inner lock and records its site in two steps; a waiter arriving
    # between them finds the site of the previous holder, which may be itself.
    lock = ProfiledLock("l", trace_threshold_ms=1.0)
    with lock:  # the main thread's site is now the recorded one
        pass
    clock = _FakeClock()
    inner = _instrument(lock, clock)
    taken = threading.Event()
    release = threading.Event()

    def half_recorded_holder() -> None:
        inner._inner.acquire()  # took the lock, has not recorded a site yet
        taken.set()
        release.wait(WAIT)
        clock.advance(0.02)  # the slow critical section the waiter must outwait
        inner._inner.release()

    t = threading.Thread(target=half_recorded_holder)
    t.start()
    assert taken.wait(WAIT)

    def release_once_main_blocks() -> None:
        inner.blocking.wait(WAIT)
        release.set()

    waiting = threading.Thread(target=release_once_main_blocks)
    waiting.start()
    with caplog.at_level(logging.WARNING, logger=LOGGER), lock:
        pass
    t.join(WAIT)
    waiting.join(WAIT)
    (record,) = _trace_records(caplog)
    assert "holder when the wait began: not recorded yet" in record.getMessage()
