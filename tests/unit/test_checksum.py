"""Checksum points (``tserver.checksum``) and their comparison (``client.checksum``): where a
run of entries is cut, what the checksum covers, how results are kept and waited for, and
how replicas are judged."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from raftlet.client.checksum import ReplicaChecksum, TabletChecksum
from raftlet.consensus.core.types import Entry, EntryType
from raftlet.proto import tablet_pb2
from raftlet.schema.rows import OpType, encode_row_op
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from raftlet.tserver.checksum import (
    CHECKSUM_MARKER,
    STOPPED,
    ChecksumResult,
    RecentChecksums,
    checksum_rows,
    is_checksum_point,
    pin_checksum,
    split_after_checksum_points,
)
from raftlet.tserver.store import ApplyEntry, TabletStore

SCHEMA = Schema(
    [
        ColumnSchema("k", DataType.INT64, is_key=True),
        ColumnSchema("v", DataType.STRING, nullable=True),
    ]
)


def _write(i: int) -> Entry:
    op = encode_row_op(SCHEMA, OpType.INSERT, {"k": i, "v": str(i)})
    return Entry(i, 1, EntryType.NORMAL, tablet_pb2.WriteOperationPB(ops=[op]).SerializeToString())


def _point(i: int) -> Entry:
    return Entry(i, 1, EntryType.NORMAL, CHECKSUM_MARKER)


def test_a_point_is_told_from_writes_and_no_ops() -> None:
    assert is_checksum_point(_point(3))
    assert not is_checksum_point(_write(3))
    assert not is_checksum_point(Entry(3, 1, EntryType.NO_OP, CHECKSUM_MARKER))
    # Even a write with no rows at all (which the server refuses) is not a point.
    empty = tablet_pb2.WriteOperationPB(request_id={"client_id": "c", "seq_no": 1})
    assert not is_checksum_point(Entry(3, 1, EntryType.NORMAL, empty.SerializeToString()))


def test_runs_are_cut_right_after_each_point() -> None:
    w1, p2, w3, w4, p5, p6 = _write(1), _point(2), _write(3), _write(4), _point(5), _point(6)
    assert split_after_checksum_points([w1, w3]) == [[w1, w3]]
    assert split_after_checksum_points([w1, p2, w3, w4]) == [[w1, p2], [w3, w4]]
    assert split_after_checksum_points([w1, p2, w3, w4, p5, p6]) == [
        [w1, p2],
        [w3, w4, p5],
        [p6],
    ]
    assert split_after_checksum_points([p2]) == [[p2]]


def _store(path: Path, rows: dict[int, str]) -> TabletStore:
    store = TabletStore.open(path, SCHEMA)
    ops = [encode_row_op(SCHEMA, OpType.INSERT, {"k": k, "v": v}) for k, v in rows.items()]
    store.apply_batch([ApplyEntry(1, 1, ops)])
    return store


def test_the_checksum_covers_every_row_and_only_the_rows(tmp_path: Path) -> None:
    rows = {i: f"value {i}" for i in range(2500)}  # more than one fetch
    a = _store(tmp_path / "a.sqlite", rows)
    b = _store(tmp_path / "b.sqlite", dict(reversed(rows.items())))  # other insert order
    c = _store(tmp_path / "c.sqlite", {**rows, 1234: "value 1235"})
    try:
        ra, rb, rc = (checksum_rows(s, 1) for s in (a, b, c))
        assert ra.rows == rb.rows == rc.rows == 2500
        assert ra.checksum == rb.checksum
        assert len(ra.checksum) == 32
        assert not ra.failure
        assert rc.checksum != ra.checksum
        wrong_index = checksum_rows(a, 2)
        assert wrong_index.checksum == ""
        assert "at index 1, not 2" in wrong_index.failure
    finally:
        for s in (a, b, c):
            s.close()


def test_a_pinned_checksum_is_of_its_index_while_the_store_applies_on(tmp_path: Path) -> None:
    """The apply thread pins the rows and goes on; the rows are read on another thread.
    Read in the apply thread, a checksum held a tablet's writes for its whole length (14 s
    for 320,000 rows of 1 KB, review r33a)."""
    rows = {i: f"value {i}" for i in range(2500)}
    store = _store(tmp_path / "a.sqlite", rows)
    alone = _store(tmp_path / "b.sqlite", rows)
    try:
        read = pin_checksum(store, 1)
        more = [encode_row_op(SCHEMA, OpType.INSERT, {"k": k, "v": "later"}) for k in (-1, 9999)]
        delete = encode_row_op(SCHEMA, OpType.DELETE, {"k": 5})
        store.apply_batch([ApplyEntry(2, 1, more), ApplyEntry(3, 1, [delete])])
        assert store.applied_index() == 3
        with ThreadPoolExecutor(1) as other:
            pinned = other.submit(read).result(timeout=30)
        assert pinned == checksum_rows(alone, 1)
        assert pinned.rows == 2500
        now = checksum_rows(store, 3)
        assert now.rows == 2501
        assert now.checksum != pinned.checksum
    finally:
        store.close()
        alone.close()


def test_a_pinned_checksum_ends_early_once_its_replica_stops(tmp_path: Path) -> None:
    """Its read transaction would otherwise last the whole read after the replica stopped
    (and a deleted tablet's file would be kept that long)."""
    store = _store(tmp_path / "a.sqlite", {i: f"value {i}" for i in range(2500)})
    try:
        stopping = threading.Event()
        read = pin_checksum(store, 1, stopped=stopping.is_set)
        stopping.set()
        result = read()
        assert (result.checksum, result.failure) == ("", STOPPED)
        assert result.rows < 2500
    finally:
        store.close()


def test_results_are_kept_for_the_last_points_and_waited_for() -> None:
    kept = RecentChecksums(kept=2)
    for i in (1, 2, 3):
        kept.record(ChecksumResult(i, i, f"sum{i}"))
    assert kept.wait(1, 0) is None  # the oldest was dropped
    assert kept.wait(3, 0) == ChecksumResult(3, 3, "sum3")
    kept.begin(4)
    assert kept.reading(4)
    later = threading.Timer(0.05, lambda: kept.record(ChecksumResult(4, 4, "sum4")))
    later.start()
    try:
        assert kept.wait(4, 10) == ChecksumResult(4, 4, "sum4")
    finally:
        later.join()
    assert not kept.reading(4)


def _tablet(*replicas: ReplicaChecksum) -> TabletChecksum:
    return TabletChecksum("t", 9, replicas)


def test_replicas_are_judged_by_the_majority() -> None:
    same = TabletChecksum("t", 9, (ReplicaChecksum("a", 5, "x"), ReplicaChecksum("b", 5, "x")))
    assert same.ok
    assert same.agreed == "x"
    assert same.suspects() == []
    odd = _tablet(
        ReplicaChecksum("a", 5, "x"), ReplicaChecksum("b", 5, "y"), ReplicaChecksum("c", 5, "x")
    )
    assert not odd.ok
    assert odd.agreed == "x"
    assert [r.server for r in odd.suspects()] == ["b"]
    broken = _tablet(
        ReplicaChecksum("a", 5, "x"),
        ReplicaChecksum("b", error="UNAVAILABLE"),
        ReplicaChecksum("c", 5, "y"),
    )
    assert not broken.ok
    assert broken.agreed is None
    assert [r.server for r in broken.suspects()] == ["a", "b", "c"]
    assert not TabletChecksum("t", 0, ()).ok
    # Different rows, against a replica that gave none (its server down): only the first
    # is a divergence.
    assert odd.diverged
    assert broken.diverged
    assert not same.diverged
    down = _tablet(
        ReplicaChecksum("a", 5, "x"),
        ReplicaChecksum("b", error="UNAVAILABLE"),
        ReplicaChecksum("c", 5, "x"),
    )
    assert not down.ok
    assert not down.diverged
    assert [r.server for r in down.suspects()] == ["b"]
