"""StripedCounter: exact under threads, no lost or leaked cells of finished threads."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

from raftlet.metrics import StripedCounter

WAIT = 30.0  # generous: a loaded CI box must not turn a slow wait into a failure


def _run_threads(n: int, target: Callable[[], None]) -> None:
    threads = [threading.Thread(target=target) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()


def test_sixteen_threads_times_100k_increments_are_exact() -> None:
    counter = StripedCounter()
    threads, per_thread = 16, 100_000
    start = threading.Barrier(threads)

    def work() -> None:
        start.wait(WAIT)
        inc = counter.increment
        for _ in range(per_thread):
            inc()

    _run_threads(threads, work)
    assert counter.value() == threads * per_thread


def test_increment_by_n_sums_exactly() -> None:
    counter = StripedCounter()
    start = threading.Barrier(8)

    def work() -> None:
        start.wait(WAIT)
        for i in range(10_000):
            counter.increment(i)

    _run_threads(8, work)
    assert counter.value() == 8 * sum(range(10_000))


def test_cells_of_finished_threads_are_folded_not_lost_or_leaked() -> None:
    counter = StripedCounter()
    counter.increment(7)  # the main thread's cell stays live throughout

    def work() -> None:
        for _ in range(1000):
            counter.increment()

    # Every thread has exited before the first read.
    for _ in range(3):
        _run_threads(10, work)
    assert counter.value() == 7 + 30 * 1000
    # Only the main thread's cell is left: the others were folded into the base total.
    assert counter._live_cells() == 1
    # Folding is idempotent and later increments still land.
    counter.increment(3)
    assert counter.value() == 7 + 30 * 1000 + 3


def test_thread_churn_keeps_the_cell_table_small() -> None:
    counter = StripedCounter()
    for _ in range(200):
        t = threading.Thread(target=counter.increment)
        t.start()
        t.join(WAIT)
    # Registration folds dead cells too, so even without reads the table stays bounded.
    assert counter._live_cells() <= 1
    assert counter.value() == 200


def test_reads_during_writes_never_go_backwards() -> None:
    counter = StripedCounter()
    writers = 4
    start = threading.Barrier(writers + 1)
    done = threading.Event()

    def work() -> None:
        start.wait(WAIT)
        for _ in range(50_000):
            counter.increment()

    threads = [threading.Thread(target=work) for _ in range(writers)]
    for t in threads:
        t.start()
    start.wait(WAIT)
    seen = [0]

    def reader() -> None:
        while not done.is_set():
            v = counter.value()
            assert v >= seen[-1]
            seen.append(v)

    r = threading.Thread(target=reader)
    r.start()
    for t in threads:
        t.join(WAIT)
    done.set()
    r.join(WAIT)
    assert seen == sorted(seen)
    assert counter.value() == writers * 50_000


def test_counter_collected_before_its_threads_end_is_harmless() -> None:
    # The weakref callbacks die with the counter; a thread exiting afterwards must not
    # raise in teardown (pytest turns an unraisable exception into a failure).
    ready = threading.Event()
    release = threading.Event()

    def work() -> None:
        c = StripedCounter()
        c.increment()
        ready.set()
        del c
        release.wait(WAIT)

    t = threading.Thread(target=work)
    t.start()
    assert ready.wait(WAIT)
    gc.collect()
    release.set()
    t.join(WAIT)
    assert not t.is_alive()


def test_negative_increments_and_repr() -> None:
    counter = StripedCounter()
    counter.increment(5)
    counter.increment(-2)
    assert counter.value() == 3
    assert repr(counter) == "StripedCounter(3)"
