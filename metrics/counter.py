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

import threading
import weakref
from collections import deque
from collections.abc import Callable

__all__ = ["StripedCounter"]


class _Sentinel:
    """Lives only in a thread's thread-local storage; its death means the thread is gone."""

    __slots__ = ("__weakref__",)


class StripedCounter:
    """A monotonically used integer counter with a lock-free per-thread increment."""

    __slots__ = ("_base", "_cells", "_dead", "_local", "_lock", "_next_token")

    def __init__(self) -> None:
        # `_local.cell` (this thread's one-element list, absent until its first increment)
        # is also updated inline by ProfiledLock's contended path, which must not make a
        # Python call while holding its lock; keep that layout.
        self._local = threading.local()
        self._lock = threading.Lock()
        # token -> (cell, weakref to the owner thread's sentinel). The weakref must be kept
        # alive here or its callback would never run.
        self._cells: dict[int, tuple[list[int], weakref.ref[_Sentinel]]] = {}
        self._dead: deque[int] = deque()
        self._base = 0
        self._next_token = 0

    def increment(self, n: int = 1) -> None:
        """Add ``n`` (which may be negative, though counters normally only grow)."""
        try:
            self._local.cell[0] += n
        except AttributeError:
            # First increment by this thread: the only time the hot path takes a lock.
            self._register()[0] += n

    def value(self) -> int:
        """The sum of every cell, including those of threads that have ended."""
        with self._lock:
            self._fold_dead_locked()
            # list() snapshots the cells in one C call; the values are read one by one, each
            # atomically (see the module docstring for why that is good enough).
            return self._base + sum(cell[0] for cell, _ in list(self._cells.values()))

    def _register(self) -> list[int]:
        cell = [0]
        sentinel = _Sentinel()
        with self._lock:
            self._fold_dead_locked()
            token = self._next_token
            self._next_token += 1
            self._cells[token] = (cell, weakref.ref(sentinel, _dead_callback(self._dead, token)))
        self._local.cell = cell
        self._local.sentinel = sentinel
        return cell

    def _fold_dead_locked(self) -> None:
        dead = self._dead
        while dead:
            token = dead.popleft()
            entry = self._cells.pop(token, None)
            if entry is not None:
                # The owner thread has ended, so nothing writes this cell any more.
                self._base += entry[0][0]

    def _live_cells(self) -> int:
        """Cells not yet folded (for tests: proves dead threads' cells are not leaked)."""
        with self._lock:
            self._fold_dead_locked()
            return len(self._cells)

    def __repr__(self) -> str:
        return f"StripedCounter({self.value()})"


def _dead_callback(dead: deque[int], token: int) -> Callable[[weakref.ref[_Sentinel]], None]:
    # Closes over the deque, not the counter: no reference cycle, and a counter that is
    # garbage collected before its threads end simply takes its weakrefs (and so these
    # callbacks) with it. deque.append is atomic under the GIL, so no lock is needed in a
    # callback that runs during a thread's teardown.
    def on_thread_exit(_ref: weakref.ref[_Sentinel]) -> None:
        dead.append(token)

    return on_thread_exit
