"""``raftlet cluster ksck --checksum`` on real servers: replicas compared row for row at one
log index while writes go on, and a byte flipped in one follower's store file -- which
SQLite serves silently -- found and the replica named."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.tserver_cluster import (
    REPO,
    TserverCluster,
    WriteLoad,
    kv_op,
    running_cluster,
    write_request,
    write_with_retry,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CANARY = "CANARY-0123456789abcdef-checksum"
CANARY_KEY = -7  # below every key WriteLoad writes


def _ksck(cluster: TserverCluster) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "raftlet", "cluster", "ksck", "--cluster", str(cluster.path),
         "--checksum", "--format", "json", "--timeout", "10"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def _by_tablet(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["tablet_id"]: c for c in doc["checksums"]}


def test_ksck_checksum_agrees_under_load_and_names_a_flipped_byte(tmp_path: Path) -> None:
    with running_cluster(tmp_path, partitions=2) as cluster:
        cluster.wait_leaders()
        tablet = cluster.tablet_for_key(CANARY_KEY)
        write_with_retry(cluster, write_request(tablet, [kv_op(CANARY_KEY, CANARY)], "canary", 1))
        # Healthy before the load: ts3, started last, can still be waiting out a reconnect
        # backoff, and the check would rightly call it lagging.
        cluster.wait_caught_up()
        with WriteLoad(cluster, n_writers=2) as load:
            load.wait_acked(50, timeout=60)
            code, doc = _ksck(cluster)
        assert not load.errors, load.errors
        checks = _by_tablet(doc)
        assert set(checks) == set(cluster.tablet_ids())
        for c in checks.values():
            sums = {r["checksum"] for r in c["replicas"]}
            assert len(c["replicas"]) == 3, c
            assert len(sums) == 1, c
            assert "" not in sums, c
            assert c["index"] > 0
        assert code == 0, doc

        # A follower of the canary's tablet, stopped; one byte of the canary flipped in its
        # store file (no raft entry says so, and SQLite keeps no page checksums).
        leader = cluster.leader_of(tablet)
        follower = next(
            cluster.servers[s] for s in cluster.config.placement(tablet).replicas if s != leader.id
        )
        follower.terminate()
        store = follower.config.data_dir / tablet / "store.sqlite"
        with sqlite3.connect(store) as db:  # fold any WAL into the main file first
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        data = bytearray(store.read_bytes())
        at = data.find(CANARY.encode())
        assert at >= 0
        assert data.find(CANARY.encode(), at + 1) < 0
        data[at] ^= 0x01  # 'C' -> 'B'
        store.write_bytes(bytes(data))
        follower.start()
        # Reached again by every leader before ksck asks it for a checksum point: a server
        # started last may wait out a reconnect backoff or two.
        cluster.wait_caught_up()
        rows = follower.scan_rows(tablet)
        assert rows[CANARY_KEY] == "B" + CANARY[1:]  # served silently: what the check is for

        code, doc = _ksck(cluster)
        assert code == 1
        checks = _by_tablet(doc)
        damaged = checks[tablet]
        sums = {r["server"]: r["checksum"] for r in damaged["replicas"]}
        healthy = [s for s in sums if s != follower.id]
        assert sums[healthy[0]] == sums[healthy[1]] != sums[follower.id]
        other = next(t for t in cluster.tablet_ids() if t != tablet)
        assert len({r["checksum"] for r in checks[other]["replicas"]}) == 1

        # The table an operator reads says the same.
        text = subprocess.run(
            [sys.executable, "-m", "raftlet", "cluster", "ksck", "--cluster", str(cluster.path),
             "--checksum"],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert text.returncode == 1
        assert f"CHECKSUM MISMATCH: {tablet}" in text.stdout
        assert f"{follower.id}: " in text.stdout
