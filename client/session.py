"""Sessions: where rows are written, batched per tablet, and their errors collected.

A session turns ``insert``/``upsert``/``update``/``delete`` calls into ``Operation``s — the
row validated and packed exactly as the server will decode it (``schema.row_packer``) and
routed to its tablet (``MetaCache.route``) — and sends them in one of three modes:

- ``AUTO_FLUSH_SYNC``: each call sends its row and returns when it is acknowledged, with a
  ``WriteResult`` (the Raft index and term of the write's entry); a row error is raised as
  ``RowError``, a failure after retries as ``Timeout`` (or a subclass).
- ``MANUAL_FLUSH``: calls only buffer; ``flush()`` sends the buffer and returns when every
  row has an outcome. Failures are collected, not raised: ``errors()`` -- except a row the
  client refuses itself (a wrong type, an unknown column), which the call raises at once
  as ``RowError``, in every mode, and which ``error_count`` does not count.
- ``AUTO_FLUSH_BACKGROUND``: calls buffer and return. Each tablet's rows collect in an open
  batch that is sent as soon as it holds ``max_batch_rows`` rows or ``max_batch_bytes``
  bytes, or its oldest row has waited ``flush_interval_s``. While ``max_buffered_rows`` rows
  are unacknowledged, or a row would take those unacknowledged past ``max_buffered_bytes``
  (one row alone always goes), a call blocks (backpressure) — for at most ``timeout_s``,
  then it raises ``Timeout``. ``flush()`` sends what is open and waits until every row given before
  it has an outcome. Failures are collected: ``errors()`` (a row the client refuses is
  raised, as above).

Batches go out through ``client.batch_pipeline``: per tablet, up to
``max_batches_in_flight`` at once, started in call order, and a batch that writes a key a
batch in flight also writes waits for it, so two writes of one key are applied in the
order they were made. Tablets proceed independently, on the client's thread pool
(``flush_threads`` senders shared by all its sessions, which caps what is in flight). Each
batch is one Write RPC with its own request id, retried by ``client.rpc.call_tablet`` with
that same id until ``timeout_s`` has passed.

Errors are per operation. ``RowError.row_index`` (and ``row_index`` on any collected error)
is the operation's position in the session: the n-th write call, from 0, including calls
that were refused before sending. A batch that failed as a whole (say ``Timeout``) is
reported once per operation in it. ``errors()`` returns the errors collected so far, in
``row_index`` order, and clears them (Kudu's ``GetPendingErrors``), so each error is seen
once.

``close()`` flushes, stops the background thread and refuses further writes; a session is
also a context manager, whose end closes it -- and so writes what it buffered even when the
block is left by an exception: a session is no transaction. A process that exits without
closing a session (or its client) loses what it buffered; the client warns of it at exit.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor

from raftlet.client.arguments import check_timeout, op_type_of, row_of
from raftlet.client.batch_pipeline import BatchPipeline
from raftlet.client.channels import ServerStub
from raftlet.client.errors import ClientClosed, InvalidArgument, RaftletError, RowError, Timeout
from raftlet.client.request_tracker import RequestTracker
from raftlet.client.rpc import RpcContext, call_tablet
from raftlet.client.write_batch import (
    Operation,
    WriteResult,
    batch_errors,
    describe_write,
    encode_operation,
    write_failure,
    write_request,
)
from raftlet.proto import tablet_pb2
from raftlet.schema.rows import OpType

__all__ = [
    "DEFAULT_BATCHES_IN_FLIGHT",
    "DEFAULT_MAX_BATCH_BYTES",
    "FlushMode",
    "Operation",
    "Session",
]

# A batch's packed rows at most: far below the servers' message limit, far above what it
# takes to amortize a round trip.
DEFAULT_MAX_BATCH_BYTES = 4 << 20
# Two: the next batch travels while the last is applied, without a deep queue per tablet.
DEFAULT_BATCHES_IN_FLIGHT = 2


def _buffer_limit(given: int | None, per_batch: int, in_flight: int, unit: str) -> int:
    """``max_buffered_<unit>``: twice what the batches in flight hold unless ``given``, and
    never less than one batch's ``max_batch_<unit>``."""
    limit = 2 * in_flight * per_batch if given is None else given
    if limit < per_batch:
        raise InvalidArgument(
            f"max_buffered_{unit} ({limit}) must be at least max_batch_{unit} ({per_batch})"
        )
    return limit


class FlushMode(enum.Enum):
    AUTO_FLUSH_SYNC = "AUTO_FLUSH_SYNC"
    AUTO_FLUSH_BACKGROUND = "AUTO_FLUSH_BACKGROUND"
    MANUAL_FLUSH = "MANUAL_FLUSH"


class Session:
    """Create with ``Client.new_session``; see the module docstring."""

    def __init__(
        self,
        rpc: RpcContext,
        tracker: RequestTracker,
        executor: Executor,
        *,
        flush_mode: FlushMode = FlushMode.AUTO_FLUSH_SYNC,
        timeout_s: float = 30.0,
        max_batch_rows: int = 1000,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        max_batches_in_flight: int = DEFAULT_BATCHES_IN_FLIGHT,
        flush_interval_s: float = 0.05,
        max_buffered_rows: int | None = None,
        packed_rows: bool = True,
        on_close: Callable[[Session], None] | None = None,
        max_buffered_bytes: int | None = None,
    ) -> None:
        if not isinstance(flush_mode, FlushMode):
            raise InvalidArgument(f"flush_mode must be a FlushMode, got {flush_mode!r}")
        check_timeout(timeout_s)
        if max_batch_rows < 1:
            raise InvalidArgument(f"max_batch_rows must be at least 1, got {max_batch_rows}")
        if max_batch_bytes < 1:
            raise InvalidArgument(f"max_batch_bytes must be at least 1, got {max_batch_bytes}")
        if max_batches_in_flight < 1:
            raise InvalidArgument(
                f"max_batches_in_flight must be at least 1, got {max_batches_in_flight}"
            )
        if flush_interval_s <= 0:
            raise InvalidArgument(f"flush_interval_s must be positive, got {flush_interval_s}")
        max_buffered_rows = _buffer_limit(
            max_buffered_rows, max_batch_rows, max_batches_in_flight, "rows"
        )
        # Counted by rows alone, 1 MB rows buffered 4 GB before a call blocked.
        max_buffered_bytes = _buffer_limit(
            max_buffered_bytes, max_batch_bytes, max_batches_in_flight, "bytes"
        )
        self.flush_mode = flush_mode
        self.timeout_s = float(timeout_s)
        self.max_batch_rows = max_batch_rows
        self.max_batch_bytes = max_batch_bytes
        self.max_batches_in_flight = max_batches_in_flight
        self.flush_interval_s = float(flush_interval_s)
        self.max_buffered_rows = max_buffered_rows
        self.max_buffered_bytes = max_buffered_bytes
        self.packed_rows = packed_rows
        self._rpc = rpc
        self._tracker = tracker
        self._on_close = on_close
        # A plain lock: `with self._lock` costs no Python-level call per row, as `with` on the
        # Condition (an RLock by default, behind two Python methods) did.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pipeline = BatchPipeline(
            self._cond,
            executor,
            self._send_batch,
            self._batch_done,
            max_rows=max_batch_rows,
            max_bytes=max_batch_bytes,
            window=max_batches_in_flight,
            clock=rpc.clock,
        )
        self._next_index = 0
        self._buffer: list[Operation] = []  # MANUAL_FLUSH: rows not yet flushed
        # First indexes of batches flush() is sending on its own thread (not the pipeline's).
        self._inline: list[int] = []
        self._errors: list[RaftletError] = []
        self._error_count = 0
        self._accepted = 0  # operations ever buffered
        self._done = 0  # of those, how many have an outcome
        self._unanswered_bytes = 0  # the rows of those without one (``Operation.nbytes``)
        self._closing = False
        self._closed = False
        self._flusher: threading.Thread | None = None
        if flush_mode is FlushMode.AUTO_FLUSH_BACKGROUND:
            self._flusher = threading.Thread(
                target=self._run_flusher, name="raftlet-session-flusher", daemon=True
            )
            self._flusher.start()

    # --- writing ---------------------------------------------------------------------------

    def insert(self, table: str, row: Mapping[str, object]) -> WriteResult | None:
        return self.apply(OpType.INSERT, table, row)

    def upsert(self, table: str, row: Mapping[str, object]) -> WriteResult | None:
        """Insert ``row``, or, if its key exists, set the columns ``row`` gives (the others
        keep their values: give a column as None to clear it)."""
        return self.apply(OpType.UPSERT, table, row)

    def update(self, table: str, row: Mapping[str, object]) -> WriteResult | None:
        return self.apply(OpType.UPDATE, table, row)

    def delete(self, table: str, row: Mapping[str, object]) -> WriteResult | None:
        return self.apply(OpType.DELETE, table, row)

    def apply(self, op_type: OpType, table: str, row: Mapping[str, object]) -> WriteResult | None:
        """Write one row (see the flush modes). Raises ``RowError`` at once for a row the
        server would refuse anyway (unknown column, wrong type, missing key…), and
        ``InvalidArgument`` for a ``row`` that is not a mapping. In
        ``AUTO_FLUSH_SYNC`` mode returns where the acknowledged write is in its tablet's log
        (``WriteResult``: Raft index and term); in the buffering modes None."""
        op_type = op_type_of(op_type)
        row = row_of(row)
        # Encoded before the index is taken (an unknown table takes none), so that taking
        # it and buffering the row is one short critical section and buffers stay in index
        # order.
        try:
            try:
                op = self._encode(op_type, table, row)
            except RowError:
                if not self._rpc.meta.table_changed(table):
                    raise
                op = self._encode(op_type, table, row)  # by the table's new schema
        except RowError as e:
            with self._lock:
                index = self._take_index()
            raise RowError(index, e.code, e.message, table=table, row=row) from None
        if self.flush_mode is FlushMode.MANUAL_FLUSH:
            with self._lock:
                op.index = self._take_index()
                self._buffer.append(op)
                self._accepted += 1
                self._unanswered_bytes += op.nbytes
            return None
        if self.flush_mode is FlushMode.AUTO_FLUSH_SYNC:
            with self._lock:
                op.index = self._take_index()
            result, errors = self._write(op.tablet_id, [op])
            if errors:
                raise errors[0]
            return result
        self._buffer_background(op)
        return None

    def _encode(self, op_type: OpType, table: str, row: Mapping[str, object]) -> Operation:
        return encode_operation(
            self._rpc.meta, self._rpc.stats, -1, op_type, table, row, packed_rows=self.packed_rows
        )

    def _check_open(self) -> None:
        if self._closing:
            raise ClientClosed("the session is closed")

    def _take_index(self) -> int:
        """The next operation index (caller holds ``_lock``); ClientClosed when closed."""
        self._check_open()
        index = self._next_index
        self._next_index += 1
        return index

    def _buffer_background(self, op: Operation) -> None:
        with self._lock:
            if self._closing:
                raise ClientClosed("the session is closed")
            if not self._room_for(op.nbytes):
                self._wait_for_room(op.nbytes)
            op.index = self._next_index
            self._next_index += 1
            opened = self._pipeline.add(op)
            self._accepted += 1
            self._unanswered_bytes += op.nbytes
            if opened:  # the flusher's timer starts with the first open row
                self._cond.notify_all()

    def _room_for(self, nbytes: int) -> bool:
        """Whether a row of ``nbytes`` may be buffered now (caller holds ``_lock``)."""
        unanswered = self._unanswered_bytes
        return self._accepted - self._done < self.max_buffered_rows and (
            not unanswered or unanswered + nbytes <= self.max_buffered_bytes
        )

    def _wait_for_room(self, nbytes: int) -> None:
        """Block (holding ``_cond``) while the unacknowledged rows leave no room for a row
        of ``nbytes`` (``max_buffered_rows``, ``max_buffered_bytes``), for at most
        ``timeout_s``."""
        clock = self._rpc.clock
        deadline = clock() + self.timeout_s
        while not self._room_for(nbytes):
            left = deadline - clock()
            if left <= 0:
                raise Timeout(
                    f"session buffer full: {self._accepted - self._done} rows of "
                    f"{self._unanswered_bytes} bytes not yet acknowledged after "
                    f"{self.timeout_s:.3g} s (max_buffered_rows={self.max_buffered_rows}, "
                    f"max_buffered_bytes={self.max_buffered_bytes})",
                    may_have_applied=False,  # this row was refused before it was buffered
                )
            self._cond.wait(left)
            self._check_open()

    # --- flushing --------------------------------------------------------------------------

    def flush(self) -> None:
        """Send everything buffered and wait until each of those rows has an outcome
        (acknowledged, or an error collected for ``errors()``)."""
        with self._cond:
            ops, self._buffer = self._buffer, []
            # Every index taken so far, refused rows included (they take one and are never
            # buffered: the count of buffered rows fell one short per refusal).
            target = self._next_index
            if not (len(ops) == 1 or (ops and self._one_batch(ops))):
                self._pipeline.add_all(ops)
                self._wait_for(target)
                return
            # One batch: sent on this thread, without a hop to the pool.
            self._inline.append(ops[0].index)
        errors: list[RaftletError] = []
        try:
            errors = self._send_batch(ops[0].tablet_id, ops)
        except Exception as e:  # a bug: report it for each row rather than lose the rows
            err = RaftletError(f"writing {len(ops)} rows failed: {e!r}")
            errors = [err.for_operation(op.index, op.table, op.row) for op in ops]
        finally:
            with self._cond:
                self._inline.remove(ops[0].index)
                self._batch_done(ops, errors)
                self._cond.notify_all()
        with self._cond:
            self._wait_for(target)

    def _one_batch(self, ops: list[Operation]) -> bool:
        """Whether ``ops`` make exactly one batch (one tablet, within the limits)."""
        tablet = ops[0].tablet_id
        return (
            len(ops) <= self.max_batch_rows
            and all(op.tablet_id == tablet for op in ops)
            and sum(op.nbytes for op in ops) <= self.max_batch_bytes
        )

    def _wait_for(self, target: int) -> None:
        """Wait (holding ``_cond``) until every operation below index ``target`` of those
        accepted has an outcome."""
        while True:
            lowest = min(self._inline, default=None)
            queued = self._pipeline.lowest_unfinished()
            if lowest is None or (queued is not None and queued < lowest):
                lowest = queued
            if lowest is None or lowest >= target:
                return
            self._cond.wait()

    def _run_flusher(self) -> None:
        clock = self._rpc.clock
        with self._cond:
            while True:
                oldest = self._pipeline.oldest_open()
                if oldest is None:
                    if self._closing:
                        return
                    self._cond.wait()
                    continue
                waited = clock() - oldest
                if waited >= self.flush_interval_s or self._closing:
                    self._pipeline.close_open()
                else:
                    self._cond.wait(self.flush_interval_s - waited)

    def _batch_done(self, ops: list[Operation], errors: list[RaftletError]) -> None:
        """Caller holds ``_cond``."""
        self._errors.extend(errors)
        self._error_count += len(errors)
        self._done += len(ops)
        self._unanswered_bytes -= sum(op.nbytes for op in ops)

    def _send_batch(self, tablet_id: str, ops: list[Operation]) -> list[RaftletError]:
        """One Write RPC of ``ops`` (all of ``tablet_id``), retried with one request id.
        Returns the errors, one per failed operation."""
        return self._write(tablet_id, ops)[1]

    def _write(
        self, tablet_id: str, ops: list[Operation]
    ) -> tuple[WriteResult | None, list[RaftletError]]:
        """``_send_batch``, with where the write landed when it was acknowledged."""
        rpc = self._rpc
        tracker = self._tracker
        seq_no = tracker.new_seq_no()
        request = write_request(tablet_id, ops, tracker.client_id, seq_no)

        def write(stub: ServerStub, timeout: float, attempt_no: int) -> tablet_pb2.WriteResponse:
            request.request_id.attempt_no = attempt_no
            request.request_id.first_incomplete_seq_no = tracker.first_incomplete_seq_no()
            return stub.write(request, timeout)

        start = rpc.clock()
        try:
            response, _server = call_tablet(
                rpc,
                tablet_id,
                write,
                what=describe_write(len(ops), tablet_id),
                deadline=start + self.timeout_s,
                timeout_s=self.timeout_s,
            )
        except RaftletError as e:
            rpc.stats.error(e.cause, len(ops))
            failure = write_failure(e)
            return None, [failure.for_operation(op.index, op.table, op.row) for op in ops]
        finally:
            tracker.complete(seq_no)
        rpc.stats.write_acked(len(ops), rpc.clock() - start)
        result = WriteResult(response.op_index, response.op_term, tablet_id)
        return result, batch_errors(response, ops, tablet_id, rpc.stats)

    # --- results and lifecycle -------------------------------------------------------------

    def errors(self) -> list[RaftletError]:
        """The errors collected since the last call (and clears them); see the module
        docstring. Each has ``row_index`` set; ``RowError`` for a row the server refused."""
        with self._cond:
            out, self._errors = self._errors, []
        out.sort(key=lambda e: -1 if e.row_index is None else e.row_index)
        return out

    pending_errors = errors

    @property
    def error_count(self) -> int:
        """Errors collected over the session's life (``errors()`` does not reset it)."""
        with self._cond:
            return self._error_count

    @property
    def pending(self) -> int:
        """Operations given to the session that have no outcome yet."""
        with self._cond:
            return self._accepted - self._done

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Refuse further writes, flush what is buffered, stop the background thread.
        Idempotent; a write blocked on a full buffer fails with ``ClientClosed``."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        try:
            self.flush()
        finally:
            if self._flusher is not None:
                self._flusher.join()
            self._closed = True
            if self._on_close is not None:
                self._on_close(self)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
