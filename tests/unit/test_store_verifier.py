"""The store verifier: one pass checks every replica's store with quick_check and fails the
ones it finds damaged -- a real SQLite file with a page of garbage -- and only those; and
the next pass waits at least as long as the last one took (with a short interval,
--store_verify_interval_s=0.001 once, passes ran back to back, kept every CPU busy on an
idle server and slowed writes 6x)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from raftlet.schema.rows import OpType, encode_row_op
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from raftlet.tserver.store import ApplyEntry, TabletStore
from raftlet.tserver.store_verifier import StoreVerifier
from tests.waiting import wait_for

SCHEMA = Schema(
    [
        ColumnSchema("k", DataType.INT64, is_key=True),
        ColumnSchema("v", DataType.STRING, nullable=True),
    ]
)


@dataclass
class FakeReplica:
    tablet_id: str
    store: TabletStore
    damage: list[str] = field(default_factory=list)

    def store_damaged(self, reason: str) -> None:
        self.damage.append(reason)


def _store(path: Path) -> TabletStore:
    store = TabletStore.open(path, SCHEMA)
    ops = [encode_row_op(SCHEMA, OpType.INSERT, {"k": i, "v": "v" * 100}) for i in range(3000)]
    store.apply_batch([ApplyEntry(1, 1, ops)])
    return store


def test_one_pass_fails_the_damaged_store_and_only_that_one(tmp_path: Path) -> None:
    good = _store(tmp_path / "good.sqlite")
    bad_path = tmp_path / "bad.sqlite"
    _store(bad_path).close()
    with sqlite3.connect(bad_path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(bad_path.read_bytes())
    page = len(data) // 4096 // 2
    data[page * 4096 : (page + 1) * 4096] = b"\xff" * 4096
    bad_path.write_bytes(bytes(data))
    bad = TabletStore.open(bad_path, SCHEMA)
    replicas = [FakeReplica("t-good", good), FakeReplica("t-bad", bad)]
    verifier = StoreVerifier(lambda: replicas, interval_s=3600)
    try:
        assert verifier.verify_all() == 1
        assert replicas[0].damage == []
        (reason,) = replicas[1].damage
        assert reason.startswith("PRAGMA quick_check: ")
        assert "malformed" in reason
    finally:
        good.close()
        bad.close()


class CountingStore:
    def __init__(self) -> None:
        self.checks = 0

    def quick_check(self, max_problems: int = 5) -> list[str]:
        self.checks += 1
        return []


def test_the_thread_checks_every_interval_until_stopped() -> None:
    store = CountingStore()
    replica = FakeReplica("t", store)  # type: ignore[arg-type]
    verifier = StoreVerifier(lambda: [replica], interval_s=0.02)
    verifier.start()
    try:
        wait_for(lambda: store.checks >= 3, 10, "three passes")
    finally:
        verifier.stop()
    done = store.checks
    assert replica.damage == []
    verifier.verify_all()  # stopped: a pass does nothing
    assert store.checks == done


# --- pacing -------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0


@dataclass
class _SlowStore:
    """A quick_check that takes ``seconds`` on the test's clock."""

    clock: _Clock
    seconds: float
    checks: int = 0

    def quick_check(self, max_problems: int = 5) -> list[str]:
        self.checks += 1
        self.clock.now += self.seconds
        return []


def _slow(tablet_id: str, clock: _Clock, seconds: float) -> FakeReplica:
    return FakeReplica(tablet_id, _SlowStore(clock, seconds))  # type: ignore[arg-type]


class _Stop:
    """The verifier's stop event: records each wait and stops it after ``passes`` waits."""

    def __init__(self, passes: int) -> None:
        self.waits: list[float] = []
        self._passes = passes

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return len(self.waits) > self._passes

    def is_set(self) -> bool:
        return False

    def set(self) -> None:
        pass


def test_the_next_pass_waits_at_least_as_long_as_the_last_one_took() -> None:
    clock = _Clock()
    replicas = [_slow(f"t{i}", clock, 2.0) for i in range(3)]  # 6 s a pass
    verifier = StoreVerifier(lambda: replicas, interval_s=1.0, clock=lambda: clock.now)
    stop = _Stop(passes=3)
    verifier._stop = stop  # type: ignore[assignment]
    verifier._run()  # on this thread: the fake stop event ends it after three passes
    assert [r.store.checks for r in replicas] == [3, 3, 3]
    assert stop.waits == [1.0, 6.0, 6.0, 6.0]


def test_a_quick_pass_waits_the_interval() -> None:
    clock = _Clock()
    replicas = [_slow("t", clock, 0.25)]
    verifier = StoreVerifier(lambda: replicas, interval_s=60.0, clock=lambda: clock.now)
    stop = _Stop(passes=2)
    verifier._stop = stop  # type: ignore[assignment]
    verifier._run()
    assert stop.waits == [60.0, 60.0, 60.0]
