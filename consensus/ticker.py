"""Raft ticks for every replica of a server, from one thread.

A replica's clock is a stream of ticks (``consensus.core`` counts them; it never reads a
clock).  One ``Ticker`` per server turns wall time into ticks for all its replicas: each tick
it calls every registered callback, which only queues the tick for its replica's worker
(``RaftConsensus``), so one busy or stuck replica never delays another's ticks, and a server
with 64 replicas wakes one thread per tick interval, not 64.

``ManualTicker`` has the same interface and no thread: a test calls ``tick()`` and decides
when time passes, so nothing waits for a wall-clock election.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["ManualTicker", "TickSource", "Ticker"]

logger = logging.getLogger(__name__)

TickCallback = Callable[[], None]


class TickSource:
    """What a replica registers with: ``register`` returns the function that unregisters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: dict[int, TickCallback] = {}
        self._next_key = 0

    def register(self, callback: TickCallback) -> Callable[[], None]:
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._callbacks[key] = callback

        def unregister() -> None:
            with self._lock:
                self._callbacks.pop(key, None)

        return unregister

    def tick(self) -> None:
        """One tick for every registered replica (the callbacks must not block)."""
        with self._lock:
            callbacks = list(self._callbacks.values())
        for callback in callbacks:
            try:
                callback()
            except Exception:
                logger.exception("a tick callback failed")

    def start(self) -> None:
        """Begin ticking (a no-op for a source ticked by hand)."""

    def stop(self) -> None:
        """Stop ticking (a no-op for a source ticked by hand)."""


class ManualTicker(TickSource):
    """Ticks only when ``tick()`` is called: the test is the clock."""


class Ticker(TickSource):
    """Ticks every ``interval_s`` of wall time on its own thread."""

    def __init__(self, interval_s: float, name: str = "raft-ticker") -> None:
        super().__init__()
        if interval_s <= 0:
            raise ValueError(f"tick interval must be positive, got {interval_s}")
        self.interval_s = interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._started and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        interval = self.interval_s
        next_tick = time.monotonic() + interval
        while not self._stopping.wait(max(0.0, next_tick - time.monotonic())):
            next_tick += interval
            now = time.monotonic()
            if next_tick < now:  # we fell behind (a long pause): don't burst
                next_tick = now + interval
            self.tick()
