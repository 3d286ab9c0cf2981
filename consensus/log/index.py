"""The in-memory index of a log: term of every live entry and where its record is.

Live entries are contiguous, ``first .. last``.  Each live entry belongs to one record
(``Rec``); a record may also hold entries that a later batch replaced, which are simply no
longer live.  Records are kept in index order, and since a later batch only ever replaces a
suffix, the segment sequence of live records never decreases with the index: deleting the
oldest segments removes a prefix of the log.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable, Sequence

__all__ = ["PENDING", "LogIndex", "Rec"]

# Sequence of a record not written yet (its batch is still queued for the appender).
PENDING = -1


class Rec:
    """One record: the entries it starts with, and where it is once written.

    A producer creates it pending; the appender fills in ``frame_size`` and ``offset`` when
    it writes the record and publishes ``seq`` once it is durable.  ``count`` is how many
    entries of its batch it holds (the record may later hold fewer live ones).
    """

    __slots__ = ("count", "first", "frame_size", "offset", "seq")

    def __init__(self, first: int, count: int) -> None:
        self.first = first
        self.count = count
        self.frame_size = 0
        self.offset = 0
        self.seq = PENDING

    def __repr__(self) -> str:
        return f"Rec(first={self.first}, seq={self.seq}, offset={self.offset})"


_AFTER_ALL = 1 << 62


def _seq_key(rec: Rec) -> int:
    # Pending records will land in the active segment or a later one.
    return _AFTER_ALL if rec.seq == PENDING else rec.seq


class LogIndex:
    def __init__(self, first: int = 1) -> None:
        self.first = first
        self.next = first  # last + 1
        self.last_term = 0  # term of the last entry; 0 when empty
        self._terms = array("Q")
        self._recs: list[Rec] = []
        self._rec_firsts: list[int] = []

    def __len__(self) -> int:
        return self.next - self.first

    @property
    def last(self) -> int:
        return self.next - 1

    def term(self, index: int) -> int:
        return self._terms[index - self.first]

    def append(self, first: int, terms: Sequence[int], recs: Iterable[Rec]) -> None:
        """Replace everything from ``first`` on.  The caller has checked there is no gap;
        ``first`` at or below ``self.first`` drops the whole log (below happens only on
        replay, after GC)."""
        if first != self.next:
            if first <= self.first or self.next == self.first:
                self._terms = array("Q")
                self._recs.clear()
                self._rec_firsts.clear()
                self.first = first
            else:
                del self._terms[first - self.first :]
                k = bisect.bisect_left(self._rec_firsts, first)
                del self._recs[k:]
                del self._rec_firsts[k:]
        self._terms.extend(terms)
        for r in recs:
            self._recs.append(r)
            self._rec_firsts.append(r.first)
        self.next = first + len(terms)
        self.last_term = terms[-1]

    def append_one(self, term: int, rec: Rec) -> None:
        """``append`` of one entry right after the last (the common case, kept cheap)."""
        self._terms.append(term)
        self._recs.append(rec)
        self._rec_firsts.append(rec.first)
        self.next += 1
        self.last_term = term

    def locate(self, index: int) -> tuple[int, Rec]:
        """(position, record) of the record holding live entry ``index``."""
        k = bisect.bisect_right(self._rec_firsts, index) - 1
        return k, self._recs[k]

    def rec_at(self, k: int) -> Rec:
        return self._recs[k]

    def rec_count(self) -> int:
        return len(self._recs)

    def live_end(self, k: int) -> int:
        """Last live index of record ``k``."""
        return self._rec_firsts[k + 1] - 1 if k + 1 < len(self._recs) else self.next - 1

    def first_rec_after_segment(self, seq: int) -> int:
        """Position of the first record in a segment after ``seq`` (or pending)."""
        return bisect.bisect_right(self._recs, seq, key=_seq_key)

    def drop_prefix(self, k: int) -> None:
        """Forget records before position ``k``; the log then starts at record ``k``."""
        new_first = self._rec_firsts[k]
        del self._terms[: new_first - self.first]
        del self._recs[:k]
        del self._rec_firsts[:k]
        self.first = new_first
