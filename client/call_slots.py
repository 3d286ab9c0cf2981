"""Slots for calls to one server, handed out in the order they were asked for.

``threading.Semaphore`` lets a thread that releases a slot take it straight back -- it holds
the GIL while the woken waiter has yet to run -- so with a few more threads than slots, each
looping over calls, the same few waited out their whole timeout while the rest went round
(a reviewer's 34 scanning threads on 32 slots: 4 timeouts in 20 s, every server thread idle).
Here a released slot goes to the thread that has waited longest, before anyone else can take
it.
"""

from __future__ import annotations

import threading
from collections import deque

__all__ = ["NEVER_SENT", "FairSlots"]

# How a call that got no slot says so (``channels.NoCallSlot``; ``retry`` tells it by this).
NEVER_SENT = "the call was never sent"


class FairSlots:
    """``count`` slots; ``acquire`` waits in line (first come, first served)."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"slots: need at least 1, got {count}")
        self.count = count
        self._lock = threading.Lock()
        self._free = count
        # One locked lock per waiting thread, oldest first: released to hand it a slot.
        self._waiters: deque[threading.Lock] = deque()

    def acquire(self, timeout: float) -> bool:
        """Take a slot, waiting up to ``timeout`` seconds; whether one was taken."""
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return True
            if timeout <= 0:
                return False
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        try:
            if turn.acquire(timeout=timeout):
                return True
        except BaseException:  # interrupted (Ctrl-C): leave the line, and any slot handed
            if not self._leave(turn):
                self.release()
            raise
        return not self._leave(turn)

    def _leave(self, turn: threading.Lock) -> bool:
        """Take ``turn`` out of the line; False if it was handed a slot already."""
        with self._lock:
            try:
                self._waiters.remove(turn)
            except ValueError:
                return False
            return True

    def release(self) -> None:
        """Give a slot back: to the longest waiting thread, if any."""
        with self._lock:
            if self._waiters:
                self._waiters.popleft().release()
            elif self._free < self.count:
                self._free += 1
            else:
                raise ValueError("slots: released more often than acquired")

    def in_use(self) -> int:
        """Slots taken now."""
        with self._lock:
            return self.count - self._free
