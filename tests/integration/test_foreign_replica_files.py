"""A replica directory holding a file that is not its own, on real servers: another
tablet's store file copied over this tablet's, or an older consensus-meta put back beside a
log that went on to later terms.  The replica is FAILED at open, with the reason in the
server's log, and repaired by a tablet copy from the leader while the server's other tablet
serves; no acknowledged row is lost or shown twice."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integration.tserver_cluster import (
    Server,
    TserverCluster,
    WriteLoad,
    running_cluster,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FLAGS = ["--tablet_copy_repair_interval_s", "1"]


def _caught_up(cluster: TserverCluster, server: Server, tablet: str) -> None:
    def check() -> bool:
        commit = cluster.leader_of(tablet).tablet_status(tablet)["commit_index"]
        return server.tablet_status(tablet)["applied_index"] == commit

    wait_for(check, 60, f"{server.id} caught up on {tablet}")


def _repaired(follower: Server, tablet: str) -> None:
    """FAILED at open first (unless the repair was quicker than a look), then a copy."""
    wait_for(
        lambda: follower.metric("tablet_copies_installed_total") >= 1, 120, f"a repair of {tablet}"
    )
    wait_for(lambda: follower.tablet_status(tablet)["state"] != "FAILED", 30, "serving")


def test_another_tablets_store_file_fails_the_replica_until_a_copy_repairs_it(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path, partitions=2, flags=FLAGS) as cluster:
        damaged, other = cluster.tablet_ids()
        cluster.wait_leaders()
        with WriteLoad(cluster, n_writers=3) as load:
            load.wait_acked(300, timeout=120)
            load.stop()
            follower = cluster.follower_of(damaged)
            for tablet in (damaged, other):
                _caught_up(cluster, follower, tablet)
            follower.terminate()
            data = follower.config.data_dir
            for leftover in (data / damaged).glob("store.sqlite-*"):
                leftover.unlink()
            shutil.copyfile(data / other / "store.sqlite", data / damaged / "store.sqlite")
            follower.start()
            _repaired(follower, damaged)
        for tablet in (damaged, other):
            cluster.wait_converged(tablet, load.expected(tablet), timeout=60)
        log = follower.log_path.read_text(errors="replace")
        assert f"belongs to tablet '{other}', not to '{damaged}'" in log, log[-3000:]


def test_an_older_consensus_meta_fails_the_replica_until_a_copy_repairs_it(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path, partitions=2, flags=FLAGS) as cluster:
        damaged, other = cluster.tablet_ids()
        cluster.wait_leaders()
        with WriteLoad(cluster, n_writers=3) as load:
            load.wait_acked(100, timeout=120)
            leader = cluster.leader_of(damaged)
            follower = cluster.follower_of(damaged)
            third = next(s for s in cluster.servers.values() if s not in (leader, follower))
            _caught_up(cluster, follower, damaged)
            meta = follower.config.data_dir / damaged / "consensus-meta"
            saved = tmp_path / "old-consensus-meta"
            shutil.copyfile(meta, saved)
            old_term = int(str(follower.tablet_status(damaged)["term"]))
            cluster.move_leader(damaged, third.id)  # two terms later, with writes in them
            cluster.move_leader(damaged, leader.id)
            load.wait_acked(load.count() + 200, timeout=120)
            load.stop()
            _caught_up(cluster, follower, damaged)
            assert int(str(follower.tablet_status(damaged)["term"])) > old_term
            follower.terminate()
            shutil.copyfile(saved, meta)
            follower.start()
            _repaired(follower, damaged)
        for tablet in (damaged, other):
            cluster.wait_converged(tablet, load.expected(tablet), timeout=60)
        log = follower.log_path.read_text(errors="replace")
        assert f"consensus metadata {meta} is older than the log" in log, log[-3000:]
