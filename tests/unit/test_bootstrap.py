"""Opening a replica from its directory: replay, and refusing directories that lost data."""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from raftlet.consensus.core import Entry, EntryType, HardState
from raftlet.proto import common_pb2, tablet_pb2
from raftlet.schema.row_block import encode_row_block
from raftlet.schema.rows import OpType, encode_row_op
from raftlet.tserver import bootstrap
from raftlet.tserver.bootstrap import (
    STORE_FILE,
    TOMBSTONE_FILE,
    ReplicaOpenError,
    apply_entries,
    open_replica,
    to_apply_entries,
    to_apply_entry,
)
from raftlet.tserver.store import StoreError, TabletStore
from tests.integration.storage_crash_child import SCHEMA, write_for
from tests.unit.store_helpers import store_contents

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


def test_the_metadata_membership_is_authoritative_once_it_exists(tmp_path: Path) -> None:
    """Memberships change at run time: the placement only seeds a fresh directory."""
    open_replica(tmp_path, SCHEMA, VOTERS, learners=["d"]).close()
    r = open_replica(tmp_path, SCHEMA, ["a", "b", "d"])
    try:
        state = r.storage.metadata.state
        assert (state.voters, state.learners) == (tuple(VOTERS), ("d",))
    finally:
        r.close()


def test_a_tombstoned_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / TOMBSTONE_FILE).write_text("")
    with pytest.raises(ReplicaOpenError, match="tombstone"):
        open_replica(tmp_path, SCHEMA, VOTERS)


def test_a_store_ahead_of_its_log_is_refused(tmp_path: Path) -> None:
    r = open_replica(tmp_path, SCHEMA, VOTERS)
    r.storage.append(_entries(1, 3, 1))
    apply_entries(r.store, r.storage.entries(1, 4))
    r.close()
    for segment in (tmp_path / "wal").iterdir():
        segment.unlink()
    with pytest.raises(ReplicaOpenError, match="applied up to index 3 but the log ends at 0"):
        open_replica(tmp_path, SCHEMA, VOTERS)


def test_a_log_gone_beside_the_metadata_is_refused(tmp_path: Path) -> None:
    """Deleted by hand while the server was down, with the store, say: opened, the replica
    would keep its term and vote and forget what it acknowledged (and could vote for a
    lagging candidate)."""
    r = open_replica(tmp_path, SCHEMA, VOTERS)
    r.storage.append(_entries(1, 3, 1))
    r.close()
    shutil.rmtree(tmp_path / "wal")
    for store in tmp_path.glob("store.sqlite*"):
        store.unlink()
    with pytest.raises(ReplicaOpenError, match="holds consensus metadata but no wal"):
        open_replica(tmp_path, SCHEMA, VOTERS)
    assert not (tmp_path / "wal").exists()  # refused before anything was made again


def test_a_store_that_applied_an_entry_the_log_does_not_have_is_refused(
    tmp_path: Path,
) -> None:
    r = open_replica(tmp_path, SCHEMA, VOTERS)
    r.storage.append(_entries(1, 3, 1))
    apply_entries(r.store, r.storage.entries(1, 4))
    # The log's entry 3 is now of another term, saved first as the driver does.
    r.storage.save_hard_state(HardState(term=2, vote="", commit=0))
    r.storage.append(_entries(3, 3, 2))
    r.close()
    with pytest.raises(ReplicaOpenError, match="entry 3 of term 1, but the log has term 2"):
        open_replica(tmp_path, SCHEMA, VOTERS)


def test_a_store_with_damage_sqlite_can_see_is_refused(tmp_path: Path) -> None:
    r = open_replica(tmp_path, SCHEMA, VOTERS)
    r.storage.append(_entries(1, 400, 1))
    apply_entries(r.store, r.storage.entries(1, 401))
    assert r.store.quick_check() == []
    r.close()
    store = tmp_path / "store.sqlite"
    with sqlite3.connect(store) as db:  # fold the WAL into the file, so the damage stays
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(store.read_bytes())
    pages = len(data) // 4096
    assert pages > 8
    page = pages // 2  # a b-tree page of the rows, garbage from end to end
    data[page * 4096 : (page + 1) * 4096] = b"\xff" * 4096
    store.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"is damaged \(PRAGMA quick_check\)"):
        open_replica(tmp_path, SCHEMA, VOTERS)


def test_missing_metadata_beside_a_non_empty_log_is_refused(tmp_path: Path) -> None:
    """Starting afresh would forget the vote this replica persisted: it could then vote
    twice in one term.  So a replica whose metadata is gone is refused, not reset."""
    r = open_replica(tmp_path, SCHEMA, VOTERS)
    r.storage.append(_entries(1, 3, 1))
    r.storage.save_hard_state(HardState(term=1, vote="b", commit=0))
    r.close()
    (tmp_path / "consensus-meta").unlink()
    with pytest.raises(ReplicaOpenError, match=r"consensus metadata .*consensus-meta is missing"):
        open_replica(tmp_path, SCHEMA, VOTERS)
    assert not (tmp_path / "consensus-meta").exists()  # nothing was written in its place


def test_missing_metadata_beside_a_non_empty_store_is_refused(tmp_path: Path) -> None:
    r = open_replica(tmp_path, SCHEMA, VOTERS)
    r.storage.append(_entries(1, 2, 1))
    apply_entries(r.store, r.storage.entries(1, 3))
    r.close()
    (tmp_path / "consensus-meta").unlink()
    shutil.rmtree(tmp_path / "wal")
    with pytest.raises(ReplicaOpenError, match="store applied to 2"):
        open_replica(tmp_path, SCHEMA, VOTERS)


def test_a_fresh_directory_with_an_empty_log_still_opens(tmp_path: Path) -> None:
    open_replica(tmp_path, SCHEMA, VOTERS).close()  # creates an empty WAL segment
    (tmp_path / "consensus-meta").unlink()
    r = open_replica(tmp_path, SCHEMA, VOTERS)  # nothing to forget: a fresh replica
    try:
        assert r.storage.voters() == tuple(VOTERS)
    finally:
        r.close()


def _mixed_log(rng: random.Random, n: int) -> list[Entry]:
    """A log of what replay meets: a NO_OP opening each term; packed one-row INSERTs (most
    of them) and packed or per-cell writes of many rows of every op type over a few keys,
    so rows fail (KEY_EXISTS, KEY_NOT_FOUND); retries of earlier requests proposed again;
    clients forgetting old requests; anonymous writes; a damaged row block."""
    entries: list[Entry] = []
    seq = {"a": 0, "b": 0}
    payloads: list[bytes] = []
    term = 0
    for index in range(1, n + 1):
        if index == 1 or rng.random() < 0.03:
            term += 1
            entries.append(Entry(term, index, EntryType.NO_OP))
            continue
        if payloads and rng.random() < 0.1:  # a retry of an earlier write, proposed again
            entries.append(Entry(term, index, EntryType.NORMAL, rng.choice(payloads[-6:])))
            continue
        write = tablet_pb2.WriteOperationPB()
        if rng.random() < 0.9:
            client = rng.choice("ab")
            seq[client] += 1
            write.request_id.CopyFrom(
                common_pb2.RequestIdPB(
                    client_id=client,
                    seq_no=seq[client],
                    first_incomplete_seq_no=max(0, seq[client] - rng.randrange(4)),
                )
            )
        if rng.random() < 0.7:
            rows: list[tuple[OpType, dict[str, Any]]] = [
                (OpType.INSERT, {"k": index, "v": f"v{index}"})
            ]
        else:
            rows = []
            for _ in range(rng.randrange(1, 7)):
                op = rng.choice(list(OpType))
                row: dict[str, Any] = {"k": rng.randrange(6)}
                if op is not OpType.DELETE:
                    row["v"] = rng.choice(["x", None])
                rows.append((op, row))
        if rng.random() < 0.8:
            block_rows, indirect = encode_row_block(SCHEMA, rows)
            if rng.random() < 0.03:
                block_rows = block_rows[:-1]  # damaged: not a whole number of rows
            write.row_block.rows, write.row_block.indirect = block_rows, indirect
        else:
            write.ops.extend(encode_row_op(SCHEMA, op, row) for op, row in rows)
        payloads.append(write.SerializeToString())
        entries.append(Entry(term, index, EntryType.NORMAL, payloads[-1]))
    return entries


def test_entries_convert_together_as_each_converts_alone() -> None:
    entries = _mixed_log(random.Random(7), 300)
    assert to_apply_entries(entries, SCHEMA) == [to_apply_entry(e, SCHEMA) for e in entries]


@pytest.mark.parametrize("seed", range(4))
def test_replay_after_a_crash_gives_the_store_that_applying_one_by_one_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    monkeypatch.setattr(bootstrap, "_REPLAY_CHUNK", 7)  # many chunks; retries across them
    rng = random.Random(seed)
    entries = _mixed_log(rng, 150)
    # The reference: the apply stage's way, one entry per store transaction.
    with TabletStore.open(tmp_path / "reference.sqlite", SCHEMA, "replica") as reference:
        for e in entries:
            reference.apply_batch([to_apply_entry(e, SCHEMA)])
    # A replica that made every entry durable and committed, and crashed with its store
    # applied up to ``crashed_at``.
    crashed_at = rng.randrange(len(entries))
    r = open_replica(tmp_path / "replica", SCHEMA, VOTERS)
    r.storage.append(entries)
    for e in entries[:crashed_at]:
        r.store.apply_batch([to_apply_entry(e, SCHEMA)])
    r.storage.save_hard_state(HardState(term=entries[-1].term, vote="a", commit=len(entries)))
    r.close()
    r = open_replica(tmp_path / "replica", SCHEMA, VOTERS)
    try:
        assert r.replayed == len(entries) - crashed_at
        assert set(r.seconds) == {"store", "log", "replay"}
    finally:
        r.close()
    assert store_contents(tmp_path / "replica" / STORE_FILE) == store_contents(
        tmp_path / "reference.sqlite"
    )
