"""What the leader knows of each follower (etcd's tracker.Progress).

A follower is in one of three states:
- PROBE: the leader does not know where the follower's log matches its own.  It
  sends one APPEND at a time (``probe_sent``) and backs ``next`` off on rejection.
- REPLICATE: the logs match up to ``match``; the leader streams APPENDs
  optimistically (``next`` advances on send), at most ``max_inflight`` unacknowledged
  and, once their entries reach ``max_inflight_bytes``, no more until some are.
- SNAPSHOT: the follower needs entries log GC discarded here, so it is getting a copy of
  the tablet instead (``pending_snapshot``: the leader's first log index when it asked);
  nothing is sent to it until the driver reports the copy done or failed.

Invariant: 0 <= match < next.
"""

from __future__ import annotations

import enum
from collections import deque

__all__ = ["Inflights", "Progress", "ProgressState"]


class ProgressState(enum.Enum):
    PROBE = "PROBE"
    REPLICATE = "REPLICATE"
    SNAPSHOT = "SNAPSHOT"


class Inflights:
    """The APPENDs sent but not yet acknowledged, oldest first: each one's last index and
    entry bytes.  Full at ``capacity`` messages, or at ``max_bytes`` (0: no cap) -- the
    message that crosses it is still sent, so one larger than the cap goes alone."""

    def __init__(self, capacity: int, max_bytes: int = 0) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._sent: deque[tuple[int, int]] = deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._sent)

    @property
    def bytes(self) -> int:
        return self._bytes

    def add(self, last_index: int, size: int = 0) -> None:
        if self.full():
            raise OverflowError("inflight window is full")
        self._sent.append((last_index, size))
        self._bytes += size

    def free_le(self, index: int) -> None:
        """Forget every APPEND whose last entry is at or below ``index``."""
        sent = self._sent
        while sent and sent[0][0] <= index:
            self._bytes -= sent.popleft()[1]

    def free_first_one(self) -> None:
        if self._sent:
            self._bytes -= self._sent.popleft()[1]

    def full(self) -> bool:
        return len(self._sent) >= self.capacity or 0 < self.max_bytes <= self._bytes

    def reset(self) -> None:
        self._sent.clear()
        self._bytes = 0


class Progress:
    def __init__(
        self, match: int, next_index: int, max_inflight: int, max_inflight_bytes: int = 0
    ) -> None:
        self.match = match
        self.next = next_index
        self.state = ProgressState.PROBE
        # PROBE only: an APPEND is outstanding; send no other until it is answered.
        self.probe_sent = False
        # Heard from since the last check-quorum round (thesis §6.2).
        self.recent_active = False
        # The leader's tick count when it last heard from this peer (None: not in this
        # leadership, or not since a stall): what a membership change is checked against.
        self.heard_tick: int | None = None
        # The leader's tick count when a heartbeat's answer last made it send to this peer.
        self.resent_tick: int | None = None
        self.inflights = Inflights(max_inflight, max_inflight_bytes)
        # SNAPSHOT only: the index the copy must reach (0 otherwise).
        self.pending_snapshot = 0

    def __repr__(self) -> str:
        return f"Progress(match={self.match}, next={self.next}, state={self.state.value})"

    def become_probe(self) -> None:
        self.state = ProgressState.PROBE
        self.next = self.match + 1
        self.probe_sent = False
        self.pending_snapshot = 0
        self.inflights.reset()

    def become_snapshot(self, index: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = index
        self.probe_sent = False
        self.inflights.reset()

    def snapshot_done(self, index: int) -> None:
        """The follower installed a copy of the state at ``index``: probe from there (the
        copy may have been taken later than asked, so ``index`` may pass the pending one).
        ``match`` moves when the follower answers the probe, as for any other."""
        self.become_probe()
        self.next = max(self.next, index + 1)

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflights.reset()

    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.SNAPSHOT:
            return True
        return self.inflights.full()

    def sent_entries(self, last_index: int | None, size: int = 0) -> None:
        """Record an APPEND just sent whose last entry is ``last_index`` (None: empty) and
        whose entries are ``size`` bytes."""
        if self.state is ProgressState.REPLICATE:
            if last_index is not None:
                self.next = last_index + 1
                self.inflights.add(last_index, size)
        else:
            self.probe_sent = True

    def maybe_update(self, index: int) -> bool:
        """The follower acknowledged a match up to ``index``; False if nothing new."""
        updated = False
        if self.match < index:
            self.match = index
            updated = True
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        return updated

    def maybe_decrease_to(self, rejected: int, match_hint: int) -> bool:
        """The follower rejected an APPEND whose previous index was ``rejected``.

        ``match_hint`` is the highest index that may still match.  Returns False
        when the rejection is stale (answers an APPEND we no longer care about).
        """
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.state is ProgressState.SNAPSHOT or self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, match_hint + 1), self.match + 1)
        self.probe_sent = False
        return True
