"""A running replica that fails, over three in-process replicas: a store that cannot apply
(ENOSPC) or cannot commit once its writers were answered, and a log whose fdatasync
fails.  The failed leader leaves at once, the replica reports FAILED with its reason and
refuses calls with "tablet failed: ...", another leader takes over with no acknowledged
write lost, and -- for the store -- the replica applies again, clears FAILED and catches
up once the disk works, without being reopened.

The store's failure is injected here by wrapping its ``apply_batch`` or its connection (a
unit test); the integration test ``tests/integration/test_tablet_failure.py`` fills a real
disk."""

from __future__ import annotations

import contextlib
import errno
import logging
import shutil
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import DecodeError

from raftlet.consensus.core import Role
from raftlet.consensus.raft_consensus import ReplicaFailed
from raftlet.proto import tablet_pb2
from raftlet.tserver import tablet_replica as replica_module
from raftlet.tserver.errors import TabletFailed
from raftlet.tserver.store import ApplyEntry, EntryResult, StoreError
from raftlet.tserver.store import tablet_store as store_module
from raftlet.tserver.tablet_replica import ReplicaOptions, TabletReplica
from tests.unit.consensus_cluster import FAST
from tests.unit.store_helpers import CommitHook, RefusedCheckpoints
from tests.unit.test_tablet_replica import Tablet, keys_on, send, write


class DiskSwitch:
    """Makes one replica's store fail every apply with ENOSPC while ``full`` is set."""

    def __init__(self, replica: TabletReplica) -> None:
        self.full = threading.Event()
        self.attempts = 0
        store = replica.store
        real = store.apply_batch

        def apply_batch(
            batch: Sequence[ApplyEntry],
            before_commit: Callable[[list[EntryResult]], None] | None = None,
        ) -> list[EntryResult]:
            if self.full.is_set():
                self.attempts += 1
                cause = OSError(errno.ENOSPC, "No space left on device")
                raise StoreError("tablet store: apply failed: database or disk is full") from cause
            return real(batch, before_commit)

        store.apply_batch = apply_batch  # type: ignore[method-assign]


@pytest.fixture
def tablet(tmp_path: Path) -> Iterator[Tablet]:
    t = Tablet(tmp_path)
    yield t
    t.close()


def _others(tablet: Tablet, node: str) -> list[TabletReplica]:
    return [r for n, r in tablet.replicas.items() if n != node]


def test_a_leader_whose_store_fails_steps_down_and_recovers_when_the_disk_works(
    tablet: Tablet, caplog: pytest.LogCaptureFixture
) -> None:
    leader = tablet.leader()
    for i in range(1, 6):
        send(leader, write([i], "c1", i)).result()
    disk = DiskSwitch(leader)
    disk.full.set()
    with caplog.at_level(logging.ERROR, logger="raftlet.tserver.tablet_replica"):
        failing = send(leader, write([6], "c1", 6))
        # The waiting call is failed, not left hanging: its retry goes elsewhere.
        with pytest.raises(TabletFailed, match=r"tablet failed: .*ENOSPC"):
            failing.result()
    assert leader.consensus.snapshot.role is not Role.LEADER
    reason = leader.failure_reason()
    assert reason is not None
    assert "ENOSPC" in reason
    assert "database or disk is full" in reason
    status = leader.published_status()
    assert (status["state"], status["failed"]) == ("FAILED", True)
    assert status["failure"] == reason
    with pytest.raises(TabletFailed):
        send(leader, write([100]))
    with pytest.raises(TabletFailed):
        leader.scan(tablet_pb2.ScanRequest(tablet_id="kv-p0"))
    with pytest.raises(TabletFailed):  # not "not applied after 1 s": it applies nothing
        leader.checksum_at(leader.store.applied_index() + 1, 1.0)
    assert caplog.text.count("the replica is FAILED") == 1  # said once, not per retry

    # Another replica leads; the retry of the failed call is applied exactly once there.
    new = tablet.leader()
    assert new is not leader
    assert not send(new, write([6], "c1", 6)).result().row_errors
    for i in range(7, 12):
        send(new, write([i], "c1", i)).result()
    tablet.wait_for(lambda: disk.attempts >= 3, what="the failed store is retried")
    # A failed replica never campaigns or takes leadership back.
    for _ in range(100):
        tablet.ticker.tick()
    assert leader.consensus.snapshot.role is Role.FOLLOWER
    assert leader.failure_reason() is not None

    disk.full.clear()  # space freed
    tablet.wait_for(lambda: leader.failure_reason() is None, what="FAILED clears")
    assert leader.published_status()["state"] == "RUNNING"
    expected = list(range(1, 12))
    for r in tablet.replicas.values():
        tablet.wait_for(lambda r=r: keys_on(r) == expected, what=f"{r.server_id} converges")
    # It serves again.
    follower_read = tablet_pb2.ScanRequest(
        tablet_id="kv-p0", read_mode=tablet_pb2.READ_FOLLOWER_APPLIED
    )
    assert len(leader.scan(follower_read).rows) == len(expected)


def test_a_commit_that_fails_after_the_answer_loses_nothing_and_applies_once(
    tablet: Tablet,
) -> None:
    """A leader answers a round's writers before its store commits them (the entries are
    committed in the log, their results final).  When that commit fails, the answer
    stands: the leader fails over, the write is in every store exactly once, and a
    retry of it gets the first outcome."""
    leader = tablet.leader()
    for i in range(1, 4):
        send(leader, write([i], "c5", i)).result()
    failing = threading.Event()

    def fail_commit(_hook: CommitHook) -> None:
        if failing.is_set():
            raise sqlite3.OperationalError("disk I/O error")

    hook = CommitHook(leader.store, fail_commit)
    failing.set()
    answered = send(leader, write([4], "c5", 4)).result()  # answered, then the commit fails
    assert not answered.row_errors
    tablet.wait_for(lambda: hook.commits >= 1, what="the commit fails")
    tablet.wait_for(lambda: leader.failure_reason() is not None, what="the leader fails")
    assert "disk I/O error" in (leader.failure_reason() or "")
    assert leader.store.applied_index() < answered.op_index  # rolled back: not in its store

    new = tablet.leader()
    assert new is not leader
    retry = send(new, write([4], "c5", 4)).result()  # the client's retry, elsewhere
    assert (retry.op_index, retry.op_term) == (answered.op_index, answered.op_term)
    assert not retry.row_errors
    send(new, write([5], "c5", 5)).result()

    failing.clear()
    tablet.wait_for(lambda: leader.failure_reason() is None, what="FAILED clears")
    for r in tablet.replicas.values():
        tablet.wait_for(lambda r=r: keys_on(r) == [1, 2, 3, 4, 5], what=f"{r.server_id} converges")


def test_a_follower_whose_store_fails_keeps_the_tablet_available(tablet: Tablet) -> None:
    leader = tablet.leader()
    follower = _others(tablet, leader.server_id)[0]
    disk = DiskSwitch(follower)
    disk.full.set()
    for i in range(1, 21):
        send(leader, write([i], "c2", i)).result()
    tablet.wait_for(lambda: follower.failure_reason() is not None, what="the follower fails")
    assert tablet.leader() is leader  # nothing moved: the leader never depended on it
    disk.full.clear()
    tablet.wait_for(lambda: follower.failure_reason() is None, what="FAILED clears")
    tablet.wait_for(lambda: keys_on(follower) == list(range(1, 21)), what="it catches up")


def test_a_leader_whose_log_fails_hands_over_and_stays_failed(tablet: Tablet) -> None:
    leader = tablet.leader()
    for i in range(1, 4):
        send(leader, write([i], "c3", i)).result()
    writer: Any = leader.consensus_log()._writer

    def failing_sync() -> None:
        raise OSError(errno.EIO, "injected fdatasync failure")

    writer.sync = failing_sync
    call = send(leader, write([4], "c3", 4))
    with pytest.raises(TabletFailed, match="tablet failed: the log failed"):
        call.result()
    tablet.wait_for(lambda: leader.failure_reason() is not None, what="the log fails")
    reason = leader.failure_reason()
    assert reason is not None
    assert reason.startswith("the log failed")
    assert leader.consensus.snapshot.role is Role.FOLLOWER
    with pytest.raises(ReplicaFailed, match="tablet failed: the log failed"):
        leader.consensus.check_leadership_and_bind_term()
    new = tablet.leader()
    assert new is not leader
    send(new, write([4], "c3", 4)).result()
    for _ in range(100):
        tablet.ticker.tick()
    # No retry for a log: still FAILED, and never a candidate.
    assert leader.failure_reason() == reason
    assert leader.consensus.snapshot.role is Role.FOLLOWER
    for r in _others(tablet, leader.server_id):
        tablet.wait_for(lambda r=r: keys_on(r) == [1, 2, 3, 4], what="the others have every row")


@pytest.mark.parametrize("deleted", ["the tablet directory", "the store files"])
def test_files_deleted_under_a_running_leader_fail_it_and_another_leads(
    tmp_path: Path, deleted: str
) -> None:
    """Deleted by hand while the server ran, a replica stayed leader, RUNNING, and
    acknowledged writes into files no restart would find; status said OK."""
    tablet = Tablet(tmp_path, options=ReplicaOptions(consensus=FAST, log_gc_interval_s=0.01))
    try:
        leader = tablet.leader()
        for i in range(1, 4):
            send(leader, write([i], "c5", i)).result()
        directory = tmp_path / leader.server_id
        if deleted == "the tablet directory":
            shutil.rmtree(directory)
        else:
            for name in ("store.sqlite", "store.sqlite-wal"):
                (directory / name).unlink()
        tablet.wait_for(lambda: leader.failure_reason() is not None, what="the replica fails")
        assert "deleted" in str(leader.failure_reason())
        # A store that failed hands leadership over (set_promotable), a moment after it says
        # it failed; a failed log publishes a follower's snapshot before its failure.
        tablet.wait_for(
            lambda: not leader.consensus.snapshot.leader_ready, what="the old leader steps down"
        )
        new = tablet.leader()
        assert new is not leader
        send(new, write([4], "c5", 4)).result()
        for r in _others(tablet, leader.server_id):
            tablet.wait_for(lambda r=r: keys_on(r) == [1, 2, 3, 4], what=f"{r.server_id}")
    finally:
        tablet.close()


def test_a_store_that_cannot_checkpoint_fails_and_serves_again_once_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its file made immutable, SQLite's automatic checkpoints failed in silence and
    the -wal grew without bound; the replica said RUNNING."""
    tablet = Tablet(tmp_path, options=ReplicaOptions(consensus=FAST, log_gc_interval_s=0.01))
    try:
        leader = tablet.leader()
        connection = RefusedCheckpoints(leader.store._writer)
        leader.store._writer = connection  # type: ignore[assignment]
        first = send(leader, write([1], "c6", 1))
        tablet.wait_for(lambda: leader.failure_reason() is not None, what="the replica fails")
        assert "checkpoint failed: disk I/O error" in str(leader.failure_reason())
        # Failed before its answer -- or before it was replicated, when an idle pass's
        # checkpoint (log GC runs on the ticker too) failed the replica first: retried below.
        with contextlib.suppress(TabletFailed, ReplicaFailed):
            first.result()
        new = tablet.leader()
        assert new is not leader
        send(new, write([1], "c6", 1)).result()
        send(new, write([2], "c6", 2)).result()
        # Checkpoints work again, but the retry's first fsync fails (ENOSPC at fsync): its
        # OSError escaped the retry, and no retry came after it -- FAILED for good.
        failed: list[str] = []
        real_fsync = store_module._fsync_path

        def fsync(path: Path, *, directory: bool = False) -> None:
            if not failed and not directory and leader.store.path.parent == Path(path).parent:
                failed.append(str(path))
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            real_fsync(path, directory=directory)

        monkeypatch.setattr(store_module, "_fsync_path", fsync)
        connection.refusing.clear()
        tablet.wait_for(lambda: leader.failure_reason() is None, what="it serves again")
        assert failed  # the retry met the failed fsync, and a later one got through
        tablet.wait_for(lambda: keys_on(leader) == [1, 2], what="it catches up")
    finally:
        tablet.close()


def test_a_leader_whose_store_file_is_found_damaged_fails_for_good(
    tablet: Tablet, tmp_path: Path
) -> None:
    leader = tablet.leader()
    for i in range(1, 6):
        send(leader, write([i], "c3", i)).result()
    # What the store verifier does when quick_check reports damage.
    leader.store_damaged("PRAGMA quick_check: Page 7: btree page has bad header")
    tablet.wait_for(lambda: leader.failure_reason() is not None, what="the leader fails")
    reason = leader.failure_reason()
    assert reason is not None
    assert "the store file is damaged" in reason
    assert "Page 7" in reason
    new = tablet.leader()
    assert new is not leader
    for i in range(6, 10):
        send(new, write([i], "c3", i)).result()
    # No retry mends a damaged file: it stays FAILED and never leads again.
    for _ in range(200):
        tablet.ticker.tick()
    assert leader.failure_reason() == reason
    assert leader.consensus.snapshot.role is Role.FOLLOWER
    with pytest.raises(TabletFailed):
        leader.scan(
            tablet_pb2.ScanRequest(tablet_id="kv-p0", read_mode=tablet_pb2.READ_FOLLOWER_APPLIED)
        )
    for r in _others(tablet, leader.server_id):
        tablet.wait_for(lambda r=r: keys_on(r) == list(range(1, 10)), what=f"{r.server_id}")


def test_a_committed_entry_a_follower_cannot_decode_fails_it_and_is_never_skipped(
    tablet: Tablet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries that leave the follower's hold and then fail to decode (a bug, a forged
    append) fail the replica like a store that cannot apply -- not an error logged by the
    apply stage's mailbox, which had left the replica RUNNING with those writes missing for
    good.  It retries them from its log, and once they decode it applies them all."""
    leader = tablet.leader()
    for i in range(1, 4):
        send(leader, write([i], "c7", i)).result()
    follower = _others(tablet, leader.server_id)[0]
    tablet.wait_for(lambda: keys_on(follower) == [1, 2, 3], what="the follower applies")
    real = replica_module.to_apply_entries
    broken = threading.Event()
    broken.set()

    def to_apply_entries(entries: Sequence[Any], schema: Any) -> Any:
        # Only a follower decodes whole entries (a leader's own rows were decoded once).
        if broken.is_set() and entries:
            raise DecodeError("Error parsing message with type 'raftlet.WriteOperationPB'")
        return real(entries, schema)

    monkeypatch.setattr(replica_module, "to_apply_entries", to_apply_entries)
    for i in range(4, 7):
        send(leader, write([i], "c7", i)).result()
    tablet.wait_for(lambda: follower.failure_reason() is not None, what="the follower fails")
    reason = follower.failure_reason()
    assert reason is not None
    assert "do not decode" in reason, reason
    assert keys_on(follower) == [1, 2, 3]
    broken.clear()  # the retry reads them back from its log
    tablet.wait_for(lambda: follower.failure_reason() is None, what="FAILED clears")
    for r in tablet.replicas.values():
        tablet.wait_for(lambda r=r: keys_on(r) == list(range(1, 7)), what=f"{r.server_id}")


def _real_corruption(tmp_path: Path) -> sqlite3.DatabaseError:
    """What SQLite raises reading a file whose pages were overwritten."""
    path = tmp_path / "damaged.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
        db.executemany("INSERT INTO t VALUES (?, ?)", [(i, "x" * 200) for i in range(2000)])
    db.close()
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(b"\xa5" * 4096 * 20)
    db = sqlite3.connect(path)
    try:
        db.execute("SELECT count(*), sum(length(v)) FROM t").fetchall()
    except sqlite3.DatabaseError as e:
        return e
    finally:
        db.close()
    raise AssertionError("no corruption seen")


def test_damage_is_told_apart_from_a_full_disk(tmp_path: Path) -> None:
    from raftlet.tserver.store import damage_in

    corrupt = _real_corruption(tmp_path)
    wrapped = StoreError(f"tablet store x: scan failed: {corrupt}")
    wrapped.__cause__ = corrupt
    assert damage_in(wrapped) == f"tablet store x: scan failed: {corrupt}"
    full = sqlite3.OperationalError("database or disk is full")
    assert damage_in(StoreError("apply failed")) is None
    assert damage_in(full) is None
    assert damage_in(OSError(errno.ENOSPC, "No space left on device")) is None


@pytest.mark.parametrize("found_by", ["scan", "apply"])
def test_a_store_found_damaged_by_a_read_or_an_apply_fails_for_good_and_asks_for_a_copy(
    tablet: Tablet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, found_by: str
) -> None:
    """Damage seen outside the verifier's hourly check: a read that hits a bad page, an
    apply that does. It was taken for a failure that may pass -- the scan answered an
    internal error and no other replica was tried, the apply retried for good -- and the
    replica stayed a voter that could lead."""
    leader = tablet.leader()
    for i in range(1, 4):
        send(leader, write([i], "c3", i)).result()
    follower = _others(tablet, leader.server_id)[0]
    tablet.wait_for(lambda: keys_on(follower) == [1, 2, 3], what="the follower has the rows")
    corrupt = _real_corruption(tmp_path)
    store = follower.store
    if found_by == "scan":

        def open_scan(*_a: Any, **_k: Any) -> Any:
            raise StoreError(f"tablet store {store.path}: scan failed: {corrupt}") from corrupt

        monkeypatch.setattr(store, "open_scan", open_scan)
        with pytest.raises(TabletFailed, match="the store file is damaged"):
            follower.scan(
                tablet_pb2.ScanRequest(
                    tablet_id="kv-p0", read_mode=tablet_pb2.READ_FOLLOWER_APPLIED
                )
            )
    else:

        def apply_batch(*_a: Any, **_k: Any) -> list[EntryResult]:
            raise StoreError(f"tablet store {store.path}: apply failed: {corrupt}") from corrupt

        monkeypatch.setattr(store, "apply_batch", apply_batch)
        send(leader, write([4], "c3", 4)).result()
    tablet.wait_for(lambda: follower.failure_reason() is not None, what="FAILED")
    assert "malformed" in str(follower.failure_reason())
    assert follower.needs_repair()  # a copy mends it; no retry would
    for i in range(5, 8):
        send(leader, write([i], "c3", i)).result()


def test_a_leader_that_cannot_read_the_entries_a_follower_needs_fails_and_hands_over(
    tablet: Tablet, caplog: pytest.LogCaptureFixture
) -> None:
    """Review r34a: a WAL segment gone from under a leader, needed to catch a returning
    follower up, made every write of the tablet answer "internal server error
    (FileNotFoundError)" though each was committed; the leader never handed over and
    logged 30 tracebacks a second. Now its log counts as failed, as one found damaged at
    open does: it hands over to a voter holding its whole log, which catches the follower
    up."""
    leader = tablet.leader()
    for i in range(1, 4):
        send(leader, write([i], "c9", i)).result()
    lagging = next(n for n in tablet.replicas if n != leader.server_id)
    tablet.stop(lagging)
    for i in range(4, 21):
        send(leader, write([i], "c9", i)).result()
    log = leader.consensus_log()
    real = log.entries
    gone = log.last_index() - 5  # what the follower needs, not what the leader applies

    def entries(lo: int, hi: int, max_size: int | None = None) -> Any:
        if lo <= gone:
            raise FileNotFoundError(errno.ENOENT, "No such file", "wal-0000000000000001.seg")
        return real(lo, hi, max_size)

    log.entries = entries  # type: ignore[method-assign]
    caplog.set_level(logging.ERROR)
    back = tablet.open(lagging)
    tablet.wait_for(lambda: leader.failure_reason() is not None, what="the leader's log fails")
    assert "cannot be read" in str(leader.failure_reason())
    assert "wal-0000000000000001.seg" in str(leader.failure_reason())
    new = tablet.leader()
    assert new is not leader
    assert new is not back  # it lacks entries: only the voter with the whole log may lead
    send(new, write([21], "c9", 21)).result()
    tablet.wait_for(lambda: keys_on(back) == list(range(1, 22)), what="the follower catches up")
    assert not [r for r in caplog.records if "handler failed" in r.getMessage()]
