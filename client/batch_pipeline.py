"""A session's batches on their way out: per tablet, a window of batches in flight, in key
order.

One batch per tablet at a time leaves the tablet idle while each answer travels back and
the next batch is formed, so a single writer can never fill a server. Here a tablet may
have up to ``window`` batches in flight. What must not change is the order of two writes
of one key, so a batch waits -- and every later batch of its tablet behind it -- while a
batch already in flight to that tablet writes one of its keys. Batches of one tablet are
started in the order they were cut, i.e. call order.

Rows are cut into batches per tablet at ``max_rows`` rows or ``max_bytes`` packed bytes,
whichever comes first (a single larger row still goes, alone). In background mode the
session adds rows as they come (``add``): a tablet's open batch goes out when full, and
the session's flusher closes what is left open on a timer or ``flush()``. In manual mode
``flush()`` adds the whole buffer and closes it at once.

The pipeline shares the session's condition variable: every method expects it held, and
each finished batch notifies it, so ``flush()`` can wait for ``lowest_unfinished()``.
Sends run on the client's executor.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from raftlet.client.errors import ClientClosed, RaftletError
from raftlet.client.write_batch import Operation

__all__ = ["BatchPipeline"]

# Sends one batch (all of one tablet) and returns one error per failed operation.
SendBatch = Callable[[str, list[Operation]], list[RaftletError]]
# Called (condition held) when a batch has an outcome: its operations and their errors.
OnDone = Callable[[list[Operation], list[RaftletError]], None]


@dataclass(eq=False)
class _Batch:
    tablet_id: str
    ops: list[Operation] = field(default_factory=list)
    nbytes: int = 0
    opened: float = 0.0
    # The keys it writes; only computed when a window lets batches overlap.
    keys: frozenset[bytes] = frozenset()


class BatchPipeline:
    def __init__(
        self,
        cond: threading.Condition,
        executor: Executor,
        send: SendBatch,
        on_done: OnDone,
        *,
        max_rows: int,
        max_bytes: int,
        window: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cond = cond
        self._executor = executor
        self._send = send
        self._on_done = on_done
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.window = window
        self._clock = clock
        self._open: dict[str, _Batch] = {}
        self._queued: dict[str, deque[_Batch]] = {}
        self._in_flight: dict[str, list[_Batch]] = {}

    # --- forming batches -------------------------------------------------------------------

    def add(self, op: Operation) -> bool:
        """Put ``op`` in its tablet's open batch; a full batch is closed and may start.
        True if there was no open batch before (a timer may need starting)."""
        was_idle = not self._open
        batch = self._open.get(op.tablet_id)
        size = op.nbytes
        if batch is None:
            batch = self._open[op.tablet_id] = _Batch(op.tablet_id, opened=self._clock())
        elif batch.nbytes + size > self.max_bytes:  # this row would overflow it: close first
            self._close(batch)
            batch = self._open[op.tablet_id] = _Batch(op.tablet_id, opened=self._clock())
        ops = batch.ops
        ops.append(op)
        batch.nbytes += size
        if len(ops) >= self.max_rows or batch.nbytes >= self.max_bytes:
            self._close(batch)
        return was_idle

    def add_all(self, ops: Sequence[Operation]) -> None:
        """Add ``ops`` and close every open batch."""
        for op in ops:
            self.add(op)
        self.close_open()

    def close_open(self) -> None:
        """Close every open batch (they start as their windows allow)."""
        for batch in list(self._open.values()):
            self._close(batch)

    def has_open(self) -> bool:
        return bool(self._open)

    def oldest_open(self) -> float | None:
        """When the oldest row still in an open batch was added (clock time), if any."""
        return min((b.opened for b in self._open.values()), default=None)

    def _close(self, batch: _Batch) -> None:
        del self._open[batch.tablet_id]
        if self.window > 1:
            batch.keys = frozenset(op.key for op in batch.ops)
        self._queued.setdefault(batch.tablet_id, deque()).append(batch)
        self._start(batch.tablet_id)

    # --- sending ---------------------------------------------------------------------------

    def _start(self, tablet_id: str) -> None:
        queued = self._queued[tablet_id]
        flying = self._in_flight.setdefault(tablet_id, [])
        while queued and len(flying) < self.window:
            head = queued[0]
            if any(not head.keys.isdisjoint(b.keys) for b in flying):
                return  # a key of it is still in flight: keep the order of that key's writes
            queued.popleft()
            flying.append(head)
            try:
                self._executor.submit(self._run, head)
            except RuntimeError:  # the executor was shut down: the client is closed
                flying.remove(head)
                err = ClientClosed("the client is closed")
                self._finish(head, [err.for_operation(o.index, o.table, o.row) for o in head.ops])

    def _run(self, batch: _Batch) -> None:
        try:
            errors = self._send(batch.tablet_id, batch.ops)
        except Exception as e:  # a bug must not leave flush() waiting forever
            err = RaftletError(f"writing {len(batch.ops)} rows failed: {e!r}")
            errors = [err.for_operation(o.index, o.table, o.row) for o in batch.ops]
        with self._cond:
            self._in_flight[batch.tablet_id].remove(batch)
            self._finish(batch, errors)
            self._start(batch.tablet_id)

    def _finish(self, batch: _Batch, errors: list[RaftletError]) -> None:
        self._on_done(batch.ops, errors)
        self._cond.notify_all()

    # --- progress --------------------------------------------------------------------------

    def lowest_unfinished(self) -> int | None:
        """The lowest operation index without an outcome, or None if all have one."""
        firsts = [b.ops[0].index for b in self._open.values()]
        firsts += [q[0].ops[0].index for q in self._queued.values() if q]
        firsts += [b.ops[0].index for flying in self._in_flight.values() for b in flying]
        return min(firsts, default=None)

    def in_flight(self) -> int:
        """Batches sent and not yet answered."""
        return sum(len(f) for f in self._in_flight.values())
