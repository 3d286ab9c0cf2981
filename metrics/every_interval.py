"""``EveryInterval``: when a log line that each event would repeat is due -- at most one per
interval, the events in between only counted, so the line can say how many it stands for.
Anything a remote party can cause at its own rate (refused connections, bytes that are no
raftlet frames) is logged through one: a line per event let anyone who reaches a port fill
the log at the rate they connect (review r34b: 400 lines in a second)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["EveryInterval", "held_back"]


class EveryInterval:
    """At most one line per ``interval_s`` of ``clock``. Thread-safe."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._next: float | None = None  # None: the first event is said at once
        self._unsaid = 0

    def due(self) -> int | None:
        """An event: None if its line is not due (it is counted), else how many events the
        line stands for -- this one and those held back since the last line."""
        now = self._clock()
        with self._lock:
            if self._next is not None and now < self._next:
                self._unsaid += 1
                return None
            events, self._unsaid, self._next = self._unsaid + 1, 0, now + self._interval_s
        return events


def held_back(events: int, what: str = "") -> str:
    """What a due line adds for the ``events`` it stands for (``EveryInterval.due``): ""
    for itself alone, else " (N more[ what] since the last line)"."""
    if events <= 1:
        return ""
    return f" ({events - 1} more{' ' + what if what else ''} since the last line)"
