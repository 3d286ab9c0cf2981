"""One server per data directory: a second ``raftlet tserver`` on a running server's
``--data_dir`` (other ports, so nothing else stops it) exits with one line and touches
nothing -- it once marked every tablet FAILED and its repair copied tablets over the running
server's files -- and a data directory refuses to start under another server's id."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.tserver_cluster import (
    TserverCluster,
    WriteLoad,
    free_ports,
    tserver_that_exits,
)

pytestmark = pytest.mark.integration


def _tserver(cluster: TserverCluster, server_id: str, *flags: str) -> tuple[int | None, str]:
    """A ``raftlet tserver`` of the cluster's config on fresh ports: exit code, stderr."""
    rpc, http = free_ports(2)
    code, out, err = tserver_that_exits(
        cluster,
        *("--server_id", server_id, "--rpc_addr", f"127.0.0.1:{rpc}"),
        *("--http_addr", f"127.0.0.1:{http}", *flags),
    )
    assert "ready" not in out, err  # it started: the lock did not hold
    return code, err


def _files(directory: Path) -> dict[str, int]:
    """Each file's inode, but for consensus-meta's, which the running server itself replaces
    (by rename) when its term or vote changes: an election under the test's load did."""
    return {
        str(p.relative_to(directory)): p.stat().st_ino
        for p in directory.rglob("*")
        if not p.name.startswith("consensus-meta")
    }


def test_a_second_server_on_a_data_dir_in_use_exits_and_touches_nothing(tmp_path: Path) -> None:
    cluster = TserverCluster(tmp_path, partitions=1).start()
    try:
        (tablet,) = cluster.tablet_ids()
        cluster.wait_leaders()
        ts1_dir = cluster.config.server("ts1").data_dir
        with WriteLoad(cluster, n_writers=2, name="before") as load:
            load.wait_acked(20)
        files = _files(ts1_dir / tablet)
        code, stderr = _tserver(cluster, "ts1")
        assert code == 1, stderr
        assert "Traceback" not in stderr, stderr
        assert f"--data_dir {ts1_dir} is in use by another process (pid " in stderr, stderr
        assert f"(pid {cluster.servers['ts1'].pid})" in stderr, stderr
        # Nothing of the running server's replica was replaced, and it goes on.
        assert {k: v for k, v in _files(ts1_dir / tablet).items() if k in files} == files
        with WriteLoad(cluster, n_writers=2, name="after", key_base=500_000) as load:
            load.wait_acked(20)
        cluster.wait_caught_up()
    finally:
        cluster.stop()


def test_a_data_dir_refuses_another_servers_id(tmp_path: Path) -> None:
    cluster = TserverCluster(tmp_path, partitions=1).start()
    try:
        cluster.wait_leaders()
        ts1_dir = cluster.config.server("ts1").data_dir
        assert cluster.servers["ts1"].terminate() == 0
        code, stderr = _tserver(cluster, "ts2", "--data_dir", str(ts1_dir))
        assert code == 2, stderr  # a config error: systemd does not restart on 2
        assert "Traceback" not in stderr, stderr
        assert f"--data_dir {ts1_dir} belongs to server 'ts1', not 'ts2'" in stderr, stderr
        cluster.servers["ts1"].start()  # its owner still may
        cluster.wait_leaders()
    finally:
        cluster.stop()
