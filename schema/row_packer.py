"""Packing one row at a time into the row block form, fast: what a client does per write call.

``row_block.encode_row_block`` is the reference encoder: it normalizes every value, builds a
``RowOp`` to check the rules and reports the first problem precisely. A client writing a
thousand rows a second per thread cannot pay that per row. ``RowPacker`` handles the values
a program usually passes -- ``int`` in range, ``float`` that is not NaN, ``bool``, ``str``,
``bytes``, ``None`` -- with one type test each, checks the op's rules once per shape of row
(op type, columns given, NULLs) and packs the row with the layout's precompiled struct. The
packing function is generated per schema, one block of code per column (as ``dataclasses``
generates ``__init__``): a loop over the columns cost more than the packing itself.
Anything else (a ``datetime``, a ``bytearray``, a FLOAT to round to 32 bits, an unknown
column, a broken rule, a key over ``MAX_KEY_BYTES``) goes to ``encode_row_block``, which
normalizes it or raises the ``RowOpError`` it deserves. Both give the same bytes for a row
either accepts (``tests/unit/test_schema_row_packer.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import cast

from raftlet.schema.row_block import encode_row_block, row_layout
from raftlet.schema.rows import MAX_KEY_BYTES, OpType, RowOpError, build_row_op
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


class _Slow(Exception):
    """The row needs the reference encoder."""


class RowPacker:
    """Packs rows of one schema; see the module docstring. Thread-safe (no mutable state
    beyond a cache of checked row shapes)."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self._pack = _compile(schema)

    def pack(self, op_type: OpType | int, row: Mapping[str, object]) -> tuple[bytes, bytes]:
        """``row`` as a one-row block ``(rows, indirect)``, exactly as
        ``encode_row_block(schema, [(op_type, row)])`` packs it; raises ``RowOpError`` for a
        row the server would refuse."""
        try:
            return self._pack(op_type, row)
        except _Slow:
            return encode_row_block(self.schema, [(op_type, row)])


# Each column's block reads its value, tests its type, and sets its bits and cells; anything
# unusual raises _Slow.
_CELL_CODE = {
    _Kind.INT: """\
    if type(v) is not int or not {lo} <= v <= {hi}:
        raise _Slow
    c{i} = v""",
    _Kind.DOUBLE: """\
    if type(v) is not float or v != v:
        raise _Slow
    c{i} = v + 0.0""",
    _Kind.BOOL: """\
    if type(v) is not bool:
        raise _Slow
    c{i} = int(v)""",
    _Kind.STRING: """\
    if type(v) is not str:
        raise _Slow
    try:
        d = v.encode("utf-8")
    except UnicodeEncodeError:
        raise _Slow from None
    c{i} = at
    n{i} = len(d)
    at += n{i}
    side.append(d)""",
    _Kind.BINARY: """\
    if type(v) is not bytes:
        raise _Slow
    c{i} = at
    n{i} = len(v)
    at += n{i}
    side.append(v)""",
}


def _compile(schema: Schema) -> Callable[[object, Mapping[str, object]], tuple[bytes, bytes]]:
    layout = row_layout(schema)
    lines = [
        "def pack(op_type, row):",
        "    op = OPS.get(op_type)",
        "    if op is None or not row.keys() <= NAMES:",
        "        raise _Slow",
        "    isset = null = at = 0",
        "    side = []",
    ]
    cells: list[str] = []
    for i, col in enumerate(schema.columns):
        kind = _KIND[col.type]
        varlen = kind is _Kind.STRING or kind is _Kind.BINARY
        zero = "0.0" if col.type in (DataType.FLOAT, DataType.DOUBLE) else "0"
        if kind is _Kind.OTHER:  # FLOAT: its rounding to 32 bits is the reference's job
            lines += [f"    if {col.name!r} in row:", "        raise _Slow", f"    c{i} = {zero}"]
        else:
            lo, hi = INTEGER_RANGES.get(col.type, (0, 0))
            given = _CELL_CODE[kind].format(i=i, lo=lo, hi=hi).replace("\n", "\n    ")
            unset = f"c{i} = at\n        n{i} = 0" if varlen else f"c{i} = {zero}"
            lines += [
                f"    v = row.get({col.name!r}, NOT_GIVEN)",
                "    if v is NOT_GIVEN:",
                f"        {unset}",
                "    elif v is None:",
                f"        isset |= {1 << i}",
                f"        null |= {1 << i}",
                f"        {unset}",
                "    else:",
                f"        isset |= {1 << i}",
                "    " + given,
            ]
        cells += [f"c{i}", f"n{i}"] if varlen else [f"c{i}"]
    nbytes = layout.bitmap_bytes
    ncols = len(schema.columns)
    not_nullable = sum(1 << i for i, c in enumerate(schema.columns) if not c.nullable)
    if schema.fixed_key_bytes is None:
        # The shape check below sees placeholders, not values: a key's size must be measured
        # here (as rows.key_bytes does: strings by their UTF-8 bytes, other columns 8), or an
        # over-long key would go to the server instead of being refused at once.
        sizes = [
            f"n{i}" if _KIND[c.type] in (_Kind.STRING, _Kind.BINARY) else "8"
            for i, c in enumerate(schema.key_columns)
        ]
        lines += [f"    if {' + '.join(sizes)} > {MAX_KEY_BYTES}:", "        raise _Slow"]
    lines += [
        f"    if null & {not_nullable}:",
        "        raise _Slow",
        f"    shape = (isset << {ncols} | null) << 3 | op",
        "    ok = SHAPES.get(shape)",
        "    if ok is None:",
        "        ok = RULES(SCHEMA, OpType(op), isset, null)",
        "        if len(SHAPES) < 4096:",
        "            SHAPES[shape] = ok",
        "    if not ok:",
        "        raise _Slow",
        f"    bitmaps = isset.to_bytes({nbytes}, 'little'), null.to_bytes({nbytes}, 'little')",
        f"    return STRUCT.pack(op, *bitmaps, {', '.join(cells)}), b''.join(side)",
    ]
    scope: dict[str, object] = {
        "OPS": {int(t): int(t) for t in OpType},
        "OpType": OpType,
        "SHAPES": {},
        "NAMES": frozenset(c.name for c in schema.columns),
        "NOT_GIVEN": _NOT_GIVEN,
        "_Slow": _Slow,
        "RULES": _rules_ok,
        "SCHEMA": schema,
        "STRUCT": layout.row,
    }
    # Our own text, built from the column types above; names are quoted with repr.
    exec("\n".join(lines), scope)
    return cast(Callable[[object, Mapping[str, object]], tuple[bytes, bytes]], scope["pack"])


def _rules_ok(schema: Schema, op: OpType, isset: int, null: int) -> bool:
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
