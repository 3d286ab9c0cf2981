"""Exactly-once at the store: a request id applied once, remembered durably, forgotten
only below the client's first incomplete seq_no."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def test_a_late_copy_below_the_first_incomplete_seq_no_is_not_applied(tmp_path: Path) -> None:
    """Its record is gone with the others below the bound; the bound itself stays (and
    survives a reopen), so the copy is stale rather than new."""
    upsert = functools.partial(encode_row_op, SCHEMA, OpType.UPSERT)
    with TabletStore.open(tmp_path / "s.sqlite", SCHEMA) as store:
        store.apply_batch(
            [
                ApplyEntry(1, 1, [upsert({"k": 1, "v": 1})], request=("c1", 1)),
                ApplyEntry(2, 1, [upsert({"k": 1, "v": 2})], request=("c1", 2), **_FI2),
            ]
        )
        assert store.lookup_request("c1", 1) is None
        assert store.request_bound("c1") == 2
        assert store.request_bound("c2") == 0
    with TabletStore.open(tmp_path / "s.sqlite", SCHEMA) as store:
        late, other = store.apply_batch(
            [
                ApplyEntry(3, 2, [upsert({"k": 1, "v": 1})], request=("c1", 1)),
                # Another client's seq_no 1 is its own, and new.
                ApplyEntry(4, 2, [upsert({"k": 2, "v": 1})], request=("c2", 1), **_FI2),
            ]
        )
        assert late.stale_below == 2
        assert (late.rows_applied, late.duplicate_of) == (0, 0)
        assert other.stale_below == 0
        assert other.rows_applied == 1
        assert store.scan().rows == [(1, 2), (2, 1)]
        assert store.lookup_request("c1", 1) is None  # a stale entry records nothing
        assert store.applied_index() == 4


_FI2 = {"first_incomplete_seq_no": 2}


def test_anonymous_writes_are_applied_every_time(tmp_path: Path) -> None:
    with TabletStore.open(tmp_path / "s.sqlite", SCHEMA) as store:
        r1, r2 = store.apply_batch(
            [ApplyEntry(1, 1, [_insert(7, 1)]), ApplyEntry(2, 1, [_insert(7, 1)])]
        )
        assert r1.rows_applied == 1
        assert [e.code for e in r2.row_errors] == [ErrorCode.KEY_EXISTS]


@st.composite
def request_entries(draw: st.DrawFn) -> tuple[list[ApplyEntry], list[int]]:
    """Writes of two clients with colliding seq_nos (retries, stale retries after a prune),
    each upserting its own key, and random cut points into apply batches."""
    entries = []
    for i in range(draw(st.integers(1, 25))):
        client = draw(st.sampled_from(["c1", "c2"]))
        seq = draw(st.integers(1, 6))
        entries.append(
            ApplyEntry(
                i + 1,
                1,
                [encode_row_op(SCHEMA, OpType.INSERT, {"k": draw(st.integers(0, 8)), "v": i})],
                request=(client, seq),
                first_incomplete_seq_no=draw(st.integers(0, 7)),
            )
        )
    cuts = sorted(set(draw(st.lists(st.integers(1, len(entries)), max_size=6))))
    return entries, cuts


def _outcome(store: TabletStore, results: list[object]) -> tuple[object, ...]:
    with store._reader() as conn:
        records = conn.execute(
            "SELECT client_id, seq_no, op_index, op_term, row_errors FROM raftlet_requests "
            "ORDER BY client_id, seq_no"
        ).fetchall()
        bounds = conn.execute(
            "SELECT client_id, bound, op_index FROM raftlet_request_bounds ORDER BY client_id"
        ).fetchall()
    return (results, store.scan().rows, records, bounds)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request_entries())
def test_records_written_in_bulk_end_as_one_entry_at_a_time(
    case: tuple[list[ApplyEntry], list[int]],
) -> None:
    """Replicas group entries into apply batches differently: every grouping must give the
    same results, rows and request records as applying the entries one at a time."""
    entries, cuts = case
    with tempfile.TemporaryDirectory() as tmp:
        with TabletStore.open(Path(tmp) / "one.sqlite", SCHEMA) as one:
            singly = [one.apply_batch([e])[0] for e in entries]
            expected = _outcome(one, singly)
        with TabletStore.open(Path(tmp) / "bulk.sqlite", SCHEMA) as bulk:
            results = []
            for start, end in zip([0, *cuts], [*cuts, len(entries)], strict=True):
                if start < end:
                    results += bulk.apply_batch(entries[start:end])
            assert _outcome(bulk, results) == expected
