"""Opening a replica whose directory holds a file that is not its own: a store file from
another tablet, or a consensus-meta older than the log beside it.  Either is refused (the
replica is FAILED, with a reason an operator can act on); the directories a crash, a
truncation, a membership change or a tablet copy leave still open."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import crc32c
import pytest

from raftlet.consensus.core import ConfState, Entry, EntryType, HardState, Membership
from raftlet.consensus.log import LogOptions
from raftlet.consensus.log import segment as segment_format
from raftlet.consensus.log.metadata import FILE_NAME as META_FILE
from raftlet.tserver.bootstrap import (
    STORE_FILE,
    OpenedReplica,
    ReplicaOpenError,
    apply_entries,
    open_replica,
)
from raftlet.tserver.failed_tablet import FailedTablet, open_or_fail
from raftlet.tserver.store import StoreError, TabletStore
from raftlet.tserver.tablet_copy_install import (
    CopiedState,
    build_replica_dir,
    replaced_dir,
    staging_dir,
    swap_in,
)
from tests.integration.storage_crash_child import SCHEMA, write_for

VOTERS = ("a", "b", "c")


def _entries(first: int, last: int, term: int) -> list[Entry]:
    return [Entry(term, i, EntryType.NORMAL, write_for(i)) for i in range(first, last + 1)]


def _replica(directory: Path, last: int, term: int, applied: int) -> None:
    """A replica directory as a running one leaves it: the term saved, entries 1..last of
    it in the log, committed up to ``applied`` and applied."""
    r = open_replica(directory, SCHEMA, VOTERS)
    try:
        r.storage.save_hard_state(HardState(term=term, vote="a", commit=applied))
        r.storage.append(_entries(1, last, term))
        apply_entries(r.store, r.storage.entries(1, applied + 1))
    finally:
        r.close()


def _open_or_fail(directory: Path) -> OpenedReplica | FailedTablet:
    return open_or_fail(
        lambda: open_replica(directory, SCHEMA, VOTERS),
        tablet_id=directory.name,
        table="kv",
        partition=0,
        voters=VOTERS,
        directory=directory,
    )


# --- the store's tablet id ------------------------------------------------------------------


def test_a_new_store_records_its_tablet_and_opens_again_as_it(tmp_path: Path) -> None:
    with TabletStore.open(tmp_path / STORE_FILE, SCHEMA, "kv-p0") as store:
        assert store.tablet_id == "kv-p0"
    with TabletStore.open(tmp_path / STORE_FILE, SCHEMA, "kv-p0") as store:
        assert store.tablet_id == "kv-p0"
    # A tool that reads the file on its own checks nothing, and learns whose it is.
    with TabletStore.open(tmp_path / STORE_FILE) as store:
        assert store.tablet_id == "kv-p0"


def test_a_store_of_another_tablet_is_refused(tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE
    TabletStore.open(path, SCHEMA, "kv-p0").close()
    with pytest.raises(StoreError) as info:
        TabletStore.open(path, SCHEMA, "kv-p1")
    message = str(info.value)
    assert str(path) in message
    assert "belongs to tablet 'kv-p0', not to 'kv-p1'" in message
    assert "tablet copy from the leader" in message


def test_a_store_made_before_stores_recorded_their_tablet_is_taken_and_marked(
    tmp_path: Path,
) -> None:
    path = tmp_path / STORE_FILE
    TabletStore.open(path, SCHEMA).close()  # as an older build made it: no id
    with TabletStore.open(path, SCHEMA, "kv-p0") as store:
        assert store.tablet_id == "kv-p0"
    with pytest.raises(StoreError, match=r"belongs to tablet 'kv-p0', not to 'kv-p1'"):
        TabletStore.open(path, SCHEMA, "kv-p1")


def test_a_snapshot_keeps_the_tablet_id(tmp_path: Path) -> None:
    """A tablet copy installs the source's snapshot: the same tablet's id, kept."""
    with TabletStore.open(tmp_path / "source.sqlite", SCHEMA, "kv-p0") as store:
        store.snapshot(tmp_path / "copy.sqlite")
    with TabletStore.open(tmp_path / "copy.sqlite", SCHEMA, "kv-p0") as copy:
        assert copy.tablet_id == "kv-p0"


def test_a_replica_with_another_tablets_store_is_failed(tmp_path: Path) -> None:
    """The reviewer's case: kv-p0's store copied over kv-p1's.  Both logs hold the store's
    applied (index, term), so nothing but the id tells them apart."""
    p0, p1 = tmp_path / "kv-p0", tmp_path / "kv-p1"
    _replica(p0, last=6, term=2, applied=6)
    _replica(p1, last=6, term=2, applied=4)
    for leftover in p1.glob(STORE_FILE + "-*"):
        leftover.unlink()
    shutil.copyfile(p0 / STORE_FILE, p1 / STORE_FILE)
    failed = _open_or_fail(p1)
    assert isinstance(failed, FailedTablet)
    assert failed.reason.startswith("StoreError: ")
    assert str(p1 / STORE_FILE) in failed.reason
    assert "belongs to tablet 'kv-p0', not to 'kv-p1'" in failed.reason
    # Its own tablet's replica still opens.
    opened = _open_or_fail(p0)
    assert isinstance(opened, OpenedReplica)
    opened.close()


def test_a_replica_whose_store_predates_tablet_ids_opens_and_is_marked(tmp_path: Path) -> None:
    directory = tmp_path / "kv-p0"
    directory.mkdir()
    TabletStore.open(directory / STORE_FILE, SCHEMA).close()  # no id, as before
    _replica(directory, last=3, term=1, applied=3)
    with TabletStore.open(directory / STORE_FILE) as store:
        assert store.tablet_id == "kv-p0"


def test_a_tablet_copy_opens_with_the_tablets_id(tmp_path: Path) -> None:
    """The copy path: the leader's snapshot, installed under this server's directory of the
    same tablet, opens -- its id and its consensus-meta's term are consistent."""
    leader_data, data = tmp_path / "ts1", tmp_path / "ts2"
    _replica(leader_data / "kv-p0", last=5, term=3, applied=5)
    staging = staging_dir(data, "kv-p0")
    staging.mkdir(parents=True)
    with TabletStore.open(leader_data / "kv-p0" / STORE_FILE, SCHEMA) as leader:
        index, term = leader.snapshot(staging / STORE_FILE)
    copied = CopiedState(index=index, term=term, source_uuid="a", source_term=4, voters=VOTERS)
    build_replica_dir(staging, copied, None, LogOptions())
    swap_in(data / "kv-p0", staging, replaced_dir(data, "kv-p0"))
    opened = open_replica(data / "kv-p0", SCHEMA, VOTERS, create=False)
    try:
        assert opened.store.tablet_id == "kv-p0"
        assert opened.store.applied_index() == 5
    finally:
        opened.close()


# --- consensus-meta older than the log ------------------------------------------------------


def test_a_consensus_meta_older_than_its_log_is_failed(tmp_path: Path) -> None:
    """The reviewer's case: a copy of consensus-meta at term 3 put back beside a log that
    went on to term 5 (two step-downs, then writes)."""
    directory = tmp_path / "kv-p0"
    _replica(directory, last=4, term=3, applied=4)
    shutil.copyfile(directory / META_FILE, tmp_path / "old-meta")
    r = open_replica(directory, SCHEMA, VOTERS)
    r.storage.save_hard_state(HardState(term=5, vote="b", commit=4))
    r.storage.append(_entries(5, 8, 5))
    r.close()
    shutil.copyfile(tmp_path / "old-meta", directory / META_FILE)
    with pytest.raises(ReplicaOpenError, match=r"its term 3 < 5, the term of the log's last"):
        open_replica(directory, SCHEMA, VOTERS)
    failed = _open_or_fail(directory)
    assert isinstance(failed, FailedTablet)
    assert f"consensus metadata {directory / META_FILE} is older than the log" in failed.reason
    assert "tablet copy from the leader" in failed.reason


def test_a_crash_after_a_new_term_was_saved_before_its_entries_opens(tmp_path: Path) -> None:
    directory = tmp_path / "kv-p0"
    _replica(directory, last=4, term=3, applied=2)
    r = open_replica(directory, SCHEMA, VOTERS)
    r.storage.save_hard_state(HardState(term=7, vote="", commit=4))  # then the crash
    r.close()
    opened = open_replica(directory, SCHEMA, VOTERS)
    assert opened.storage.initial_state().term == 7
    opened.close()


def test_a_truncated_log_opens(tmp_path: Path) -> None:
    """A new leader's entries replace an uncommitted suffix: the term is saved first; a
    crash before or after the truncation is written leaves a directory that opens."""
    directory = tmp_path / "kv-p0"
    _replica(directory, last=6, term=3, applied=3)
    r = open_replica(directory, SCHEMA, VOTERS)
    r.storage.save_hard_state(HardState(term=4, vote="b", commit=3))
    r.close()
    open_replica(directory, SCHEMA, VOTERS).close()  # crashed before the truncation
    r = open_replica(directory, SCHEMA, VOTERS)
    r.storage.append(_entries(5, 5, 4))  # replaces 5..6 of term 3
    r.close()
    opened = open_replica(directory, SCHEMA, VOTERS)
    try:
        assert (opened.storage.last_index(), opened.storage.term(5)) == (5, 4)
    finally:
        opened.close()


def test_a_membership_change_cut_by_a_crash_opens(tmp_path: Path) -> None:
    """A CONFIG entry above the saved membership is legitimate: a truncation that takes the
    entry back saves the older membership first, and a crash may come before the truncation
    is written.  Only the term is checked."""
    directory = tmp_path / "kv-p0"
    _replica(directory, last=3, term=2, applied=3)
    old, new = Membership(VOTERS), Membership((*VOTERS, "d"))
    r = open_replica(directory, SCHEMA, VOTERS)
    r.storage.save_conf_state(ConfState(new, 4, old, 0), HardState(term=2, vote="a", commit=3))
    r.storage.append([Entry(2, 4, EntryType.CONFIG, new.encode())])
    # A leader of term 3 will truncate entry 4: the membership it falls back to is saved...
    r.storage.save_conf_state(ConfState(old, 0, old, 0), HardState(term=3, vote="b", commit=3))
    r.close()  # ...and the crash comes before the truncation is written.
    opened = open_replica(directory, SCHEMA, VOTERS)
    try:
        assert opened.storage.last_index() == 4
        assert opened.storage.metadata.state.config_index == 0
    finally:
        opened.close()


def _newer_meta(directory: Path) -> None:
    meta = directory / META_FILE
    data = bytearray(meta.read_bytes())
    data[8:12] = (2).to_bytes(4, "little")  # the format version: one this build does not know
    meta.write_bytes(bytes(data))


def _newer_segment(directory: Path) -> None:
    (segment,) = sorted((directory / "wal").glob("wal-*.seg"))[:1]
    data = bytearray(segment.read_bytes())
    data[8:12] = (9).to_bytes(4, "little")
    # The header's checksum, as a newer release would have written it.
    size = segment_format._HEADER.size
    segment_format._HEADER_CRC.pack_into(data, size, crc32c.crc32c(bytes(data[:size])))
    segment.write_bytes(bytes(data))


def _newer_store(directory: Path) -> None:
    import sqlite3

    conn = sqlite3.connect(directory / STORE_FILE)
    conn.execute("UPDATE raftlet_meta SET value = 2 WHERE key = 'format_version'")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("newer", [_newer_meta, _newer_segment, _newer_store])
def test_files_a_newer_release_wrote_fail_the_replica_but_are_not_repaired(
    tmp_path: Path, newer: Any
) -> None:
    """Review r28a: a consensus-meta of a newer version was taken for damage, and a tablet
    copy replaced the replica's files a second later -- after a rollback of every server,
    with nothing newer left to return to."""
    directory = tmp_path / "kv-p0"
    _replica(directory, last=3, term=1, applied=3)
    newer(directory)
    failed = _open_or_fail(directory)
    assert isinstance(failed, FailedTablet)
    assert "written by a newer release" in failed.reason, failed.reason
    assert not failed.repairable
    # Damage of the same field is still damage, which a copy repairs.
    assert FailedTablet("t", "kv", 0, VOTERS, directory, "x").repairable
