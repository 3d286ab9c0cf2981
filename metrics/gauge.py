"""Gauges: a value that is set (or nudged) and a value computed when it is read."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

__all__ = ["FunctionGauge", "Gauge"]

_log = logging.getLogger(__name__)

# A broken FunctionGauge is read on every scrape; one log line per this many seconds is
# enough to notice it without flooding the log.
_ERROR_LOG_INTERVAL_S = 60.0


class Gauge:
    """A value that goes up and down.

    ``set`` is a single attribute store (atomic under the GIL). ``increment`` and
    ``decrement`` are read-modify-write, so they take a small lock: gauges track things like
    queue lengths that change far less often than counters are bumped, so it never matters.
    """

    __slots__ = ("_lock", "_value")

    def __init__(self, value: float = 0) -> None:
        self._value = value
        self._lock = threading.Lock()

    def set(self, v: float) -> None:
        self._value = v

    def increment(self, n: float = 1) -> None:
        with self._lock:
            self._value += n

    def decrement(self, n: float = 1) -> None:
        with self._lock:
            self._value -= n

    def value(self) -> float:
        return self._value

    def __repr__(self) -> str:
        return f"Gauge({self._value!r})"


class FunctionGauge:
    """A gauge whose value is ``fn()`` at read time (e.g. the current Raft term).

    An exception from ``fn`` is logged (rate-limited) and read as NaN: a broken gauge must
    never break the exporter that reads every metric.
    """

    __slots__ = ("_fn", "_last_error_log")

    def __init__(self, fn: Callable[[], float]) -> None:
        self._fn = fn
        self._last_error_log = -math.inf

    def value(self) -> float:
        try:
            return float(self._fn())
        except Exception:
            now = time.monotonic()
            if now - self._last_error_log >= _ERROR_LOG_INTERVAL_S:
                self._last_error_log = now
                _log.warning("function gauge %r raised; reporting NaN", self._fn, exc_info=True)
            return math.nan

    def __repr__(self) -> str:
        return f"FunctionGauge({self._fn!r})"
