"""TcpListener's socket: a free port below the kernel's ephemeral range; IPv6 addresses."""

from __future__ import annotations

import socket

import pytest

from raftlet.tserver.tcp_listener import _ephemeral_low, bind_listener
from tests.ipv6 import needs_ipv6_loopback
from tests.waiting import WAIT_S


def test_a_listener_on_port_0_stays_below_the_kernels_ephemeral_range() -> None:
    """Launchers reserve servers' RPC ports by asking the kernel (bind to port 0): a tcp
    listener must not be handed one of those before its owner starts."""
    socks = [bind_listener("127.0.0.1", 0) for _ in range(20)]
    try:
        ports = [s.getsockname()[1] for s in socks]
        assert len(set(ports)) == 20
        assert all(10_000 <= p < _ephemeral_low() for p in ports), ports
    finally:
        for s in socks:
            s.close()


@needs_ipv6_loopback
@pytest.mark.parametrize("host", ["[::1]", "::1"])
def test_a_listener_binds_an_ipv6_address_written_as_the_config_writes_it(host: str) -> None:
    """cluster.toml writes IPv6 in brackets ("[::1]:7051"); the server once passed "[::1]"
    to the socket API, which looked it up as a host name and refused to start."""
    for port in (0, _free_ipv6_port()):
        with bind_listener(host, port) as sock:
            assert sock.family == socket.AF_INET6
            bound = sock.getsockname()[1]
            assert port in (0, bound)
            with socket.create_connection(("::1", bound), timeout=WAIT_S):
                conn, _ = sock.accept()
                conn.close()


def _free_ipv6_port() -> int:
    with socket.create_server(("::1", 0), family=socket.AF_INET6) as s:
        return int(s.getsockname()[1])
