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
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["ManualTicker", "TickSource", "Ticker"]

logger = logging.getLogger(__name__)

# Called with the number of ticks that passed since the last call.
TickCallback = Callable[[int], None]


class TickSource:
    """What a replica registers with: ``register`` returns the function that unregisters."""

    def __init__(self, ticks_per_call: int = 1) -> None:
        if ticks_per_call < 1:
            raise ValueError(f"ticks per call must be at least 1, got {ticks_per_call}")
        self.ticks_per_call = ticks_per_call
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
    its own thread."""

    def __init__(
        self, interval_s: float, name: str = "raft-ticker", ticks_per_call: int = 1
    ) -> None:
        super().__init__(ticks_per_call)
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
        interval = self.interval_s * self.ticks_per_call
        next_tick = time.monotonic() + interval
        while not self._stopping.wait(max(0.0, next_tick - time.monotonic())):
            next_tick += interval
            now = time.monotonic()
            if next_tick < now:  # we fell behind (a long pause): don't burst
                next_tick = now + interval
            self.tick()
