"""What the connections of one listening port may hold of a server while frames arrive.

A ``FrameLink`` keeps the bytes of a frame until the frame is whole, and a frame may be as
long as the port's message limit (16 MiB by default). Unbounded, a client that starts many
large frames and stops sending -- stopped by a debugger, hung, or hostile -- pins all those
bytes for as long as its connections stay open: connections each holding a 16 MiB frame
one byte short took a server from 56 to 316 MiB (sixteen of them) and 580 MiB
(thirty-two), for good, and the write port takes 1,024 connections. Two bounds, for the
links a ``TcpListener`` accepts:

- **A frame's deadline**: once a frame's first bytes are in, the rest must arrive within
  ``frame_deadline_s``, or the link is closed (freeing what it held). A client that sends
  nothing between frames is not affected: an idle link holds nothing.
- **A byte budget shared by the port's links**: a frame longer than ``reserve_above_bytes``
  reserves its announced length before the reader takes in more of it. When the budget
  is spent the reader stops reading that connection -- TCP's flow control then holds the
  sender back -- until other frames finish (or their deadlines pass), and closes the link
  if the wait outlasts the frame's deadline. Frames waiting for room hold no reservation,
  and a reservation is only waited for, never held while waiting, so the links that hold
  the budget can always finish their frames. Small frames (every single-row write,
  heartbeats, answers) never touch the budget.

So what a port's links hold is at most the budget plus, per connection, one read and one
small frame, and for no longer than a frame's deadline.

What this does not do: a frame reserves what its header announces, before its bytes come,
so a few connections that announce large frames and then trickle them hold the budget for
a deadline at a time, and delay other large frames (not small ones) meanwhile -- a review
blocked 200 KB batch writes with four such connections. Reserving bytes only as they
arrive would instead let honest large frames that arrive together each hold part of the
budget and wait for each other until their deadlines. Who may open connections at all is
TLS's business (mutual TLS, the writer role on the write port).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ReceiveBudget", "ReceiveLimits", "receive_limits_for"]

# Slow links still carry the largest frame well within it (16 MiB in a minute is ~2 Mbit/s).
FRAME_DEADLINE_S = 60.0
RESERVE_ABOVE_BYTES = 64 * 1024
# At least a few of the largest frames at once, and never less than one.
_BUDGET_FRAMES = 4
_BUDGET_FLOOR_BYTES = 64 * 1024 * 1024
_GIVEN_UP_POLL_S = 0.25


class ReceiveBudget:
    """Bytes that frames arriving on one port may hold, reserved frame by frame."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"a receive budget must be positive, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self._held = 0
        self._freed = threading.Condition()

    def held(self) -> int:
        with self._freed:
            return self._held

    def reserve(
        self, nbytes: int, timeout_s: float, given_up: Callable[[], bool] = lambda: False
    ) -> bool:
        """Reserve ``nbytes``, waiting up to ``timeout_s`` for room; False if none came or
        ``given_up()`` turned true meanwhile (looked at every ``_GIVEN_UP_POLL_S``: a link
        closed under a waiting reader). A request over the whole budget is granted once
        nothing else is held, so a frame the port's limit allows is never refused for its
        size alone."""
        deadline = time.monotonic() + timeout_s
        with self._freed:
            while self._held > 0 and self._held + nbytes > self.limit_bytes:
                left = deadline - time.monotonic()
                if left <= 0 or given_up():
                    return False
                self._freed.wait(min(left, _GIVEN_UP_POLL_S))
            self._held += nbytes
            return True

    def release(self, nbytes: int) -> None:
        with self._freed:
            self._held -= nbytes
            self._freed.notify_all()


@dataclass(frozen=True)
class ReceiveLimits:
    """The bounds a port's links apply while frames arrive (see the module's docstring)."""

    budget: ReceiveBudget
    frame_deadline_s: float = FRAME_DEADLINE_S
    reserve_above_bytes: int = RESERVE_ABOVE_BYTES


def receive_limits_for(
    max_frame_bytes: int, frame_deadline_s: float = FRAME_DEADLINE_S
) -> ReceiveLimits:
    """A port's limits for frames of at most ``max_frame_bytes``."""
    budget = max(_BUDGET_FRAMES * max_frame_bytes, _BUDGET_FLOOR_BYTES)
    return ReceiveLimits(ReceiveBudget(budget), frame_deadline_s=frame_deadline_s)
