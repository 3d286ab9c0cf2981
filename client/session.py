"""Sessions: where rows are written, batched per tablet, and their errors collected.

A session turns ``insert``/``upsert``/``update``/``delete`` calls into ``Operation``s — the
row validated and encoded exactly as the server will decode it (``schema.encode_row_op``)
and routed to its tablet (``MetaCache.tablet_for``) — and sends them in one of three modes:

- ``AUTO_FLUSH_SYNC``: each call sends its row and returns when it is acknowledged; a row
  error is raised as ``RowError``, a failure after retries as ``Timeout`` (or a subclass).
- ``MANUAL_FLUSH``: calls only buffer; ``flush()`` sends the buffer and returns when every
  row has an outcome. Failures are collected, not raised: ``errors()``.
- ``AUTO_FLUSH_BACKGROUND``: calls buffer and return; a background thread sends the buffer
  when it holds ``max_batch_rows`` rows or its oldest row has waited ``flush_interval_s``.
  While ``max_buffered_rows`` rows are unacknowledged, a call blocks (backpressure) — for at
  most ``timeout_s``, then it raises ``Timeout``. ``flush()`` waits until every row given
  before it has an outcome. Failures are collected: ``errors()``.

A flush groups the rows by tablet, cuts each group into batches of at most ``max_batch_rows``
and sends the tablets' groups in parallel on the client's thread pool; the batches of one
tablet go one after another, in call order, so two writes of one key are applied in the order
they were made. Each batch is one Write RPC with its own request id, retried by
``client.rpc.call_tablet`` with that same id until ``timeout_s`` has passed.

Errors are per operation. ``RowError.row_index`` (and ``row_index`` on any collected error)
is the operation's position in the session: the n-th write call, from 0, including calls
that were refused before sending. A batch that failed as a whole (say ``Timeout``) is
reported once per operation in it. ``errors()`` returns the errors collected so far and
clears them (Kudu's ``GetPendingErrors``), so each error is seen once.

``close()`` flushes, stops the background thread and refuses further writes; a session is
also a context manager.
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor

from raftlet.client.channels import ServerStub
from raftlet.client.errors import ClientClosed, InvalidArgument, RaftletError, Timeout
from raftlet.client.request_tracker import RequestTracker
from raftlet.client.rpc import RpcContext, call_tablet
from raftlet.client.write_batch import (
    Operation,
    batch_errors,
    describe_write,
    encode_operation,
    write_request,
)
from raftlet.proto import tablet_pb2
from raftlet.schema.rows import OpType

__all__ = ["FlushMode", "Operation", "Session"]


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
        flush_interval_s: float = 0.05,
        max_buffered_rows: int | None = None,
        on_close: Callable[[Session], None] | None = None,
    ) -> None:
        if not isinstance(flush_mode, FlushMode):
            raise InvalidArgument(f"flush_mode must be a FlushMode, got {flush_mode!r}")
        if timeout_s <= 0:
            raise InvalidArgument(f"timeout_s must be positive, got {timeout_s}")
        if max_batch_rows < 1:
            raise InvalidArgument(f"max_batch_rows must be at least 1, got {max_batch_rows}")
        if flush_interval_s <= 0:
            raise InvalidArgument(f"flush_interval_s must be positive, got {flush_interval_s}")
        if max_buffered_rows is None:
            max_buffered_rows = 4 * max_batch_rows
        if max_buffered_rows < max_batch_rows:
            raise InvalidArgument(
                f"max_buffered_rows ({max_buffered_rows}) must be at least "
                f"max_batch_rows ({max_batch_rows})"
            )
        self.flush_mode = flush_mode
        self.timeout_s = float(timeout_s)
        self.max_batch_rows = max_batch_rows
        self.flush_interval_s = float(flush_interval_s)
        self.max_buffered_rows = max_buffered_rows
        self._rpc = rpc
        self._tracker = tracker
        self._executor = executor
        self._on_close = on_close
        self._cond = threading.Condition()
        self._next_index = 0
        self._buffer: list[Operation] = []
        self._buffer_since = 0.0  # clock() when the oldest buffered operation was added
        self._errors: list[RaftletError] = []
        self._error_count = 0
        self._accepted = 0  # operations ever buffered
        self._done = 0  # of those, how many have an outcome (buffers are sent in order)
        self._flush_upto = 0  # flush() wants the first _flush_upto accepted ones sent now
        self._closing = False
        self._closed = False
        self._flusher: threading.Thread | None = None
        if flush_mode is FlushMode.AUTO_FLUSH_BACKGROUND:
            self._flusher = threading.Thread(
                target=self._run_flusher, name="raftlet-session-flusher", daemon=True
            )
            self._flusher.start()

    # --- writing ---------------------------------------------------------------------------

    def insert(self, table: str, row: Mapping[str, object]) -> None:
        self.apply(OpType.INSERT, table, row)

    def upsert(self, table: str, row: Mapping[str, object]) -> None:
        self.apply(OpType.UPSERT, table, row)

    def update(self, table: str, row: Mapping[str, object]) -> None:
        self.apply(OpType.UPDATE, table, row)

    def delete(self, table: str, row: Mapping[str, object]) -> None:
        self.apply(OpType.DELETE, table, row)

    def apply(self, op_type: OpType, table: str, row: Mapping[str, object]) -> None:
        """Write one row (see the flush modes). Raises ``RowError`` at once for a row the
        server would refuse anyway (unknown column, wrong type, missing key…)."""
        op = self._prepare(OpType(op_type), table, row)
        if self.flush_mode is FlushMode.AUTO_FLUSH_SYNC:
            errors = self._send_batch(op.tablet_id, [op])
            if errors:
                raise errors[0]
        elif self.flush_mode is FlushMode.MANUAL_FLUSH:
            with self._cond:
                self._check_open()
                self._buffer.append(op)
                self._accepted += 1
        else:
            self._buffer_background(op)

    def _check_open(self) -> None:
        if self._closing:
            raise ClientClosed("the session is closed")

    def _prepare(self, op_type: OpType, table: str, row: Mapping[str, object]) -> Operation:
        with self._cond:
            self._check_open()
        self._rpc.meta.table(table)  # an unknown table takes no index
        row = dict(row)  # the caller may reuse its dict; errors report what was written
        with self._cond:
            index = self._next_index
            self._next_index += 1
        return encode_operation(self._rpc.meta, self._rpc.stats, index, op_type, table, row)

    def _buffer_background(self, op: Operation) -> None:
        clock = self._rpc.clock
        with self._cond:
            self._check_open()
            deadline = clock() + self.timeout_s
            while self._accepted - self._done >= self.max_buffered_rows:
                left = deadline - clock()
                if left <= 0:
                    raise Timeout(
                        f"session buffer full: {self._accepted - self._done} rows not yet "
                        f"acknowledged after {self.timeout_s:.3g} s (max_buffered_rows="
                        f"{self.max_buffered_rows})"
                    )
                self._cond.wait(left)
                self._check_open()
            if not self._buffer:
                self._buffer_since = clock()
            self._buffer.append(op)
            self._accepted += 1
            if len(self._buffer) == 1 or len(self._buffer) >= self.max_batch_rows:
                self._cond.notify_all()

    # --- flushing --------------------------------------------------------------------------

    def flush(self) -> None:
        """Send everything buffered and wait until each of those rows has an outcome
        (acknowledged, or an error collected for ``errors()``)."""
        if self.flush_mode is FlushMode.MANUAL_FLUSH:
            with self._cond:
                ops, self._buffer = self._buffer, []
            errors = self._send(ops)
            with self._cond:
                self._record(errors)
                self._done += len(ops)
                self._cond.notify_all()
        elif self.flush_mode is FlushMode.AUTO_FLUSH_BACKGROUND:
            with self._cond:
                target = self._accepted
                self._flush_upto = max(self._flush_upto, target)
                self._cond.notify_all()
                while self._done < target:
                    flusher = self._flusher
                    if flusher is None or not flusher.is_alive():
                        raise RaftletError("the session's background flusher is not running")
                    self._cond.wait(0.5)

    def _run_flusher(self) -> None:
        clock = self._rpc.clock
        while True:
            with self._cond:
                while True:
                    if self._buffer:
                        sent = self._accepted - len(self._buffer)
                        waited = clock() - self._buffer_since
                        if (
                            len(self._buffer) >= self.max_batch_rows
                            or self._flush_upto > sent
                            or self._closing
                            or waited >= self.flush_interval_s
                        ):
                            break
                        self._cond.wait(self.flush_interval_s - waited)
                    elif self._closing:
                        return
                    else:
                        self._cond.wait()
                ops, self._buffer = self._buffer, []
            try:
                errors = self._send(ops)
            except Exception as e:  # a bug must not leave flush() waiting forever
                err = RaftletError(f"writing {len(ops)} rows failed: {e!r}")
                errors = [err.for_operation(op.index, op.table, op.row) for op in ops]
            with self._cond:
                self._record(errors)
                self._done += len(ops)
                self._cond.notify_all()

    def _record(self, errors: list[RaftletError]) -> None:
        """Caller holds ``_cond``."""
        self._errors.extend(errors)
        self._error_count += len(errors)

    def _send(self, ops: list[Operation]) -> list[RaftletError]:
        """Send ``ops``: tablets in parallel, each tablet's batches in order."""
        if not ops:
            return []
        groups: dict[str, list[Operation]] = {}
        for op in ops:
            groups.setdefault(op.tablet_id, []).append(op)

        def send_group(tablet_id: str, group: list[Operation]) -> list[RaftletError]:
            errors: list[RaftletError] = []
            for start in range(0, len(group), self.max_batch_rows):
                errors.extend(
                    self._send_batch(tablet_id, group[start : start + self.max_batch_rows])
                )
            return errors

        items = list(groups.items())
        if len(items) == 1:
            return send_group(*items[0])
        results: list[list[RaftletError]] = []
        try:
            futures = [self._executor.submit(send_group, t, g) for t, g in items]
        except RuntimeError:  # the executor was shut down: the client is closed
            err = ClientClosed("the client is closed")
            return [err.for_operation(op.index, op.table, op.row) for op in ops]
        for future in futures:
            results.append(future.result())
        merged = list(itertools.chain.from_iterable(results))
        merged.sort(key=lambda e: e.row_index if e.row_index is not None else -1)
        return merged

    def _send_batch(self, tablet_id: str, ops: list[Operation]) -> list[RaftletError]:
        """One Write RPC of ``ops`` (all of ``tablet_id``), retried with one request id.
        Returns the errors, one per failed operation."""
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
            return [e.for_operation(op.index, op.table, op.row) for op in ops]
        finally:
            tracker.complete(seq_no)
        rpc.stats.write_acked(len(ops), rpc.clock() - start)
        return batch_errors(response, ops, tablet_id, rpc.stats)

    # --- results and lifecycle -------------------------------------------------------------

    def errors(self) -> list[RaftletError]:
        """The errors collected since the last call (and clears them); see the module
        docstring. Each has ``row_index`` set; ``RowError`` for a row the server refused."""
        with self._cond:
            out, self._errors = self._errors, []
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
