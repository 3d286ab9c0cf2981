"""One write RPC's pure parts, shared by ``Session`` (threads) and ``AsyncClient`` (asyncio).

- ``encode_operation``: a write call → ``Operation``, the row validated and packed exactly as
  the server will decode it (``schema.row_block``) and routed to its tablet; a row the
  server would refuse anyway raises ``RowError`` (counted in the stats) before any RPC.
- ``write_request``: the ``WriteRequest`` of a batch of one tablet's operations -- their
  packed rows joined into one row block, not encoded again (or their per-cell
  ``RowOperationPB``s, the older form, for a session that asks for it) -- carrying the exactly-once
  request id (``client_id``, ``seq_no``; the caller sets ``attempt_no`` and
  ``first_incomplete_seq_no`` on each attempt, see ``request_tracker``).
- ``batch_errors``: a ``WriteResponse`` → one ``RowError`` per row the server refused, with
  the operation's own ``row_index`` (counted in the stats by code).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from raftlet.client.errors import RaftletError, RowError, Timeout
from raftlet.client.meta_cache import MetaState
from raftlet.client.stats import StatsRecorder
from raftlet.proto import tablet_pb2
from raftlet.schema.row_block import join_row_blocks
from raftlet.schema.row_packer import row_packer
from raftlet.schema.rows import ErrorCode, OpType, RowOpError, encode_row_op
from raftlet.schema.schema import Schema

__all__ = [
    "Operation",
    "WriteResult",
    "batch_errors",
    "code_name",
    "describe_write",
    "encode_operation",
    "write_failure",
    "write_request",
]


@dataclass(frozen=True, slots=True)
class WriteResult:
    """Where an acknowledged write is in its tablet's log: the Raft index and term of its
    entry (for a retried write, the entry that applied it first), and the tablet.  Reads
    that must see the write can wait for this index on that tablet
    (``Client.scan(..., min_index={result.tablet_id: result.op_index})``)."""

    op_index: int
    op_term: int
    tablet_id: str = ""


@dataclass(slots=True)
class Operation:
    """One write call of a session, validated, encoded and routed."""

    index: int
    table: str
    type: OpType
    row: Mapping[str, object]
    tablet_id: str
    schema: Schema
    # The row as a one-row block: (rows, indirect) of schema.row_block.
    packed: tuple[bytes, bytes]
    # The encoded primary key (writes of one key keep their order).
    key: bytes = b""
    # The row in the per-cell form instead, when the session sends that form.
    cells: tablet_pb2.RowOperationPB | None = None
    # The row's size on the wire.
    nbytes: int = 0


def code_name(code: int) -> str:
    try:
        return ErrorCode.Name(code)
    except ValueError:
        return f"CODE_{code}"


def encode_operation(
    meta: MetaState,
    stats: StatsRecorder,
    index: int,
    op_type: OpType,
    table: str,
    row: Mapping[str, object],
    *,
    packed_rows: bool = True,
) -> Operation:
    """``row`` (the caller's own copy) as operation ``index`` of ``table``; raises
    ``RowError`` for a row the server would refuse, ``InvalidArgument`` for an unknown
    table or a key that cannot be routed. ``packed_rows=False``: encoded in the per-cell
    form (``RowOperationPB``) instead of the packed row block."""
    info = meta.table(table)
    cells = None
    packed = (b"", b"")
    try:
        if packed_rows:
            packed = row_packer(info.schema).pack(op_type, row)
        else:
            cells = encode_row_op(info.schema, op_type, row)
    except RowOpError as e:
        code = code_name(e.code)
        stats.error(code)
        message = e.message.removeprefix("row 0: ")
        raise RowError(index, code, message, table=table, row=row) from None
    tablet_id, key = meta.route_in(info, row)
    size = cells.ByteSize() if cells is not None else len(packed[0]) + len(packed[1])
    return Operation(index, table, op_type, row, tablet_id, info.schema, packed, key, cells, size)


def write_request(
    tablet_id: str, ops: Sequence[Operation], client_id: str, seq_no: int
) -> tablet_pb2.WriteRequest:
    request = tablet_pb2.WriteRequest(tablet_id=tablet_id)
    if ops and ops[0].cells is not None:
        request.ops.extend(op.cells for op in ops if op.cells is not None)
    elif ops:
        rows, indirect = join_row_blocks(ops[0].schema, [op.packed for op in ops])
        request.row_block.rows = rows
        request.row_block.indirect = indirect
    if ops:
        # Rows packed for another schema than the leader's would be stored as other values.
        request.schema_fingerprint = ops[0].schema.fingerprint
    request.request_id.client_id = client_id
    request.request_id.seq_no = seq_no
    return request


def write_failure(error: RaftletError) -> RaftletError:
    """``error`` as a failed write reports it: its text says whether the write may still
    have been applied (``may_have_applied``), which is what its caller must decide on --
    read it back, or write it again."""
    if not isinstance(error, Timeout):
        if not error.may_have_applied:
            return error
        # A server's INTERNAL, the client closed while the write was out, a failure after
        # an attempt whose fate is unknown: said as a timeout says it.
        return error.with_message(f"{error}; its outcome is unknown: it may have been applied")
    if error.may_have_applied:
        said = "its outcome is unknown: it may have been applied"
    elif error.attempts == 0:
        said = "it was not sent"
    else:
        said = "it was not applied: every attempt was refused before reaching a log"
    return error.with_message(f"{error}; {said}")


def describe_write(rows: int, tablet_id: str) -> str:
    return f"write of {rows} row{'s' if rows != 1 else ''} to tablet {tablet_id}"


def batch_errors(
    response: tablet_pb2.WriteResponse,
    ops: Sequence[Operation],
    tablet_id: str,
    stats: StatsRecorder,
) -> list[RaftletError]:
    """The errors of an acknowledged write, one per row the server refused."""
    errors: list[RaftletError] = []
    for row_error in response.row_errors:
        if row_error.row_index >= len(ops):
            err = RaftletError(
                f"tablet {tablet_id} reported an error for row {row_error.row_index} of a "
                f"{len(ops)}-row write: {row_error.message}"
            )
            errors.append(err)
            stats.error(err.cause)
            continue
        op = ops[row_error.row_index]
        code = code_name(row_error.code)
        stats.error(code)
        errors.append(
            RowError(
                op.index,
                code,
                row_error.message,
                table=op.table,
                row=op.row,
                tablet_id=tablet_id,
            )
        )
    return errors
