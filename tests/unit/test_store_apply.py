"""TabletStore writes: every type round-trips, per-row results, one transaction per batch,
idempotent replay."""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlet.proto import tablet_pb2
from raftlet.schema.keys import encode_key
from raftlet.schema.rows import OpType, RowOp, decode_row_op, encode_row_op
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import INTEGER_RANGES, DataType, Value
from raftlet.tserver.store import ApplyEntry, EntryResult, StoreError, TabletStore
from raftlet.tserver.store.sql import SqlBuilder
from tests.unit.schema_strategies import key_schemas, keys_of, values_of
from tests.unit.store_helpers import SIMPLE, WIDE, insert, ops


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TabletStore]:
    with TabletStore.open(tmp_path / "t.db", SIMPLE) as s:
        yield s


def all_rows(store: TabletStore) -> list[tuple[Value, ...]]:
    return store.scan().rows


def codes(result: EntryResult) -> list[tuple[int, str]]:
    return [(e.row_index, e.code_name) for e in result.row_errors]


def test_every_type_round_trips_including_nulls_and_extremes(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = []
    extremes = {
        "c_int8": INTEGER_RANGES[DataType.INT8],
        "c_int16": INTEGER_RANGES[DataType.INT16],
        "c_int32": INTEGER_RANGES[DataType.INT32],
        "c_int64": INTEGER_RANGES[DataType.INT64],
        "c_unixtime_micros": INTEGER_RANGES[DataType.UNIXTIME_MICROS],
    }
    for side in (0, 1):
        row: dict[str, object] = {"tenant": "ext", "id": side}
        row.update({name: bounds[side] for name, bounds in extremes.items()})
        rows.append(row)
    rows.append(
        {
            "tenant": "ünïcødé 🦀",
            "id": -1,
            "c_float": 0.1,  # rounded to float32 on the way in
            "c_double": 0.1,
            "c_bool": False,
            "c_string": "日本語\x00with NUL",
            "c_binary": b"\x00\x01\x02\x00\xff",
            "c_unixtime_micros": dt.datetime(1969, 7, 20, 20, 17, 40, tzinfo=dt.UTC),
        }
    )
    rows.append(
        {
            "tenant": "inf",
            "id": 0,
            "c_float": math.inf,
            "c_double": -math.inf,
            "c_bool": True,
            "c_string": "",
            "c_binary": b"",
        }
    )
    rows.append({"tenant": "nulls", "id": 0})  # every value column NULL
    with TabletStore.open(tmp_path / "t.db", WIDE) as store:
        [result] = store.apply_batch([(1, 1, insert(WIDE, *rows))])
        assert result.row_errors == ()
        assert result.rows_applied == len(rows)
        got: dict[object, dict[str, Value]] = {
            (r[0], r[1]): dict(zip(WIDE.column_names, r, strict=True)) for r in all_rows(store)
        }
    for row in rows:
        stored = got[row["tenant"], row["id"]]
        expected = dict.fromkeys(WIDE.column_names) | dict(row)
        decoded = decode_row_op(WIDE, encode_row_op(WIDE, OpType.INSERT, row))
        expected.update(decoded.values)  # the normalized form: float32, micros
        assert stored == expected
        for name, value in stored.items():
            if value is not None:
                assert type(value) is type(expected[name]), name
    assert got["ünïcødé 🦀", -1]["c_unixtime_micros"] == -14182940000000
    assert got["ünïcødé 🦀", -1]["c_float"] == pytest.approx(0.1, rel=1e-7)
    assert got["ünïcødé 🦀", -1]["c_float"] != 0.1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_key_schema_round_trips_and_scans_in_encoded_key_order(data: st.DataObject) -> None:
    schema = data.draw(key_schemas())
    keys = data.draw(st.lists(keys_of(schema), max_size=15, unique=True))
    vals = data.draw(
        st.lists(values_of(DataType.INT64) | st.none(), min_size=len(keys), max_size=len(keys))
    )
    names = [c.name for c in schema.key_columns]
    rows = [{**dict(zip(names, k, strict=True)), "val": v} for k, v in zip(keys, vals, strict=True)]
    with tempfile.TemporaryDirectory() as d, TabletStore.open(Path(d) / "t.db", schema) as store:
        [result] = store.apply_batch([(1, 1, insert(schema, *rows))])
        assert result.row_errors == ()
        got = store.scan().rows
    expected = sorted(
        ((*(r[n] for n in names), r["val"]) for r in rows),
        key=lambda t: encode_key(schema, t[:-1]),
    )
    assert got == expected


def test_insert_existing_key_fails_that_row_only(store: TabletStore) -> None:
    [r] = store.apply_batch(
        [
            ApplyEntry(
                1,
                1,
                insert(
                    SIMPLE, {"id": 1, "name": "a"}, {"id": 1, "name": "b"}, {"id": 2, "name": "c"}
                ),
            )
        ]
    )
    assert codes(r) == [(1, "KEY_EXISTS")]
    assert "already present" in r.row_errors[0].message
    assert r.rows_applied == 2
    assert all_rows(store) == [(1, "a", None), (2, "c", None)]


def test_upsert_inserts_or_overwrites_only_given_columns(store: TabletStore) -> None:
    store.apply_batch([(1, 1, insert(SIMPLE, {"id": 1, "name": "a", "score": 1.5}))])
    [r] = store.apply_batch(
        [
            (
                2,
                1,
                ops(SIMPLE, OpType.UPSERT, [{"id": 1, "name": "A"}, {"id": 2, "name": "b"}]),
            )
        ]
    )
    assert r.row_errors == ()
    assert all_rows(store) == [(1, "A", 1.5), (2, "b", None)]
    # A hand-made RowOp that skipped decoding: SQLite checks NOT NULL before the conflict,
    # so it fails as a row (the same way on every replica) and the batch goes on.
    unchecked = RowOp(OpType.UPSERT, (2,), {}, row_index=0)
    [r] = store.apply_batch([(3, 1, [unchecked, *insert(SIMPLE, {"id": 3, "name": "c"})])])
    assert codes(r) == [(0, "INVALID_ROW")]
    assert all_rows(store) == [(1, "A", 1.5), (2, "b", None), (3, "c", None)]


def test_update_and_delete_of_missing_key_fail_that_row_only(store: TabletStore) -> None:
    store.apply_batch([(1, 1, insert(SIMPLE, {"id": 1, "name": "a"}, {"id": 2, "name": "b"}))])
    batch = [
        *ops(SIMPLE, OpType.UPDATE, [{"id": 9, "name": "x"}, {"id": 1, "score": -2.0}]),
        *ops(SIMPLE, OpType.DELETE, [{"id": 9}, {"id": 2}]),
        *ops(SIMPLE, OpType.UPDATE, [{"id": 2, "name": "gone"}]),
    ]
    [r] = store.apply_batch([(2, 1, batch)])
    assert codes(r) == [(0, "KEY_NOT_FOUND"), (2, "KEY_NOT_FOUND"), (4, "KEY_NOT_FOUND")]
    assert "(9,) not found" in r.row_errors[0].message
    assert r.rows_applied == 2
    assert all_rows(store) == [(1, "a", -2.0)]


def test_rows_applied_are_counted_by_operation(store: TabletStore) -> None:
    """What ``rows_inserted_total`` and its siblings count: rows applied, by operation
    (a failed row counts nowhere), bulk runs and row-by-row runs alike."""
    rows = [{"id": i, "name": "a"} for i in range(40)]  # a run long enough for one statement
    [bulk] = store.apply_batch([(1, 1, insert(SIMPLE, *rows))])
    assert (bulk.rows_applied, bulk.rows_by_op) == (40, (40, 0, 0, 0))
    batch = [
        *ops(SIMPLE, OpType.UPSERT, [{"id": 1, "name": "b"}, {"id": 100, "name": "new"}]),
        *ops(SIMPLE, OpType.UPDATE, [{"id": 2, "name": "c"}, {"id": 999, "name": "missing"}]),
        *ops(SIMPLE, OpType.DELETE, [{"id": 3}, {"id": 4}, {"id": 5}]),
        *insert(SIMPLE, {"id": 6, "name": "exists"}),
    ]
    [mixed, again] = store.apply_batch(
        [(2, 1, batch), (3, 1, insert(SIMPLE, {"id": 7, "name": "x"}))]
    )
    assert codes(mixed) == [(3, "KEY_NOT_FOUND"), (7, "KEY_EXISTS")]
    assert (mixed.rows_applied, mixed.rows_by_op) == (6, (0, 2, 1, 3))
    assert (codes(again), again.rows_by_op) == ([(0, "KEY_EXISTS")], (0, 0, 0, 0))


def test_undecodable_rows_are_reported_and_the_rest_applied(store: TabletStore) -> None:
    Op = tablet_pb2.RowOperationPB
    bad_column = Op(type=Op.INSERT, cells=[tablet_pb2.CellPB(column="nope")])
    good = insert(SIMPLE, {"id": 5, "name": "ok"})[0]
    null_name = Op(
        type=Op.INSERT,
        cells=[
            tablet_pb2.CellPB(column="id", value=tablet_pb2.ValuePB(int_value=6)),
            tablet_pb2.CellPB(column="name", value=tablet_pb2.ValuePB(null_value=True)),
        ],
    )
    [r] = store.apply_batch([(1, 1, [bad_column, good, null_name])])
    assert codes(r) == [(0, "UNKNOWN_COLUMN"), (2, "NULL_NOT_ALLOWED")]
    assert all_rows(store) == [(5, "ok", None)]
    assert store.applied_index() == 1


def test_decoded_rowops_keep_their_row_index(store: TabletStore) -> None:
    op = RowOp(OpType.DELETE, (42,), {}, row_index=7)
    [r] = store.apply_batch([(1, 1, [op])])
    assert codes(r) == [(7, "KEY_NOT_FOUND")]


def test_entries_in_one_batch_see_each_other_and_one_transaction_records_the_last(
    store: TabletStore,
) -> None:
    results = store.apply_batch(
        [
            (1, 1, insert(SIMPLE, {"id": 1, "name": "a"})),
            (2, 1, []),  # a NO_OP or config entry: no rows, still applied
            (3, 2, ops(SIMPLE, OpType.UPDATE, [{"id": 1, "name": "b"}])),
            (4, 2, ops(SIMPLE, OpType.DELETE, [{"id": 1}])),
            (5, 2, insert(SIMPLE, {"id": 1, "name": "c"})),
        ]
    )
    assert [r.row_errors for r in results] == [()] * 5
    assert [r.rows_applied for r in results] == [1, 0, 1, 1, 1]
    assert (store.applied_index(), store.applied_term()) == (5, 2)
    assert all_rows(store) == [(1, "c", None)]


def test_replay_of_applied_entries_is_a_no_op(store: TabletStore) -> None:
    first = [
        (1, 1, insert(SIMPLE, {"id": 1, "name": "a"})),
        (2, 1, insert(SIMPLE, {"id": 2, "name": "b"})),
    ]
    store.apply_batch(first)
    before = all_rows(store)
    again = store.apply_batch(first)
    assert [r.skipped for r in again] == [True, True]
    assert [r.row_errors for r in again] == [(), ()]  # no KEY_EXISTS: nothing was run
    assert all_rows(store) == before
    # A batch straddling the applied index applies only the new part.
    overlap = store.apply_batch(
        [
            (2, 1, ops(SIMPLE, OpType.DELETE, [{"id": 2}])),
            (3, 1, ops(SIMPLE, OpType.UPDATE, [{"id": 1, "name": "A"}])),
        ]
    )
    assert [r.skipped for r in overlap] == [True, False]
    assert all_rows(store) == [(1, "A", None), (2, "b", None)]
    assert (store.applied_index(), store.applied_term()) == (3, 1)


def test_replay_after_reopen_is_a_no_op(tmp_path: Path) -> None:
    entries = [(i, 1, insert(SIMPLE, {"id": i, "name": str(i)})) for i in range(1, 6)]
    with TabletStore.open(tmp_path / "t.db", SIMPLE) as s:
        s.apply_batch(entries[:3])
    with TabletStore.open(tmp_path / "t.db", SIMPLE) as s:
        assert s.applied_index() == 3
        # Recovery replays the whole log tail; what is applied is skipped.
        results = s.apply_batch(entries)
        assert [r.skipped for r in results] == [True, True, True, False, False]
        assert all(r.row_errors == () for r in results)
        assert s.count() == 5


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([(2, 1, []), (2, 1, [])], "must increase: 2 after 2"),
        ([(3, 1, []), (2, 1, [])], "must increase: 2 after 3"),
        ([(1, 2, []), (2, 1, [])], "entry 2 has term 1, below term 2"),
        ([(0, 1, [])], "index must be a positive int"),
        ([(1, -1, [])], "term must be a non-negative int"),
    ],
)
def test_bad_entry_sequences_are_refused_before_anything_is_applied(
    store: TabletStore, entries: list[tuple[int, int, list[object]]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        store.apply_batch(entries)  # type: ignore[arg-type]
    assert store.applied_index() == 0
    assert store.count() == 0


def test_term_may_not_go_below_the_applied_term(store: TabletStore) -> None:
    store.apply_batch([(5, 3, [])])
    with pytest.raises(ValueError, match="term 2, below term 3 of entry 5"):
        store.apply_batch([(6, 2, [])])


def test_a_failure_mid_batch_rolls_back_everything(store: TabletStore) -> None:
    broken = RowOp(OpType.INSERT, (1, 2), {"name": "x"})  # two key values for a one-column key
    with pytest.raises(ValueError, match="key has 2 values"):
        store.apply_batch([(1, 1, insert(SIMPLE, {"id": 1, "name": "a"})), (2, 1, [broken])])
    assert store.applied_index() == 0
    assert store.count() == 0
    # The store is still usable afterwards.
    store.apply_batch([(1, 1, insert(SIMPLE, {"id": 1, "name": "a"}))])
    assert store.count() == 1


def test_sqlite_errors_surface_as_store_error_and_roll_back(store: TabletStore) -> None:
    store.apply_batch([(1, 1, insert(SIMPLE, {"id": 1, "name": "a"}))])
    # Simulate an I/O-level failure: a second writer connection holds the write lock.
    blocker = sqlite3.connect(store.path, timeout=0, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        store._writer.execute("PRAGMA busy_timeout=0")  # fail fast instead of waiting 30 s
        with pytest.raises(StoreError, match="nothing applied"):
            store.apply_batch([(2, 1, insert(SIMPLE, {"id": 2, "name": "b"}))])
    finally:
        blocker.close()
    assert store.applied_index() == 1
    assert store.count() == 1


def test_values_are_parameters_not_sql(store: TabletStore) -> None:
    evil = "x'); DROP TABLE tablet_rows; --"
    store.apply_batch([(1, 1, insert(SIMPLE, {"id": 1, "name": evil}))])
    assert all_rows(store) == [(1, evil, None)]


def test_columns_with_sql_keywords_as_names(tmp_path: Path) -> None:
    schema = Schema(
        [
            ColumnSchema("select", DataType.INT8, is_key=True),
            ColumnSchema("from", DataType.STRING, nullable=True),
            ColumnSchema("where", DataType.BOOL, nullable=True),
        ]
    )
    with TabletStore.open(tmp_path / "t.db", schema) as s:
        s.apply_batch(
            [
                (1, 1, insert(schema, {"select": 1, "from": "a", "where": True})),
                (2, 1, ops(schema, OpType.UPSERT, [{"select": 1, "where": False}])),
            ]
        )
        assert s.scan().rows == [(1, "a", False)]


_SMALL_KEYS = st.integers(0, 6)


@st.composite
def mixed_ops(draw: st.DrawFn) -> list[tuple[OpType, dict[str, object]]]:
    """Runs of INSERTs and UPSERTs (long enough to be applied in one statement) mixed with
    UPDATEs and DELETEs, on a few keys so that keys collide."""
    out: list[tuple[OpType, dict[str, object]]] = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(list(OpType)))
        for _ in range(draw(st.integers(1, 8))):
            key = draw(_SMALL_KEYS)
            if kind is OpType.DELETE:
                out.append((kind, {"id": key}))
            elif kind is OpType.UPDATE:
                out.append((kind, {"id": key, "name": draw(st.sampled_from("xyz"))}))
            else:
                out.append((kind, {"id": key, "name": draw(st.sampled_from("abc"))}))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_ops())
def test_a_batch_applied_in_runs_ends_as_it_would_row_by_row(
    batch: list[tuple[OpType, dict[str, object]]],
) -> None:
    """One entry lets a run of rows of one kind go in one statement; one entry per row
    cannot. Same final rows, same per-row errors (KEY_EXISTS, KEY_NOT_FOUND), whichever path
    each run took."""
    pbs = [encode_row_op(SIMPLE, kind, row) for kind, row in batch]
    with tempfile.TemporaryDirectory() as tmp:
        with TabletStore.open(Path(tmp) / "bulk.db", SIMPLE) as bulk:
            [whole] = bulk.apply_batch([ApplyEntry(1, 1, pbs)])
            bulk_rows = all_rows(bulk)
        with TabletStore.open(Path(tmp) / "single.db", SIMPLE) as single:
            one_by_one = single.apply_batch(
                [ApplyEntry(i + 1, 1, [pb]) for i, pb in enumerate(pbs)]
            )
            single_rows = all_rows(single)
    assert bulk_rows == single_rows
    assert codes(whole) == [(i, name) for i, r in enumerate(one_by_one) for _, name in codes(r)]
    assert whole.rows_applied == sum(r.rows_applied for r in one_by_one)


@contextlib.contextmanager
def _made_without_rowid() -> Iterator[None]:
    """Stores opened new inside make ``tablet_rows`` as builds before 2026-12-07 did."""
    made = SqlBuilder.create_table
    SqlBuilder.create_table = lambda self: made(self) + " WITHOUT ROWID"  # type: ignore[method-assign]
    try:
        yield
    finally:
        SqlBuilder.create_table = made  # type: ignore[method-assign]


# A key of two columns, one a string: the rowid table's key is then an index beside it
# (SIMPLE's one integer key is the rowid itself).
TWO_KEYS = Schema(
    [
        ColumnSchema("tenant", DataType.STRING, is_key=True),
        ColumnSchema("id", DataType.INT32, is_key=True),
        ColumnSchema("name", DataType.STRING),
        ColumnSchema("score", DataType.DOUBLE, nullable=True),
    ]
)


@pytest.mark.parametrize("schema", [SIMPLE, TWO_KEYS], ids=["integer key", "two keys"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=mixed_ops())
def test_a_store_made_without_rowid_applies_as_a_new_one(
    schema: Schema, batch: list[tuple[OpType, dict[str, object]]]
) -> None:
    """New stores keep rows in a rowid table; those made before kept them in the key's
    b-tree (WITHOUT ROWID) and must go on working the same: same rows in the same order,
    same per-row errors."""
    if schema is TWO_KEYS:
        batch = [(kind, {"tenant": f"t{row['id'] % 2}", **row}) for kind, row in batch]
    pbs = [encode_row_op(schema, kind, row) for kind, row in batch]
    with tempfile.TemporaryDirectory() as tmp:
        with _made_without_rowid(), TabletStore.open(Path(tmp) / "old.db", schema):
            pass
        conn = sqlite3.connect(Path(tmp) / "old.db")
        try:
            ddl = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'tablet_rows'")
            assert "WITHOUT ROWID" in ddl.fetchone()[0]
        finally:
            conn.close()
        entries = [ApplyEntry(i + 1, 1, [pb]) for i, pb in enumerate(pbs)]
        with TabletStore.open(Path(tmp) / "old.db", schema) as old:
            old_results = old.apply_batch(entries)
            old_rows = all_rows(old)
        with TabletStore.open(Path(tmp) / "new.db", schema) as new:
            new_results = new.apply_batch(entries)
            new_rows = all_rows(new)
    assert old_rows == new_rows
    assert [codes(r) for r in old_results] == [codes(r) for r in new_results]
