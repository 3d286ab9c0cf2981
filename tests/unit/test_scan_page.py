"""Scan pages filled from a real store: both row forms give the store's rows, a page stays
within its rows and (roughly) its bytes, resume keys walk the table once, and a stored value
that does not fit its column is a server error, not a crash."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from raftlet.proto import tablet_pb2
from raftlet.schema.predicates import Predicate
from raftlet.schema.row_pages import decode_page, page_rows
from raftlet.schema.rows import row_from_pb
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType, Value
from raftlet.tserver.scan_page import fill_page
from raftlet.tserver.store import StoreError, TabletStore
from tests.unit.store_helpers import WIDE, insert

PACKED, CELLS = tablet_pb2.ROW_FORMAT_PACKED, tablet_pb2.ROW_FORMAT_CELLS
N = 300


def wide_row(i: int) -> dict[str, object]:
    """Row i of the table: every type, NULLs in a pattern, non-ASCII text now and then."""
    row: dict[str, object] = {"tenant": f"t{i % 3}", "id": i}
    if i % 5:
        row |= {
            "c_int8": i % 128 - 64,
            "c_int16": -i,
            "c_int32": i * 1000,
            "c_int64": i << 40,
            "c_unixtime_micros": i * 1_000_003,
            "c_float": i / 8,
            "c_double": i / 3,
            "c_bool": i % 2 == 0,
            "c_string": ("é" if i % 7 == 0 else "s") * (i % 50),
            "c_binary": bytes([i % 256]) * (i % 9),
        }
    return row


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TabletStore]:
    with TabletStore.open(tmp_path_factory.mktemp("pages") / "t.db", WIDE) as s:
        s.apply_batch([(1, 1, insert(WIDE, *(wide_row(i) for i in range(N))))])
        yield s


def page_values(response: tablet_pb2.ScanResponse) -> list[tuple[Value, ...]]:
    columns = list(response.columns)
    if response.HasField("row_block"):
        assert not response.rows
        types = [WIDE.column(c).type for c in columns]
        block = response.row_block
        return page_rows(decode_page(types, block.rows, block.indirect))
    return [row_from_pb(WIDE, columns, pb) for pb in response.rows]


def scan_all(
    store: TabletStore,
    fmt: int,
    max_rows: int | None,
    max_bytes: int,
    projection: Sequence[str] | None = None,
    predicates: Sequence[Predicate] = (),
) -> tuple[list[tuple[Value, ...]], list[tablet_pb2.ScanResponse]]:
    rows: list[tuple[Value, ...]] = []
    pages: list[tablet_pb2.ScanResponse] = []
    resume = None
    while True:
        limit = max_rows + 1 if max_rows is not None else None
        with store.open_scan(projection, predicates, resume, limit) as cursor:
            page = fill_page(cursor, fmt, max_rows, max_bytes)
        pages.append(page)
        rows += page_values(page)
        if not page.has_more:
            return rows, pages
        assert page.HasField("resume_key")
        resume = page.resume_key


@pytest.mark.parametrize("fmt", [PACKED, CELLS])
@pytest.mark.parametrize(
    ("projection", "predicates"),
    [
        (None, []),
        (["c_string", "id", "c_bool"], []),
        (["c_double"], [Predicate.range("id", lower=17, upper=250)]),
        (["tenant", "c_binary"], [Predicate.is_not_null("c_int8")]),
    ],
)
def test_pages_of_either_form_walk_the_rows_the_store_holds(
    store: TabletStore, fmt: int, projection: list[str] | None, predicates: list[Predicate]
) -> None:
    want = store.scan(projection, predicates).rows
    assert want
    for max_rows, max_bytes in [(None, 1 << 20), (7, 1 << 20), (None, 700), (13, 2000), (1, 1)]:
        got, pages = scan_all(store, fmt, max_rows, max_bytes, projection, predicates)
        assert got == want, (max_rows, max_bytes)
        assert all(len(page_values(p)) >= 1 for p in pages)  # every page makes progress
        if max_rows is not None:
            assert all(len(page_values(p)) <= max_rows for p in pages)


def side_bytes(row: tuple[Value, ...]) -> int:
    """A packed row's bytes in the side buffer."""
    return sum(
        len(v.encode() if isinstance(v, str) else v) for v in row if isinstance(v, str | bytes)
    )


@pytest.mark.parametrize("fmt", [PACKED, CELLS])
def test_a_page_ends_with_the_row_that_reaches_its_bytes(store: TabletStore, fmt: int) -> None:
    budget = 3000
    _, pages = scan_all(store, fmt, None, budget)
    assert len(pages) > 3
    biggest_row = 0
    for page in pages:
        if fmt == PACKED:
            block = page.row_block
            rows = page_values(page)
            size = len(block.rows) + len(block.indirect)
            row_bytes = len(block.rows) // len(rows) + max(map(side_bytes, rows))
        else:
            size = sum(r.ByteSize() + 3 for r in page.rows)
            row_bytes = max(r.ByteSize() + 3 for r in page.rows)
        biggest_row = max(biggest_row, row_bytes)
        if page.has_more:
            assert size >= budget
        assert size < budget + biggest_row


def values_of(schema: Schema, page: tablet_pb2.ScanResponse) -> list[tuple[Value, ...]]:
    types = [schema.column(c).type for c in page.columns]
    if page.HasField("row_block"):
        return page_rows(decode_page(types, page.row_block.rows, page.row_block.indirect))
    return [row_from_pb(schema, list(page.columns), pb) for pb in page.rows]


def page_bytes(page: tablet_pb2.ScanResponse) -> int:
    """The bytes a page's rows take in its form, as the page filler counts them."""
    if page.HasField("row_block"):
        return len(page.row_block.rows) + len(page.row_block.indirect)
    return sum(r.ByteSize() + 3 for r in page.rows)


@pytest.mark.parametrize("fmt", [PACKED, CELLS])
def test_a_row_that_would_take_a_page_past_its_cap_begins_the_next_page(
    tmp_path: Path, fmt: int
) -> None:
    # Small rows up to the budget, then a row nearly the cap on its own: ending the page
    # with it (it reaches the budget) would send budget + cap bytes, more than gRPC lets a
    # response carry, and every scan of the tablet would fail on it.
    schema = Schema(
        [ColumnSchema("k", DataType.INT64, is_key=True), ColumnSchema("v", DataType.BINARY)]
    )
    budget, cap = 4000, 10_000
    sizes = [100] * 30 + [9_900] + [100] * 5 + [9_900, 9_900] + [100] * 3
    with TabletStore.open(tmp_path / "t.db", schema) as s:
        s.apply_batch(
            [(1, 1, insert(schema, *({"k": i, "v": b"x" * n} for i, n in enumerate(sizes))))]
        )
        got: list[int] = []
        resume: bytes | None = None
        for _ in range(len(sizes) + 1):  # a scan that never ends fails here, not hangs
            with s.open_scan(None, (), resume) as cursor:
                page = fill_page(cursor, fmt, None, budget, cap)
            keys = [r[0] for r in values_of(schema, page)]
            assert keys, "every page makes progress"
            assert page_bytes(page) <= cap or len(keys) == 1
            got += keys
            if not page.has_more:
                break
            resume = page.resume_key
    assert got == list(range(len(sizes)))


@pytest.mark.parametrize("fmt", [PACKED, CELLS])
def test_a_row_larger_than_the_cap_is_a_page_of_its_own(tmp_path: Path, fmt: int) -> None:
    schema = Schema(
        [ColumnSchema("k", DataType.INT64, is_key=True), ColumnSchema("v", DataType.BINARY)]
    )
    with TabletStore.open(tmp_path / "t.db", schema) as s:
        s.apply_batch([(1, 1, insert(schema, *({"k": i, "v": b"x" * 500} for i in range(3))))])
        with s.open_scan(None, ()) as cursor:
            page = fill_page(cursor, fmt, None, 100, 200)
    assert page.has_more
    assert page_bytes(page) > 200  # one row, over the cap on its own, rather than no progress


def test_a_page_of_exactly_the_rows_left_says_there_are_no_more(store: TabletStore) -> None:
    with store.open_scan(["id"], [], None, N + 1) as cursor:
        page = fill_page(cursor, PACKED, N, 1 << 20)
    assert len(page_values(page)) == N
    assert not page.has_more
    assert not page.HasField("resume_key")
    with store.open_scan(["id"], [], None, N) as cursor:
        page = fill_page(cursor, PACKED, N - 1, 1 << 20)
    assert page.has_more
    assert page.HasField("resume_key")


def test_an_empty_result_is_an_empty_block(store: TabletStore) -> None:
    pred = [Predicate.equals("id", -1)]
    with store.open_scan(None, pred) as cursor:
        page = fill_page(cursor, PACKED, None, 1 << 20)
    assert page.HasField("row_block")  # present, so the client reads it as packed
    assert page.row_block.rows == b""
    assert not page.has_more
    with store.open_scan(None, pred) as cursor:
        page = fill_page(cursor, CELLS, None, 1 << 20)
    assert not page.HasField("row_block")
    assert not page.rows


@pytest.mark.parametrize("fmt", [PACKED, CELLS])
def test_a_stored_value_outside_its_type_is_a_store_error(tmp_path: Path, fmt: int) -> None:
    path = tmp_path / "t.db"
    with TabletStore.open(path, WIDE) as s:
        s.apply_batch([(1, 1, insert(WIDE, wide_row(1)))])
    # Another tool wrote 300 into an INT8 column: SQLite's INTEGER takes it.
    conn = sqlite3.connect(path)
    conn.execute("UPDATE tablet_rows SET c_int8 = 300")
    conn.commit()
    conn.close()
    with (
        TabletStore.open(path) as s,
        s.open_scan(["c_int8"]) as cursor,
        pytest.raises(StoreError, match="does not fit"),
    ):
        fill_page(cursor, fmt, None, 1 << 20)


@pytest.mark.parametrize("key_type", [DataType.STRING, DataType.BINARY])
@pytest.mark.parametrize("fmt", [PACKED, CELLS])
def test_a_page_that_ends_at_an_empty_key_still_continues(
    tmp_path: Path, key_type: DataType, fmt: int
) -> None:
    # An empty string or binary key encodes as no bytes: the resume key after it is empty
    # and must still be sent (and taken) as a resume key, not as "from the start" or "done".
    schema = Schema([ColumnSchema("k", key_type, is_key=True), ColumnSchema("n", DataType.INT64)])
    keys = ["", "a", "b", "c"] if key_type is DataType.STRING else [b"", b"\x00", b"a", b"b"]
    with TabletStore.open(tmp_path / "t.db", schema) as store:
        store.apply_batch([(1, 1, insert(schema, *({"k": k, "n": i} for i, k in enumerate(keys))))])
        got: list[Value] = []
        resume: bytes | None = None
        for _ in range(len(keys) + 2):  # a scan that never ends fails here, not hangs
            with store.open_scan(None, (), resume, 2) as cursor:
                page = fill_page(cursor, fmt, 1, 1 << 20)
            types = [key_type, DataType.INT64]
            if page.HasField("row_block"):
                block = page.row_block
                got += [r[0] for r in page_rows(decode_page(types, block.rows, block.indirect))]
            else:
                got += [row_from_pb(schema, ["k", "n"], r)[0] for r in page.rows]
            if not page.has_more:
                break
            assert page.HasField("resume_key")
            resume = page.resume_key
        assert got == keys
