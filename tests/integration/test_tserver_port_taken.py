"""A tablet server whose RPC address is taken exits at once with one clear line -- exit
code 1, the address named, no traceback -- and leaves nothing running behind it; the
launchers that picked the ports themselves (the test harness, ``raftlet cluster up``) then
start the new cluster again on new ports."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlet.deploy import local
from raftlet.deploy.local import LocalCluster, pid_alive
from tests.integration.tserver_cluster import (
    TserverCluster,
    tserver_that_exits,
)

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def _closing(cluster: TserverCluster) -> Iterator[None]:
    try:
        yield
    finally:
        cluster.stop()


@contextlib.contextmanager
def _taken(address: str) -> Iterator[None]:
    """Someone else listening on ``address`` (host:port) for the block."""
    host, port = address.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind((host, int(port)))
        taken.listen()
        yield


def test_a_taken_rpc_port_is_one_error_line(tmp_path: Path) -> None:
    cluster = TserverCluster(tmp_path, partitions=1)
    rpc_addr = cluster.config.servers[0].rpc_addr
    with _taken(rpc_addr), _closing(cluster):
        code, out, stderr = tserver_that_exits(cluster, "--server_id", "ts1")
    assert code == 1, stderr
    assert "ready" not in out
    assert "Traceback" not in stderr, stderr
    assert f"raftlet tserver: error: cannot listen for RPCs on {rpc_addr}" in stderr, stderr


def test_a_status_port_taken_before_the_first_start_makes_the_harness_pick_new_ports(
    tmp_path: Path,
) -> None:
    cluster = TserverCluster(tmp_path, partitions=1)
    http_addr = cluster.config.servers[1].http_addr
    with _taken(http_addr), _closing(cluster):
        cluster.start()
        assert all(s.alive for s in cluster.servers.values())
        assert cluster.config.servers[1].http_addr != http_addr
        log = (tmp_path / "ts2.log").read_text()
        assert f"cannot listen for status pages on {http_addr}" in log, log
        cluster.wait_leaders()


def test_ports_held_keeps_every_port_of_the_cluster_from_others_until_the_servers_start(
    tmp_path: Path,
) -> None:
    """What a test that opens its own listeners first (link proxies) relies on."""
    cluster = TserverCluster(tmp_path, partitions=1)
    addresses = [a for s in cluster.config.servers for a in (s.rpc_addr, s.http_addr)]
    with _closing(cluster):
        with cluster.ports_held():
            for address in addresses:
                host, port = address.rsplit(":", 1)
                with (
                    socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other,
                    pytest.raises(OSError, match="in use"),
                ):
                    other.bind((host, int(port)))
        cluster.start()  # released: the servers bind them
        started = [a for s in cluster.config.servers for a in (s.rpc_addr, s.http_addr)]
        assert started == addresses


def test_cluster_up_picks_new_ports_when_one_it_picked_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher's kernel-picked ports are free when picked; here the test takes the
    first server's RPC port right after, as another process might."""
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    first: list[int] = []
    pick = local.free_ports

    def pick_then_take(n: int, host: str = "127.0.0.1") -> list[int]:
        ports = pick(n, host)
        if not first:
            first.extend(ports)
            taken.bind((host, ports[0]))
            taken.listen()
        return ports

    monkeypatch.setattr(local, "free_ports", pick_then_take)
    said: list[str] = []
    cluster: LocalCluster | None = None
    with taken:
        try:
            cluster = LocalCluster.create(tmp_path / "c", tablets=1, on_progress=said.append)
            assert all(pid_alive(s.pid) for s in cluster.servers.values())
            assert cluster.config.servers[0].rpc_addr != f"127.0.0.1:{first[0]}"
            assert any("cannot listen for RPCs" in line and "new ports" in line for line in said)
        finally:
            if cluster is not None:
                cluster.down()
