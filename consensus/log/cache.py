"""The log cache: the most recent decoded entries, bounded in bytes.

It always holds a contiguous run ``lo .. log.last``, so a read splits into "from disk"
below ``lo`` and "from memory" from ``lo`` on.  Entries whose record is not on disk yet
are pinned (Kudu's LogCache does the same): a batch is readable from the moment it is
accepted, before the appender has written it.
"""

from __future__ import annotations

from collections.abc import Sequence

from raftlet.consensus.core.types import Entry

__all__ = ["LogCache"]


class LogCache:
    def __init__(self, capacity_bytes: int, next_index: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.lo = next_index  # first cached index; == hi when empty
        self.hi = next_index  # one past the last cached index (== log last + 1)
        self.nbytes = 0
        self._entries: dict[int, Entry] = {}

    def __len__(self) -> int:
        return self.hi - self.lo

    def get(self, index: int) -> Entry:
        return self._entries[index]

    def range(self, lo: int, hi: int) -> list[Entry]:
        es = self._entries
        return [es[i] for i in range(lo, hi)]

    def append(self, entries: Sequence[Entry]) -> None:
        """Add a batch, dropping any cached suffix it replaces."""
        if not entries:
            return
        first = entries[0].index
        if first != self.hi:
            if first <= self.lo:
                self._entries.clear()
                self.nbytes = 0
                self.lo = first
            else:
                self.truncate_from(first)
        es = self._entries
        for e in entries:
            es[e.index] = e
            self.nbytes += e.size()
        self.hi = entries[-1].index + 1

    def append_one(self, entry: Entry) -> None:
        """``append`` of the entry right after the last cached one."""
        self._entries[entry.index] = entry
        self.nbytes += len(entry.data) + 24  # Entry.size(), without the call
        self.hi += 1

    def truncate_from(self, index: int) -> None:
        es = self._entries
        for i in range(index, self.hi):
            self.nbytes -= es.pop(i).size()
        self.hi = min(self.hi, index)

    def evict(self, evictable_below: int) -> None:
        """Drop the oldest entries while over capacity, but none at or above
        ``evictable_below`` (those are not on disk yet)."""
        es = self._entries
        while self.nbytes > self.capacity_bytes and self.lo < min(evictable_below, self.hi):
            self.nbytes -= es.pop(self.lo).size()
            self.lo += 1

    def drop_below(self, index: int) -> None:
        """Forget entries below ``index`` (garbage-collected)."""
        es = self._entries
        while self.lo < min(index, self.hi):
            self.nbytes -= es.pop(self.lo).size()
            self.lo += 1
        if self.lo < index:  # everything was below: the empty cache restarts there
            self.lo = self.hi = index
