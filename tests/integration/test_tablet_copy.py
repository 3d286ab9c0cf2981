"""Tablet copy on real servers: a follower that the leader's log can no longer catch up --
it was stopped while log GC went past the retention cap, or its directory was wiped -- gets
a copy of the tablet from the leader, in small checksummed chunks, while writes go on; a
FAILED replica (a corrupt WAL, a deleted consensus-meta) is repaired the same way while the
server's other tablets serve. No acknowledged row is lost or duplicated."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from raftlet.consensus.log.segment import HEADER_SIZE
from tests.integration.tserver_cluster import (
    Server,
    TserverCluster,
    WriteLoad,
    running_cluster,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEGMENT = 32 * 1024
FLAGS = [
    "--log_segment_size_bytes",
    str(SEGMENT),
    "--log_gc_interval_s",
    "0.2",
    "--log_max_segments_retained",
    "3",
    # Many chunks per copy, so a copy spans many calls under load.
    "--tablet_copy_chunk_bytes",
    "4096",
    "--tablet_copy_repair_interval_s",
    "1",
]


def _index(server: Server, tablet: str, key: str) -> int:
    return int(str(server.tablet_status(tablet)[key]))


def _copies(server: Server) -> float:
    return server.metric("tablet_copies_installed_total")


def _write_past_the_log_of(
    cluster: TserverCluster, load: WriteLoad, tablet: str, stopped_at: int
) -> None:
    """Write until every running replica's log starts after ``stopped_at``."""
    for s in cluster.alive_servers():
        wait_for(
            lambda s=s: _index(s, tablet, "first_index") > stopped_at + 1,
            120,
            f"log GC on {s.id} past {stopped_at}",
        )
    load.wait_acked(load.count() + 100, timeout=120)


def test_a_follower_stopped_past_the_retained_log_catches_up_by_tablet_copy(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path, partitions=1, flags=FLAGS) as cluster:
        (tablet,) = cluster.tablet_ids()
        cluster.wait_leaders()
        with WriteLoad(cluster, n_writers=3) as load:
            load.wait_acked(300, timeout=120)
            follower = cluster.follower_of(tablet)
            follower.terminate()
            # Past whatever the stopped follower's log may hold: the leader's log reaches
            # at least as far (were it the follower's applied index, its log could go a
            # segment further, and the leader then catch it up by plain appends).
            stopped_at = _index(cluster.leader_of(tablet), tablet, "last_index")
            _write_past_the_log_of(cluster, load, tablet, stopped_at)
            follower.start()
            # It comes back, is found behind the leader's log, and copies the tablet while
            # the writers go on.
            wait_for(lambda: _copies(follower) >= 1, 120, f"a tablet copy on {follower.id}")
            assert _index(follower, tablet, "first_index") > stopped_at
            load.wait_acked(load.count() + 300, timeout=120)
        cluster.wait_converged(tablet, load.expected(tablet), timeout=60)
        # Served by whoever led then: summed over the servers, as leadership may have moved.
        served = sum(
            s.metric("tablet_copy_sessions_total", outcome="installed")
            for s in cluster.alive_servers()
        )
        assert served >= 1


def test_a_new_leader_copies_to_a_lagging_follower_before_its_no_op_commits(
    tmp_path: Path,
) -> None:
    """The leader dies while a follower is behind its log: the one replica left that holds
    everything wins, and its no-op needs that follower's acknowledgement. The follower can
    only catch up by a copy -- which a leader refused until its no-op committed, so the
    tablet took no write until the old leader came back."""
    with running_cluster(tmp_path, partitions=1, flags=FLAGS) as cluster:
        (tablet,) = cluster.tablet_ids()
        cluster.wait_leaders()
        with WriteLoad(cluster, n_writers=3) as load:
            load.wait_acked(300, timeout=120)
            old_leader = cluster.leader_of(tablet)
            follower = cluster.follower_of(tablet)
            follower.terminate()
            stopped_at = _index(old_leader, tablet, "last_index")
            _write_past_the_log_of(cluster, load, tablet, stopped_at)
        old_leader.kill()
        follower.start()
        new_leader = cluster.leader_of(tablet, timeout=60)
        assert new_leader.id not in (old_leader.id, follower.id)
        wait_for(lambda: _copies(follower) >= 1, 120, f"a tablet copy on {follower.id}")
        with WriteLoad(cluster, n_writers=2, key_base=50_000_000, name="after") as after:
            after.wait_acked(100, timeout=120)
        expected = load.expected(tablet) | after.expected(tablet)
        cluster.wait_converged(tablet, expected, timeout=60, servers=[new_leader.id, follower.id])


@pytest.mark.parametrize("writes", ["idle", "under_load"])
def test_a_wiped_follower_is_repaired_by_tablet_copy(tmp_path: Path, writes: str) -> None:
    """Idle, nothing but its first heartbeat answer tells the leader that the follower lost
    its log (it used to stay empty, looking healthy, until the next write)."""
    with running_cluster(tmp_path, partitions=1, flags=FLAGS) as cluster:
        (tablet,) = cluster.tablet_ids()
        cluster.wait_leaders()
        with WriteLoad(cluster, n_writers=3) as load:
            load.wait_acked(300, timeout=120)
            for s in cluster.servers.values():
                wait_for(lambda s=s: _index(s, tablet, "first_index") > 1, 60, f"GC on {s.id}")
            if writes == "idle":
                load.stop()
            follower = cluster.follower_of(tablet)
            follower.terminate()
            shutil.rmtree(follower.config.data_dir / tablet)
            follower.start()
            wait_for(lambda: _copies(follower) >= 1, 120, f"a tablet copy on {follower.id}")
            if writes == "under_load":
                load.wait_acked(load.count() + 300, timeout=120)
        cluster.wait_converged(tablet, load.expected(tablet), timeout=60)


@pytest.mark.parametrize(
    ("damage", "writes"),
    [
        ("corrupt_wal", "under_load"),
        ("deleted_consensus_meta", "under_load"),
        # Idle: the leader's copy is at the very index the damaged replica saved as its
        # commit, which was taken for "holds the tablet as far as the copy" (FAILED until
        # the next write).
        ("corrupt_wal", "idle"),
    ],
)
def test_a_failed_replica_is_repaired_while_the_servers_other_tablets_serve(
    tmp_path: Path, damage: str, writes: str
) -> None:
    with running_cluster(tmp_path, partitions=2, flags=FLAGS) as cluster:
        damaged, other = cluster.tablet_ids()
        cluster.wait_leaders()
        with WriteLoad(cluster, n_writers=3) as load:
            load.wait_acked(300, timeout=120)
            if writes == "idle":
                load.stop()
                for s in cluster.servers.values():
                    wait_for(
                        lambda s=s: (
                            _index(s, damaged, "applied_index")
                            == _index(cluster.leader_of(damaged), damaged, "commit_index")
                        ),
                        60,
                        f"{s.id} caught up",
                    )
            follower = cluster.follower_of(damaged)
            follower.terminate()
            directory = follower.config.data_dir / damaged
            if damage == "corrupt_wal":
                # Inside the first record's payload, with records after it: damage, not a
                # torn tail (which recovery would cut off as a crash's half-written write).
                segment = sorted((directory / "wal").glob("*.seg"))[0]
                data = bytearray(segment.read_bytes())
                offset = HEADER_SIZE + 12
                assert len(data) > offset + 200
                data[offset] ^= 0xFF
                segment.write_bytes(bytes(data))
            else:
                (directory / "consensus-meta").unlink()
            follower.start()
            # Repaired from the leader (FAILED at open first, unless the repair was quicker
            # than this look), while its other tablet keeps serving on the same server.
            wait_for(lambda: _copies(follower) >= 1, 120, f"a repair of {damaged}")
            wait_for(lambda: follower.tablet_status(damaged)["state"] != "FAILED", 30, "serving")
            if writes == "under_load":
                load.wait_acked(load.count() + 300, timeout=120)
            assert load.count(other) > 0
        for tablet in (damaged, other):
            cluster.wait_converged(tablet, load.expected(tablet), timeout=60)
        log = follower.log_path.read_text(errors="replace")
        why = "LogCorruption" if damage == "corrupt_wal" else "consensus metadata"
        assert why in log, log[-3000:]
