"""A batch of entries applied in one ``apply_batch`` has exactly the outcome of applying
them one at a time: the same results, rows, request records and applied index -- whatever
the duplicates, forgotten requests, failing rows and run shapes in it."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlet.schema.row_block import encode_row_block
from raftlet.schema.row_runs import decode_row_runs
from raftlet.schema.rows import ErrorCode, OpType, encode_row_op
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from raftlet.tserver.store import ApplyEntry, TabletStore, tablet_store
from raftlet.tserver.store.request_records import (
    Request,
    StoredBound,
    StoredRecord,
    plan_requests,
)
from tests.unit.store_helpers import store_contents

SCHEMA = Schema(
    [
        ColumnSchema("k", DataType.INT64, is_key=True),
        ColumnSchema("v", DataType.STRING, nullable=True),
    ]
)

request_ids = st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 6))
requests = st.one_of(st.none(), request_ids)


@st.composite
def request_lists(draw: st.DrawFn) -> list[tuple[Request | None, int]]:
    return draw(st.lists(st.tuples(requests, st.integers(0, 7)), max_size=12))


def _one_at_a_time(
    reqs: list[tuple[Request | None, int]],
    stored: dict[Request, StoredRecord],
    indexes: list[int] | None = None,
    window: int | None = None,
    bounds: dict[str, StoredBound] | None = None,
) -> tuple[
    dict[int, StoredRecord],
    dict[int, int],
    dict[Request, StoredRecord | int],
    dict[int, int],
    dict[str, StoredBound],
]:
    """The request and bounds tables as the entries see them one after another, the
    obvious way; with ``indexes`` (each entry's log index) and ``window``, the records and
    bounds out of each entry's window dropped first."""
    table: dict[Request, StoredRecord | int] = dict(stored)
    limits: dict[str, StoredBound] = dict(bounds or {})
    repeats_stored: dict[int, StoredRecord] = {}
    repeats_batch: dict[int, int] = {}
    stale: dict[int, int] = {}

    def written(held: StoredRecord | int) -> int:
        assert indexes is not None
        return indexes[held] if isinstance(held, int) else held[0]

    for pos, (key, first_incomplete) in enumerate(reqs):
        if indexes is not None and window is not None:
            for k in [k for k, held in table.items() if written(held) < indexes[pos] - window]:
                del table[k]
            for c in [c for c, (_, at) in limits.items() if at < indexes[pos] - window]:
                del limits[c]
        if key is None:
            continue
        if key in table:
            held = table[key]
            if isinstance(held, int):
                repeats_batch[pos] = held
            else:
                repeats_stored[pos] = held
            continue
        bound = limits.get(key[0], (0, 0))[0]
        if key[1] < bound:
            stale[pos] = bound
            continue
        table[key] = pos
        if first_incomplete > 0:
            limits[key[0]] = (max(bound, first_incomplete), indexes[pos] if indexes else 0)
            for k in [k for k in table if k[0] == key[0] and k[1] < first_incomplete]:
                del table[k]
    return repeats_stored, repeats_batch, table, stale, limits


stored_bounds = st.dictionaries(
    st.sampled_from(["a", "b"]), st.tuples(st.integers(0, 7), st.integers(1, 9)), max_size=2
)


@settings(max_examples=500, deadline=None)
@given(
    request_lists(),
    st.dictionaries(
        request_ids,
        st.tuples(st.integers(1, 9), st.integers(1, 3), st.binary(max_size=2)),
        max_size=6,
    ),
    stored_bounds,
)
def test_the_request_plan_is_what_one_at_a_time_sees(
    reqs: list[tuple[Request | None, int]],
    stored: dict[Request, StoredRecord],
    bounds: dict[str, StoredBound],
) -> None:
    plan = plan_requests(reqs, stored, bounds=bounds)
    repeats_stored, repeats_batch, table, stale, limits = _one_at_a_time(
        reqs, stored, bounds=bounds
    )
    assert plan.repeats_stored == repeats_stored
    assert plan.repeats_batch == repeats_batch
    assert plan.stale == stale
    assert {**bounds, **{c: (b, at) for c, b, at in plan.bounds}} == limits
    # Deletes first, then the inserts, reach the same table.
    after: dict[Request, StoredRecord | int] = {
        k: v
        for k, v in stored.items()
        if not any(k[0] == client and k[1] < bound for client, bound in plan.deletes)
    }
    for pos in plan.inserts:
        key = reqs[pos][0]
        assert key is not None
        assert key not in after
        after[key] = pos
    assert after == table
    assert plan.inserts == sorted(plan.inserts)


@settings(max_examples=500, deadline=None)
@given(
    request_lists(),
    st.dictionaries(
        request_ids,
        st.tuples(st.integers(1, 9), st.integers(1, 3), st.binary(max_size=2)),
        max_size=6,
    ),
    st.lists(st.integers(1, 3), min_size=12, max_size=12),
    st.integers(1, 6),
    stored_bounds,
)
def test_the_request_plan_keeps_what_the_window_leaves_one_at_a_time(
    reqs: list[tuple[Request | None, int]],
    stored: dict[Request, StoredRecord],
    gaps: list[int],
    window: int,
    bounds: dict[str, StoredBound],
) -> None:
    # Entry indexes grow past the stored records' (1..9), with gaps (other entry types).
    indexes = list(itertools.accumulate(gaps, initial=10))[1 : len(reqs) + 1]
    plan = plan_requests(reqs, stored, indexes, window, bounds)
    repeats_stored, repeats_batch, table, stale, limits = _one_at_a_time(
        reqs, stored, indexes, window, bounds
    )
    assert plan.repeats_stored == repeats_stored
    assert plan.repeats_batch == repeats_batch
    assert plan.stale == stale
    if reqs:
        kept = {c: v for c, v in bounds.items() if v[1] >= plan.expire_below}
        assert {**kept, **{c: (b, at) for c, b, at in plan.bounds}} == {
            c: v for c, v in limits.items() if v[1] >= plan.expire_below
        }
    # Expiry and deletes first, then the inserts, reach the same table.
    after: dict[Request, StoredRecord | int] = {
        k: v
        for k, v in stored.items()
        if v[0] >= plan.expire_below
        and not any(k[0] == client and k[1] < bound for client, bound in plan.deletes)
    }
    for pos in plan.inserts:
        key = reqs[pos][0]
        assert key is not None
        assert key not in after
        after[key] = pos
    if reqs:
        assert after == table


def test_a_store_keeps_request_records_only_within_its_window(tmp_path: Path) -> None:
    # One client id per write that never comes back: only the window bounds its records.
    with TabletStore.open(tmp_path / "t.db", SCHEMA) as store:
        store.request_window = 5
        for i in range(1, 21):
            op = encode_row_op(SCHEMA, OpType.INSERT, {"k": i, "v": None})
            store.apply_batch([ApplyEntry(i, 1, [op], request=(f"c{i}", 1))])
            assert store.request_records() == min(i, 6)
        assert store.requests_expired == 14
        assert store.lookup_request("c15", 1) is not None
        assert store.lookup_request("c14", 1) is None
        # A retry of a recorded request is a duplicate (no row applied twice) ...
        again = encode_row_op(SCHEMA, OpType.INSERT, {"k": 20, "v": None})
        (dup,) = store.apply_batch([ApplyEntry(21, 1, [again], request=("c20", 1))])
        assert dup.duplicate_of == 20
        # ... one out of the window is applied afresh (here: its row exists, KEY_EXISTS).
        old = encode_row_op(SCHEMA, OpType.INSERT, {"k": 1, "v": None})
        (fresh,) = store.apply_batch([ApplyEntry(22, 1, [old], request=("c1", 1))])
        assert not fresh.duplicate_of
        assert [e.code for e in fresh.row_errors] == [ErrorCode.KEY_EXISTS]


def test_before_commit_sees_the_results_and_readers_see_the_batch_after_it(
    tmp_path: Path,
) -> None:
    with TabletStore.open(tmp_path / "t.db", SCHEMA) as store:
        first = encode_row_op(SCHEMA, OpType.INSERT, {"k": 1, "v": "a"})
        store.apply_batch([ApplyEntry(1, 1, [first], request=("c", 1))])
        seen: list[tuple[list[int], int, int, list[ErrorCode]]] = []

        def before_commit(results: list[Any]) -> None:
            # Another connection, and the applied index, still show the last commit.
            seen.append(
                (
                    [e.index for e in results],
                    store.applied_index(),
                    store.count(),
                    [f.code for r in results for f in r.row_errors],
                )
            )

        again = encode_row_op(SCHEMA, OpType.INSERT, {"k": 1, "v": "b"})
        fresh = encode_row_op(SCHEMA, OpType.INSERT, {"k": 2, "v": "c"})
        results = store.apply_batch(
            [ApplyEntry(2, 1, [again], request=("c", 2)), ApplyEntry(3, 1, [fresh])],
            before_commit=before_commit,
        )
        assert seen == [([2, 3], 1, 1, [ErrorCode.KEY_EXISTS])]
        assert [e.index for e in results] == [2, 3]
        assert (store.applied_index(), store.count()) == (3, 2)

        # A replay of applied entries only has nothing to commit: no call.
        store.apply_batch([ApplyEntry(3, 1, [fresh])], before_commit=before_commit)
        assert len(seen) == 1


def test_a_batch_is_committed_even_if_before_commit_raises(tmp_path: Path) -> None:
    with TabletStore.open(tmp_path / "t.db", SCHEMA) as store:

        def before_commit(_results: list[Any]) -> None:
            raise RuntimeError("a bug in the caller")

        op = encode_row_op(SCHEMA, OpType.INSERT, {"k": 7, "v": None})
        with pytest.raises(RuntimeError, match="a bug in the caller"):
            store.apply_batch([ApplyEntry(1, 1, [op])], before_commit=before_commit)
        assert (store.applied_index(), store.count()) == (1, 1)
        # The entries are committed in the log: applying them is right whatever the
        # caller did with their results, and a replay now skips them.
        (again,) = store.apply_batch([ApplyEntry(1, 1, [op])])
        assert again.skipped


def _open_deleted_files() -> list[str]:
    """What this process holds open that has no name any more (SQLite's temp files are
    unlinked as soon as they are opened)."""
    fds = Path("/proc/self/fd")
    targets = []
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # an fd closed since the listing
            targets.append(os.readlink(fd))
    return [t for t in targets if t.endswith("(deleted)")]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_a_bulk_run_opens_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bulk run runs in a savepoint, whose journal SQLite spills to a temp file once it
    # holds more than 64 KiB of original pages -- in a store of any size, a run of a few
    # dozen rows landing on as many leaf pages -- open until the savepoint's release: an
    # open, an unlink and a close in nearly every store transaction of a loaded leader.
    # Look at the process's files right after each statement of many rows.
    seen: list[list[str]] = []

    class Cursor(sqlite3.Cursor):
        def executemany(self, sql: str, params: Any) -> sqlite3.Cursor:
            result = super().executemany(sql, params)
            seen.append(_open_deleted_files())
            return result

    class Connection(sqlite3.Connection):
        def cursor(self, factory: Any = Cursor) -> Any:
            return super().cursor(factory)

    monkeypatch.setattr(sqlite3, "connect", functools.partial(sqlite3.connect, factory=Connection))

    def run(keys: range) -> list[Any]:
        rows = [(OpType.INSERT, {"k": k, "v": "x" * 100}) for k in keys]
        runs, failures = decode_row_runs(SCHEMA, *encode_row_block(SCHEMA, rows))
        assert not failures
        return list(runs)

    with TabletStore.open(tmp_path / "t.db", SCHEMA) as store:
        store.apply_batch([ApplyEntry(1, 1, run(range(0, 60_000, 10)))])  # ~200 leaf pages
        before = _open_deleted_files()
        seen.clear()
        store.apply_batch([ApplyEntry(2, 1, run(range(5, 60_000, 1_000)))])  # one row a page
        assert store.count() == 6_060
    assert len(seen) >= 2  # the rows' statement, the applied index's
    assert all(files == before for files in seen), seen


@st.composite
def entries(draw: st.DrawFn) -> list[ApplyEntry]:
    """Writes over a few keys (so rows collide: KEY_EXISTS, KEY_NOT_FOUND), as packed runs
    or per-cell ops, of every op type, long enough for runs of one statement; some repeat
    a request, some forget older ones, some are anonymous or empty (a NO_OP)."""
    out: list[ApplyEntry] = []
    for index in range(1, draw(st.integers(1, 14)) + 1):
        rows: list[tuple[OpType, dict[str, Any]]] = []
        shape = draw(st.sampled_from(list(OpType)))
        for _ in range(draw(st.integers(0, 6))):
            op = shape if draw(st.integers(0, 3)) else draw(st.sampled_from(list(OpType)))
            row: dict[str, Any] = {"k": draw(st.integers(0, 5))}
            if op is not OpType.DELETE:
                row["v"] = draw(st.sampled_from(["x", "yy", None]))
            rows.append((op, row))
        ops: list[Any]
        failures: list[Any] = []
        if draw(st.booleans()):
            runs, failures = decode_row_runs(SCHEMA, *encode_row_block(SCHEMA, rows))
            ops = list(runs)
        else:
            ops = [encode_row_op(SCHEMA, op, row) for op, row in rows]
        request = draw(requests)
        out.append(
            ApplyEntry(
                index,
                1 + index // 5,  # a few terms
                ops,
                request=request,
                first_incomplete_seq_no=draw(st.integers(0, 7)) if request else 0,
                row_failures=failures,
            )
        )
    return out


@settings(max_examples=200, deadline=None)
@given(entries(), st.lists(st.integers(1, 14), max_size=4), st.sampled_from([4, 5, 9, 512]))
def test_a_batch_applies_as_its_entries_one_at_a_time(
    batch: list[ApplyEntry], cuts: list[int], max_bulk_rows: int
) -> None:
    """``max_bulk_rows``: the longest statement of the batches (the store's default for
    the entries applied one at a time), so that runs are also cut into pieces."""
    with tempfile.TemporaryDirectory() as tmp:
        one = TabletStore.open(Path(tmp) / "one.sqlite", SCHEMA)
        chunked = TabletStore.open(Path(tmp) / "chunked.sqlite", SCHEMA)
        try:
            expected = [r for e in batch for r in one.apply_batch([e])]
            bounds = sorted({0, len(batch), *(c for c in cuts if c < len(batch))})
            default = tablet_store._MAX_BULK_ROWS
            tablet_store._MAX_BULK_ROWS = max_bulk_rows
            try:
                got = [
                    r
                    for lo, hi in itertools.pairwise(bounds)
                    for r in chunked.apply_batch(batch[lo:hi])
                ]
            finally:
                tablet_store._MAX_BULK_ROWS = default
            assert got == expected
            assert chunked.applied_index() == one.applied_index() == batch[-1].index
        finally:
            one.close()
            chunked.close()
        assert store_contents(Path(tmp) / "chunked.sqlite") == store_contents(
            Path(tmp) / "one.sqlite"
        )
