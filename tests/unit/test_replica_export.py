"""Reading a stopped server's replica offline (`raftlet tablet export`): the way to save
what a tablet that lost a majority for good still holds. A copy is opened as the server
would open it, committed entries replayed; the server's own files are left as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given

from raftlet.consensus.core import Entry, EntryType, HardState
from raftlet.schema.schema import Schema, SchemaError
from raftlet.tserver.bootstrap import apply_entries, open_replica
from raftlet.tserver.data_dir_lock import DataDirLock
from raftlet.tserver.replica_export import ExportError, exported_replica, schema_from_description
from raftlet.tserver.table_layout import TABLES_FILE
from tests.integration.storage_crash_child import SCHEMA, write_for
from tests.unit.schema_strategies import schemas

VOTERS = ["a", "b", "c"]


def _keys(first: int, last: int) -> set[int]:
    return {i * 1000 + j for i in range(first, last + 1) for j in range(3)}


@pytest.fixture
def replica(tmp_path: Path) -> Path:
    """A replica of t-p0 whose store applied 1..4, whose log holds 1..10, committed to 8."""
    data_dir = tmp_path / "ts1"
    directory = data_dir / "t-p0"
    r = open_replica(directory, SCHEMA, VOTERS)
    entries = [Entry(1, i, EntryType.NORMAL, write_for(i)) for i in range(2, 11)]
    r.storage.append([Entry(1, 1, EntryType.NO_OP), *entries])
    apply_entries(r.store, r.storage.entries(1, 5))
    r.storage.save_hard_state(HardState(term=1, vote="a", commit=8))
    r.close()
    record = {"t": {"partitions": 1, "schema": SCHEMA.describe()}}
    (data_dir / TABLES_FILE).write_text(json.dumps(record))
    return directory


def test_the_rows_are_those_committed_and_the_servers_files_stay_as_they_were(
    replica: Path,
) -> None:
    with exported_replica(replica) as x:
        assert {row["k"] for row in x.rows} == _keys(2, 8)
        assert (x.tablet_id, x.table, x.schema) == ("t-p0", "t", SCHEMA)
        assert (x.applied_index, x.commit_index, x.last_index, x.beyond_commit) == (8, 8, 10, 2)
    r = open_replica(replica, SCHEMA, VOTERS, create=False)
    try:
        assert r.replayed == 4  # 5..8 again: the export replayed its copy, not these files
    finally:
        r.close()


def test_all_logged_applies_the_entries_after_the_last_known_commit(replica: Path) -> None:
    with exported_replica(replica, all_logged=True) as x:
        assert {row["k"] for row in x.rows} == _keys(2, 10)
        assert (x.applied_index, x.beyond_commit) == (10, 2)


def test_a_running_servers_replica_is_refused(replica: Path) -> None:
    lock = DataDirLock.acquire(replica.parent, "ts1")
    try:
        with (
            pytest.raises(ExportError, match="in use by a running server"),
            exported_replica(replica),
        ):
            pass
    finally:
        lock.release()


def test_what_is_no_replica_is_refused_by_name(replica: Path, tmp_path: Path) -> None:
    with (
        pytest.raises(ExportError, match="no such replica directory"),
        exported_replica(replica.parent / "t-p1"),
    ):
        pass
    with (
        pytest.raises(ExportError, match="is a file, not a replica directory"),
        exported_replica(next(p for p in replica.iterdir() if p.is_file())),
    ):
        pass
    with (
        pytest.raises(ExportError, match="not a tablet's directory"),
        exported_replica(replica.parent),
    ):
        pass
    (replica.parent / TABLES_FILE).write_text("{}")
    with pytest.raises(ExportError, match="no record of table 't'"), exported_replica(replica):
        pass
    (replica / "consensus-meta").unlink()
    (replica.parent / TABLES_FILE).write_text(
        json.dumps({"t": {"partitions": 1, "schema": SCHEMA.describe()}})
    )
    with (
        pytest.raises(ExportError, match=r"cannot be opened: .*consensus metadata"),
        exported_replica(replica),
    ):
        pass


@given(schemas())
def test_a_recorded_schema_reads_back_as_itself(schema: Schema) -> None:
    assert schema_from_description(schema.describe()) == schema


def test_what_is_no_recorded_schema_is_refused() -> None:
    for bad in ("", "id INT64", "id NUMBER KEY", "id INT64 KEY, v STRING MAYBE"):
        with pytest.raises(SchemaError):
            schema_from_description(bad)


def test_a_symlink_is_read_as_the_directory_it_names(replica: Path, tmp_path: Path) -> None:
    """The lock checked was that of the link's parent: a running server's replica was
    read through a link elsewhere."""
    link = tmp_path / "elsewhere" / "t-p0"
    link.parent.mkdir()
    link.symlink_to(replica)
    with exported_replica(link) as x:
        assert x.tablet_id == "t-p0"
    lock = DataDirLock.acquire(replica.parent, "ts1")
    try:
        with pytest.raises(ExportError, match="in use by a running server"), exported_replica(link):
            pass
    finally:
        lock.release()


def test_a_work_dir_that_cannot_take_the_copy_is_refused_by_name(replica: Path) -> None:
    with (
        pytest.raises(ExportError, match="no such directory"),
        exported_replica(replica, work_dir=replica.parent / "nope"),
    ):
        pass
    inside = replica / "scratch"
    inside.mkdir()
    with (
        pytest.raises(ExportError, match="lies inside the replica directory"),
        exported_replica(replica, work_dir=inside),
    ):
        pass


def test_a_refusal_names_the_servers_files_not_the_copys(replica: Path) -> None:
    (replica / "consensus-meta").unlink()
    with pytest.raises(ExportError) as e, exported_replica(replica):
        pass
    assert "raftlet-export-" not in str(e.value)
    assert str(replica / "consensus-meta") in str(e.value)


def test_store_only_reads_a_replica_the_server_refuses_to_open(replica: Path) -> None:
    """A damaged log or lost metadata: the export was refused with the server's reason,
    and the last survivor's readable store could only be read with SQLite by hand."""
    (replica / "consensus-meta").unlink()
    with (
        pytest.raises(ExportError, match=r"cannot be opened: .*\(--store-only reads its store"),
        exported_replica(replica),
    ):
        pass
    with exported_replica(replica, store_only=True) as x:
        assert {row["k"] for row in x.rows} == _keys(2, 4)  # what the store had applied
        assert (x.applied_index, x.log_read) == (4, False)
    (replica / "store.sqlite").unlink()
    with (
        pytest.raises(ExportError, match=r"holds no store\.sqlite"),
        exported_replica(replica, store_only=True),
    ):
        pass
