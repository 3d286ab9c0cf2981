"""Per-thread cells that outlive their threads' deaths: the registration and dead-thread
bookkeeping shared by ``StripedCounter`` and ``Histogram``.

Each metric keeps one cell per writing thread, found through a ``threading.local``.  When a
thread ends, CPython clears its thread-local storage, which drops a sentinel object kept
there beside the cell; a weakref callback on the sentinel queues the cell's token as dead (a
lock-free ``deque.append``, because the callback runs inside the dying thread's teardown).
The metric folds dead cells into its base under its lock (``_fold_dead_locked``, which each
metric defines for its own kind of cell), so a churning thread pool neither loses values nor
grows the cell table.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["PerThreadCells"]

CellT = TypeVar("CellT")


class _Sentinel:
    """Lives only in a thread's thread-local storage; its death means the thread is gone."""

    __slots__ = ("__weakref__",)


class PerThreadCells(Generic[CellT]):
    """Base of a per-thread metric; the subclass defines ``_fold_dead_locked``."""

    __slots__ = ("_cells", "_dead", "_local", "_lock", "_next_token")

    _lock: threading.Lock
    _local: threading.local
    # token -> (cell, weakref to the owner thread's sentinel).  The weakref must be kept
    # alive here or its callback would never run.
    _cells: dict[int, tuple[CellT, weakref.ref[_Sentinel]]]
    _dead: deque[int]
    _next_token: int

    def _init_cells(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._cells = {}
        self._dead = deque()
        self._next_token = 0

    def _fold_dead_locked(self) -> None:
        raise NotImplementedError

    def _register_cell(self, cell: CellT) -> CellT:
        """Make ``cell`` this thread's cell (the one time a writer takes the lock)."""
        sentinel = _Sentinel()
        with self._lock:
            self._fold_dead_locked()
            token = self._next_token
            self._next_token += 1
            self._cells[token] = (cell, weakref.ref(sentinel, _dead_callback(self._dead, token)))
        self._local.cell = cell
        self._local.sentinel = sentinel
        return cell

    def _live_cells(self) -> int:
        """Cells not yet folded (for tests: proves dead threads' cells are not leaked)."""
        with self._lock:
            self._fold_dead_locked()
            return len(self._cells)


def _dead_callback(dead: deque[int], token: int) -> Callable[[weakref.ref[_Sentinel]], None]:
    # Closes over the deque, not the metric: no reference cycle, and a metric that is
    # garbage collected before its threads end simply takes its weakrefs (and so these
    # callbacks) with it.  deque.append is atomic under the GIL, so no lock is needed in a
    # callback that runs during a thread's teardown.
    def on_thread_exit(_ref: weakref.ref[_Sentinel]) -> None:
        dead.append(token)

    return on_thread_exit
