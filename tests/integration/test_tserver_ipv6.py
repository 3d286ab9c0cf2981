"""A server whose config gives IPv6 addresses (``rpc_addr = "[::1]:PORT"``, which the config
accepts) starts, says where its status pages are, and takes writes. It once exited at once:
the brackets went to the socket API, which looked "[::1]" up as a host name."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.tserver_cluster import REPO, START_TIMEOUT_S, _read_line, wait_for
from tests.ipv6 import needs_ipv6_loopback

pytestmark = pytest.mark.integration


def _free_ipv6_ports(n: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        socks = [
            stack.enter_context(socket.create_server(("::1", 0), family=socket.AF_INET6))
            for _ in range(n)
        ]
        return [s.getsockname()[1] for s in socks]


def _start(config: Path, server_id: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "raftlet", "tserver", "--config", str(config),
             "--server_id", server_id, "--empty_dir_wait_s=0"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=err,
        )  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


def _tcp_links_out(http: int) -> float:
    """The server's open consensus tcp connections to peers (0 when it cannot be asked)."""
    try:
        with urllib.request.urlopen(f"http://[::1]:{http}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "consensus_tcp_connections" and sample.labels.get("direction") == "out"
    )


@needs_ipv6_loopback
def test_servers_on_ipv6_addresses_serve_and_replicate_over_tcp(tmp_path: Path) -> None:
    """Three servers: each starts and says where its status pages are, writes are taken,
    and peers reach each other's consensus tcp port (the bracketed host went to the socket
    API there too, and Raft stayed on the slower gRPC stream without a word)."""
    ports = _free_ipv6_ports(6)
    servers = "".join(
        f'[[servers]]\nid = "ts{i + 1}"\nrpc_addr = "[::1]:{ports[2 * i]}"\n'
        f'http_addr = "[::1]:{ports[2 * i + 1]}"\n\n'
        for i in range(3)
    )
    config = tmp_path / "cluster.toml"
    config.write_text(
        '[cluster]\nname = "v6"\n\n' + servers + '[[tables]]\nname = "kv"\npartitions = 2\n'
        'replication_factor = 3\ncolumns = [{ name = "key", type = "INT64", key = true }]\n'
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(3):
            log = tmp_path / f"ts{i + 1}.log"
            procs.append(_start(config, f"ts{i + 1}", log))
            line = _read_line(procs[-1], START_TIMEOUT_S)
            assert "ready" in line, log.read_text(errors="replace")
            url = f"http://[::1]:{ports[2 * i + 1]}/"
            assert line.endswith(f"status {url}"), line
        with urllib.request.urlopen(f"{url}healthz", timeout=START_TIMEOUT_S) as r:
            assert r.read() == b"OK"
        write = subprocess.run(
            [sys.executable, "-m", "raftlet", "write", "--cluster", str(config),
             "--rows", "50", "--no-progress", "--format", "json"],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert write.returncode == 0, write.stderr
        assert '"failed_rows": 0' in write.stdout, write.stdout
        # Each tablet's leader links to its two followers.
        wait_for(
            lambda: sum(_tcp_links_out(ports[2 * i + 1]) for i in range(3)) >= 2,
            30,
            "consensus tcp links between the servers",
        )
    finally:
        for proc in procs:
            _stop(proc)
