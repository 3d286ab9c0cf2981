"""What a replica's files take on disk, as /metrics, /tablets.json and ``raftlet metrics``
show it: the gauges read the real files of a real replica (WAL segments, the SQLite store
with its -wal and -shm), running or FAILED."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlet.cli.metrics_cmd import _format, key_metrics
from raftlet.consensus.log import LogOptions
from raftlet.metrics.export_json import generate_json
from raftlet.metrics.registry import MetricRegistry
from raftlet.tserver.disk_usage import directory_usage
from raftlet.tserver.failed_tablet import FailedTablet
from raftlet.tserver.status_pages import (
    register_disk_total_gauge,
    register_tablet_gauges,
    tablet_statuses,
)
from raftlet.tserver.tablet_replica import ReplicaOptions, TabletReplica
from tests.unit.consensus_cluster import FAST
from tests.unit.test_tablet_replica import Tablet, send, write

SEGMENT = 4096  # small: a few writes roll the WAL over into several segments


@pytest.fixture
def tablet(tmp_path: Path) -> Iterator[Tablet]:
    options = ReplicaOptions(
        consensus=FAST,
        log=LogOptions(segment_size_bytes=SEGMENT, fsync=False),
        log_gc_interval_s=0,  # no GC: the files stay as the writes left them
    )
    t = Tablet(tmp_path, options=options)
    yield t
    t.close()


def _real(directory: Path) -> tuple[int, int, int]:
    """(WAL bytes, WAL segments, store bytes) of ``directory``, from the files themselves."""
    segments = list((directory / "wal").glob("*.seg"))
    store = [p for s in ("", "-wal", "-shm") if (p := directory / f"store.sqlite{s}").exists()]
    return (
        sum(os.path.getsize(p) for p in segments),
        len(segments),
        sum(os.path.getsize(p) for p in store),
    )


def _gauges(registry: MetricRegistry, entity_id: str) -> dict[str, float]:
    (entity,) = [e for e in generate_json(registry) if e["id"] == entity_id]
    return {m["name"]: m["value"] for m in entity["metrics"]}


def _settled_leader(tablet: Tablet) -> TabletReplica:
    """The leader, after 40 writes it applied and no write since (so its files are still)."""
    leader = tablet.leader()
    last = 0
    for i in range(40):
        last = send(leader, write(list(range(i * 10, i * 10 + 10)), "c1", i + 1)).result().op_index
    tablet.wait_for(lambda: leader.store.applied_index() >= last, what="the leader applies")
    return leader


def test_tablet_disk_gauges_and_status_are_the_sizes_of_the_replicas_files(
    tablet: Tablet,
) -> None:
    leader = _settled_leader(tablet)
    registry = MetricRegistry()
    register_tablet_gauges(registry.entity("tablet", "kv-p0", {}), lambda: leader)
    server = registry.entity("server", "ts1", {})
    register_disk_total_gauge(server, {"kv-p0": leader}, {}, tablet.root / "no-copy-area")

    log_bytes, segments, store = _real(leader.directory)
    assert segments >= 3, "the writes rolled the WAL over"
    # SQLite in WAL mode: the -wal holds the writes until a checkpoint, and counts.
    assert (leader.directory / "store.sqlite-wal").exists()
    assert store > os.path.getsize(leader.directory / "store.sqlite")
    gauges = _gauges(registry, "kv-p0")
    assert gauges["tablet_log_bytes"] == log_bytes
    assert gauges["tablet_log_segments"] == segments
    assert gauges["tablet_store_bytes"] == store
    assert _gauges(registry, "ts1")["tablets_disk_bytes"] == log_bytes + store

    (status,) = tablet_statuses([leader])
    assert (status["log_bytes"], status["log_segments"], status["store_bytes"]) == (
        log_bytes,
        segments,
        store,
    )


def test_a_failed_replicas_files_are_read_from_its_directory(tablet: Tablet) -> None:
    """A FAILED replica has no open log, but its files take the disk all the same."""
    _settled_leader(tablet)
    follower = next(n for n, r in tablet.replicas.items() if not r.consensus.snapshot.leader_ready)
    directory = tablet.replicas[follower].directory
    tablet.stop(follower)
    failed = FailedTablet("kv-p0", "kv", 0, ("a", "b", "c"), directory, "bad")
    registry = MetricRegistry()
    register_tablet_gauges(registry.entity("tablet", "kv-p0", {}), lambda: failed)
    register_disk_total_gauge(
        registry.entity("server", "ts1", {}), {}, {"kv-p0": failed}, directory / "none"
    )

    log_bytes, segments, store = _real(directory)
    assert min(log_bytes, segments, store) > 0
    assert directory_usage(directory).total_bytes == log_bytes + store
    gauges = _gauges(registry, "kv-p0")
    assert gauges["tablet_failed"] == 1
    assert (
        gauges["tablet_log_bytes"],
        gauges["tablet_log_segments"],
        gauges["tablet_store_bytes"],
    ) == (log_bytes, segments, store)
    assert _gauges(registry, "ts1")["tablets_disk_bytes"] == log_bytes + store
    (status,) = tablet_statuses([], [failed])
    assert (status["log_bytes"], status["store_bytes"]) == (log_bytes, store)


def test_no_replica_and_no_directory_read_as_zero(tmp_path: Path) -> None:
    registry = MetricRegistry()
    register_tablet_gauges(registry.entity("tablet", "gone", {}), lambda: None)
    missing = FailedTablet("kv-p1", "kv", 1, ("a",), tmp_path / "nothing", "bad")
    register_tablet_gauges(registry.entity("tablet", "kv-p1", {}), lambda: missing)
    for tid in ("gone", "kv-p1"):
        gauges = _gauges(registry, tid)
        assert gauges["tablet_log_bytes"] == gauges["tablet_store_bytes"] == 0
        assert gauges["tablet_log_segments"] == 0


def test_the_copy_area_is_counted_apart_from_the_replicas(tmp_path: Path) -> None:
    """A copy on its way in (a staging directory with the store's part and a WAL), a
    snapshot on its way out: neither is a replica yet, and tablets_disk_bytes leaves them
    out, so they have a gauge of their own -- 0 when no copy runs, or no area exists."""
    area = tmp_path / ".tablet-copy"
    registry = MetricRegistry()
    register_disk_total_gauge(registry.entity("server", "ts1", {}), {}, {}, area)
    assert _gauges(registry, "ts1")["tablet_copy_disk_bytes"] == 0
    (area / "kv-p0.staging" / "wal").mkdir(parents=True)
    (area / "kv-p0.staging" / "store.sqlite.part").write_bytes(b"s" * 3000)
    (area / "kv-p0.staging" / "wal" / "wal-0000000000000001.seg").write_bytes(b"w" * 500)
    (area / "out-9.sqlite").write_bytes(b"o" * 70)
    (area / "kv-p1.copying").write_bytes(b"")
    gauges = _gauges(registry, "ts1")
    assert gauges["tablet_copy_disk_bytes"] == 3570
    assert gauges["tablets_disk_bytes"] == 0
    assert key_metrics(_server_doc(3570))["copy_bytes"] == 3570


def _server_doc(copy_bytes: int) -> list[dict[str, Any]]:
    metric = {"name": "tablet_copy_disk_bytes", "value": copy_bytes}
    return [{"type": "server", "id": "ts1", "attributes": {}, "metrics": [metric]}]


def test_raftlet_metrics_shows_each_servers_wal_and_store_bytes_in_human_units() -> None:
    def tablet_entity(tid: str, log: int, segments: int, store: int) -> dict[str, Any]:
        return {
            "type": "tablet",
            "id": tid,
            "attributes": {},
            "metrics": [
                {"name": "tablet_log_bytes", "value": log},
                {"name": "tablet_log_segments", "value": segments},
                {"name": "tablet_store_bytes", "value": store},
            ],
        }

    doc = [
        tablet_entity("kv-p0", 64 * 8 << 20, 64, 47 << 20),
        tablet_entity("kv-p1", 3 << 20, 1, 1 << 20),
    ]
    shown = key_metrics(doc)
    assert shown["wal_bytes"] == (512 << 20) + (3 << 20)
    assert shown["wal_segments"] == 65
    assert shown["store_bytes"] == 48 << 20
    assert _format("bytes", shown["wal_bytes"]) == "515.0 MiB"
    assert _format("bytes", shown["store_bytes"]) == "48.0 MiB"
    assert _format("bytes", None) == "-"
