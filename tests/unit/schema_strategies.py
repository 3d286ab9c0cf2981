"""Hypothesis strategies for column values, schemas, keys and write batches (shared by the
schema and store tests). Values are drawn already normalized, as ``schema.types.normalize``
would return them."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from raftlet.schema.rows import OpType
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import INTEGER_RANGES, DataType, Value, normalize

ALL_TYPES = list(DataType)


def values_of(dtype: DataType) -> st.SearchStrategy[Value]:
    if dtype in INTEGER_RANGES:
        lo, hi = INTEGER_RANGES[dtype]
        # Bias towards the edges, where sign flips and widths go wrong.
        return st.one_of(st.sampled_from([lo, lo + 1, -1, 0, 1, hi - 1, hi]), st.integers(lo, hi))
    if dtype is DataType.FLOAT:
        return st.floats(width=32, allow_nan=False).map(lambda f: normalize(dtype, f))
    if dtype is DataType.DOUBLE:
        return st.floats(allow_nan=False).map(lambda f: normalize(dtype, f))
    if dtype is DataType.BOOL:
        return st.booleans()
    if dtype is DataType.STRING:
        return st.text(max_size=12)  # surrogates (not UTF-8) are excluded by default
    assert dtype is DataType.BINARY
    # NULs and 0x01 are what the escaping has to get right.
    return st.binary(max_size=12) | st.lists(st.sampled_from([0, 1, 255]), max_size=6).map(bytes)


@st.composite
def key_schemas(draw: st.DrawFn, max_keys: int = 3) -> Schema:
    """A schema whose key is 1..max_keys columns of any types, plus one nullable value column."""
    types = draw(st.lists(st.sampled_from(ALL_TYPES), min_size=1, max_size=max_keys))
    cols = [ColumnSchema(f"k{i}", t, is_key=True) for i, t in enumerate(types)]
    cols.append(ColumnSchema("val", DataType.INT64, nullable=True))
    return Schema(cols)


def keys_of(schema: Schema) -> st.SearchStrategy[tuple[Value, ...]]:
    return st.tuples(*(values_of(c.type) for c in schema.key_columns))


# A schema and the rows of one write: (op type, column name -> value; None is NULL).
Batch = tuple[Schema, list[tuple[OpType, dict[str, Any]]]]


@st.composite
def schemas(draw: st.DrawFn) -> Schema:
    """One or two key columns, then value columns of every kind, nullable or not."""
    key_types = draw(st.lists(st.sampled_from(ALL_TYPES), min_size=1, max_size=2))
    cols = [ColumnSchema(f"k{i}", t, is_key=True) for i, t in enumerate(key_types)]
    for i, t in enumerate(draw(st.lists(st.sampled_from(ALL_TYPES), max_size=10))):
        cols.append(ColumnSchema(f"c{i}", t, nullable=draw(st.booleans())))
    return Schema(cols)


@st.composite
def batches(draw: st.DrawFn, uniform: bool = False, max_rows: int = 8) -> Batch:
    """Valid rows of INSERT, UPSERT and UPDATE, each giving its own columns and NULLs; or,
    ``uniform``, rows that all share one op type and one choice of given and NULL columns
    (what a client's batch usually is)."""
    schema = draw(schemas())
    value_cols = schema.columns[schema.num_key_columns :]
    ops: list[tuple[OpType, dict[str, Any]]] = []
    shape: tuple[OpType, list[tuple[str, bool]]] | None = None
    for _ in range(draw(st.integers(0, max_rows))):
        if shape is None or not uniform:
            op = draw(st.sampled_from([OpType.INSERT, OpType.UPSERT, OpType.UPDATE]))
            given: list[tuple[str, bool]] = []  # (column, NULL?)
            for col in value_cols:
                if op is OpType.UPDATE and col.nullable and not draw(st.booleans()):
                    continue
                given.append((col.name, col.nullable and draw(st.booleans())))
            if op is OpType.UPDATE and not given:
                op = OpType.UPSERT  # an UPDATE must change something
            shape = (op, given)
        op, given = shape
        row: dict[str, Any] = {c.name: draw(values_of(c.type)) for c in schema.key_columns}
        for name, is_null in given:
            row[name] = None if is_null else draw(values_of(schema.column(name).type))
        ops.append((op, row))
    return schema, ops
