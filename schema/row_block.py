"""Row operations packed into one block per batch: fixed-width cells and a side buffer.

The per-cell form (``RowOperationPB`` with one ``CellPB`` and ``ValuePB`` per value) costs a
protobuf message per cell, built and parsed in Python on both sides. A row block is what Kudu
sends instead (its ``RowOperationsPB``): every row has the same width for a given schema, so
a whole batch is encoded and decoded with one precompiled ``struct`` over the buffer.

Layout, little-endian, no padding. ``rows`` holds ``n`` rows of ``row_width(schema)`` bytes:

    op type      u8      (``OpType``: INSERT 1, UPSERT 2, UPDATE 3, DELETE 4)
    isset        ceil(columns / 8) bytes, bit i set: column i is given
    null         ceil(columns / 8) bytes, bit i set: column i is given as NULL
    cells        one per column in schema order, given or not (zero when not):
                 INT8 i8 · INT16 i16 · INT32 i32 · INT64 / UNIXTIME_MICROS i64 · FLOAT f32 ·
                 DOUBLE f64 · BOOL u8 (0 or 1) · STRING / BINARY u32 offset + u32 length
                 into ``indirect``

``indirect`` holds the variable-length bytes (STRING as UTF-8). "Given" and "NULL" are two
bits because they mean different things: an UPDATE changes only given columns, and an INSERT
leaves a column that is not given NULL. A scan's packed result page uses the same layout for
its projected columns (``row_pages``), so ``RowLayout`` is built from a list of column types.

Damage to the block's structure -- a length that is not a whole number of rows, a bit for a
column that does not exist, NULL without isset, a cell pointing outside ``indirect``, a BOOL
that is neither 0 nor 1 -- raises ``RowBlockError`` for the whole batch (INVALID_ARGUMENT):
the block cannot be trusted. A well-formed row that breaks the schema's rules (a missing key,
NULL in a non-nullable column, an unknown op type, invalid UTF-8, NaN) is a per-row
``RowFailure``, exactly as ``rows.decode_row_ops`` reports it for the per-cell form.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from functools import lru_cache

from raftlet.schema.rows import ErrorCode, OpType, RowFailure, RowOp, RowOpError, build_row_op
from raftlet.schema.schema import Schema
from raftlet.schema.types import DataType, TypeMismatch, Value, normalize

__all__ = [
    "RowBlockError",
    "RowLayout",
    "decode_row_block",
    "encode_row_block",
    "join_row_blocks",
    "layout_of_types",
    "row_layout",
    "row_width",
]

_CELL = {
    DataType.INT8: "b",
    DataType.INT16: "h",
    DataType.INT32: "i",
    DataType.INT64: "q",
    DataType.UNIXTIME_MICROS: "q",
    DataType.FLOAT: "f",
    DataType.DOUBLE: "d",
    DataType.BOOL: "B",
    DataType.STRING: "II",
    DataType.BINARY: "II",
}
_VARLEN = (DataType.STRING, DataType.BINARY)
_U32 = struct.Struct("<I")
_OPS = frozenset(int(t) for t in OpType)


class RowBlockError(ValueError):
    """The block is malformed as a whole (the request is refused with INVALID_ARGUMENT)."""


class RowLayout:
    """The precompiled row struct of one list of column types (a schema's, or a scan's
    projection: ``row_pages``), and where each column's cell sits in it."""

    def __init__(self, types: Sequence[DataType]) -> None:
        ncols = len(types)
        self.bitmap_bytes = (ncols + 7) // 8
        # Op type and the two bitmaps: the part of a row that says what the row is.
        self.header_size = 1 + 2 * self.bitmap_bytes
        fmt = "<B" + f"{self.bitmap_bytes}s" * 2 + "".join(_CELL[t] for t in types)
        self.row = struct.Struct(fmt)
        # Index in an unpacked row tuple of each column's first field.
        self.field: list[int] = []
        at = 3
        for t in types:
            self.field.append(at)
            at += 2 if t in _VARLEN else 1
        self.types = list(types)
        # Byte offset, within a row, of each variable-length cell's side-buffer offset.
        self.varlen_at: list[int] = []
        prefix = "<B" + f"{self.bitmap_bytes}s" * 2
        for t in types:
            if t in _VARLEN:
                self.varlen_at.append(struct.calcsize(prefix))
            prefix += _CELL[t]
        # Bits above the last column must be clear in both bitmaps.
        self.spare_mask = (~((1 << ncols) - 1)) & ((1 << (8 * self.bitmap_bytes)) - 1)


@lru_cache(maxsize=64)
def layout_of_types(types: tuple[DataType, ...]) -> RowLayout:
    """The (cached) layout of rows whose columns have ``types``, in that order."""
    return RowLayout(types)


@lru_cache(maxsize=64)
def row_layout(schema: Schema) -> RowLayout:
    """The (cached) layout of ``schema``'s rows in a block."""
    return layout_of_types(tuple(c.type for c in schema.columns))


def row_width(schema: Schema) -> int:
    """Bytes per row of ``schema`` in a block."""
    return row_layout(schema).row.size


def encode_row_block(
    schema: Schema, ops: Sequence[tuple[OpType | int, Mapping[str, object]]]
) -> tuple[bytes, bytes]:
    """``(rows, indirect)`` for ``ops`` (op type, column name → value; None is NULL).

    Validates as ``rows.encode_row_op`` does and raises ``RowOpError`` (with ``row_index``
    in the message) on the first bad row, so a client learns of it before a round trip."""
    layout = row_layout(schema)
    rows = bytearray(layout.row.size * len(ops))
    indirect = bytearray()
    ncols = len(schema.columns)
    for n, (op_type, row) in enumerate(ops):
        isset = 0
        null = 0
        if int(op_type) not in _OPS:
            raise RowOpError(ErrorCode.INVALID_ROW, f"row {n}: unknown op type {op_type}")
        fields: list[object] = [int(op_type), b"", b""]
        given: dict[int, Value] = {}
        for name, raw in row.items():
            if not schema.has_column(name):
                raise RowOpError(ErrorCode.UNKNOWN_COLUMN, f"row {n}: unknown column {name!r}")
            idx = schema.index_of(name)
            try:
                given[idx] = normalize(layout.types[idx], raw)
            except TypeMismatch as e:
                raise RowOpError(
                    ErrorCode.TYPE_MISMATCH, f"row {n}: column {name!r}: {e}"
                ) from None
            if given[idx] is None and not schema.columns[idx].nullable:
                raise RowOpError(
                    ErrorCode.NULL_NOT_ALLOWED, f"row {n}: column {name!r} is not nullable"
                )
        for idx in range(ncols):
            dtype = layout.types[idx]
            value = given.get(idx)
            if idx in given:
                isset |= 1 << idx
                if value is None:
                    null |= 1 << idx
            if dtype in _VARLEN:
                if value is None:
                    # Where the next bytes would go, so joining blocks moves every cell alike.
                    fields += (len(indirect), 0)
                else:
                    data = value.encode("utf-8") if isinstance(value, str) else value
                    assert isinstance(data, bytes)
                    fields += (len(indirect), len(data))
                    indirect += data
            elif value is None:
                fields.append(0.0 if dtype in (DataType.FLOAT, DataType.DOUBLE) else 0)
            else:
                fields.append(int(value) if dtype is DataType.BOOL else value)
        fields[1] = isset.to_bytes(layout.bitmap_bytes, "little")
        fields[2] = null.to_bytes(layout.bitmap_bytes, "little")
        try:
            build_row_op(schema, OpType(int(op_type)), given, n)
        except RowOpError as e:
            raise RowOpError(e.code, f"row {n}: {e.message}") from None
        layout.row.pack_into(rows, n * layout.row.size, *fields)
    return bytes(rows), bytes(indirect)


def join_row_blocks(schema: Schema, blocks: Sequence[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    """One block of the rows of ``blocks`` (each ``(rows, indirect)``), in order: the side
    buffers are concatenated and each variable-length cell's offset moved by what came
    before.  Lets a client encode (and validate) each row once, when it is written, and
    send any batch of them without encoding again."""
    layout = row_layout(schema)
    rows = b"".join(r for r, _ in blocks)
    indirect = b"".join(i for _, i in blocks)
    if not layout.varlen_at:
        return rows, indirect
    out = bytearray(rows)
    width = layout.row.size
    pos = 0
    base = 0
    for block_rows, block_indirect in blocks:
        if base:
            for row_at in range(pos, pos + len(block_rows), width):
                for at in layout.varlen_at:
                    (offset,) = _U32.unpack_from(out, row_at + at)
                    _U32.pack_into(out, row_at + at, offset + base)
        pos += len(block_rows)
        base += len(block_indirect)
    return bytes(out), indirect


def decode_row_block(
    schema: Schema, rows: bytes, indirect: bytes
) -> tuple[list[RowOp], list[RowFailure]]:
    """Decode and validate a block: the valid rows (each with its ``row_index``) and one
    ``RowFailure`` per invalid row; ``RowBlockError`` if the block itself is malformed."""
    layout = row_layout(schema)
    width = layout.row.size
    if len(rows) % width:
        raise RowBlockError(
            f"row block of {len(rows)} bytes is not a whole number of {width}-byte rows"
        )
    side = memoryview(indirect)
    limit = len(indirect)
    spare = layout.spare_mask
    fields = layout.field
    types = layout.types
    good: list[RowOp] = []
    errors: list[RowFailure] = []
    for n, row in enumerate(layout.row.iter_unpack(rows)):
        isset = int.from_bytes(row[1], "little")
        null = int.from_bytes(row[2], "little")
        if (isset | null) & spare:
            raise RowBlockError(f"row {n}: bitmap bit set for a column the schema lacks")
        if null & ~isset:
            raise RowBlockError(f"row {n}: a column is NULL but not given")
        given: dict[int, Value] = {}
        failure: RowFailure | None = None
        bit = 1
        for idx, dtype in enumerate(types):
            if isset & bit:
                at = fields[idx]
                if null & bit:
                    if not schema.columns[idx].nullable:
                        failure = failure or RowFailure(
                            n,
                            ErrorCode.NULL_NOT_ALLOWED,
                            f"column {schema.columns[idx].name!r} is not nullable",
                        )
                    given[idx] = None
                elif dtype in _VARLEN:
                    offset, length = row[at], row[at + 1]
                    if offset + length > limit:
                        raise RowBlockError(
                            f"row {n}: column {schema.columns[idx].name!r} points past the "
                            f"{limit}-byte side buffer"
                        )
                    data = side[offset : offset + length]
                    if dtype is DataType.BINARY:
                        given[idx] = bytes(data)
                    else:
                        try:
                            given[idx] = str(data, "utf-8")
                        except UnicodeDecodeError as e:
                            given[idx] = None
                            failure = failure or RowFailure(
                                n,
                                ErrorCode.TYPE_MISMATCH,
                                f"column {schema.columns[idx].name!r}: not valid UTF-8: {e.reason}",
                            )
                elif dtype is DataType.BOOL:
                    flag = row[at]
                    if flag > 1:
                        raise RowBlockError(
                            f"row {n}: BOOL column {schema.columns[idx].name!r} holds {flag}"
                        )
                    given[idx] = flag == 1
                elif dtype is DataType.FLOAT or dtype is DataType.DOUBLE:
                    f = row[at]
                    if math.isnan(f):
                        failure = failure or RowFailure(
                            n,
                            ErrorCode.TYPE_MISMATCH,
                            f"column {schema.columns[idx].name!r}: NaN is not supported",
                        )
                    given[idx] = f + 0.0  # -0.0 becomes +0.0, as normalize does
                else:
                    given[idx] = row[at]
            bit <<= 1
        if failure is not None:
            errors.append(failure)
            continue
        if row[0] not in _OPS:
            errors.append(RowFailure(n, ErrorCode.INVALID_ROW, f"unknown operation type {row[0]}"))
            continue
        try:
            # A committed entry's rows too: the key limit is for where a write is admitted.
            good.append(build_row_op(schema, OpType(row[0]), given, n, key_limit=False))
        except RowOpError as e:
            errors.append(RowFailure(n, e.code, e.message))
    return good, errors
