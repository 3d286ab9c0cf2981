"""A drop-in ``threading.Lock``/``RLock`` that measures how long threads wait for it.

Fast path (the lock is free): exactly one non-blocking try on the inner lock. The would-be
holder's site (file, line, thread id, from ``sys._getframe`` without walking the stack)
and a striped attempt count are taken just *before* the try, and a successful try is
followed by one attribute store. Nothing is timed; ``acquisitions()`` is attempts minus
failed attempts.

Slow path (the try failed): the blocking acquire is timed; the wait is added (in µs,
rounded up so any real wait is visible) to the contention counter, observed into the wait
histogram, and counted as a contended acquisition. A wait longer than the trace threshold
logs one line at WARNING, "Waited N ms on lock <name>", with the acquisition sites of the
holder the waiter first found and of the one that handed the lock to it, the waiter thread,
and how many other waits went over the threshold since the last such line; the waiter's
stack follows at DEBUG. At most one such report per ``_TRACE_INTERVAL_S`` for the whole
process, all locks together: a server has a lock per tablet, and a limit per lock let 64
tablets log 64 reports a second.

Both paths are arranged so that the critical section contains as few points as possible
where the GIL can switch threads (none at all for ``with lock:`` on the fast path): see
the comment on the Lock interface for why a profiled lock must care.

The lock works as a ``threading.Condition``'s lock: it provides ``_is_owned``,
``_release_save`` and ``_acquire_restore`` (as ``RLock`` does), and re-acquiring after
``wait`` goes through the profiled path, so waiting for a notifier to leave its critical
section counts as contention, which it is.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from operator import attrgetter, methodcaller
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from raftlet.metrics.counter import StripedCounter
from raftlet.metrics.histogram import Histogram

__all__ = [
    "ProfiledLock",
    "get_lock_contention_trace_threshold_ms",
    "set_lock_contention_trace_threshold_ms",
]

_log = logging.getLogger(__name__)

# The --lock_contention_trace_threshold_ms flag (tserver.settings). Read on each slow acquire (not
# copied into locks), so setting it after locks exist still takes effect.
_trace_threshold_ms: float = 100.0

_TRACE_INTERVAL_S = 10.0  # at most one trace report per this many seconds, all locks together

# (filename, line number, thread ident). The ident, not the Thread or its name: get_ident()
# is a C call, current_thread() a Python one costing twice as much on every acquire. Names
# are looked up only when a trace is logged.
_Site = tuple[str, int, int]


def set_lock_contention_trace_threshold_ms(ms: float) -> None:
    """Set the default wait above which a contended acquire is logged (locks built without
    their own ``trace_threshold_ms``)."""
    global _trace_threshold_ms
    if ms < 0:
        raise ValueError(f"threshold must be >= 0, got {ms}")
    _trace_threshold_ms = float(ms)


def get_lock_contention_trace_threshold_ms() -> float:
    return _trace_threshold_ms


class _InnerOps:
    """The inner lock's acquires and the clock as attribute reads, evaluated entirely in C:
    reading a property whose getter is an ``operator.methodcaller`` makes no call from
    bytecode, so it is not followed by a point where the GIL can switch threads (see the
    comment on the Lock interface). Releasing needs no such trick: the switch point after a
    call to ``release()`` comes once the lock is already free."""

    __slots__ = ("acquire", "perf_counter_ns")

    if TYPE_CHECKING:
        # Any, so that mypy does not carry one read's narrowed result over to the next.
        ok: Any  # acquire(False): the non-blocking try
        wait: Any  # acquire(): block until acquired
        now: int  # time.perf_counter_ns()
    else:
        ok = property(methodcaller("acquire", False))
        wait = property(methodcaller("acquire"))
        now = property(methodcaller("perf_counter_ns"))

    def __init__(self, acquire: Any) -> None:
        self.acquire = acquire
        self.perf_counter_ns = time.perf_counter_ns


class ProfiledLock:
    """See the module docstring. ``reentrant=True`` wraps an ``RLock``."""

    __slots__ = (
        "_attempts",
        "_contended",
        "_contention",
        "_exit",
        "_failures",
        "_holder_site",
        "_lock",
        "_name",
        "_ops",
        "_reentrant",
        "_release",
        "_trace_threshold_ms",
        "_wait_histogram",
    )

    def __init__(
        self,
        name: str,
        *,
        reentrant: bool = False,
        contention_counter: StripedCounter | None = None,
        wait_histogram: Histogram | None = None,
        trace_threshold_ms: float | None = None,
    ) -> None:
        self._name = name
        self._reentrant = reentrant
        self._lock: Any = threading.RLock() if reentrant else threading.Lock()
        # Own statistics are created when none are given, so every lock can be asked for
        # its contention; the registry passes in the ones it exports.
        if contention_counter is None:
            contention_counter = StripedCounter()
        self._contention = contention_counter
        self._wait_histogram = wait_histogram if wait_histogram is not None else Histogram()
        # acquisitions = attempts - failures: attempts are counted *before* taking the inner
        # lock (see the comment on the Lock interface), failures on the rare failing paths.
        self._attempts = StripedCounter()
        self._failures = StripedCounter()
        self._contended = StripedCounter()
        # The inner lock's own C methods, served as release and __exit__, and its acquires
        # as attribute reads (see the comment on the Lock interface).
        self._release = self._lock.release
        self._exit = self._lock.__exit__
        self._ops = _InnerOps(self._lock.acquire)
        self._trace_threshold_ms = trace_threshold_ms
        self._holder_site: _Site | None = None

    # ---- the Lock interface -------------------------------------------------------------
    #
    # Keeping the critical section free of GIL switch points. Under the GIL a running thread
    # gives way only at the interpreter's check points: entering a Python function, a
    # backward jump, and the return of a call made from bytecode. If a switch falls while a
    # thread holds the lock, every thread that runs next blocks on it; and a waiter that is
    # then handed the lock holds it while it waits up to a switch interval (5 ms) for the
    # GIL, so the others queue behind it too: a convoy, which sustains itself as long as the
    # lock stays busy. `with threading.Lock():` around call-free code has no check point
    # inside and never starts one; a wrapper that calls anything while holding the lock
    # does. Measured with 16 threads taking an idle lock (bench/term_check.py): with this
    # bookkeeping done after taking the lock, contention appeared out of nothing (p99
    # 0.4-0.9 ms, 0.1-0.5 M ops/s); done before it, p99 ~3 µs, ~0.6 M ops/s, no contention.
    # So:
    # - everything that calls (frame, thread id, the attempt count) happens *before* the
    #   inner acquire, and after it only one attribute store;
    # - the try itself is an attribute read (_InnerOps.ok: a property whose getter is a C
    #   methodcaller), not a call from bytecode, whose return would be a check point with
    #   the lock already held;
    # - release and __exit__ are the inner lock's own C methods, fetched by a C attrgetter,
    #   so leaving the critical section runs no Python frame either.
    # `with lock:` thus has no check point inside; an explicit acquire() keeps one (the
    # return from the call to it), so `with` is the form for hot paths. The contended path
    # keeps a few (the histogram observe and its return), see _acquire_contended.

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not blocking and timeout != -1:
            raise ValueError("can't specify a timeout for a non-blocking call")
        caller = sys._getframe(1)
        site = (caller.f_code.co_filename, caller.f_lineno, threading.get_ident())
        self._attempts.increment()
        if self._ops.ok:  # the one non-blocking try on the inner lock
            self._holder_site = site
            return True
        if not blocking:
            self._failures.increment()
            return False
        return self._acquire_contended(caller, site, timeout)

    def __enter__(self) -> bool:
        # acquire()'s fast path again rather than a call to it, so that the site is the
        # `with` statement and the try is not followed by a return from a call.
        caller = sys._getframe(1)
        site = (caller.f_code.co_filename, caller.f_lineno, threading.get_ident())
        self._attempts.increment()
        if self._ops.ok:
            self._holder_site = site
            return True
        return self._acquire_contended(caller, site, -1)

    if TYPE_CHECKING:

        def release(self) -> None: ...

        def __exit__(
            self,
            exc_type: type[BaseException] | None,
            exc: BaseException | None,
            tb: TracebackType | None,
        ) -> None: ...

    else:
        # The holder site is deliberately kept on release: it is the *last* holder's, which
        # is what the next waiter to get the lock wants to report.
        release = property(attrgetter("_release"), doc="Release the lock (the inner lock's).")
        __exit__ = property(attrgetter("_exit"))

    def locked(self) -> bool:
        if not self._reentrant:
            return bool(self._lock.locked())
        # RLock has no locked() before Python 3.14.
        if self._lock._is_owned():
            return True
        if self._lock.acquire(False):
            self._lock.release()
            return False
        return True

    # ---- what threading.Condition looks for -----------------------------------------------

    def _is_owned(self) -> bool:
        if self._reentrant:
            return bool(self._lock._is_owned())
        # threading.Condition's own fallback for a plain Lock, done on the inner lock so it
        # neither counts as an acquisition nor overwrites the holder site.
        if self._lock.acquire(False):
            self._lock.release()
            return False
        return True

    def _release_save(self) -> Any:
        if self._reentrant:
            return self._lock._release_save()  # (recursion count, owner)
        self._lock.release()
        return None

    def _acquire_restore(self, state: Any) -> None:
        # Re-acquire through the profiled path, then restore an RLock's recursion depth with
        # reentrant acquires, which cannot block because this thread now owns the lock.
        self.acquire()
        if self._reentrant:
            count, _owner = state
            for _ in range(count - 1):
                self._lock.acquire()

    def condition(self) -> threading.Condition:
        """``threading.Condition(self)``, typed: typeshed admits only Lock/RLock there."""
        return threading.Condition(cast(Any, self))

    # ---- statistics ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def contention_counter(self) -> StripedCounter:
        return self._contention

    @property
    def wait_histogram(self) -> Histogram:
        return self._wait_histogram

    def contention_time_us(self) -> int:
        """Total µs threads have spent blocked on this lock."""
        return self._contention.value()

    def acquisitions(self) -> int:
        """Successful acquisitions, contended or not (reentrant ones included). An acquire
        still in progress may already be counted."""
        return self._attempts.value() - self._failures.value()

    def contended_acquisitions(self) -> int:
        """Successful acquisitions that had to wait."""
        return self._contended.value()

    def __repr__(self) -> str:
        state = "locked" if self.locked() else "unlocked"
        return f"<ProfiledLock {self._name!r} {state}>"

    # ---- the slow path --------------------------------------------------------------------

    def _acquire_contended(self, caller: Any, site: _Site, timeout: float) -> bool:
        """Block for the lock (the non-blocking try has failed) and record the wait.

        The recording is done with the lock held (it must be: the wait is only known once
        the lock is had), so it keeps switch points few: the untimed acquire and the clock
        are attribute reads (_InnerOps), the counters are bumped in their per-thread cells
        inline; what is left is the histogram observe and this method's return.
        """
        ops = self._ops
        first_holder = self._holder_site
        acquired: bool
        if timeout < 0:
            start = ops.now
            acquired = ops.wait
            waited_ns = ops.now - start
        else:
            start = time.perf_counter_ns()
            acquired = self._lock.acquire(True, timeout)  # timed waits are rare
            waited_ns = time.perf_counter_ns() - start
        # Read before overwriting it: the site of the holder that handed the lock over.
        last_holder = self._holder_site
        waited_us = -(-waited_ns // 1000)  # rounded up: a real wait never reads as 0
        if acquired:
            self._holder_site = site
            # StripedCounter.increment, inlined: its cell is a one-element list in a
            # threading.local, and reaching it is attribute reads, not calls. A thread's
            # first contended acquire registers its cell through the method.
            try:
                self._contended._local.cell[0] += 1
            except AttributeError:
                self._contended.increment()
        else:
            self._failures.increment()
        # A failed (timed out) wait is still time lost to contention.
        try:
            self._contention._local.cell[0] += waited_us
        except AttributeError:
            self._contention.increment(waited_us)
        self._wait_histogram.observe(waited_ns / 1000.0)
        threshold_ms = self._trace_threshold_ms
        if threshold_ms is None:
            threshold_ms = _trace_threshold_ms
        if waited_ns > threshold_ms * 1e6:
            self._trace(waited_ns, caller, first_holder, last_holder, acquired)
        return acquired

    def _trace(
        self,
        waited_ns: int,
        caller: Any,
        first_holder: _Site | None,
        last_holder: _Site | None,
        acquired: bool,
    ) -> None:
        report = _trace_limit.admit(waited_ns)
        if report is None:
            return
        more, longest_ns = report
        names = {t.ident: t.name for t in threading.enumerate()}
        holders = f"holder when the wait began: {_describe(first_holder, names)}"
        if last_holder != first_holder:
            holders += f"; last holder before this thread: {_describe(last_holder, names)}"
        waiter = threading.current_thread().name
        since = ""
        if more:
            since = (
                f"; {more} more wait{'s' if more != 1 else ''} over the threshold on any lock "
                f"since the last report, the longest {longest_ns // 1_000_000} ms"
            )
        _log.warning(
            "Waited %d ms on lock %s%s (%s; waiter: thread %r)%s; every thread's stack: "
            "/stacks on the server's status page; lock wait totals: `raftlet metrics "
            "--filter lock`",
            waited_ns // 1_000_000,
            self._name,
            "" if acquired else " and timed out",
            holders,
            waiter,
            since,
        )
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug(
                "stack of thread %r, which waited %d ms on lock %s:\n%s",
                waiter,
                waited_ns // 1_000_000,
                self._name,
                "".join(traceback.format_stack(caller)).rstrip("\n"),
            )


class _TraceLimit:
    """The process-wide rate limit of the wait reports, counting the waits it holds back.

    Its lock makes check-and-set atomic when several waiters trip it together; it is only
    reached after a wait above the threshold."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._gate = threading.Lock()
        self._last = -float("inf")
        self._held_back = 0
        self._longest_held_back_ns = 0

    def admit(self, waited_ns: int) -> tuple[int, int] | None:
        """None if this wait is not to be reported; else the number of waits held back
        since the last report and the longest of them, in ns."""
        with self._gate:
            now = self._clock()
            if now - self._last < _TRACE_INTERVAL_S:
                self._held_back += 1
                self._longest_held_back_ns = max(self._longest_held_back_ns, waited_ns)
                return None
            self._last = now
            report = (self._held_back, self._longest_held_back_ns)
            self._held_back = 0
            self._longest_held_back_ns = 0
            return report


_trace_limit = _TraceLimit()


def _describe(site: _Site | None, names: dict[int | None, str]) -> str:
    if site is None:
        return "unknown"
    filename, lineno, ident = site
    if ident == threading.get_ident():
        # A waiter is never the holder, so this is the waiter's own earlier site: the real
        # holder had taken the inner lock but not yet recorded itself (the two steps are not
        # atomic, and a GIL switch can fall between them).
        return "not recorded yet"
    thread = repr(names[ident]) if ident in names else f"{ident} (exited)"
    return f"{filename}:{lineno} in thread {thread}"
