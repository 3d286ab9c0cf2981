"""Callbacks at a deadline, for every replica of a server, from one thread.

The ticker's 100 ms grain is Raft's clock; some decisions need a finer one -- a leader that
holds a round's writes back for a few milliseconds (``tserver.tablet_replica``, "lingering")
must let them go on time, with no write coming in to look; a failed replica's apply stage
retries after a backoff.  A ``Timers`` runs such callbacks on one thread of its own, started
with the first one, so a server with 64 replicas has one such thread, not one per wait
(``threading.Timer`` starts a thread for each).  Callbacks run on that thread in deadline
order and must be short: they post to a mailbox and return.  A callback's failure is
logged, never the thread's end.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["Timers"]

logger = logging.getLogger(__name__)


class Timers:
    """One thread that runs callbacks once their deadline (monotonic clock) has passed."""

    def __init__(
        self, name: str = "timers", *, thread_start: Callable[[], None] | None = None
    ) -> None:
        self.name = name
        self._thread_start = thread_start
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()  # equal deadlines run in the order they came
        self._thread: threading.Thread | None = None
        self._stopped = False

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> bool:
        """Run ``callback`` on the timer thread ``delay_s`` from now; False (and never run)
        once stopped."""
        deadline = time.monotonic() + max(0.0, delay_s)
        with self._cond:
            if self._stopped:
                return False
            # Only an earlier head moves the thread's wake-up: a later one need not wake it.
            earliest = not self._heap or deadline < self._heap[0][0]
            heapq.heappush(self._heap, (deadline, next(self._order), callback))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            elif earliest:
                self._cond.notify()
        return True

    def pending(self) -> int:
        """Callbacks not run yet."""
        with self._cond:
            return len(self._heap)

    def stop(self, timeout: float = 10.0) -> None:
        """Drop what has not run and end the thread (waits for a callback running now)."""
        with self._cond:
            self._stopped = True
            self._heap.clear()
            thread = self._thread
            self._cond.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        if self._thread_start is not None:
            self._thread_start()
        while True:
            with self._cond:
                while True:
                    if self._stopped:
                        return
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        callback = heapq.heappop(self._heap)[2]
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
            try:
                callback()
            except Exception:
                logger.exception("%s: a callback failed", self.name)
