"""Raft ticks for every replica of a server, from one thread.

A replica's clock is a stream of ticks (``consensus.core`` counts them; it never reads a
clock).  One ``Ticker`` per server turns wall time into ticks for all its replicas: each tick
it calls every registered callback, which only queues the tick for its replica's worker
(``RaftConsensus``), so one busy or stuck replica never delays another's ticks, and a server
with 64 replicas wakes one thread per tick interval, not 64.

A ``Ticker`` may deliver ticks in batches (``ticks_per_call``): with a heartbeat every 3
ticks, waking each replica every 3rd tick with 3 ticks keeps the core's fine-grained counts
(randomized election timeouts) while waking each replica's worker a third as often -- with
64 replicas per server, those wake-ups were most of an idle server's CPU.

``ManualTicker`` has the same interface and no thread: a test calls ``tick()`` and decides
when time passes, so nothing waits for a wall-clock election.

Two promises the leader lease (``consensus.raft_consensus``) builds on:
- Ticks never come faster than wall time: consecutive calls are at least
  ``interval_s * ticks_per_call`` apart, measured from the end of the previous call (a late
  call is not followed by an early one to catch up; missed ticks are dropped).  So a
  follower counts at most ``ticks_per_call`` ticks more than the time that passed.
- Stalls are noticed.  When a wake-up comes later than due by more than ``stall_margin_s``
  (a SIGSTOP, a paused VM, a long GC or swap), the ticker counts it (``stalls``) and calls
  every registered stall callback with the stall's length, before that call's ticks.  It
  logs the stall too, at most once a minute (``STALL_LOG_INTERVAL_S``), the next line
  counting the stalls in between: a process that stalls on every tick (an overloaded
  machine, a tick shorter than the scheduler's wake-up) logged one line per tick.
  Lateness is measured on ``CLOCK_BOOTTIME`` where there is one: unlike
  ``CLOCK_MONOTONIC`` it keeps counting while the machine is suspended.  ``is_on_time()``
  tells a reader, without waiting for the ticker's thread, that the ticker is not overdue
  right now -- a reader that runs first after a pause sees it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

__all__ = [
    "STALL_LOG_INTERVAL_S",
    "ManualTicker",
    "StallCallback",
    "TickSource",
    "Ticker",
    "stall_clock",
]

logger = logging.getLogger(__name__)

# At most one stall line (and one "ticker failed" line) per this many seconds.
STALL_LOG_INTERVAL_S = 60.0

# Called with the number of ticks that passed since the last call.
TickCallback = Callable[[int], None]
# Called with the seconds a stall lasted beyond the expected wake-up.
StallCallback = Callable[[float], None]


def stall_clock() -> float:
    """Seconds on a clock that counts a suspended machine's time (CLOCK_BOOTTIME, Linux);
    the monotonic clock elsewhere."""
    return time.clock_gettime(_STALL_CLOCK_ID) if _STALL_CLOCK_ID is not None else time.monotonic()


_STALL_CLOCK_ID: int | None = getattr(time, "CLOCK_BOOTTIME", None)


class TickSource:
    """What a replica registers with: ``register`` returns the function that unregisters."""

    def __init__(self, ticks_per_call: int = 1) -> None:
        if ticks_per_call < 1:
            raise ValueError(f"ticks per call must be at least 1, got {ticks_per_call}")
        self.ticks_per_call = ticks_per_call
        self._lock = threading.Lock()
        self._callbacks: dict[int, TickCallback] = {}
        self._stall_callbacks: dict[int, StallCallback] = {}
        self._next_key = 0
        # Stalls noticed so far: a reader that noted the count can tell one happened since.
        self.stalls = 0
        # The stall log's rate limit (monotonic time of the last line; stalls not logged).
        self._log_clock: Callable[[], float] = time.monotonic
        self._stall_logged_at: float | None = None
        self._stalls_unlogged = 0
        self._longest_unlogged = 0.0

    def register(
        self, callback: TickCallback, on_stall: StallCallback | None = None
    ) -> Callable[[], None]:
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._callbacks[key] = callback
            if on_stall is not None:
                self._stall_callbacks[key] = on_stall

        def unregister() -> None:
            with self._lock:
                self._callbacks.pop(key, None)
                self._stall_callbacks.pop(key, None)

        return unregister

    def report_stall(self, seconds: float) -> None:
        """This process did not run for ``seconds`` beyond a due tick: count it, log it (at
        most once a minute), tell every registered stall callback (which must not block)."""
        self.stalls += 1
        self._log_stall(seconds)
        with self._lock:
            callbacks = list(self._stall_callbacks.values())
        for callback in callbacks:
            try:
                callback(seconds)
            except Exception:
                logger.exception("a stall callback failed")

    def _log_stall(self, seconds: float) -> None:
        now = self._log_clock()
        last = self._stall_logged_at
        if last is not None and now - last < STALL_LOG_INTERVAL_S:
            self._stalls_unlogged += 1
            self._longest_unlogged = max(self._longest_unlogged, seconds)
            return
        since = ""
        if self._stalls_unlogged:
            since = (
                f" ({self._stalls_unlogged} more since the last report, the longest "
                f"{self._longest_unlogged:.3f} s late)"
            )
        self._stall_logged_at = now
        self._stalls_unlogged = 0
        self._longest_unlogged = 0.0
        # The ticker does not know the read mode, so the lease clause says when it applies:
        # with the default (read_index) there is no lease to end.
        logger.warning(
            "the process stalled: a tick came %.3f s late%s; likely causes: the machine is "
            "overloaded, the process was paused or swapped out, or --tick_interval_ms is "
            "shorter than the process can keep; any leader lease ends (leases exist only "
            "with --leader_read_mode=lease)",
            seconds,
            since,
        )

    def is_on_time(self) -> bool:
        """False while a tick is overdue by more than the stall margin (always True for a
        source ticked by hand: its test reports stalls itself)."""
        return True

    def tick(self) -> None:
        """``ticks_per_call`` ticks for every registered replica (callbacks must not block)."""
        with self._lock:
            callbacks = list(self._callbacks.values())
        for callback in callbacks:
            try:
                callback(self.ticks_per_call)
            except Exception:
                logger.exception("a tick callback failed")

    def start(self) -> None:
        """Begin ticking (a no-op for a source ticked by hand)."""

    def stop(self) -> None:
        """Stop ticking (a no-op for a source ticked by hand)."""


class ManualTicker(TickSource):
    """Ticks only when ``tick()`` is called: the test is the clock."""


class Ticker(TickSource):
    """One tick per ``interval_s`` of wall time, delivered ``ticks_per_call`` at a time on
    its own thread.  ``stall_margin_s`` (default: one call's interval) is how late a wake-up
    may be before it counts as a stall; ``clock`` measures lateness (``stall_clock``)."""

    def __init__(
        self,
        interval_s: float,
        name: str = "raft-ticker",
        ticks_per_call: int = 1,
        stall_margin_s: float | None = None,
        clock: Callable[[], float] = stall_clock,
    ) -> None:
        super().__init__(ticks_per_call)
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"tick interval must be a positive number, got {interval_s}")
        self.interval_s = interval_s
        self.call_interval_s = interval_s * ticks_per_call
        self.stall_margin_s = self.call_interval_s if stall_margin_s is None else stall_margin_s
        if self.stall_margin_s <= 0:
            raise ValueError(f"stall margin must be positive, got {self.stall_margin_s}")
        self._clock = clock
        self._due = clock() + self.call_interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._due = self._clock() + self.call_interval_s
            self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._started and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def is_on_time(self) -> bool:
        return not self._started or self._clock() - self._due <= self.stall_margin_s

    def _run(self) -> None:
        # Nothing may end this thread but stop(): without it every replica of the server
        # stays up, answering RPCs, and never ticks again -- no heartbeat, no election.
        interval = self.call_interval_s
        next_tick = time.monotonic() + interval
        failed_at: float | None = None
        while True:
            try:
                # TIMEOUT_MAX: a longer wait raises OverflowError (a tick of 1e13 ms did).
                wait = min(max(0.0, next_tick - time.monotonic()), threading.TIMEOUT_MAX)
                if self._stopping.wait(wait):
                    return
                if time.monotonic() < next_tick:
                    continue  # woke early: the spacing promise needs the whole interval
                late = self._clock() - self._due
                if late > self.stall_margin_s:
                    self.report_stall(late)
                self.tick()
                # From the end of this call: never closer than an interval, never a burst.
                next_tick = time.monotonic() + interval
                self._due = self._clock() + interval
            except Exception:
                next_tick = time.monotonic() + interval
                now = time.monotonic()
                if failed_at is None or now - failed_at >= STALL_LOG_INTERVAL_S:
                    failed_at = now
                    logger.exception(
                        "the Raft ticker failed; it ticks on after one interval (this server's "
                        "replicas miss a tick; if this repeats, restart the server)"
                    )
