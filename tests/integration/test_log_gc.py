"""Log GC on real servers: with small WAL segments and frequent GC, a write load leaves
each replica's WAL bounded; a stopped follower holds GC back on the others (they keep what
it lacks) and catches up from their logs when it returns; restarts and leader changes on
logs whose prefix is gone lose nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.tserver_cluster import (
    TserverCluster,
    WriteLoad,
    running_cluster,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEGMENT = 32 * 1024
FLAGS = ["--log_segment_size_bytes", str(SEGMENT), "--log_gc_interval_s", "0.2"]


def _segments(cluster: TserverCluster, server: str, tablet: str) -> list[Path]:
    wal = cluster.servers[server].config.data_dir / tablet / "wal"
    return sorted(wal.glob("*.seg"))


def _disk_shown_is_on_disk(cluster: TserverCluster, server: str, tablet: str) -> bool:
    """Whether one scrape of ``server``'s /metrics, and its /tablets.json, show what its
    replica's files take now: WAL bytes and segments, the store with its -wal and -shm, and
    the server's total."""
    s = cluster.servers[server]
    (status,) = [t for t in s.tablets_json() if t["tablet_id"] == tablet]
    shown = {
        sample.name: sample.value
        for family in s.metric_families()
        for sample in family.samples
        if sample.labels.get("tablet") == tablet or sample.name == "tablets_disk_bytes"
    }
    directory = s.config.data_dir / tablet
    segments = _segments(cluster, server, tablet)
    store = [directory / f"store.sqlite{x}" for x in ("", "-wal", "-shm")]
    log_bytes = sum(p.stat().st_size for p in segments)
    store_bytes = sum(p.stat().st_size for p in store if p.exists())
    assert log_bytes > 0
    assert store_bytes > 0
    return (
        shown.get("tablet_log_bytes"),
        shown.get("tablet_log_segments"),
        shown.get("tablet_store_bytes"),
        shown.get("tablets_disk_bytes"),
        status["log_bytes"],
        status["store_bytes"],
    ) == (log_bytes, len(segments), store_bytes, log_bytes + store_bytes, log_bytes, store_bytes)


def _first_index(cluster: TserverCluster, server: str, tablet: str) -> int:
    (status,) = [t for t in cluster.servers[server].tablets_json() if t["tablet_id"] == tablet]
    return int(status["first_index"])


def test_the_wal_stays_bounded_and_a_stopped_follower_holds_gc_back(tmp_path: Path) -> None:
    with running_cluster(tmp_path, partitions=1, flags=FLAGS) as cluster:
        (tablet,) = cluster.tablet_ids()
        cluster.wait_leaders()
        with WriteLoad(cluster, n_writers=3) as load:
            load.wait_acked(1500, timeout=120)
            # GC keeps up: every replica deleted segments, and holds only a few.
            for s in cluster.servers.values():
                wait_for(
                    lambda s=s: s.metric("log_gc_segments_deleted_total") > 0,
                    30,
                    f"log GC on {s.id}",
                )
            for sid in cluster.servers:
                assert _first_index(cluster, sid, tablet) > 1
            leader = cluster.leader_of(tablet)
            follower = next(s for s in cluster.servers.values() if s.id != leader.id)
            follower.terminate()
            stopped_at = max(
                int(t["applied_index"]) for t in leader.tablets_json() if t["tablet_id"] == tablet
            )
            kept = len(_segments(cluster, leader.id, tablet))
            before = load.count()
            load.wait_acked(before + 1500, timeout=120)
            # The others kept every entry the stopped follower lacks.
            for s in cluster.alive_servers():
                assert _first_index(cluster, s.id, tablet) <= stopped_at + 1, s.id
            assert len(_segments(cluster, leader.id, tablet)) >= kept + 2
            follower.start()
            # Enough that every replica's active segment starts after where it stopped.
            n = load.count()
            load.wait_acked(n + 1200, timeout=180)
        cluster.wait_converged(tablet, load.expected(tablet), timeout=60)
        # With every voter back, GC moves on past where the follower had stopped.
        for sid in cluster.servers:
            wait_for(
                lambda sid=sid: _first_index(cluster, sid, tablet) > stopped_at,
                60,
                f"GC past index {stopped_at} on {sid}",
            )
            assert len(_segments(cluster, sid, tablet)) <= 8, sid
            # /metrics shows the WAL and the store as their files are (GC, which may delete a
            # segment between a scrape and the listing, moves on: the two agree once it is done).
            wait_for(
                lambda sid=sid: _disk_shown_is_on_disk(cluster, sid, tablet),
                30,
                f"/metrics of {sid} showing its files",
            )


def test_restarts_and_a_leader_change_on_collected_logs_lose_nothing(tmp_path: Path) -> None:
    with running_cluster(tmp_path, partitions=1, flags=FLAGS) as cluster:
        (tablet,) = cluster.tablet_ids()
        cluster.wait_leaders()
        with WriteLoad(cluster, n_writers=3) as load:
            load.wait_acked(1200, timeout=120)
            for sid in cluster.servers:
                wait_for(lambda sid=sid: _first_index(cluster, sid, tablet) > 1, 30, f"GC on {sid}")
            # Every server restarts from a log that no longer starts at 1.
            for s in list(cluster.servers.values()):
                s.terminate()
                s.start()
                n = load.count()
                load.wait_acked(n + 100, timeout=120)
            # And leadership moves.
            old = cluster.leader_of(tablet)
            old.kill()
            cluster.new_leader_of(tablet, old.id)
            n = load.count()
            load.wait_acked(n + 200, timeout=120)
            old.start()
            n = load.count()
            load.wait_acked(n + 200, timeout=120)
        cluster.wait_converged(tablet, load.expected(tablet), timeout=60)
