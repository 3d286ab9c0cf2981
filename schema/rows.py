"""Row operations: decoding ``RowOperationPB`` into typed operations with per-row errors,
encoding them on the client, and the ``RowPB`` cells of scan results.

A bad row never fails the whole request: ``decode_row_ops`` returns the good rows and one
``RowFailure`` (with a ``RowErrorPB`` code) per bad row, as Kudu does. The same validation runs
on the client (``encode_row_op``) so most mistakes are caught before a round trip.

Decoding rules, checked in this order; a row reports only its first error:

1. the op type is one of INSERT, UPSERT, UPDATE, DELETE (else INVALID_ROW);
2. per cell: the column exists (UNKNOWN_COLUMN), appears once (INVALID_ROW), the value fits
   the type (TYPE_MISMATCH), and is not NULL in a non-nullable column (NULL_NOT_ALLOWED).
   A cell whose ValuePB has no member set means "not given" and is ignored;
3. every key column is given (MISSING_KEY_COLUMN), and the key of an INSERT or UPSERT is at
   most ``MAX_KEY_BYTES`` (16 KiB: strings and binaries by their bytes, any other column 8)
   (INVALID_ROW) -- checked where a write is admitted (``key_limit``: the client's encoders,
   and the leader, which refuses such a write whole), never where a committed entry is
   decoded: entries that older leaders wrote before the limit existed must apply as they
   did there, or replicas of mixed versions diverge. An UPDATE or DELETE creates no key,
   so it may name a longer key stored before the limit;
4. DELETE gives only key columns; UPDATE gives at least one non-key column (INVALID_ROW);
5. INSERT and UPSERT give every non-nullable column (NULL_NOT_ALLOWED): there are no column
   defaults, and an UPSERT may turn out to be an insert.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from raftlet.proto import tablet_pb2
from raftlet.schema.schema import Schema
from raftlet.schema.types import TypeMismatch, Value, value_from_pb, value_to_pb

__all__ = [
    "MAX_KEY_BYTES",
    "ErrorCode",
    "OpType",
    "RowFailure",
    "RowOp",
    "RowOpError",
    "build_row_op",
    "check_key_size",
    "decode_row_op",
    "decode_row_ops",
    "encode_row_op",
    "key_bytes",
    "row_from_pb",
    "row_to_pb",
]

ErrorCode = tablet_pb2.RowErrorPB.Code
# A row's key, its string and binary columns by their bytes: a scan page carries a key
# twice (the row and the resume key), and keys of megabytes made a tablet's pages too
# large to send -- every full scan of it failed for good. Kudu's limit too.
MAX_KEY_BYTES = 16 * 1024
_Op = tablet_pb2.RowOperationPB


class OpType(enum.IntEnum):
    """The numbers are those of ``RowOperationPB.OpType``."""

    INSERT = _Op.INSERT
    UPSERT = _Op.UPSERT
    UPDATE = _Op.UPDATE
    DELETE = _Op.DELETE


class RowOpError(ValueError):
    """One row is invalid; ``code`` is a ``RowErrorPB.Code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class RowFailure:
    """A per-row failure: ``row_index`` is the row's position in its request's ``ops``."""

    row_index: int
    code: int
    message: str

    def to_pb(self) -> tablet_pb2.RowErrorPB:
        return tablet_pb2.RowErrorPB(
            row_index=self.row_index,
            code=cast(tablet_pb2.RowErrorPB.Code, self.code),
            message=self.message,
        )

    @property
    def code_name(self) -> str:
        return ErrorCode.Name(self.code)


@dataclass(frozen=True, slots=True)
class RowOp:
    """A validated row operation.

    ``key`` holds the key column values in key order (normalized, never None); ``values``
    the given non-key columns in schema order (None is SQL NULL); ``row_index`` the row's
    position in the request, so results can point back at it.
    """

    type: OpType
    key: tuple[Value, ...]
    values: Mapping[str, Value] = field(default_factory=dict)
    row_index: int = 0


def decode_row_op(
    schema: Schema,
    pb: tablet_pb2.RowOperationPB,
    row_index: int = 0,
    *,
    key_limit: bool = True,
) -> RowOp:
    """Decode and validate one row; raises ``RowOpError`` (see the module docstring;
    ``key_limit`` False for a committed entry's rows)."""
    try:
        op_type = OpType(pb.type)
    except ValueError:
        raise RowOpError(ErrorCode.INVALID_ROW, f"unknown operation type {pb.type}") from None
    given: dict[int, Value] = {}
    for cell in pb.cells:
        if not schema.has_column(cell.column):
            raise RowOpError(ErrorCode.UNKNOWN_COLUMN, f"unknown column {cell.column!r}")
        idx = schema.index_of(cell.column)
        if idx in given:
            raise RowOpError(ErrorCode.INVALID_ROW, f"column {cell.column!r} given twice")
        if not cell.HasField("value") or cell.value.WhichOneof("value") is None:
            continue
        col = schema.columns[idx]
        try:
            value = value_from_pb(col.type, cell.value)
        except TypeMismatch as e:
            raise RowOpError(ErrorCode.TYPE_MISMATCH, f"column {col.name!r}: {e}") from None
        if value is None and not col.nullable:
            raise RowOpError(ErrorCode.NULL_NOT_ALLOWED, f"column {col.name!r} is not nullable")
        given[idx] = value
    return build_row_op(schema, op_type, given, row_index, key_limit=key_limit)


def build_row_op(
    schema: Schema,
    op_type: OpType,
    given: Mapping[int, Value],
    row_index: int,
    *,
    key_limit: bool = True,
) -> RowOp:
    """The ``RowOp`` of decoded cells (column index → value), checked against rules 3-5
    of the module docstring (``key_limit``: rule 3's limit too); raises ``RowOpError``.
    Shared by both wire forms."""
    nkeys = schema.num_key_columns
    for i in range(nkeys):
        if i not in given:
            raise RowOpError(
                ErrorCode.MISSING_KEY_COLUMN,
                f"key column {schema.columns[i].name!r} not given",
            )
    key = tuple(given[i] for i in range(nkeys))
    if key_limit:
        check_key_size(schema, op_type, key)
    non_key = sorted(i for i in given if i >= nkeys)
    if op_type is OpType.DELETE and non_key:
        raise RowOpError(
            ErrorCode.INVALID_ROW,
            f"DELETE takes only key columns, got {schema.columns[non_key[0]].name!r}",
        )
    if op_type is OpType.UPDATE and not non_key:
        raise RowOpError(ErrorCode.INVALID_ROW, "UPDATE changes no column (only the key given)")
    if op_type in (OpType.INSERT, OpType.UPSERT):
        for i in range(nkeys, len(schema.columns)):
            col = schema.columns[i]
            if i not in given and not col.nullable:
                raise RowOpError(
                    ErrorCode.NULL_NOT_ALLOWED,
                    f"{op_type.name} gives no value for non-nullable column {col.name!r}",
                )
    return RowOp(
        type=op_type,
        key=key,
        values={schema.columns[i].name: given[i] for i in non_key},
        row_index=row_index,
    )


def check_key_size(schema: Schema, op_type: OpType, key: Sequence[Value]) -> None:
    """Refuse (``RowOpError`` INVALID_ROW) an INSERT or UPSERT whose key is over
    ``MAX_KEY_BYTES``: rule 3's limit, for where a write is admitted."""
    if op_type not in (OpType.INSERT, OpType.UPSERT):
        return
    size = schema.fixed_key_bytes
    if size is None:
        size = key_bytes(key)
    if size > MAX_KEY_BYTES:
        raise RowOpError(
            ErrorCode.INVALID_ROW, f"the key is {size} bytes, over the {MAX_KEY_BYTES}-byte limit"
        )


def key_bytes(key: Sequence[Value]) -> int:
    """A key's size as ``MAX_KEY_BYTES`` counts it."""
    size = 0
    for v in key:
        if isinstance(v, str):
            size += len(v) if v.isascii() else len(v.encode("utf-8", "surrogatepass"))
        elif isinstance(v, bytes | bytearray | memoryview):
            size += len(v)
        else:
            size += 8
    return size


def decode_row_ops(
    schema: Schema, ops: Iterable[tablet_pb2.RowOperationPB], *, key_limit: bool = True
) -> tuple[list[RowOp], list[RowFailure]]:
    """Decode a request's rows: the valid ones (each with its ``row_index``) and the errors."""
    good: list[RowOp] = []
    errors: list[RowFailure] = []
    for i, pb in enumerate(ops):
        try:
            good.append(decode_row_op(schema, pb, i, key_limit=key_limit))
        except RowOpError as e:
            errors.append(RowFailure(i, e.code, e.message))
    return good, errors


def encode_row_op(
    schema: Schema, op_type: OpType | int, row: Mapping[str, object]
) -> tablet_pb2.RowOperationPB:
    """Build the ``RowOperationPB`` for ``row`` (column name → Python value; None is NULL).

    Validates exactly as the server will and raises ``RowOpError`` on the first problem, so
    a client learns of a bad row without a round trip.
    """
    pb = tablet_pb2.RowOperationPB(type=cast(_Op.OpType, int(op_type)))
    for name, value in row.items():
        cell = pb.cells.add(column=name)
        if not schema.has_column(name):
            raise RowOpError(ErrorCode.UNKNOWN_COLUMN, f"unknown column {name!r}")
        col = schema.column(name)
        try:
            value_to_pb(col.type, value, cell.value)
        except TypeMismatch as e:
            raise RowOpError(ErrorCode.TYPE_MISMATCH, f"column {name!r}: {e}") from None
    decode_row_op(schema, pb)
    return pb


def row_to_pb(schema: Schema, columns: Sequence[str], row: Sequence[object]) -> tablet_pb2.RowPB:
    """A scan result row: ``row[i]`` is the value of column ``columns[i]``."""
    if len(columns) != len(row):
        raise ValueError(f"{len(columns)} columns but {len(row)} values")
    pb = tablet_pb2.RowPB()
    for name, value in zip(columns, row, strict=True):
        value_to_pb(schema.column(name).type, value, pb.values.add())
    return pb


def row_from_pb(schema: Schema, columns: Sequence[str], pb: tablet_pb2.RowPB) -> tuple[Value, ...]:
    """Inverse of ``row_to_pb``; raises ``TypeMismatch`` on a value of the wrong type."""
    if len(pb.values) != len(columns):
        raise ValueError(f"{len(columns)} columns but {len(pb.values)} values")
    return tuple(
        value_from_pb(schema.column(name).type, v)
        for name, v in zip(columns, pb.values, strict=True)
    )
