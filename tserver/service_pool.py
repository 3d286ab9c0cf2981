"""Bounded service pools: the hand-off from the gRPC event loop to service threads.

Kudu's shape: every gRPC service has its own pool — one bounded queue (a deque behind one
lock; an idle worker sleeps on a wake lock of its own) feeding N worker threads. The event
loop only `offer`s a call, which never blocks: when the queue is full the call is refused at
once (RESOURCE_EXHAUSTED "service queue full") and `rpcs_queue_overflow` counts it, so overload
shows up as a number and a fast, retriable error instead of an ever-growing backlog whose
calls all time out. Separate pools keep a storm of client writes from starving consensus.

A worker pops a call, observes how long it waited (`rpc_incoming_queue_time_us`), drops it
with DEADLINE_EXCEEDED if its deadline already passed (running it could only waste work the
client no longer waits for; `rpcs_timed_out_in_queue`), else runs its handler. A handler may
complete the call before returning, or hand it on (a write is completed by the tablet's
apply thread): `handler_latency_us` is measured from dequeue to completion either way.

With `yield_on_wake`, an `offer` that wakes an idle worker yields its CPU (`sched_yield`).
The callers are the front door -- the event loop, a write connection's reader -- and under
SCHED_BATCH, on a server bound to one CPU, the worker they wake cannot run until they
block; with more input at hand the event loop goes on for up to a millisecond first, and
that was the lock-free mode's queue time at p99 in the KUDU-2727 scenario
(docs/benchmarks.md, "The front door yields to the call it hands off"). The yield costs a
system call, and the context switch it makes would have come at the caller's next block.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from raftlet.consensus.workers import Sleepers
from raftlet.metrics import catalogue
from raftlet.metrics.counter import StripedCounter
from raftlet.metrics.histogram import Histogram
from raftlet.metrics.registry import MetricEntity, MetricRegistry
from raftlet.tserver.errors import DeadlineExceededInQueue, ServiceUnavailable

__all__ = ["InboundCall", "ServicePool", "ServicePoolMetrics"]

logger = logging.getLogger(__name__)

_US_PER_S = 1_000_000


class InboundCall:
    """One RPC on its way through a service pool.

    `run(call)` is the handler; it runs on a service thread and completes the call with
    `respond(result)` or `fail(exc)`, now or later and from any thread. The first completion
    wins and is passed to `on_result` / `on_error` (given by whoever created the call — the
    gRPC glue resolves its future there); later ones are ignored, because two answers to one
    RPC is a bug that must not crash the thread that happens to make the second one.

    `deadline` is on the `time.monotonic()` clock, None for no deadline.
    """

    __slots__ = (
        "_done",
        "_latency",
        "_lock",
        "_on_error",
        "_on_result",
        "deadline",
        "enqueued_at",
        "method",
        "run",
        "started_at",
    )

    def __init__(
        self,
        method: str,
        run: Callable[[InboundCall], None],
        *,
        deadline: float | None = None,
        on_result: Callable[[object], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.method = method
        self.run = run
        self.deadline = deadline
        self._on_result = on_result
        self._on_error = on_error
        # Set by the pool: when offered, and when a worker began running the handler.
        self.enqueued_at: float | None = None
        self.started_at: float | None = None
        # The handler-latency histogram to observe into on completion; set only for calls
        # whose handler actually ran (a call dropped in the queue has no handler latency).
        self._latency: Histogram | None = None
        # Per call, because completion may race between a service thread (handler raised)
        # and an apply thread (deferred respond); held only to flip `_done`.
        self._lock = threading.Lock()
        self._done = False

    def __repr__(self) -> str:
        return f"InboundCall({self.method!r}, deadline={self.deadline!r}, done={self._done})"

    @property
    def done(self) -> bool:
        """True once `respond` or `fail` has taken effect."""
        return self._done

    def respond(self, result: object) -> None:
        """Complete the call successfully (first completion only)."""
        if self._claim("respond"):
            self._observe_latency()
            if self._on_result is not None:
                try:
                    self._on_result(result)
                except Exception:
                    # The callback is the transport's; its failure must not be reported as
                    # the handler's (nor re-enter this call through the worker's `fail`).
                    logger.exception("on_result callback of %s failed", self.method)

    def fail(self, exc: BaseException) -> None:
        """Complete the call with an error (first completion only)."""
        if self._claim("fail"):
            self._observe_latency()
            if self._on_error is not None:
                try:
                    self._on_error(exc)
                except Exception:
                    logger.exception("on_error callback of %s failed", self.method)

    def _claim(self, how: str) -> bool:
        with self._lock:
            already = self._done
            self._done = True
        if already:
            logger.debug("ignoring second completion (%s) of %r", how, self)
            return False
        return True

    def _observe_latency(self) -> None:
        latency, started = self._latency, self.started_at
        if latency is not None and started is not None:
            latency.observe((time.monotonic() - started) * _US_PER_S)


class ServicePoolMetrics:
    """The metrics of one service pool, instantiated from `metrics.catalogue` prototypes.

    `queue_overflow` is the pool's total; `queue_overflow_for(method)` and
    `handler_latency_for(method)` are per method, created on first use and cached so the hot
    path takes no registry lock.

    Whether the per-method or the total overflow count is the exported series follows the
    catalogue's `rpcs_queue_overflow` label names: with a `method` label the per-method
    counters are exported (Prometheus `sum by (service)` gives the total) and the total is
    kept here only; with `service` alone the total is exported and the per-method counts are
    kept here only. Either way both are readable from this object.
    """

    def __init__(self, entity: MetricEntity, service: str, methods: Sequence[str] = ()) -> None:
        """``methods``: the service's RPC names, whose overflow series exist from the start
        at 0 -- a dashboard must not show "no data" for the headline metric until the
        first overflow."""
        self.entity = entity
        self.service = service
        self._overflow_has_method = "method" in catalogue.RPCS_QUEUE_OVERFLOW.label_names
        self.queue_overflow: StripedCounter = (
            StripedCounter()
            if self._overflow_has_method
            else entity.counter(catalogue.RPCS_QUEUE_OVERFLOW, service=service)
        )
        self.queue_time_us: Histogram = entity.histogram(
            catalogue.RPC_INCOMING_QUEUE_TIME_US, service=service
        )
        self.timed_out_in_queue: StripedCounter = entity.counter(
            catalogue.RPCS_TIMED_OUT_IN_QUEUE, service=service
        )
        # Guards only the creation of per-method metrics; lookups read the dicts without it
        # (a dict read is atomic under the GIL and entries are never removed).
        self._lock = threading.Lock()
        self._overflow_by_method: dict[str, StripedCounter] = {}
        self._latency_by_method: dict[str, Histogram] = {}
        self._failed_by_code: dict[tuple[str, str, str], StripedCounter] = {}
        for method in methods:
            self.queue_overflow_for(method)

    @classmethod
    def standalone(cls, service: str) -> ServicePoolMetrics:
        """Metrics on a private registry: for tests and tools that run a pool alone."""
        return cls(MetricRegistry().entity("server", f"standalone-{service}"), service)

    def queue_overflow_for(self, method: str) -> StripedCounter:
        counter = self._overflow_by_method.get(method)
        if counter is None:
            with self._lock:
                counter = self._overflow_by_method.get(method)
                if counter is None:
                    counter = (
                        self.entity.counter(
                            catalogue.RPCS_QUEUE_OVERFLOW, service=self.service, method=method
                        )
                        if self._overflow_has_method
                        else StripedCounter()
                    )
                    self._overflow_by_method[method] = counter
        return counter

    def failed_for(self, method: str, code: str, error: str = "") -> StripedCounter:
        """The count of ``method``'s calls answered with status ``code`` (its name) carrying
        the ``ServerErrorPB`` code ``error`` (its name; "" when the answer carries none).
        ``error`` is what tells a not-leader redirect (FAILED_PRECONDITION, NOT_LEADER) from
        a refusal a client sees with the same status (STALE_REQUEST, a refused change)."""
        key = (method, code, error)
        counter = self._failed_by_code.get(key)
        if counter is None:
            with self._lock:
                counter = self._failed_by_code.get(key)
                if counter is None:
                    counter = self.entity.counter(
                        catalogue.RPCS_FAILED,
                        service=self.service,
                        method=method,
                        code=code,
                        error=error,
                    )
                    self._failed_by_code[key] = counter
        return counter

    def handler_latency_for(self, method: str) -> Histogram:
        hist = self._latency_by_method.get(method)
        if hist is None:
            with self._lock:
                hist = self._latency_by_method.get(method)
                if hist is None:
                    hist = self.entity.histogram(
                        catalogue.HANDLER_LATENCY_US, service=self.service, method=method
                    )
                    self._latency_by_method[method] = hist
        return hist


class ServicePool:
    """A bounded queue of `InboundCall`s served by `num_threads` daemon worker threads.

    `offer` may be called before `start()` (calls wait in the queue, still bounded) so a
    server can wire its services before it spins up threads. `stop()` is final.
    """

    def __init__(
        self,
        name: str,
        *,
        num_threads: int = 10,
        queue_length: int = 50,
        metrics: ServicePoolMetrics | None = None,
        yield_on_wake: bool = False,
    ) -> None:
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        # Workers take calls only from the queue, so a zero-length queue would refuse all.
        if queue_length < 1:
            raise ValueError(f"queue_length must be >= 1, got {queue_length}")
        self.name = name
        self._num_threads = num_threads
        self.queue_length = queue_length
        self.metrics = metrics if metrics is not None else ServicePoolMetrics.standalone(name)
        # One lock: `offer` holds it for an append, a worker for a pop, so the event loop
        # never waits behind a handler.  `offer` wakes an idle worker through `_sleepers`.
        self._mutex = threading.Lock()
        self._sleepers = Sleepers()
        # See the module docstring; not every platform has sched_yield.
        self._yield = getattr(os, "sched_yield", None) if yield_on_wake else None
        self._queue: deque[InboundCall] = deque()
        self._stopping = False
        self._threads: list[threading.Thread] = []

    def __repr__(self) -> str:
        return (
            f"ServicePool({self.name!r}, threads={self._num_threads}, "
            f"queued={len(self._queue)}/{self.queue_length})"
        )

    @property
    def num_threads(self) -> int:
        return self._num_threads

    @property
    def stopped(self) -> bool:
        """True once `stop()` began: `offer` refuses everything from then on."""
        return self._stopping

    def queue_size(self) -> int:
        """Calls waiting for a worker (not counting the ones being run)."""
        return len(self._queue)

    def start(self) -> None:
        """Start the worker threads (idempotent; a stopped pool cannot be restarted)."""
        with self._mutex:
            if self._stopping:
                raise RuntimeError(f"service pool {self.name!r} is stopped")
            if self._threads:
                return
            self._threads = [
                threading.Thread(target=self._work, name=f"svc-{self.name}-{i}", daemon=True)
                for i in range(self._num_threads)
            ]
        for t in self._threads:
            t.start()

    def offer(self, call: InboundCall, requests: int = 1) -> bool:
        """Queue `call` if there is room. Never blocks; False means it was not queued.

        A refusal because the queue is full is counted in `rpcs_queue_overflow` (total and
        per method), as `requests` refusals: a write stream's frame is one call for all its
        writes, each refused to its client (counted once, the overflows of asyncio clients
        read a fifth of the refusals they met: review r34b). A refusal because the pool is
        stopping is not counted -- it is no overload.
        """
        call.enqueued_at = time.monotonic()
        with self._mutex:
            if self._stopping:
                return False
            if len(self._queue) < self.queue_length:
                self._queue.append(call)
                waker = self._sleepers.take_one()
                queued = True
            else:
                queued = False
        if queued:
            if waker is not None:
                waker.release()
                if self._yield is not None:
                    self._yield()  # let the woken worker start the call now
            return True
        # Counted outside the lock: the counters need none, and the lock is the queue's.
        self.metrics.queue_overflow.increment(requests)
        self.metrics.queue_overflow_for(call.method).increment(requests)
        return False

    def stop(self, timeout: float | None = None) -> bool:
        """Stop accepting, fail queued calls with ServiceUnavailable, join the workers.

        Handlers already running are let finish (up to `timeout` seconds in all); calls
        they handed on are completed by whoever holds them. Returns True if every worker
        exited in time. Safe to call more than once and from a worker thread.
        """
        with self._mutex:
            self._stopping = True
            leftover = list(self._queue)
            self._queue.clear()
            sleepers = self._sleepers.take_all()
        for waker in sleepers:
            waker.release()
        # Failed outside the lock: completion runs callbacks, which must not hold up offers.
        # Before the join, so queued clients hear at once rather than after the last handler.
        for call in leftover:
            call.fail(ServiceUnavailable("server shutting down"))
        deadline = None if timeout is None else time.monotonic() + timeout
        me = threading.current_thread()
        for t in self._threads:
            if t is me:
                continue
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads if t is not me)

    def _work(self) -> None:
        waker = Sleepers.new_waker()  # released by the offer (or stop) that gives it work
        while True:
            with self._mutex:
                if self._stopping:
                    # Whatever is still queued is failed by stop(), not run: a shutting-down
                    # server should not start new work.
                    return
                if self._queue:
                    call = self._queue.popleft()
                else:
                    self._sleepers.park(waker)
                    call = None
            if call is None:
                waker.acquire()
                continue
            self._handle(call)

    def _handle(self, call: InboundCall) -> None:
        now = time.monotonic()
        enqueued = call.enqueued_at if call.enqueued_at is not None else now
        waited = now - enqueued
        metrics = self.metrics
        metrics.queue_time_us.observe(waited * _US_PER_S)
        if call.deadline is not None and now >= call.deadline:
            metrics.timed_out_in_queue.increment()
            call.fail(DeadlineExceededInQueue(self.name, call.method, waited))
            return
        call.started_at = now
        call._latency = metrics.handler_latency_for(call.method)
        try:
            call.run(call)
        except Exception as exc:
            if call.done:
                # The handler answered and then raised: the client has its answer, but the
                # handler has a bug worth seeing.
                logger.warning(
                    "handler of %s raised after completing its call", call.method, exc_info=True
                )
            else:
                call.fail(exc)
