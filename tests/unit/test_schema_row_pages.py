"""Packed scan pages: they decode to exactly the values the per-cell form decodes to, for every
column type, NULLs, empty and extreme values; a byte budget cuts a page after the row that
reaches it; a malformed page is refused with ``RowPageError`` and nothing else."""

from __future__ import annotations

import contextlib
import math
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlet.proto import tablet_pb2
from raftlet.schema.row_block import decode_row_block
from raftlet.schema.row_pages import (
    PAGE_OP,
    RowPageError,
    decode_page,
    encode_page,
    page_layout,
    page_rows,
)
from raftlet.schema.rows import OpType, row_from_pb, row_to_pb
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import INTEGER_RANGES, DataType, Value
from tests.unit.schema_strategies import ALL_TYPES, values_of

Page = tuple[list[DataType], list[tuple[Value, ...]]]


def extreme_values(dtype: DataType) -> st.SearchStrategy[Value]:
    """The largest and smallest a cell holds, beside the ordinary draws."""
    if dtype in INTEGER_RANGES:
        return st.sampled_from(INTEGER_RANGES[dtype])
    if dtype is DataType.FLOAT:
        return st.sampled_from([math.inf, -math.inf, 3.4028234663852886e38, 1.401298464324817e-45])
    if dtype is DataType.DOUBLE:
        return st.sampled_from([math.inf, -math.inf, 1.7976931348623157e308, 5e-324])
    if dtype is DataType.BOOL:
        return st.booleans()
    if dtype is DataType.STRING:
        return st.sampled_from(["", "\U0010ffff" * 300, "é" * 70_000, "\x00"])
    return st.sampled_from([b"", b"\xff" * 70_000, b"\x00"])


@st.composite
def pages(draw: st.DrawFn, max_rows: int = 12) -> Page:
    """Column types (any, repeated), and rows with NULLs anywhere (the page does not know
    which columns are nullable: that is the schema's business)."""
    types = draw(st.lists(st.sampled_from(ALL_TYPES), min_size=1, max_size=11))
    cells = [
        st.one_of(st.none(), values_of(t), extreme_values(t))
        if draw(st.booleans())
        else values_of(t)
        for t in types
    ]
    rows = draw(st.lists(st.tuples(*cells), max_size=max_rows))
    return types, rows


def columns_of(types: list[DataType], rows: list[tuple[Value, ...]]) -> list[list[Any]]:
    """Columns of values as the store returns them: a BOOL as 0/1."""
    cols: list[list[Any]] = [[row[j] for row in rows] for j in range(len(types))]
    for j, t in enumerate(types):
        if t is DataType.BOOL:
            cols[j] = [None if v is None else int(bool(v)) for v in cols[j]]
    return cols


def schema_of(types: list[DataType]) -> Schema:
    cols = [ColumnSchema(f"c{i}", t, nullable=True) for i, t in enumerate(types)]
    return Schema([ColumnSchema("k", DataType.INT64, is_key=True), *cols])


def same(a: Any, b: Any) -> bool:
    """Equal, and a float's sign too (0.0 == -0.0 would hide a lost normalization)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(pages())
def test_a_page_decodes_to_what_the_per_cell_form_decodes_to(page: Page) -> None:
    types, rows = page
    packed = encode_page(types, columns_of(types, rows))
    assert packed.count == len(rows)
    assert len(packed.rows) == len(rows) * page_layout(types).row.size
    decoded = page_rows(decode_page(types, packed.rows, packed.indirect))
    # The per-cell form, as the server builds it and the client reads it.
    schema = schema_of(types)
    names = [f"c{i}" for i in range(len(types))]
    per_cell = [row_from_pb(schema, names, row_to_pb(schema, names, row)) for row in rows]
    assert len(decoded) == len(per_cell)
    for got, want in zip(decoded, per_cell, strict=True):
        assert all(same(g, w) for g, w in zip(got, want, strict=True)), (got, want)


def test_an_empty_page_is_no_rows() -> None:
    types = [DataType.INT64, DataType.STRING]
    packed = encode_page(types, [[], []])
    assert (packed.rows, packed.indirect, packed.count) == (b"", b"", 0)
    assert decode_page(types, b"", b"") == [[], []]


def test_minus_zero_comes_back_as_plus_zero_as_the_per_cell_form_gives_it() -> None:
    types = [DataType.DOUBLE, DataType.FLOAT]
    packed = encode_page(types, [[-0.0], [-0.0]])
    assert all(same(v, 0.0) for v in page_rows(decode_page(types, packed.rows, packed.indirect))[0])


@settings(max_examples=200, deadline=None)
@given(pages(max_rows=20), st.integers(0, 400))
def test_a_byte_budget_ends_the_page_with_the_row_that_reaches_it(page: Page, budget: int) -> None:
    types, rows = page
    cols = columns_of(types, rows)
    whole = encode_page(types, cols)
    cut = encode_page(types, cols, max_bytes=budget)
    assert cut.size == len(cut.rows) + len(cut.indirect)
    if rows:
        assert 1 <= cut.count <= len(rows)
        assert cut.count == len(rows) or cut.size >= budget
        # One row fewer would not have reached the budget.
        shorter = encode_page(types, [c[: cut.count - 1] for c in cols])
        assert shorter.size < budget or cut.count == 1
    got = page_rows(decode_page(types, cut.rows, cut.indirect))
    assert got == page_rows(decode_page(types, whole.rows, whole.indirect))[: cut.count]


@settings(max_examples=200, deadline=None)
@given(pages(max_rows=20), st.integers(1, 400), st.integers(0, 600))
def test_a_cap_ends_the_page_before_the_row_that_would_pass_it(
    page: Page, budget: int, cap: int
) -> None:
    types, rows = page
    cols = columns_of(types, rows)
    capped = encode_page(types, cols, max_bytes=budget, cap=cap)
    budget_only = encode_page(types, cols, max_bytes=budget)
    assert capped.size <= cap
    assert capped.count <= budget_only.count
    if capped.count < budget_only.count:  # one more row would have passed the cap
        assert encode_page(types, [c[: capped.count + 1] for c in cols]).size > cap


@settings(max_examples=100, deadline=None)
@given(pages(max_rows=20), st.integers(0, 20))
def test_parts_encoded_with_a_base_join_into_one_page(page: Page, split: int) -> None:
    """How the server fills a page: fetched chunk by chunk, each side buffer after the last."""
    types, rows = page
    cols = columns_of(types, rows)
    first = encode_page(types, [c[:split] for c in cols])
    second = encode_page(types, [c[split:] for c in cols], base=len(first.indirect))
    rows_bytes, side = first.rows + second.rows, first.indirect + second.indirect
    assert page_rows(decode_page(types, rows_bytes, side)) == page_rows(
        decode_page(types, *_whole(types, cols))
    )


def _whole(types: list[DataType], cols: list[list[Any]]) -> tuple[bytes, bytes]:
    page = encode_page(types, cols)
    return page.rows, page.indirect


def test_a_page_of_the_whole_schema_is_a_write_block_of_inserts() -> None:
    schema = Schema(
        [
            ColumnSchema("k", DataType.INT64, is_key=True),
            ColumnSchema("s", DataType.STRING, nullable=True),
            ColumnSchema("b", DataType.BINARY, nullable=True),
            ColumnSchema("t", DataType.BOOL),
        ]
    )
    rows = [(1, "a", None, 1), (2, None, b"\x00\xff", 0), (3, "ü", b"", 1)]
    page = encode_page([c.type for c in schema.columns], [list(c) for c in zip(*rows, strict=True)])
    ops, failures = decode_row_block(schema, page.rows, page.indirect)
    assert failures == []
    assert [op.type for op in ops] == [OpType.INSERT] * 3
    assert [(*op.key, *op.values.values()) for op in ops] == [
        (1, "a", None, True),
        (2, None, b"\x00\xff", False),
        (3, "ü", b"", True),
    ]
    assert PAGE_OP == tablet_pb2.RowOperationPB.INSERT


# --- what a server cannot pack -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "value"),
    [
        (DataType.INT8, 128),
        (DataType.INT32, -(2**31) - 1),
        (DataType.INT64, "7"),
        (DataType.DOUBLE, "x"),
        (DataType.STRING, b"bytes"),
        (DataType.STRING, "\ud800"),  # a lone surrogate is not UTF-8
        (DataType.BINARY, "text"),
    ],
)
def test_a_value_its_cell_cannot_hold_is_refused(dtype: DataType, value: object) -> None:
    with pytest.raises(RowPageError):
        encode_page([DataType.INT64, dtype], [[1], [value]])


def test_columns_must_match_the_types() -> None:
    with pytest.raises(RowPageError, match="column types"):
        encode_page([DataType.INT64], [[1], [2]])
    with pytest.raises(RowPageError, match="different lengths"):
        encode_page([DataType.INT64, DataType.INT64], [[1], [2, 3]])
    with pytest.raises(RowPageError, match="at least one column"):
        decode_page([], b"", b"")


# --- malformed pages ---------------------------------------------------------------------------

TYPES = [DataType.INT64, DataType.STRING, DataType.BOOL, DataType.DOUBLE, DataType.BINARY]


def _page() -> tuple[bytearray, bytes]:
    page = encode_page(TYPES, [[1, 2], ["ab", None], [1, 0], [0.5, None], [b"x", b"yz"]])
    return bytearray(page.rows), page.indirect


# Where cells sit in a row of TYPES: op 0, isset 1, null 2, INT64 3, STRING offset 11 and
# length 15, BOOL 19, DOUBLE 20, BINARY 28; 36 bytes.
BOOL_AT, DOUBLE_AT, WIDTH = 19, 20, 36


def test_damage_to_the_structure_is_refused() -> None:
    rows, side = _page()
    width = WIDTH
    assert page_layout(TYPES).row.size == WIDTH
    assert decode_page(TYPES, bytes(rows), side)  # the undamaged page reads
    with pytest.raises(RowPageError, match="whole number"):
        decode_page(TYPES, bytes(rows[:-1]), side)
    with pytest.raises(RowPageError, match="points past"):
        decode_page(TYPES, bytes(rows), side[:-1])
    other_op = bytearray(rows)
    other_op[width] = int(OpType.DELETE)
    with pytest.raises(RowPageError, match="op type"):
        decode_page(TYPES, bytes(other_op), side)
    not_given = bytearray(rows)
    not_given[1] &= ~0x04
    with pytest.raises(RowPageError, match="isset"):
        decode_page(TYPES, bytes(not_given), side)
    spare = bytearray(rows)
    spare[2] |= 0x80  # NULL bit of an 8th column
    with pytest.raises(RowPageError, match="lacks"):
        decode_page(TYPES, bytes(spare), side)


def test_bad_cells_are_refused() -> None:
    rows, side = _page()
    bad_bool = bytearray(rows)
    bad_bool[BOOL_AT] = 2
    with pytest.raises(RowPageError, match="BOOL"):
        decode_page(TYPES, bytes(bad_bool), side)
    nan = bytearray(rows)
    struct.pack_into("<d", nan, DOUBLE_AT, math.nan)
    with pytest.raises(RowPageError, match="NaN"):
        decode_page(TYPES, bytes(nan), side)
    with pytest.raises(RowPageError, match="UTF-8"):
        decode_page(TYPES, bytes(rows), b"\xc3(" + side[2:])


def test_a_null_cells_content_is_not_read() -> None:
    """NULL means no value: whatever bytes a NULL BOOL or DOUBLE cell holds are ignored."""
    rows, side = _page()
    assert rows[WIDTH + 2] & 0x08  # row 1's DOUBLE is NULL ...
    struct.pack_into("<d", rows, WIDTH + DOUBLE_AT, math.nan)  # ... so its NaN is no value
    rows[WIDTH + BOOL_AT] = 0
    rows[2] |= 0x04  # and row 0's BOOL is NULL now: its 1 is no value either
    got = page_rows(decode_page(TYPES, bytes(rows), side))
    assert (got[0][2], got[1][3]) == (None, None)


@settings(max_examples=300, deadline=None)
@given(pages(max_rows=4), st.data())
def test_random_damage_is_refused_or_read_never_a_crash(page: Page, data: st.DataObject) -> None:
    types, rows = page
    packed = encode_page(types, columns_of(types, rows))
    damaged = bytearray(packed.rows + packed.indirect)
    if damaged:
        for _ in range(data.draw(st.integers(1, 4))):
            at = data.draw(st.integers(0, len(damaged) - 1))
            damaged[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(damaged)))
    with contextlib.suppress(RowPageError):
        decode_page(types, bytes(damaged[:cut]), bytes(damaged[cut:]))
