"""A counter that threads bump without contending: the LongAdder idea.

Each thread adds to its own cell, a one-element list reached through a ``threading.local``;
a read sums every cell. The hot path takes no lock. The only lock is taken once per thread
per counter, to register the thread's cell, and by readers.

Why this is safe under the GIL: a cell is written by exactly one thread (its owner), so the
non-atomic read-add-store of ``cell[0] += n`` can never lose an update to another writer.
A reader loads ``cell[0]`` with one bytecode, which sees either the old or the new value,
never a torn one. A read concurrent with increments therefore returns a value that some
interleaving of them produced (exact once the writers are quiet).

Finished threads: when a thread ends, CPython clears its thread-local storage, which drops
a sentinel object we keep there beside the cell; a weakref callback on the sentinel queues
the cell as dead (a lock-free ``deque.append``, because the callback runs inside the dying
thread's teardown). The next read or registration folds dead cells into a base total and
forgets them, so a churning thread pool neither loses counts nor grows the cell list.
"""

from __future__ import annotations

from raftlet.metrics._thread_cells import PerThreadCells

__all__ = ["StripedCounter"]


class StripedCounter(PerThreadCells[list[int]]):
    """A monotonically used integer counter with a lock-free per-thread increment."""

    __slots__ = ("_base",)

    def __init__(self) -> None:
        # `_local.cell` (this thread's one-element list, absent until its first increment)
        # is also updated inline by ProfiledLock's contended path, which must not make a
        # Python call while holding its lock; keep that layout.
        self._init_cells()
        self._base = 0

    def increment(self, n: int = 1) -> None:
        """Add ``n`` (which may be negative, though counters normally only grow)."""
        try:
            self._local.cell[0] += n
        except AttributeError:
            # First increment by this thread: the only time the hot path takes a lock.
            self._register_cell([0])[0] += n

    def value(self) -> int:
        """The sum of every cell, including those of threads that have ended."""
        with self._lock:
            self._fold_dead_locked()
            # list() snapshots the cells in one C call; the values are read one by one, each
            # atomically (see the module docstring for why that is good enough).
            return self._base + sum(cell[0] for cell, _ in list(self._cells.values()))

    def _fold_dead_locked(self) -> None:
        dead = self._dead
        while dead:
            token = dead.popleft()
            entry = self._cells.pop(token, None)
            if entry is not None:
                # The owner thread has ended, so nothing writes this cell any more.
                self._base += entry[0][0]

    def __repr__(self) -> str:
        return f"StripedCounter({self.value()})"
