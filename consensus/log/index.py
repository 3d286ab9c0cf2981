"""The in-memory index of a log: the term of every live entry, and where records are.

Live entries are contiguous, ``first .. last``; their terms are kept as soon as a batch is
accepted.  Records (``Rec``) are added only once they are durable, by the appender, so
every record here is on disk.  A record may hold entries that a later batch replaced,
which are simply no longer live.  Records are kept in index order, and since a later batch
only ever replaces a suffix, the segment sequence of records never decreases with the
index: deleting the oldest segments removes a prefix of the log.

Between accepting a batch that replaces a suffix and that batch becoming durable, the
records it replaces are still listed (the disk still holds them, and a crash would bring
them back).  Nobody reads them: the log cache pins every entry from the lowest
not-yet-durable batch on, so reads from disk stop below it, and GC never starts the log
at a record at or above it.

Records are kept in parallel arrays, not as objects: a log held back from GC (a follower
down for minutes) lists hundreds of thousands of them, and as objects each cost ~160 bytes
of the heap -- review r31a saw a leader grow 70 MiB over a peer's five-minute outage, and
keep it after GC freed them (the allocator's arenas stay). ``Rec`` is made on demand.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence

__all__ = ["LogIndex", "Rec"]


class Rec:
    """One durable record: the entries it starts with and where its frame is."""

    __slots__ = ("count", "first", "frame_size", "offset", "seq")

    def __init__(self, first: int, count: int, seq: int, offset: int, frame_size: int) -> None:
        self.first = first
        self.count = count  # entries in the record (it may hold fewer live ones)
        self.seq = seq
        self.offset = offset
        self.frame_size = frame_size

    def __repr__(self) -> str:
        return f"Rec(first={self.first}, count={self.count}, seq={self.seq}, offset={self.offset})"


class LogIndex:
    def __init__(self, first: int = 1) -> None:
        self.first = first
        self.next = first  # last + 1
        self.last_term = 0  # term of the last entry; 0 when empty
        self.terms = array("Q")  # appended to directly on the producers' hot path
        # Record k is (_firsts[k], _counts[k], _seqs[k], _offsets[k], _sizes[k]).
        self._firsts = array("q")
        self._counts = array("q")
        self._seqs = array("q")
        self._offsets = array("q")
        self._sizes = array("q")

    def __len__(self) -> int:
        return self.next - self.first

    @property
    def last(self) -> int:
        return self.next - 1

    def term(self, index: int) -> int:
        return self.terms[index - self.first]

    def append(self, first: int, terms: Sequence[int]) -> None:
        """Replace the terms from ``first`` on.  The caller has checked there is no gap;
        ``first`` at or below ``self.first`` restarts the log there (below happens only on
        replay, after GC)."""
        if first != self.next:
            if first <= self.first or self.next == self.first:
                self.terms = array("Q")
                self.first = first
            else:
                del self.terms[first - self.first :]
        self.terms.extend(terms)
        self.next = first + len(terms)
        self.last_term = terms[-1]

    def append_one(self, term: int) -> None:
        """``append`` of one entry right after the last (the common case, kept cheap)."""
        self.terms.append(term)
        self.next += 1
        self.last_term = term

    def add_record(self, rec: Rec) -> None:
        """A record is durable; any record from its first index on is replaced by it."""
        firsts = self._firsts
        if firsts and firsts[-1] >= rec.first:
            self._drop_from(bisect.bisect_left(firsts, rec.first))
        firsts.append(rec.first)
        self._counts.append(rec.count)
        self._seqs.append(rec.seq)
        self._offsets.append(rec.offset)
        self._sizes.append(rec.frame_size)

    def _columns(self) -> tuple[array[int], ...]:
        return self._firsts, self._counts, self._seqs, self._offsets, self._sizes

    def _drop_from(self, k: int) -> None:
        for column in self._columns():
            del column[k:]

    def locate(self, index: int) -> tuple[int, Rec]:
        """(position, record) of the record holding live, durable entry ``index``."""
        k = bisect.bisect_right(self._firsts, index) - 1
        if k < 0 or index >= self._firsts[k] + self._counts[k]:
            raise AssertionError(f"entry {index} has no durable record")
        return k, self.rec_at(k)

    def rec_at(self, k: int) -> Rec:
        return Rec(
            self._firsts[k], self._counts[k], self._seqs[k], self._offsets[k], self._sizes[k]
        )

    def rec_count(self) -> int:
        return len(self._firsts)

    def live_end(self, k: int) -> int:
        """Last index record ``k`` holds that no later record replaced (reads stop below
        not-yet-durable batches on their own, see the module docstring)."""
        end = self._firsts[k] + self._counts[k] - 1
        if k + 1 < len(self._firsts):
            return min(end, self._firsts[k + 1] - 1)
        return min(end, self.next - 1)

    def first_rec_after_segment(self, seq: int) -> int:
        """Position of the first record in a segment after ``seq``."""
        return bisect.bisect_right(self._seqs, seq)

    def drop_prefix(self, k: int) -> None:
        """Forget records before position ``k``; the log then starts at record ``k``."""
        new_first = self._firsts[k]
        del self.terms[: new_first - self.first]
        for column in self._columns():
            del column[:k]
        self.first = new_first
