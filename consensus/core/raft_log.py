"""The Raft log as the core sees it: durable entries (in Storage) plus the
unstable tail not yet known to be durable (etcd's raftLog + unstable).

Invariants:
- applied <= committed, and committed never decreases.
- Entries at index >= unstable_offset live in ``_unstable``; below it, in storage.
- ``_in_progress`` is the last unstable index already handed to the driver for
  persistence; unstable_offset - 1 <= _in_progress <= last_index().
- Committed entries are delivered only once durable (index < unstable_offset),
  so a replica never applies what a crash could take back.
- ``_handed`` holds the batches handed out and not yet reported durable, in the order
  handed out; the driver reports them in that order (a log writes them in that order), and
  a report covers every batch before its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from raftlet.consensus.core.errors import RaftConfigError
from raftlet.consensus.core.storage import Storage, limit_size
from raftlet.consensus.core.types import Entry

__all__ = ["RaftLog"]


class RaftLog:
    def __init__(
        self, storage: Storage, committed: int, applied: int, max_applying_bytes: int = 0
    ) -> None:
        self.storage = storage
        last = storage.last_index()
        if applied > last:
            raise RaftConfigError(f"applied index {applied} is beyond the durable log's end {last}")
        # A persisted commit index beyond the durable log cannot be trusted (the
        # entries were never fsynced); the leader will tell us the commit again.
        # The commit index is persisted only with a term or vote and at a clean stop, so
        # it may lag what the state machine applied: anything applied was committed, and
        # must never be applied twice.
        self.committed = max(min(committed, last), applied)
        self.applied = applied
        # Highest index handed out for applying (>= applied).
        self.applying = self.applied
        # With a cap (Config.max_applying_bytes), the entry bytes handed out for applying
        # and not reported applied, and each hand-out's (last index, bytes), oldest first.
        self.max_applying_bytes = max_applying_bytes
        self.applying_bytes = 0
        self._applying_handouts: deque[tuple[int, int]] = deque()
        self._unstable: list[Entry] = []
        self._unstable_offset = last + 1
        self._in_progress = last
        # (first index, last index, last term) of each batch handed out for persistence and
        # not yet reported durable, oldest first.
        self._handed: deque[tuple[int, int, int]] = deque()
        # Told of every append, with the entries written (the first one's index is where the
        # log was cut, if it overlapped): how the node follows CONFIG entries in its log.
        self.on_append: Callable[[Sequence[Entry]], None] | None = None

    # --- reads ----------------------------------------------------------------

    def first_index(self) -> int:
        """The first entry still held (log GC discards a prefix of durable entries)."""
        return self.storage.first_index()

    def last_index(self) -> int:
        if self._unstable:
            return self._unstable[-1].index
        return self.storage.last_index()

    def last_term(self) -> int:
        return self.term(self.last_index())

    def stable_index(self) -> int:
        """Every entry at or below this index is durable and agrees with our log."""
        return self._unstable_offset - 1

    def term(self, index: int) -> int:
        """Term of the entry at ``index``; IndexError beyond the last index."""
        if index >= self._unstable_offset:
            i = index - self._unstable_offset
            if i >= len(self._unstable):
                raise IndexError(f"index {index} beyond last index {self.last_index()}")
            return self._unstable[i].term
        return self.storage.term(index)

    def match_term(self, index: int, term: int) -> bool:
        if index < 0 or index > self.last_index():
            return False
        return self.term(index) == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Whether a log ending at (last_index, last_term) is at least as up to
        date as ours (paper §5.4.1: compare last terms, then lengths)."""
        our_term = self.last_term()
        return last_term > our_term or (last_term == our_term and last_index >= self.last_index())

    def entries(self, lo: int, max_size: int | None = None) -> list[Entry]:
        """Entries from ``lo`` to the end, at most ``max_size`` bytes (never empty
        when ``lo`` <= last index)."""
        last = self.last_index()
        if lo > last:
            return []
        out: list[Entry] = []
        if lo < self._unstable_offset:
            out = self.storage.entries(lo, min(self._unstable_offset, last + 1), max_size)
            if out[-1].index < self._unstable_offset - 1:
                return out  # the size cap cut inside the durable part
        start = max(lo, self._unstable_offset) - self._unstable_offset
        out.extend(self._unstable[start:])
        return limit_size(out, max_size)

    def all_entries(self) -> list[Entry]:
        return self.entries(1)

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The largest (i, term(i)) with i <= index and term(i) <= term.

        Both sides of fast backtracking use it: a follower to suggest where the
        leader should retry, the leader to skip a whole conflicting term at once.
        """
        index = min(index, self.last_index())
        first = self.first_index()
        while index > 0:
            if index < first:
                # Discarded by log GC, so committed: no conflict down there. Term 0 says
                # "unknown" (the leader resumes from what every voter holds).
                return index, 0
            t = self.term(index)
            if t <= term:
                return index, t
            index -= 1
        return 0, 0

    # --- appends ----------------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> int:
        """Append ``entries``, replacing any existing suffix they overlap."""
        if not entries:
            return self.last_index()
        first = entries[0].index
        if first <= self.committed:
            raise AssertionError(f"append at {first} would overwrite committed {self.committed}")
        if first > self.last_index() + 1:
            raise AssertionError(f"append at {first} leaves a gap after {self.last_index()}")
        if first >= self._unstable_offset:
            del self._unstable[first - self._unstable_offset :]
        else:
            # Overwriting durable entries: the tail from ``first`` becomes unstable.
            self._unstable = []
            self._unstable_offset = first
        self._unstable.extend(entries)
        self._in_progress = min(self._in_progress, first - 1)
        if self.on_append is not None:
            self.on_append(entries)
        return self.last_index()

    def find_conflict(self, entries: Sequence[Entry]) -> int:
        """Index of the first entry that is new or conflicts with ours; 0 if none."""
        for e in entries:
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def maybe_append(
        self, index: int, log_term: int, committed: int, entries: Sequence[Entry]
    ) -> int | None:
        """AppendEntries receiver rules 2-5 (Figure 2).  Returns the index of the
        last new entry, or None if our log has no entry (index, log_term)."""
        if not self.match_term(index, log_term):
            return None
        last_new = index + len(entries)
        conflict = self.find_conflict(entries)
        if conflict:
            # Never truncate what is committed: a leader with a conflicting
            # committed entry would violate leader completeness (§5.4).
            self.append(entries[conflict - index - 1 :])
        self.commit_to(min(committed, last_new))
        return last_new

    def restore(self, index: int) -> None:
        """The storage now holds a copy of the state at ``index`` (its log starts there):
        everything up to it is committed and applied, nothing of ours is unstable."""
        last = self.storage.last_index()
        if self.storage.first_index() > index or last < index:
            raise AssertionError(f"storage does not hold the restored entry {index}")
        self._unstable = []
        self._unstable_offset = last + 1
        self._in_progress = last
        self._handed.clear()  # what they wrote is gone: their reports are ignored
        self.committed = max(self.committed, index)
        self.applied = self.applying = index
        self.applying_bytes = 0
        self._applying_handouts.clear()

    # --- commit, persistence, application -----------------------------------------

    def commit_to(self, index: int) -> None:
        if index > self.committed:
            if index > self.last_index():
                raise AssertionError(f"commit {index} beyond last index {self.last_index()}")
            self.committed = index

    def maybe_commit(self, index: int, term: int) -> bool:
        """Commit ``index`` only if it is of ``term`` (the leader's own term, §5.4.2)."""
        if index > self.committed and self.term(index) == term:
            self.committed = index
            return True
        return False

    def unstable_to_persist(self) -> list[Entry]:
        """Unstable entries not yet handed out; marks them handed out."""
        start = self._in_progress + 1 - self._unstable_offset
        out = self._unstable[start:]
        if out:
            self._in_progress = out[-1].index
            self._handed.append((out[0].index, out[-1].index, out[-1].term))
        return out

    def has_unstable_to_persist(self) -> bool:
        return self._in_progress < self.last_index()

    def stable_to(self, index: int, term: int) -> bool:
        """The batch handed out whose last entry is (index, term) is durable, and every
        batch before it; whether the stable index moved.

        Only what no later batch rewrites counts: a batch handed out after it (or entries
        not yet handed out) that overwrote an entry at or below ``index`` may be on disk in
        part, so below that entry the log is durable and ours. Matching (index, term) alone
        took entries for durable that a later batch had overwritten and a later one still
        written back as they were (three leaders in turn, one slow fsync): the disk held the
        middle batch's entries while the stable index -- and so the commit index saved, and
        what was applied -- covered them."""
        ends = [(last, last_term) for _, last, last_term in self._handed]
        if (index, term) not in ends:
            return False  # no batch of ours (handed out before a restore)
        for _ in range(ends.index((index, term)) + 1):
            self._handed.popleft()
        upto = min(index, self._in_progress, *(first - 1 for first, _, _ in self._handed))
        if upto < self._unstable_offset:
            return False
        del self._unstable[: upto + 1 - self._unstable_offset]
        self._unstable_offset = upto + 1
        return True

    def committed_to_apply(self) -> list[Entry]:
        """Committed, durable entries not yet handed out for applying; marks them. With a
        cap, no more than it allows beyond what is not reported applied (one entry at
        least, when nothing is outstanding)."""
        hi = min(self.committed, self.stable_index())
        if hi <= self.applying:
            return []
        cap = self.max_applying_bytes
        if not cap:
            out = self.storage.entries(self.applying + 1, hi + 1)
            self.applying = hi
            return out
        room = cap - self.applying_bytes
        if room <= 0:
            return []
        out = self.storage.entries(self.applying + 1, hi + 1, room)
        size = sum(e.size() for e in out)
        self.applying = out[-1].index
        self.applying_bytes += size
        self._applying_handouts.append((self.applying, size))
        return out

    def has_committed_to_apply(self) -> bool:
        if self.max_applying_bytes and self.applying_bytes >= self.max_applying_bytes:
            return False
        return min(self.committed, self.stable_index()) > self.applying

    def applied_to(self, index: int) -> None:
        if index > self.committed or index < self.applied:
            raise AssertionError(
                f"applied {index} outside [{self.applied}, committed {self.committed}]"
            )
        self.applied = index
        self.applying = max(self.applying, index)
        handouts = self._applying_handouts
        while handouts and handouts[0][0] <= index:
            self.applying_bytes -= handouts.popleft()[1]
