"""A tablet server whose RPC address is taken exits at once with one clear line -- exit
code 1, the address named, no traceback -- and leaves nothing running behind it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.tserver_cluster import REPO, START_TIMEOUT_S, TserverCluster

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def _closing(cluster: TserverCluster) -> Iterator[None]:
    try:
        yield
    finally:
        cluster.stop()


def test_a_taken_rpc_port_is_one_error_line(tmp_path: Path) -> None:
    cluster = TserverCluster(tmp_path, partitions=1)
    rpc_addr = cluster.config.servers[0].rpc_addr
    host, port = rpc_addr.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken, _closing(cluster):
        taken.bind((host, int(port)))
        taken.listen()
        proc = subprocess.Popen(
            [sys.executable, "-m", "raftlet", "tserver", "--config", str(cluster.path),
             "--server_id", "ts1"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = proc.communicate(timeout=START_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stderr = err.decode()
    assert proc.returncode == 1, stderr
    assert b"ready" not in out
    assert "Traceback" not in stderr, stderr
    assert f"raftlet tserver: error: cannot listen for RPCs on {rpc_addr}" in stderr, stderr
