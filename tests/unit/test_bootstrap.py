"""Opening a replica from its directory: replay, and refusing directories that lost data."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from raftlet.consensus.core import Entry, EntryType, HardState
from raftlet.tserver.bootstrap import ReplicaOpenError, apply_entries, open_replica
from tests.integration.storage_crash_child import SCHEMA, write_for

VOTERS = ["a", "b", "c"]


def _entries(first: int, last: int, term: int) -> list[Entry]:
    return [Entry(term, i, EntryType.NORMAL, write_for(i)) for i in range(first, last + 1)]


def test_open_replays_committed_entries_above_the_applied_index(tmp_path: Path) -> None:
    r = open_replica(tmp_path, SCHEMA, VOTERS)
    r.storage.append([Entry(1, 1, EntryType.NO_OP), *_entries(2, 10, 1)])
    apply_entries(r.store, r.storage.entries(1, 4))
    r.storage.save_hard_state(HardState(term=1, vote="a", commit=8))
    r.close()

    r = open_replica(tmp_path, SCHEMA, VOTERS)
    try:
        assert r.replayed == 5  # 4..8: committed, not yet applied; 9..10 wait for a leader
        assert r.store.applied_index() == 8
        keys = {row[0] for row in r.store.scan(["k"]).rows}
        assert keys == {i * 1000 + j for i in range(2, 9) for j in range(3)}
    finally:
        r.close()


def test_reopen_without_new_commits_replays_nothing(tmp_path: Path) -> None:
    r = open_replica(tmp_path, SCHEMA, VOTERS)
    r.storage.append(_entries(1, 3, 1))
    r.storage.save_hard_state(HardState(term=1, vote="", commit=3))
    r.close()
    r = open_replica(tmp_path, SCHEMA, VOTERS)
    assert r.replayed == 3
    r.close()
    r = open_replica(tmp_path, SCHEMA, VOTERS)
    try:
        assert r.replayed == 0
        assert r.store.count() == 9
    finally:
        r.close()


def test_a_replica_of_other_voters_is_refused(tmp_path: Path) -> None:
    open_replica(tmp_path, SCHEMA, VOTERS).close()
    with pytest.raises(ReplicaOpenError, match="belongs to voters"):
        open_replica(tmp_path, SCHEMA, ["a", "b", "d"])


def test_a_store_ahead_of_its_log_is_refused(tmp_path: Path) -> None:
    r = open_replica(tmp_path, SCHEMA, VOTERS)
    r.storage.append(_entries(1, 3, 1))
    apply_entries(r.store, r.storage.entries(1, 4))
    r.close()
    shutil.rmtree(tmp_path / "wal")
    with pytest.raises(ReplicaOpenError, match="applied up to index 3 but the log ends at 0"):
        open_replica(tmp_path, SCHEMA, VOTERS)


def test_a_store_that_applied_an_entry_the_log_does_not_have_is_refused(
    tmp_path: Path,
) -> None:
    r = open_replica(tmp_path, SCHEMA, VOTERS)
    r.storage.append(_entries(1, 3, 1))
    apply_entries(r.store, r.storage.entries(1, 4))
    r.storage.append(_entries(3, 3, 2))  # the log's entry 3 is now of another term
    r.close()
    with pytest.raises(ReplicaOpenError, match="entry 3 of term 1, but the log has term 2"):
        open_replica(tmp_path, SCHEMA, VOTERS)
