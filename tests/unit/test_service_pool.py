"""ServicePool and InboundCall: bounded, never-blocking offer; deadlines; metrics; shutdown.

Every wait here is on an Event with a timeout (WAIT), never a bare sleep: a handler that must
hold a worker blocks on an Event the test sets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from raftlet.metrics import catalogue
from raftlet.metrics.counter import StripedCounter
from raftlet.metrics.export_prometheus import generate_prometheus_text
from raftlet.metrics.histogram import Histogram
from raftlet.metrics.registry import MetricRegistry
from raftlet.tserver import service_pool
from raftlet.tserver.errors import DeadlineExceededInQueue, ServiceUnavailable
from raftlet.tserver.service_pool import InboundCall, ServicePool, ServicePoolMetrics
from tests.unit.tserver_settings_helpers import parse, write_config
from tests.waiting import wait_for

WAIT = 5.0  # generous upper bound for anything that should happen promptly


class Outcome:
    """Records the completion of one call (its on_result/on_error) and signals it."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.result: object = None
        self.error: BaseException | None = None
        self.calls = 0
        self.thread = ""

    def on_result(self, result: object) -> None:
        self.calls += 1
        self.result = result
        self.thread = threading.current_thread().name
        self.event.set()

    def on_error(self, exc: BaseException) -> None:
        self.calls += 1
        self.error = exc
        self.thread = threading.current_thread().name
        self.event.set()

    def wait(self) -> Outcome:
        assert self.event.wait(WAIT), "call was not completed in time"
        return self


def make_call(
    method: str,
    run: Callable[[InboundCall], None],
    deadline: float | None = None,
) -> tuple[InboundCall, Outcome]:
    out = Outcome()
    call = InboundCall(
        method, run, deadline=deadline, on_result=out.on_result, on_error=out.on_error
    )
    return call, out


def respond_with(value: object) -> Callable[[InboundCall], None]:
    def run(call: InboundCall) -> None:
        call.respond(value)

    return run


class Blocker:
    """A handler that parks its worker until released, so the test controls the queue."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, call: InboundCall) -> None:
        self.started.set()
        assert self.release.wait(WAIT), "blocker was never released"
        call.respond("unblocked")


@pytest.fixture
def pools() -> Iterator[list[ServicePool]]:
    """Pools a test creates are stopped even when it fails, so no worker outlives it."""
    created: list[ServicePool] = []
    yield created
    for pool in created:
        pool.stop(timeout=WAIT)


def new_pool(
    pools: list[ServicePool], name: str = "test", *, threads: int = 1, queue: int = 1
) -> ServicePool:
    pool = ServicePool(name, num_threads=threads, queue_length=queue)
    pools.append(pool)
    pool.start()
    return pool


def test_full_queue_rejects_without_blocking_and_counts_each_rejection(
    pools: list[ServicePool],
) -> None:
    pool = new_pool(pools, threads=1, queue=1)
    blocker = Blocker()
    first, first_out = make_call("Write", blocker)
    assert pool.offer(first)
    assert blocker.started.wait(WAIT)  # the only worker is now busy with `first`
    second, second_out = make_call("Write", respond_with(2))
    assert pool.offer(second)  # fills the queue of one
    assert pool.queue_size() == 1

    # The rejections are offered from another thread while the worker is still blocked: if
    # offer waited for room, this thread could not finish before the release below.
    rejected: list[bool] = []

    def offer_more() -> None:
        for method in ("Write", "Scan", "Write"):
            call, _ = make_call(method, respond_with(None))
            rejected.append(not pool.offer(call))

    offerer = threading.Thread(target=offer_more)
    offerer.start()
    offerer.join(WAIT)
    assert not offerer.is_alive(), "offer blocked on a full queue"
    assert rejected == [True, True, True]
    assert pool.queue_size() == 1

    m = pool.metrics
    assert m.queue_overflow.value() == 3
    assert m.queue_overflow_for("Write").value() == 2
    assert m.queue_overflow_for("Scan").value() == 1

    blocker.release.set()
    assert first_out.wait().result == "unblocked"
    assert second_out.wait().result == 2
    assert m.queue_overflow.value() == 3  # accepted calls are never counted


def test_expired_deadline_is_failed_in_queue_and_counted(pools: list[ServicePool]) -> None:
    pool = new_pool(pools, threads=1, queue=4)
    blocker = Blocker()
    block_call, _ = make_call("Write", blocker)
    assert pool.offer(block_call)
    assert blocker.started.wait(WAIT)

    ran = threading.Event()

    def must_not_run(call: InboundCall) -> None:
        ran.set()
        call.respond("ran")

    # Its deadline has passed by the time the worker gets to it (offer does not look at
    # deadlines: the pool checks them at dequeue); the second call has plenty of time left.
    expired, expired_out = make_call("Write", must_not_run, deadline=time.monotonic() - 0.001)
    fresh, fresh_out = make_call("Write", respond_with("ok"), deadline=time.monotonic() + 60)
    assert pool.offer(expired)
    assert pool.offer(fresh)
    blocker.release.set()

    err = expired_out.wait().error
    assert isinstance(err, DeadlineExceededInQueue)
    assert err.method == "Write"
    assert err.service == "test"
    assert not ran.is_set()
    assert fresh_out.wait().result == "ok"
    assert pool.metrics.timed_out_in_queue.value() == 1
    # A call dropped in the queue never ran a handler, so it adds no handler latency: only
    # the blocker and the fresh call did.
    assert pool.metrics.handler_latency_for("Write").snapshot().count == 2


def test_queue_time_is_observed_for_every_dequeued_call(pools: list[ServicePool]) -> None:
    pool = new_pool(pools, threads=1, queue=2)
    blocker = Blocker()
    assert pool.offer(make_call("Write", blocker)[0])
    assert blocker.started.wait(WAIT)
    waiting, waiting_out = make_call("Write", respond_with(None))
    assert pool.offer(waiting)
    offered_at = time.monotonic()  # after offer stamped the call: a lower bound on its wait
    assert not waiting_out.event.wait(0.02)  # still queued behind the blocker
    released_at = time.monotonic()
    blocker.release.set()
    waiting_out.wait()

    snap = pool.metrics.queue_time_us.snapshot()
    assert snap.count == 2
    # The waiting call was dequeued only after the release, so it waited at least this long.
    assert snap.max >= (released_at - offered_at) * 1e6


def test_deferred_completion_from_another_thread(pools: list[ServicePool]) -> None:
    pool = new_pool(pools, threads=1, queue=1)
    go = threading.Event()
    handed_over = threading.Event()
    holder: list[InboundCall] = []

    def apply_thread() -> None:
        assert go.wait(WAIT)
        holder[0].respond("applied")

    applier = threading.Thread(target=apply_thread, name="apply-test")
    applier.start()

    def run(call: InboundCall) -> None:
        # Like a write: hand the call to another thread and return without completing it.
        holder.append(call)
        handed_over.set()

    call, out = make_call("Write", run)
    assert pool.offer(call)
    assert handed_over.wait(WAIT)
    handed_over_at = time.monotonic()  # after the dequeue: a lower bound on the latency
    assert not out.event.is_set()
    # The worker is free again although the first call is still open.
    other, other_out = make_call("Scan", respond_with("scanned"))
    assert pool.offer(other)
    assert other_out.wait().result == "scanned"

    assert not out.event.wait(0.02)
    completed_from = time.monotonic()  # before respond: the latency spans at least this
    go.set()
    assert out.wait().result == "applied"
    applier.join(WAIT)
    assert out.thread == "apply-test"  # callbacks run on the completing thread
    # Handler latency spans dequeue to respond, not just the run() that returned early.
    latency = pool.metrics.handler_latency_for("Write").snapshot()
    assert latency.count == 1
    assert latency.max >= (completed_from - handed_over_at) * 1e6


def test_handler_exception_fails_the_call(pools: list[ServicePool]) -> None:
    pool = new_pool(pools)

    def boom(call: InboundCall) -> None:
        raise ValueError("bad row")

    call, out = make_call("Write", boom)
    assert pool.offer(call)
    err = out.wait().error
    assert isinstance(err, ValueError)
    assert str(err) == "bad row"
    # The worker survived: it serves the next call.
    nxt, nxt_out = make_call("Write", respond_with(1))
    assert pool.offer(nxt)
    assert nxt_out.wait().result == 1


def test_exception_after_respond_keeps_the_response(
    pools: list[ServicePool], caplog: pytest.LogCaptureFixture
) -> None:
    pool = new_pool(pools)

    def respond_then_raise(call: InboundCall) -> None:
        call.respond("answered")
        raise RuntimeError("late bug")

    call, out = make_call("Write", respond_then_raise)
    with caplog.at_level(logging.WARNING, logger="raftlet.tserver.service_pool"):
        assert pool.offer(call)
        assert out.wait().result == "answered"
        # The warning is logged after the completion the test waited for; a second call
        # through the single worker orders the two.
        nxt, nxt_out = make_call("Write", respond_with(None))
        assert pool.offer(nxt)
        nxt_out.wait()
    assert out.calls == 1
    assert "raised after completing" in caplog.text


def test_second_completion_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    call, out = make_call("Write", respond_with(None))
    with caplog.at_level(logging.DEBUG, logger="raftlet.tserver.service_pool"):
        call.respond(1)
        call.respond(2)
        call.fail(ValueError("late"))
    assert call.done
    assert out.calls == 1
    assert out.result == 1
    assert out.error is None
    assert "ignoring second completion" in caplog.text


def test_completion_races_resolve_exactly_once() -> None:
    call, out = make_call("Write", respond_with(None))
    barrier = threading.Barrier(4)

    def complete(i: int) -> None:
        barrier.wait(WAIT)
        if i % 2:
            call.respond(i)
        else:
            call.fail(ValueError(str(i)))

    threads = [threading.Thread(target=complete, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert out.calls == 1


def test_failing_callback_does_not_kill_the_worker(
    pools: list[ServicePool], caplog: pytest.LogCaptureFixture
) -> None:
    pool = new_pool(pools, queue=2)

    def bad_callback(result: object) -> None:
        raise RuntimeError("transport gone")

    with caplog.at_level(logging.ERROR, logger="raftlet.tserver.service_pool"):
        assert pool.offer(InboundCall("Write", respond_with(1), on_result=bad_callback))
        nxt, nxt_out = make_call("Write", respond_with(2))
        assert pool.offer(nxt)
        assert nxt_out.wait().result == 2
    assert "on_result callback of Write failed" in caplog.text


def test_stop_fails_queued_calls_and_joins_workers(pools: list[ServicePool]) -> None:
    pool = new_pool(pools, name="stopper", threads=2, queue=5)
    blockers = [Blocker(), Blocker()]
    running = []
    for b in blockers:
        call, out = make_call("Write", b)
        assert pool.offer(call)
        running.append(out)
    for b in blockers:
        assert b.started.wait(WAIT)
    queued = []
    for _ in range(3):
        call, out = make_call("Write", respond_with("never"))
        assert pool.offer(call)
        queued.append(out)
    workers = [t for t in threading.enumerate() if t.name.startswith("svc-stopper-")]
    assert sorted(t.name for t in workers) == ["svc-stopper-0", "svc-stopper-1"]
    assert all(t.daemon for t in workers)

    # Workers are still inside their handlers, so a short stop cannot join them...
    assert pool.stop(timeout=0.05) is False
    assert pool.stopped
    # ...but the queued calls were failed at once, not after the handlers finished.
    for out in queued:
        err = out.wait().error
        assert isinstance(err, ServiceUnavailable)
        assert str(err) == "server shutting down"
    assert pool.queue_size() == 0

    # A stopped pool refuses without calling it overload.
    late, late_out = make_call("Write", respond_with(None))
    assert pool.offer(late) is False
    assert pool.metrics.queue_overflow.value() == 0
    assert not late_out.event.is_set()

    for b in blockers:
        b.release.set()
    assert pool.stop(timeout=WAIT) is True  # running handlers finish, then workers exit
    assert all(out.wait().result == "unblocked" for out in running)
    assert not any(t.is_alive() for t in workers)
    with pytest.raises(RuntimeError, match="stopped"):
        pool.start()


def test_stop_from_a_worker_thread_does_not_deadlock(pools: list[ServicePool]) -> None:
    pool = new_pool(pools, threads=2, queue=2)
    result: list[bool] = []

    def stop_from_inside(call: InboundCall) -> None:
        result.append(pool.stop(timeout=WAIT))
        call.respond(None)

    call, out = make_call("Admin", stop_from_inside)
    assert pool.offer(call)
    out.wait()
    assert result == [True]  # the other worker exited; this one skipped joining itself


def test_offer_before_start_waits_in_the_queue() -> None:
    pool = ServicePool("late", num_threads=1, queue_length=1)
    try:
        call, out = make_call("Write", respond_with("ok"))
        assert pool.offer(call)
        assert not pool.offer(make_call("Write", respond_with(None))[0])  # still bounded
        pool.start()
        assert out.wait().result == "ok"
    finally:
        assert pool.stop(timeout=WAIT)


def test_many_calls_on_many_threads_all_complete(pools: list[ServicePool]) -> None:
    pool = new_pool(pools, threads=4, queue=200)
    outs = []
    for i in range(200):
        call, out = make_call("Write" if i % 2 else "Scan", respond_with(i))
        assert pool.offer(call)
        outs.append(out)
    assert [o.wait().result for o in outs] == list(range(200))
    assert pool.metrics.queue_time_us.snapshot().count == 200
    assert pool.metrics.handler_latency_for("Write").snapshot().count == 100
    assert pool.metrics.handler_latency_for("Scan").snapshot().count == 100


def test_invalid_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="num_threads"):
        ServicePool("x", num_threads=0)
    with pytest.raises(ValueError, match="queue_length"):
        ServicePool("x", queue_length=0)


def test_metrics_are_instantiated_on_the_entity_from_the_catalogue(
    pools: list[ServicePool],
) -> None:
    registry = MetricRegistry()
    entity = registry.entity("server", "ts-1")
    metrics = ServicePoolMetrics(entity, "tablet")
    pool = ServicePool("tablet", num_threads=1, queue_length=1, metrics=metrics)
    pools.append(pool)
    pool.start()
    blocker = Blocker()
    assert pool.offer(make_call("Write", blocker)[0])
    assert blocker.started.wait(WAIT)
    queued, queued_out = make_call("Write", respond_with(None))
    assert pool.offer(queued)
    assert not pool.offer(make_call("Write", respond_with(None))[0])
    blocker.release.set()
    queued_out.wait()  # both accepted calls ran (the latency is observed before callbacks)

    exported = {(i.prototype.name, i.labels): i.metric for i in entity.instances()}

    def counter(name: str, *labels: tuple[str, str]) -> int:
        metric = exported[(name, labels)]
        assert isinstance(metric, StripedCounter)
        return metric.value()

    def count(name: str, *labels: tuple[str, str]) -> int:
        metric = exported[(name, labels)]
        assert isinstance(metric, Histogram)
        return metric.snapshot().count

    svc = ("service", "tablet")
    assert count("rpc_incoming_queue_time_us", svc) == 2
    assert counter("rpcs_timed_out_in_queue", svc) == 0
    assert count("handler_latency_us", svc, ("method", "Write")) == 2
    # rpcs_queue_overflow is exported per method or per service, whichever the catalogue
    # declares; summed over its series it is the number of rejections.
    overflow = [
        (name, labels) for name, labels in exported if name == catalogue.RPCS_QUEUE_OVERFLOW.name
    ]
    assert overflow
    assert sum(counter(name, *labels) for name, labels in overflow) == 1
    # Looking metrics up again returns the same objects (no second series).
    assert ServicePoolMetrics(entity, "tablet").queue_time_us is metrics.queue_time_us


def test_the_overflow_series_of_every_method_exist_from_startup_at_zero() -> None:
    registry = MetricRegistry()
    entity = registry.entity("server", "ts-1")
    ServicePoolMetrics(entity, "tablet", ["Write", "Scan"])
    text = generate_prometheus_text(registry).decode()
    for method in ("Write", "Scan"):
        assert (
            f'rpcs_queue_overflow_total{{method="{method}",server="ts-1",service="tablet"}} 0.0'
            in text
        ), text


def _parked(pool: ServicePool) -> bool:
    """Whether a worker of ``pool`` sleeps waiting for a call."""
    return bool(pool._sleepers._locks)


def test_an_offer_that_wakes_a_worker_yields_the_cpu_when_asked(
    pools: list[ServicePool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``yield_on_wake`` the offering thread yields right after it wakes an idle
    worker (so the call starts before whatever else that thread has to do); an offer that
    wakes no one -- the worker busy -- does not yield, and neither does a pool without."""
    yields: list[str] = []
    monkeypatch.setattr(
        service_pool.os, "sched_yield", lambda: yields.append(threading.current_thread().name)
    )
    pool = ServicePool("yielding", num_threads=1, queue_length=2, yield_on_wake=True)
    plain = ServicePool("plain", num_threads=1, queue_length=2)
    pools += [pool, plain]
    me = threading.current_thread().name
    for p in (pool, plain):
        p.start()
        wait_for(lambda p=p: _parked(p), WAIT, "the worker asleep")
        blocker = Blocker()
        blocked, first = make_call("Write", blocker)
        assert p.offer(blocked)  # wakes the worker
        assert blocker.started.wait(WAIT)
        queued, second = make_call("Write", respond_with("ok"))
        assert p.offer(queued)  # the worker is busy: nobody to wake
        blocker.release.set()
        assert first.wait().result == "unblocked"
        assert second.wait().result == "ok"
    assert yields == [me]  # the yielding pool's first offer, on the offering thread


def test_the_handoff_yield_flag_is_on_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path)
    assert parse(config).rpc_handoff_yield is True
    assert parse(config, "--rpc_handoff_yield", "false").rpc_handoff_yield is False
    with pytest.raises(SystemExit):
        parse(config, "--rpc_handoff_yield", "sometimes")
    assert "argument --rpc_handoff_yield:" in capsys.readouterr().err
