"""Hypothesis strategies for column values, schemas and keys (shared by the schema and store
tests). Values are drawn already normalized, as ``schema.types.normalize`` would return them."""

from __future__ import annotations

from hypothesis import strategies as st

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
