"""Packing one row at a time into the row block form, fast: what a client does per write call.

``row_block.encode_row_block`` is the reference encoder: it normalizes every value, builds a
``RowOp`` to check the rules and reports the first problem precisely. A client writing a
thousand rows a second per thread cannot pay that per row. ``RowPacker`` handles the values
a program usually passes -- ``int`` in range, ``float`` that is not NaN, ``bool``, ``str``,
``bytes``, ``None`` -- with one type test each, checks the op's rules once per shape of row
(op type, columns given, NULLs) and packs the row with the layout's precompiled struct.
Anything else (a ``datetime``, a ``bytearray``, a FLOAT to round to 32 bits, an unknown
column, a broken rule) goes to ``encode_row_block``, which normalizes it or raises the
``RowOpError`` it deserves. Both give the same bytes for a row either accepts
(``tests/unit/test_schema_row_packer.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from functools import lru_cache

from raftlet.schema.row_block import encode_row_block, row_layout
from raftlet.schema.rows import OpType, RowOpError, build_row_op
from raftlet.schema.schema import Schema
from raftlet.schema.types import INTEGER_RANGES, DataType

__all__ = ["RowPacker", "row_packer"]


class _Kind(enum.Enum):
    INT = 1
    DOUBLE = 2
    BOOL = 3
    STRING = 4
    BINARY = 5
    OTHER = 6  # always the reference encoder


_KIND = {
    **dict.fromkeys(INTEGER_RANGES, _Kind.INT),
    DataType.DOUBLE: _Kind.DOUBLE,
    DataType.BOOL: _Kind.BOOL,
    DataType.STRING: _Kind.STRING,
    DataType.BINARY: _Kind.BINARY,
    DataType.FLOAT: _Kind.OTHER,
}
_NOT_GIVEN = object()
_OPS = {int(t): t for t in OpType}


class _Slow(Exception):
    """The row needs the reference encoder."""


class RowPacker:
    """Packs rows of one schema; see the module docstring. Thread-safe (no mutable state
    beyond a cache of checked row shapes)."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        layout = row_layout(schema)
        self._struct = layout.row
        self._bitmap_bytes = layout.bitmap_bytes
        self._names = frozenset(c.name for c in schema.columns)
        self._columns = [
            (
                c.name,
                1 << i,
                _KIND[c.type],
                *INTEGER_RANGES.get(c.type, (0, 0)),
                c.type is DataType.DOUBLE or c.type is DataType.FLOAT,
            )
            for i, c in enumerate(schema.columns)
        ]
        self._not_nullable = sum(1 << i for i, c in enumerate(schema.columns) if not c.nullable)

    def pack(self, op_type: OpType | int, row: Mapping[str, object]) -> tuple[bytes, bytes]:
        """``row`` as a one-row block ``(rows, indirect)``, exactly as
        ``encode_row_block(schema, [(op_type, row)])`` packs it; raises ``RowOpError`` for a
        row the server would refuse."""
        try:
            return self._pack(op_type, row)
        except _Slow:
            return encode_row_block(self.schema, [(op_type, row)])

    def _pack(self, op_type: OpType | int, row: Mapping[str, object]) -> tuple[bytes, bytes]:
        op = _OPS.get(op_type)
        if op is None or not row.keys() <= self._names:
            raise _Slow
        isset = null = 0
        fields: list[object] = [int(op), b"", b""]
        side: list[bytes] = []
        at = 0
        for name, bit, kind, lo, hi, is_float in self._columns:
            v = row.get(name, _NOT_GIVEN)
            if v is _NOT_GIVEN or v is None:
                if v is None:
                    isset |= bit
                    null |= bit
                if kind is _Kind.STRING or kind is _Kind.BINARY:
                    fields += (at, 0)
                else:
                    fields.append(0.0 if is_float else 0)
                continue
            isset |= bit
            if kind is _Kind.INT:
                if type(v) is not int or not lo <= v <= hi:
                    raise _Slow
                fields.append(v)
            elif kind is _Kind.STRING:
                if type(v) is not str:
                    raise _Slow
                try:
                    data = v.encode("utf-8")
                except UnicodeEncodeError:
                    raise _Slow from None
                fields += (at, len(data))
                side.append(data)
                at += len(data)
            elif kind is _Kind.BINARY:
                if type(v) is not bytes:
                    raise _Slow
                fields += (at, len(v))
                side.append(v)
                at += len(v)
            elif kind is _Kind.DOUBLE:
                if type(v) is not float or v != v:
                    raise _Slow
                fields.append(v + 0.0)  # -0.0 becomes +0.0, as normalize does
            elif kind is _Kind.BOOL:
                if type(v) is not bool:
                    raise _Slow
                fields.append(int(v))
            else:
                raise _Slow
        if null & self._not_nullable or not _rules_hold(self.schema, op, isset, null):
            raise _Slow
        nbytes = self._bitmap_bytes
        fields[1] = isset.to_bytes(nbytes, "little")
        fields[2] = null.to_bytes(nbytes, "little")
        return self._struct.pack(*fields), b"".join(side)


@lru_cache(maxsize=1024)
def _rules_hold(schema: Schema, op: OpType, isset: int, null: int) -> bool:
    """Whether a row of this shape passes ``build_row_op``'s rules (they look only at which
    columns are given)."""
    given = {i: None if null >> i & 1 else 0 for i in range(len(schema.columns)) if isset >> i & 1}
    try:
        build_row_op(schema, op, given, 0)
    except RowOpError:
        return False
    return True


@lru_cache(maxsize=64)
def row_packer(schema: Schema) -> RowPacker:
    """The (cached) packer of ``schema``."""
    return RowPacker(schema)
