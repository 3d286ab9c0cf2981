"""TcpListener's socket: a free port below the kernel's ephemeral range; IPv6 addresses;
an accept that fails for want of file descriptors."""

from __future__ import annotations

import errno
import logging
import socket

import pytest

from raftlet.tserver import tcp_listener
from raftlet.tserver.tcp_listener import TcpListener, _ephemeral_low, bind_listener
from tests.ipv6 import needs_ipv6_loopback
from tests.waiting import WAIT_S, wait_for


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


def _no_link(*_args: object) -> None:
    raise AssertionError("no connection is ever accepted here")


class _OutOfDescriptors:
    """A listening socket whose every accept fails as a process out of descriptors does
    (the connection stays queued, so each try fails at once)."""

    def __init__(self, real: socket.socket) -> None:
        self._real = real
        self.tries = 0

    def accept(self) -> tuple[socket.socket, object]:
        self.tries += 1
        raise OSError(errno.EMFILE, "Too many open files")

    def shutdown(self, how: int) -> None:
        self._real.shutdown(how)

    def close(self) -> None:
        self._real.close()


def test_an_accept_out_of_descriptors_waits_between_tries_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """It tried again at once: a core spun and every try logged a traceback."""
    monkeypatch.setattr(tcp_listener, "_ACCEPT_RETRY_S", 0.01)
    listener = TcpListener("peer", "127.0.0.1", 0, _no_link, max_connections=4)
    fake = _OutOfDescriptors(listener._sock)
    listener._sock = fake
    with caplog.at_level(logging.ERROR):
        listener.start()
        wait_for(lambda: fake.tries >= 5, WAIT_S, "five tries")
        listener.close()
    errors = [r for r in caplog.records if r.name == tcp_listener.__name__]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "cannot accept connections (Too many open files); retrying" in errors[0].getMessage()
    assert errors[0].exc_info is None
