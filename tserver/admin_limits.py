"""Rate limits on the admin service's operations that change cluster state.

``LeaderStepDown`` moves leadership: each accepted one costs the tablet an election's worth
of unavailability for writes (the old leader stops accepting them at once, the new one must
commit a NO_OP first). An unauthenticated loop of step-downs (a probe made 116 in 10 s) keeps
a tablet leaderless most of the time. ``StepDownLimiter`` accepts at most one step-down per
tablet per interval on this server -- the server uses one election timeout, the time a
leadership change takes anyway -- and refuses the rest, which the admin servicer answers
with RESOURCE_EXHAUSTED (clients back off and retry, so an operator's single step-down
right after another still goes through, a moment later).

Only tablets this server hosts are ever tracked (the servicer checks first), so random
tablet ids cannot grow the table.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["StepDownGrant", "StepDownLimiter", "StepDownRefused"]


@dataclass(frozen=True, slots=True)
class StepDownGrant:
    """A step-down the limiter let through; ``release`` it if it did not happen."""

    tablet_id: str
    at: float
    previous: float | None


@dataclass(frozen=True, slots=True)
class StepDownRefused:
    """Too soon after the last accepted step-down of the tablet."""

    tablet_id: str
    since_last_s: float
    interval_s: float

    @property
    def retry_after_s(self) -> float:
        return max(0.0, self.interval_s - self.since_last_s)

    def message(self) -> str:
        return (
            f"LeaderStepDown of tablet {self.tablet_id} refused: this server accepted one "
            f"{self.since_last_s:.2f} s ago and accepts at most one per tablet every "
            f"{self.interval_s:.2f} s (an election timeout); retry in "
            f"{self.retry_after_s:.2f} s"
        )


class StepDownLimiter:
    """At most one accepted step-down per tablet per ``interval_s``. Thread-safe; every
    method is a dictionary operation under a lock, so it may run on the event loop."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}  # tablet id -> when its last step-down was accepted

    def acquire(self, tablet_id: str) -> StepDownGrant | StepDownRefused:
        with self._lock:
            now = self._clock()
            last = self._last.get(tablet_id)
            if last is not None and now - last < self.interval_s:
                return StepDownRefused(tablet_id, now - last, self.interval_s)
            self._last[tablet_id] = now
            return StepDownGrant(tablet_id, now, last)

    def release(self, grant: StepDownGrant) -> None:
        """Undo ``grant`` (the step-down failed: not the leader, a bad target), so that a
        refused attempt does not hold up a valid one. Ignored if a later grant replaced it."""
        with self._lock:
            if self._last.get(grant.tablet_id) != grant.at:
                return
            if grant.previous is None:
                del self._last[grant.tablet_id]
            else:
                self._last[grant.tablet_id] = grant.previous
