"""Exactly-once at the store: a request id applied once, remembered durably, forgotten
only below the client's first incomplete seq_no."""

from __future__ import annotations

from pathlib import Path

from raftlet.schema.rows import ErrorCode, OpType, encode_row_op
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from raftlet.tserver.store import ApplyEntry, TabletStore

SCHEMA = Schema([ColumnSchema("k", DataType.INT64, is_key=True), ColumnSchema("v", DataType.INT64)])


def _insert(k: int, v: int) -> object:
    return encode_row_op(SCHEMA, OpType.INSERT, {"k": k, "v": v})


def test_a_repeated_request_is_not_applied_twice_and_returns_the_first_outcome(
    tmp_path: Path,
) -> None:
    with TabletStore.open(tmp_path / "s.sqlite", SCHEMA) as store:
        first = store.apply_batch(
            [ApplyEntry(1, 1, [_insert(1, 10), _insert(1, 11)], request=("c1", 5))]
        )[0]
        assert first.rows_applied == 1
        assert [e.code for e in first.row_errors] == [ErrorCode.KEY_EXISTS]
        # The same request again, as a retry would be proposed by a new leader.
        again = store.apply_batch(
            [ApplyEntry(2, 2, [_insert(1, 10), _insert(1, 11)], request=("c1", 5))]
        )[0]
        assert (again.duplicate_of, again.duplicate_term) == (1, 1)
        assert again.rows_applied == 0
        assert again.row_errors == first.row_errors
        assert store.count() == 1
        assert store.applied_index() == 2
    with TabletStore.open(tmp_path / "s.sqlite", SCHEMA) as store:
        record = store.lookup_request("c1", 5)
        assert record is not None
        assert (record.index, record.term) == (1, 1)
        assert record.row_errors == first.row_errors
        assert store.lookup_request("c1", 6) is None
        assert store.lookup_request("c2", 5) is None


def test_results_below_first_incomplete_seq_no_are_forgotten(tmp_path: Path) -> None:
    with TabletStore.open(tmp_path / "s.sqlite", SCHEMA) as store:
        store.apply_batch(
            [
                ApplyEntry(1, 1, [_insert(1, 1)], request=("c1", 1), first_incomplete_seq_no=1),
                ApplyEntry(2, 1, [_insert(2, 2)], request=("c1", 2), first_incomplete_seq_no=1),
                ApplyEntry(3, 1, [_insert(3, 3)], request=("c2", 1), first_incomplete_seq_no=1),
                ApplyEntry(4, 1, [_insert(4, 4)], request=("c1", 3), first_incomplete_seq_no=3),
            ]
        )
        assert store.lookup_request("c1", 1) is None
        assert store.lookup_request("c1", 2) is None
        assert store.lookup_request("c1", 3) is not None
        assert store.lookup_request("c2", 1) is not None  # another client's are kept
        assert store.count() == 4


def test_anonymous_writes_are_applied_every_time(tmp_path: Path) -> None:
    with TabletStore.open(tmp_path / "s.sqlite", SCHEMA) as store:
        r1, r2 = store.apply_batch(
            [ApplyEntry(1, 1, [_insert(7, 1)]), ApplyEntry(2, 1, [_insert(7, 1)])]
        )
        assert r1.rows_applied == 1
        assert [e.code for e in r2.row_errors] == [ErrorCode.KEY_EXISTS]
