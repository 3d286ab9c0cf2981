"""TabletStore scans: projections, every predicate kind, limits and resume keys."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlet.proto import tablet_pb2
from raftlet.schema.keys import encode_key
from raftlet.schema.predicates import Predicate
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType, Value
from raftlet.tserver.store import InvalidScan, ScanResult, TabletStore
from tests.unit.store_helpers import insert

# Composite key (string, int) so resume keys exercise row-value comparison.
S = Schema(
    [
        ColumnSchema("g", DataType.STRING, is_key=True),
        ColumnSchema("n", DataType.INT16, is_key=True),
        ColumnSchema("x", DataType.INT64, nullable=True),
        ColumnSchema("f", DataType.FLOAT, nullable=True),
        ColumnSchema("s", DataType.STRING, nullable=True),
        ColumnSchema("b", DataType.BOOL, nullable=True),
    ]
)
Row = tuple[Value, ...]


def make_rows() -> list[Row]:
    rows: list[Row] = []
    for g in ("a", "b", "c"):
        for n in range(-3, 7):
            x = None if n % 4 == 0 else n * 10
            rows.append((g, n, x, n / 4, f"{g}{n}", None if n == 1 else n % 2 == 0))
    return rows


ROWS = make_rows()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TabletStore]:
    path = tmp_path_factory.mktemp("scan") / "t.db"
    with TabletStore.open(path, S) as s:
        s.apply_batch(
            [(1, 1, insert(S, *(dict(zip(S.column_names, r, strict=True)) for r in ROWS)))]
        )
        yield s


def where(pred: Callable[[Row], bool]) -> list[Row]:
    return sorted(r for r in ROWS if pred(r))


def test_full_scan_is_every_row_in_key_order(store: TabletStore) -> None:
    result = store.scan()
    assert result.columns == S.column_names
    assert result.rows == sorted(ROWS)
    assert result.resume_key is None
    assert result.applied_index == 1


def test_projection_order_and_non_key_only(store: TabletStore) -> None:
    result = store.scan(["s", "x"], [Predicate.equals("g", "b")])
    assert result.columns == ("s", "x")
    assert result.rows == [(r[4], r[2]) for r in where(lambda r: r[0] == "b")]
    # Resuming works even when the projection omits the key.
    page = store.scan(["b"], limit=4)
    assert page.resume_key is not None
    rest = store.scan(["b"], resume_key=page.resume_key)
    assert page.rows + rest.rows == [(r[5],) for r in sorted(ROWS)]


X, N, G, F, SS, B = 2, 1, 0, 3, 4, 5


@pytest.mark.parametrize(
    ("predicates", "expected"),
    [
        ([Predicate.equals("n", 2)], lambda r: r[N] == 2),
        ([Predicate.equals("g", "c"), Predicate.equals("n", -3)], lambda r: r[:2] == ("c", -3)),
        ([Predicate.equals("x", 50)], lambda r: r[X] == 50),
        ([Predicate.equals("b", True)], lambda r: r[B] is True),
        ([Predicate.equals("f", 0.25)], lambda r: r[F] == 0.25),
        ([Predicate.range("n", 0, 3)], lambda r: 0 <= r[N] < 3),
        (
            [Predicate.range("n", 0, 3, lower_inclusive=False, upper_inclusive=True)],
            lambda r: 0 < r[N] <= 3,
        ),
        ([Predicate.range("n", lower=4)], lambda r: r[N] >= 4),
        ([Predicate.range("n", lower=4, lower_inclusive=False)], lambda r: r[N] > 4),
        ([Predicate.range("n", upper=-2)], lambda r: r[N] < -2),
        ([Predicate.range("n", upper=-2, upper_inclusive=True)], lambda r: r[N] <= -2),
        ([Predicate.range("g", "b", "bz")], lambda r: r[G] == "b"),
        ([Predicate.range("x", lower=0)], lambda r: r[X] is not None and r[X] >= 0),
        ([Predicate.range("s", upper="a2", upper_inclusive=True)], lambda r: r[SS] <= "a2"),
        ([Predicate.range("n", 3, 1)], lambda r: False),
        ([Predicate.in_list("n", [5, -1, 5, 99])], lambda r: r[N] in (5, -1)),
        ([Predicate.in_list("s", ["a1", "c6", "zz"])], lambda r: r[SS] in ("a1", "c6")),
        ([Predicate.in_list("x", [])], lambda r: False),
        ([Predicate.is_null("x")], lambda r: r[X] is None),
        ([Predicate.is_not_null("x")], lambda r: r[X] is not None),
        (
            [Predicate.is_null("b"), Predicate.equals("g", "a")],
            lambda r: r[B] is None and r[G] == "a",
        ),
        ([Predicate.is_null("g")], lambda r: False),
        (
            [
                Predicate.range("n", -1, 5),
                Predicate.in_list("g", ["a", "c"]),
                Predicate.is_not_null("x"),
            ],
            lambda r: -1 <= r[N] < 5 and r[G] in ("a", "c") and r[X] is not None,
        ),
    ],
)
def test_predicates(
    store: TabletStore, predicates: list[Predicate], expected: Callable[[Row], bool]
) -> None:
    want = where(expected)
    assert store.scan(predicates=predicates).rows == want
    # The same predicates as they arrive on the wire.
    assert store.scan(predicates=[p.to_pb(S) for p in predicates]).rows == want


def test_comparisons_never_match_null(store: TabletStore) -> None:
    nulls = {r[:2] for r in ROWS if r[X] is None}
    for pred in (
        Predicate.range("x", upper=10**6),
        Predicate.in_list("x", [0, 10]),
        Predicate.range("x", lower=-(10**6)),
    ):
        got = {r[:2] for r in store.scan(predicates=[pred]).rows}
        assert not got & nulls


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"projection": ["nope"]}, "projection names unknown column 'nope'"),
        ({"projection": ["x", "x"]}, "names column 'x' twice"),
        ({"projection": "x"}, "not one string"),
        ({"predicates": [Predicate.equals("nope", 1)]}, "unknown column 'nope'"),
        ({"predicates": [Predicate.equals("n", "1")]}, "'n': value: INT16 needs an int"),
        ({"predicates": [Predicate.equals("n", 1 << 16)]}, "out of range for INT16"),
        ({"predicates": [Predicate.range("n")]}, "needs a lower or an upper bound"),
        ({"predicates": [Predicate.equals("x", None)]}, "use IS NULL"),
        (
            {
                "predicates": [
                    tablet_pb2.PredicatePB(column="x", equals=tablet_pb2.ValuePB(string_value="1"))
                ]
            },
            "'x': value: INT64 travels as int_value, got string_value",
        ),
        ({"predicates": [tablet_pb2.PredicatePB(column="x")]}, "no predicate kind set"),
        ({"predicates": ["x = 1"]}, "Predicate or PredicatePB, got str"),
        ({"limit": 0}, "limit must be a positive int"),
        ({"limit": -1}, "limit must be a positive int"),
        ({"limit": True}, "limit must be a positive int"),
        ({"resume_key": b"\x01"}, "bad resume key"),
        ({"resume_key": encode_key(S, ("a", 1)) + b"\x00"}, "bad resume key: 1 trailing bytes"),
    ],
)
def test_bad_scans_are_invalid_with_a_clear_message(
    store: TabletStore, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidScan, match=message):
        store.scan(**kwargs)  # type: ignore[arg-type]


def test_invalid_scan_is_a_value_error() -> None:
    assert issubclass(InvalidScan, ValueError)


def test_limit_exactly_the_remaining_rows_gives_no_resume_key(store: TabletStore) -> None:
    result = store.scan(limit=len(ROWS))
    assert len(result.rows) == len(ROWS)
    assert result.resume_key is None
    result = store.scan(limit=len(ROWS) - 1)
    assert result.resume_key == encode_key(S, sorted(ROWS)[-2][:2])


def test_resume_key_may_name_a_row_that_no_longer_exists(store: TabletStore) -> None:
    # A resume key is a position, not a row: between pages the row may have been deleted.
    result = store.scan(resume_key=encode_key(S, ("b", 100)))
    assert result.rows == where(lambda r: str(r[G]) > "b")
    assert store.scan(resume_key=None).rows == sorted(ROWS)
    # Empty bytes are a key (an empty string key encodes so), not "from the start".
    with pytest.raises(InvalidScan, match="bad resume key"):
        store.scan(resume_key=b"")


def scan_all_pages(
    store: TabletStore, page_sizes: list[int], **kwargs: object
) -> tuple[list[Row], int]:
    rows: list[Row] = []
    resume: bytes | None = None
    pages = 0
    while True:
        size = page_sizes[pages % len(page_sizes)]
        result: ScanResult = store.scan(limit=size, resume_key=resume, **kwargs)  # type: ignore[arg-type]
        assert len(result.rows) <= size
        rows += result.rows
        pages += 1
        resume = result.resume_key
        if resume is None:
            return rows, pages
        assert len(result.rows) == size  # a short page is always the last one


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    keys=st.lists(
        st.tuples(st.sampled_from(["", "a", "a\x00", "b", "ü"]), st.integers(-(2**15), 2**15 - 1)),
        unique=True,
        max_size=60,
    ),
    page_sizes=st.lists(st.integers(1, 25), min_size=1, max_size=5),
    predicate=st.sampled_from(
        [
            None,
            Predicate.range("n", -100, 100),
            Predicate.in_list("g", ["a", "ü"]),
            Predicate.is_not_null("x"),
        ]
    ),
)
def test_paged_scans_return_exactly_the_full_ordered_result(
    keys: list[tuple[str, int]], page_sizes: list[int], predicate: Predicate | None
) -> None:
    preds = [] if predicate is None else [predicate]
    with tempfile.TemporaryDirectory() as d, TabletStore.open(Path(d) / "t.db", S) as store:
        rows = [
            {"g": g, "n": n, "x": None if i % 3 == 0 else i, "s": g * 2}
            for i, (g, n) in enumerate(keys)
        ]
        if rows:
            store.apply_batch([(1, 1, insert(S, *rows))])
        full = store.scan(predicates=preds).rows
        paged, pages = scan_all_pages(store, page_sizes, predicates=preds)
    assert paged == full
    assert [r[:2] for r in full] == sorted(r[:2] for r in full)
    assert len(full) == len({r[:2] for r in full})
    if predicate is None:
        assert len(full) == len(keys)
    assert pages >= 1


def test_a_scan_past_its_deadline_is_interrupted_and_the_reader_serves_the_next(
    tmp_path: Path,
) -> None:
    """A slow scan (an IN list over rows with large cells took seconds a page) held its
    service thread after its caller gave up; many of them starved every write."""
    import time

    from raftlet.tserver.store import ScanDeadlineExceeded, StoreError
    from tests.unit.store_helpers import SIMPLE

    with TabletStore.open(tmp_path / "t.db", SIMPLE) as store:
        rows = [{"id": i, "name": f"n{i}"} for i in range(5000)]
        store.apply_batch([(1, 1, insert(SIMPLE, *rows))])
        passed = time.monotonic() - 1.0
        with (
            pytest.raises(ScanDeadlineExceeded, match="ran past its deadline"),
            store.open_scan(deadline=passed) as cursor,
        ):
            cursor.fetch_all()
        assert issubclass(ScanDeadlineExceeded, StoreError)
        # The same pooled reader, no longer interrupted: every row, with or without a
        # deadline still ahead.
        with store.open_scan() as cursor:
            assert len(cursor.fetch_all()) == 5000
        with store.open_scan(deadline=time.monotonic() + 60) as cursor:
            assert len(cursor.fetch_all()) == 5000
