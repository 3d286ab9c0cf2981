"""TabletStore lifecycle: create, reopen, schema checks, snapshots, durability, threads."""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from raftlet.tserver.store import (
    ApplyEntry,
    SchemaMismatchError,
    StoreClosedError,
    StoreError,
    TabletStore,
    damage_in,
)
from raftlet.tserver.store.errors import StoreFilesGone, StoreNewerFormat
from tests.unit.store_helpers import SIMPLE, RefusedCheckpoints, insert


def fill(store: TabletStore, first_index: int, count: int, term: int = 1) -> None:
    store.apply_batch(
        [
            (i, term, insert(SIMPLE, {"id": i, "name": f"r{i}"}))
            for i in range(first_index, first_index + count)
        ]
    )


def test_create_sets_wal_mode_and_tables(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with TabletStore.open(path, SIMPLE) as s:
        assert (s.applied_index(), s.applied_term()) == (0, 0)
        assert s.count() == 0
        assert s.scan().rows == []
        assert s.schema == SIMPLE
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        ddl = conn.execute("SELECT sql FROM sqlite_master WHERE name='tablet_rows'").fetchone()[0]
    finally:
        conn.close()
    assert "WITHOUT ROWID" not in ddl  # sql.SqlBuilder.create_table says why
    assert 'PRIMARY KEY ("id")' in ddl
    assert '"name" TEXT NOT NULL' in ddl
    assert '"score" REAL' in ddl
    assert '"score" REAL NOT NULL' not in ddl


def test_rows_of_1_kb_take_about_their_size_on_disk(tmp_path: Path) -> None:
    """Kept in the key's b-tree (WITHOUT ROWID), whose cells hold at most ~1,000 bytes of a
    4 KiB page, each such row put its last bytes on an overflow page of their own: 4.7
    times the rows' size (review r33a)."""
    # SIMPLE's one integer key is the rowid; a string key is an index beside the table.
    string_key = Schema(
        [ColumnSchema("k", DataType.STRING, is_key=True), ColumnSchema("name", DataType.STRING)]
    )
    rows, size = 2000, 1000
    for schema, key in ((SIMPLE, "id"), (string_key, "k")):
        path = tmp_path / f"{key}.db"
        with TabletStore.open(path, schema) as s:
            for first in range(0, rows, 100):
                batch = [
                    {key: i if key == "id" else f"key-{i:06d}", "name": "x" * size}
                    for i in range(first, first + 100)
                ]
                s.apply_batch([ApplyEntry(first // 100 + 1, 1, insert(schema, *batch))])
            s.flush()
        assert path.stat().st_size < 1.3 * rows * size, key


def test_reopen_keeps_rows_and_applied_state(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with TabletStore.open(path, SIMPLE) as s:
        fill(s, 1, 10, term=3)
    with TabletStore.open(path, SIMPLE) as s:
        assert (s.applied_index(), s.applied_term()) == (10, 3)
        assert s.count() == 10
        assert s.scan(limit=1).rows == [(1, "r1", None)]
    # Without a schema, the store's own is used.
    with TabletStore.open(path) as s:
        assert s.schema == SIMPLE
        assert s.count() == 10


def test_reopen_after_a_crash_without_close(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    s = TabletStore.open(path, SIMPLE)
    fill(s, 1, 5)
    # Simulate a crash: copy the files as they are now, with the WAL not checkpointed.
    copy = tmp_path / "copy.db"
    for suffix in ("", "-wal"):
        src = Path(f"{path}{suffix}")
        if src.exists():
            Path(f"{copy}{suffix}").write_bytes(src.read_bytes())
    s.close()
    with TabletStore.open(copy, SIMPLE) as c:
        assert c.applied_index() == 5
        assert c.count() == 5


def test_schema_mismatch_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    TabletStore.open(path, SIMPLE).close()
    other = Schema(
        [
            ColumnSchema("id", DataType.INT32, is_key=True),
            ColumnSchema("name", DataType.STRING, nullable=True),
        ]
    )
    with pytest.raises(SchemaMismatchError) as exc:
        TabletStore.open(path, other)
    msg = str(exc.value)
    assert "was created with schema (id INT32 KEY, name STRING NOT NULL" in msg
    assert "opened with (id INT32 KEY, name STRING NULL)" in msg
    assert isinstance(exc.value, StoreError)


@pytest.mark.parametrize("name", ["t.db", "t.db-wal"])
def test_a_store_whose_file_cannot_be_written_is_refused_at_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """SQLite opened an immutable file read-only without a word: every apply failed with
    SQLITE_READONLY, and the replica stayed FAILED after the file was writable again."""
    path = tmp_path / "t.db"
    with TabletStore.open(path, SIMPLE) as s:
        fill(s, 1, 2)
    (tmp_path / "t.db-wal").touch()
    real_open = os.open

    def refusing(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if Path(file).name == name and flags & os.O_RDWR:  # what chattr +i does, for root
            raise PermissionError(errno.EPERM, "Operation not permitted", str(file))
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    with pytest.raises(StoreError, match=rf"{name} cannot be written \(Operation not permitted"):
        TabletStore.open(path, SIMPLE)
    monkeypatch.setattr(os, "open", real_open)
    with TabletStore.open(path, SIMPLE) as s:
        assert s.applied_index() == 2


def test_opening_what_is_not_a_store(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database file at all" * 100)
    with pytest.raises(StoreError, match="cannot open tablet store"):
        TabletStore.open(garbage, SIMPLE)
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match=r"not a tablet store: it has tables \['t'\]"):
        TabletStore.open(foreign, SIMPLE)
    with pytest.raises(StoreError, match=r"no tablet store at .*no schema"):
        TabletStore.open(tmp_path / "absent.db")
    with pytest.raises(StoreError, match="cannot open tablet store"):
        TabletStore.open(tmp_path / "no" / "such" / "dir" / "t.db", SIMPLE)


def test_newer_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    TabletStore.open(path, SIMPLE).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE raftlet_meta SET value = 99 WHERE key = 'format_version'")
    conn.commit()
    conn.close()
    newer = r"format version 99, written by a newer release \(this one reads 1\)"
    with pytest.raises(StoreNewerFormat, match=newer):
        TabletStore.open(path, SIMPLE)


def test_closed_store_refuses_use_and_close_is_idempotent(tmp_path: Path) -> None:
    s = TabletStore.open(tmp_path / "t.db", SIMPLE)
    s.close()
    s.close()
    with pytest.raises(StoreClosedError):
        s.scan()
    with pytest.raises(StoreClosedError):
        s.apply_batch([(1, 1, [])])
    with pytest.raises(StoreClosedError):
        s.count()
    with pytest.raises(StoreClosedError):
        s.snapshot(tmp_path / "snap.db")


def test_snapshot_carries_data_and_applied_state(tmp_path: Path) -> None:
    path, snap = tmp_path / "t.db", tmp_path / "snap" / "s.db"
    snap.parent.mkdir()
    with TabletStore.open(path, SIMPLE) as s:
        fill(s, 1, 20, term=2)
        assert s.snapshot(snap) == (20, 2)
        fill(s, 21, 5, term=3)  # after the snapshot: not in it
        assert s.count() == 25
    # One self-contained file, nothing left beside it.
    assert sorted(p.name for p in snap.parent.iterdir()) == ["s.db"]
    with TabletStore.open(snap, SIMPLE) as copy:
        assert (copy.applied_index(), copy.applied_term()) == (20, 2)
        assert copy.count() == 20
        assert copy.scan().rows == [(i, f"r{i}", None) for i in range(1, 21)]
        # A restored replica continues from the snapshot's index.
        fill(copy, 21, 1, term=2)
        assert copy.applied_index() == 21


def test_snapshot_replaces_an_old_one(tmp_path: Path) -> None:
    snap = tmp_path / "s.db"
    with TabletStore.open(tmp_path / "t.db", SIMPLE) as s:
        fill(s, 1, 3)
        s.snapshot(snap)
        fill(s, 4, 3)
        assert s.snapshot(snap) == (6, 1)
    with TabletStore.open(snap) as copy:
        assert copy.count() == 6


def test_install_snapshot_replaces_the_store(tmp_path: Path) -> None:
    path, snap = tmp_path / "t.db", tmp_path / "s.db"
    with TabletStore.open(tmp_path / "leader.db", SIMPLE) as leader:
        fill(leader, 1, 30)
        leader.snapshot(snap)
    with TabletStore.open(path, SIMPLE) as lagging:
        fill(lagging, 1, 2)
        lagging.apply_batch([(3, 1, insert(SIMPLE, {"id": 999, "name": "diverged"}))])
    TabletStore.install_snapshot(snap, path)
    assert not snap.exists()
    with TabletStore.open(path, SIMPLE) as s:
        assert s.applied_index() == 30
        assert s.count() == 30
        assert s.scan(["id"], limit=1, resume_key=None).rows == [(1,)]
    with pytest.raises(StoreError, match="no snapshot file"):
        TabletStore.install_snapshot(snap, path)


def test_flush_returns_the_durable_applied_index(tmp_path: Path) -> None:
    with TabletStore.open(tmp_path / "t.db", SIMPLE) as s:
        assert s.flush() == 0
        fill(s, 1, 4)
        assert s.flush() == 4


@pytest.mark.parametrize("gone", ["t.db", "t.db-wal", "the directory", "replaced"])
def test_flush_fails_when_the_store_files_are_gone_from_under_it(tmp_path: Path, gone: str) -> None:
    """Deleted under a running store, its rows went on into unlinked files, and ``flush``
    still called them durable -- so log GC dropped the entries a restart would need."""
    directory = tmp_path / "tablet"
    directory.mkdir()
    path = directory / "t.db"
    with TabletStore.open(path, SIMPLE) as s:
        fill(s, 1, 4)
        assert s.flush() == 4
        if gone == "the directory":
            shutil.rmtree(directory)
        elif gone == "replaced":
            path.unlink()
            path.write_bytes(b"")
        else:
            (directory / gone).unlink()
        fill(s, 5, 2)  # SQLite writes on into what it has open
        with pytest.raises(StoreFilesGone) as caught:
            s.flush()
        assert damage_in(caught.value) is not None  # no retry mends it: a copy does


def test_a_checkpoint_that_fails_is_an_error_not_a_growing_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite ignores a failed automatic checkpoint: with the store file made immutable its
    -wal grew past 100 MB while status said OK."""
    with TabletStore.open(tmp_path / "t.db", SIMPLE) as s:
        fill(s, 1, 4)
        connection = RefusedCheckpoints(s._writer)
        monkeypatch.setattr(s, "_writer", connection)
        with pytest.raises(StoreError, match="checkpoint failed: disk I/O error") as caught:
            s.flush()
        assert damage_in(caught.value) is None  # it may pass (a retry checks again)
        connection.refusing.clear()
        assert s.flush() == 4


def test_concurrent_scans_and_snapshots_see_whole_batches(tmp_path: Path) -> None:
    # Every entry inserts exactly one row, so a consistent view has count == applied index.
    entries = 300
    with TabletStore.open(tmp_path / "t.db", SIMPLE) as s:
        errors: list[BaseException] = []

        def writer() -> None:
            try:
                for start in range(1, entries + 1, 3):
                    fill(s, start, 3)
            except BaseException as e:  # surfaced below
                errors.append(e)

        t = threading.Thread(target=writer)
        t.start()
        checks = 0
        while t.is_alive() or checks < 5:
            result = s.scan(["id"])
            assert len(result.rows) == result.applied_index
            assert result.applied_index % 3 == 0
            snap = tmp_path / f"snap{checks % 2}.db"
            index, _ = s.snapshot(snap)
            with TabletStore.open(snap, SIMPLE) as copy:
                assert copy.count() == index == copy.applied_index()
            checks += 1
        t.join()
        assert not errors
        assert s.count() == entries == s.applied_index()


def test_the_wal_file_shrinks_back_after_a_large_transaction(tmp_path: Path) -> None:
    """SQLite keeps its -wal file at the largest size it reached unless told a limit: a
    follower's catch-up left it at 40 MB for good, ten times its peers'."""
    from raftlet.tserver.store.tablet_store import WAL_FILE_LIMIT_BYTES

    path = tmp_path / "t.db"
    wal = tmp_path / "t.db-wal"
    big = [{"id": i, "name": "x" * 4000} for i in range(6000)]  # ~24 MiB of pages
    with TabletStore.open(path, SIMPLE) as s:
        s.apply_batch([(1, 1, insert(SIMPLE, *big))])
        assert wal.stat().st_size > WAL_FILE_LIMIT_BYTES
        s.apply_batch([(2, 1, insert(SIMPLE, {"id": 10**6, "name": "small"}))])
        assert wal.stat().st_size <= WAL_FILE_LIMIT_BYTES


def test_a_snapshot_that_fails_leaves_nothing_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a full disk every failed attempt left its rollback journal behind (one per tablet
    copy session, until the server restarted)."""
    import errno

    from raftlet.tserver.store import tablet_store as store_module

    path, snap = tmp_path / "t.db", tmp_path / "snap" / "s.db"
    snap.parent.mkdir()
    real_fsync = store_module._fsync_path

    def full(p: Path, *, directory: bool = False) -> None:
        if p.name == "s.db.tmp":
            Path(f"{p}-journal").write_bytes(b"what SQLite left")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(p, directory=directory)

    with TabletStore.open(path, SIMPLE) as s:
        fill(s, 1, 20, term=2)
        monkeypatch.setattr(store_module, "_fsync_path", full)
        with pytest.raises(StoreError, match=r"snapshot to .*s\.db failed: .*No space left"):
            s.snapshot(snap)
        assert list(snap.parent.iterdir()) == []
        monkeypatch.setattr(store_module, "_fsync_path", real_fsync)
        assert s.snapshot(snap) == (20, 2)
