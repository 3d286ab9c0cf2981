"""The server's replica worker pool and its serial mailboxes (consensus.workers)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from raftlet.consensus.workers import STALL_S, WorkerPool

TIMEOUT = 10.0


def wait_until(condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        threading.Event().wait(0.005)


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    p = WorkerPool("test", min_threads=1, max_threads=8, idle_timeout_s=0.05)
    yield p
    p.stop()


def test_a_mailbox_handles_its_items_in_order_and_never_on_two_threads(pool: WorkerPool) -> None:
    seen: list[int] = []
    running = threading.Lock()
    overlaps: list[int] = []

    def handler(batch: list[int]) -> None:
        if not running.acquire(blocking=False):
            overlaps.append(batch[0])
            return
        try:
            seen.extend(batch)
            sum(range(2000))  # long enough for another pool thread to overlap, if allowed
        finally:
            running.release()

    box = pool.mailbox("ordered", handler)
    posters = []
    for t in range(4):

        def post_many(base: int = t * 1000) -> None:
            for i in range(500):
                box.post(base + i)

        posters.append(threading.Thread(target=post_many))
    for thread in posters:
        thread.start()
    for thread in posters:
        thread.join()
    assert box.close(TIMEOUT)
    assert not overlaps
    assert len(seen) == 2000
    for t in range(4):  # each poster's items in the order it posted them
        mine = [x for x in seen if t * 1000 <= x < (t + 1) * 1000]
        assert mine == list(range(t * 1000, t * 1000 + 500))


def test_what_arrives_while_the_handler_runs_comes_as_one_batch_of_at_most_max_batch(
    pool: WorkerPool,
) -> None:
    release = threading.Event()
    entered = threading.Event()
    batches: list[list[int]] = []

    def handler(batch: list[int]) -> None:
        batches.append(batch)
        entered.set()
        release.wait(TIMEOUT)

    box = pool.mailbox("batched", handler, max_batch=3)
    box.post(0)
    assert entered.wait(TIMEOUT)
    for i in range(1, 6):
        box.post(i)
    release.set()
    assert box.close(TIMEOUT)
    assert batches == [[0], [1, 2, 3], [4, 5]]


def test_a_blocked_mailbox_does_not_hold_up_the_others(pool: WorkerPool) -> None:
    stuck = threading.Event()
    entered = threading.Event()
    done = threading.Event()

    def blocked(batch: list[int]) -> None:
        entered.set()
        stuck.wait(TIMEOUT)

    slow = pool.mailbox("slow", blocked)
    fast = pool.mailbox("fast", lambda batch: done.set())
    slow.post(1)
    assert entered.wait(TIMEOUT)
    fast.post(1)
    assert done.wait(TIMEOUT), "another replica's mailbox waited for a blocked one"
    stuck.set()
    assert slow.close(TIMEOUT)
    assert fast.close(TIMEOUT)


def test_at_max_threads_ready_work_waits_for_a_thread_and_then_runs() -> None:
    pool = WorkerPool("one", min_threads=1, max_threads=1)
    try:
        stuck = threading.Event()
        entered = threading.Event()
        done = threading.Event()
        slow = pool.mailbox("slow", lambda b: (entered.set(), stuck.wait(TIMEOUT)))
        fast = pool.mailbox("fast", lambda b: done.set())
        slow.post(1)
        assert entered.wait(TIMEOUT)
        fast.post(1)
        assert not done.wait(0.05)  # the only thread is held by the blocked handler
        assert pool.threads() == 1
        stuck.set()
        assert done.wait(TIMEOUT)
    finally:
        pool.stop()


def test_a_busy_mailbox_goes_to_the_back_of_the_line() -> None:
    pool = WorkerPool("fair", min_threads=1, max_threads=1)
    try:
        order: list[str] = []
        gate = threading.Event()

        def busy(batch: list[int]) -> None:
            gate.wait(TIMEOUT)
            order.append(f"busy{batch[0]}")

        a = pool.mailbox("busy", busy, max_batch=1)
        b = pool.mailbox("other", lambda batch: order.append("other"))
        for i in range(3):
            a.post(i)
        b.post(0)
        gate.set()
        assert a.close(TIMEOUT)
        assert b.close(TIMEOUT)
        assert order.index("other") < order.index("busy2")
    finally:
        pool.stop()


def test_close_waits_for_what_was_posted_and_refuses_more(pool: WorkerPool) -> None:
    gate = threading.Event()
    handled: list[int] = []

    def handler(batch: list[int]) -> None:
        gate.wait(TIMEOUT)
        handled.extend(batch)

    box = pool.mailbox("closing", handler)
    for i in range(3):
        assert box.post(i)
    closer_done = threading.Event()
    threading.Thread(target=lambda: (box.close(TIMEOUT), closer_done.set())).start()
    assert not closer_done.wait(0.05)
    gate.set()
    assert closer_done.wait(TIMEOUT)
    assert handled == [0, 1, 2]
    assert not box.post(3)
    assert box.pending() == 0


def test_close_from_its_own_handler_does_not_wait_for_itself(pool: WorkerPool) -> None:
    done = threading.Event()
    box_holder: list[object] = []

    def handler(batch: list[int]) -> None:
        box = box_holder[0]
        assert hasattr(box, "close")
        box.close(TIMEOUT)  # type: ignore[attr-defined]
        done.set()

    box = pool.mailbox("self-closing", handler)
    box_holder.append(box)
    box.post(1)
    assert done.wait(TIMEOUT)
    assert not box.post(2)


def test_a_failing_handler_leaves_the_mailbox_and_the_pool_working(pool: WorkerPool) -> None:
    handled: list[int] = []

    def handler(batch: list[int]) -> None:
        if batch == [0]:
            raise RuntimeError("boom")
        handled.extend(batch)

    box = pool.mailbox("failing", handler, max_batch=1)
    box.post(0)
    box.post(1)
    assert box.close(TIMEOUT)
    assert handled == [1]


def test_threads_beyond_the_minimum_end_when_idle_and_stop_ends_the_rest() -> None:
    pool = WorkerPool("shrinking", min_threads=1, max_threads=4, idle_timeout_s=0.05)
    stuck = threading.Event()
    entered = threading.Semaphore(0)
    boxes = [
        pool.mailbox(f"b{i}", lambda b: (entered.release(), stuck.wait(TIMEOUT))) for i in range(3)
    ]
    for box in boxes:
        box.post(1)
    for _ in range(3):
        assert entered.acquire(timeout=TIMEOUT)
    assert pool.threads() == 3
    stuck.set()
    wait_until(lambda: pool.threads() == 1)
    pool.stop()
    wait_until(lambda: pool.threads() == 0)


@pytest.mark.parametrize("running_target", [0, 1, 2])
def test_no_work_is_lost_while_idle_threads_time_out_as_work_arrives(running_target: int) -> None:
    # Threads beyond the minimum end after 0.2 ms idle, so threads sleep, wake, time out and
    # start all the time while four posters keep giving work. A lost wake-up (or a count of
    # threads awake that drifts) leaves a mailbox scheduled with no thread to run it, and
    # the count below never completes.
    pool = WorkerPool(
        "churn",
        min_threads=1,
        max_threads=4,
        running_target=running_target,
        idle_timeout_s=0.0002,
    )
    handled = 0
    lock = threading.Lock()
    done = threading.Event()
    total = 4 * 2000

    def handle(batch: list[int]) -> None:
        nonlocal handled
        with lock:
            handled += len(batch)
            if handled == total:
                done.set()

    boxes = [pool.mailbox(f"b{i}", handle) for i in range(8)]

    def post_many(k: int) -> None:
        for n in range(2000):
            boxes[(k + n) % len(boxes)].post(n)
            if n % 50 == 0:
                threading.Event().wait(0.0005)  # gaps, so threads go idle between bursts

    posters = [threading.Thread(target=post_many, args=(k,)) for k in range(4)]
    for t in posters:
        t.start()
    for t in posters:
        t.join(TIMEOUT)
    try:
        assert done.wait(TIMEOUT), f"handled {handled} of {total}"
        wait_until(lambda: pool.awake() == 0)  # all asleep once the work is done
    finally:
        for box in boxes:
            box.close()
        pool.stop()
    wait_until(lambda: pool.threads() == 0)


def test_pool_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="min_threads"):
        WorkerPool(min_threads=0)
    with pytest.raises(ValueError, match="min_threads"):
        WorkerPool(min_threads=4, max_threads=2)
    with pytest.raises(ValueError, match="running_target"):
        WorkerPool(running_target=-1)


def test_with_a_running_target_ready_work_waits_for_the_thread_awake() -> None:
    """While the one thread awake runs (3 ms, less than a stall), twenty mailboxes made
    ready meanwhile wait for it rather than each waking a thread of its own -- as they did
    without a target (up to ``max_threads``)."""
    pool = WorkerPool("target", min_threads=1, max_threads=8, running_target=1)
    runners: set[int] = set()
    done = threading.Semaphore(0)
    started = threading.Event()

    def busy(batch: list[int]) -> None:
        runners.add(threading.get_ident())
        started.set()
        end = time.perf_counter() + 0.003
        while time.perf_counter() < end:
            pass
        done.release()

    try:
        boxes = [pool.mailbox(f"b{i}", busy) for i in range(21)]
        boxes[0].post(0)
        assert started.wait(TIMEOUT)
        for box in boxes[1:]:
            box.post(0)
        for _ in boxes:
            assert done.acquire(timeout=TIMEOUT)
        # One thread ran them all; one more at most, had the machine stalled it past STALL_S.
        assert pool.threads() <= 2, pool.threads()
        assert len(runners) <= 2, runners
    finally:
        pool.stop()


def test_with_a_running_target_a_blocked_handler_does_not_hold_up_the_others() -> None:
    """The one thread awake blocks: after ``STALL_S`` without a handler finishing, another
    thread is woken for the ready mailbox, and again for the next while the first stays
    blocked."""
    pool = WorkerPool("stall", min_threads=1, max_threads=8, running_target=1)
    stuck = threading.Event()
    entered = threading.Event()
    try:
        slow = pool.mailbox("slow", lambda b: (entered.set(), stuck.wait(TIMEOUT)))
        slow.post(1)
        assert entered.wait(TIMEOUT)
        for i in range(3):
            done = threading.Event()
            started = time.monotonic()
            pool.mailbox(f"fast{i}", lambda b, d=done: d.set()).post(1)  # type: ignore[misc]
            assert done.wait(TIMEOUT), "another replica's mailbox waited for a blocked one"
            assert time.monotonic() - started >= STALL_S * 0.9  # woken by the stall watch
        stuck.set()
        assert slow.close(TIMEOUT)
    finally:
        pool.stop()


def test_what_a_handler_posts_runs_next_on_the_same_thread(pool: WorkerPool) -> None:
    threads: dict[str, int] = {}
    done = threading.Event()

    def second(batch: list[int]) -> None:
        threads["second"] = threading.get_ident()
        done.set()

    b = pool.mailbox("second", second)

    def first(batch: list[int]) -> None:
        threads["first"] = threading.get_ident()
        b.post(1)

    a = pool.mailbox("first", first)
    a.post(1)
    assert done.wait(TIMEOUT)
    assert threads["first"] == threads["second"]


def test_run_or_post_runs_an_idle_mailbox_on_the_calling_thread(pool: WorkerPool) -> None:
    ran: list[tuple[str, int, list[int]]] = []
    box = pool.mailbox("m", lambda batch: ran.append(("pool", threading.get_ident(), batch)))

    def inline(batch: list[int]) -> bool:
        ran.append(("inline", threading.get_ident(), batch))
        return True

    assert box.run_or_post(7, inline)
    assert ran == [("inline", threading.get_ident(), [7])]


def test_run_or_post_posts_what_the_inline_handler_declines(pool: WorkerPool) -> None:
    handled: list[int] = []
    box = pool.mailbox("m", handled.extend)
    assert box.run_or_post(1, lambda batch: False)
    assert box.close(TIMEOUT)
    assert handled == [1]


def test_run_or_post_queues_behind_a_running_handler_in_order(pool: WorkerPool) -> None:
    gate = threading.Event()
    entered = threading.Event()
    handled: list[int] = []
    inline_calls: list[list[int]] = []

    def handler(batch: list[int]) -> None:
        entered.set()
        gate.wait(TIMEOUT)
        handled.extend(batch)

    box = pool.mailbox("m", handler)
    box.post(1)
    assert entered.wait(TIMEOUT)
    assert box.run_or_post(2, lambda batch: bool(inline_calls.append(batch)) or True)
    box.post(3)
    gate.set()
    assert box.close(TIMEOUT)
    assert inline_calls == []
    assert handled == [1, 2, 3]
    assert not box.run_or_post(4, lambda batch: True)
