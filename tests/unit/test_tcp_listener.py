"""TcpListener's socket: a free port below the kernel's ephemeral range; IPv6 addresses;
an accept that fails for want of file descriptors; connections refused when it is full;
connections that never handshake."""

from __future__ import annotations

import errno
import logging
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest

from raftlet.cluster.identity import AccessRole, Identity
from raftlet.deploy.certs import ClientSpec, create_certs
from raftlet.metrics.counter import StripedCounter
from raftlet.tserver import tcp_listener
from raftlet.tserver.security import Authenticator, server_ssl_context
from raftlet.tserver.tcp_admission import TcpAdmission
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


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _refused(listener: TcpListener) -> None:
    """Connect, and see the listener close the connection at once."""
    with socket.create_connection(("127.0.0.1", listener.port), timeout=WAIT_S) as sock:
        assert sock.recv(1) == b""


def test_refused_connections_are_counted_and_said_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that reopens each refused connection at once made one WARNING each: 19,438
    lines in 50 s, before any TLS handshake."""
    clock = _Clock()
    refusals = StripedCounter()
    listener = TcpListener(
        "consensus", "127.0.0.1", 0, _no_link, max_connections=0, refusals=refusals, clock=clock
    )
    with caplog.at_level(logging.WARNING, logger=tcp_listener.__name__):
        listener.start()
        try:
            for n in range(1, 6):
                _refused(listener)
                wait_for(lambda n=n: refusals.value() == n, WAIT_S, f"{n} refusals counted")
            lines = [r.getMessage() for r in caplog.records]
            assert len(lines) == 1, lines
            assert "refused 1 connection(s) since the last such line" in lines[0]
            assert "it takes at most 0 connections" in lines[0]
            clock.now += 59.0
            _refused(listener)
            wait_for(lambda: refusals.value() == 6, WAIT_S, "the sixth refusal counted")
            assert len(caplog.records) == 1
            clock.now += 1.0  # a minute after the first line
            _refused(listener)
            wait_for(lambda: len(caplog.records) == 2, WAIT_S, "the next line")
        finally:
            listener.close()
    assert refusals.value() == 7
    # The five held back, and the one that made the line.
    assert "refused 6 connection(s) since the last such line" in caplog.records[1].getMessage()
    assert listener.refusals is refusals


def _server_side_tls(tmp_path: Path) -> tuple[TcpAdmission, ssl.SSLContext]:
    """A write port's admission under TLS, and a writer's client context for it."""
    certs = create_certs(
        tmp_path / "tls", servers=["ts1"], clients=[ClientSpec("app", AccessRole.WRITER)]
    )
    server, client = certs.servers["ts1"], certs.clients["app"]
    context = server_ssl_context(
        str(server.cert), str(server.key), str(certs.ca), ssl.CERT_REQUIRED, "write"
    )
    admission = TcpAdmission(context, Authenticator(None), AccessRole.WRITER, "write")
    dialer = ssl.create_default_context(cafile=str(certs.ca))
    dialer.load_cert_chain(str(client.cert), str(client.key))
    return admission, dialer


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_connections_that_never_handshake_make_way_for_one_that_does(tmp_path: Path) -> None:
    """Before its TLS handshake a connection has shown nothing: a storm of such connections
    held a thread each, up to the port's 1,024, stalled the server and kept real peers out
    (review r32a). At most `max_handshakes` wait; a new one closes the oldest."""
    admission, dialer = _server_side_tls(tmp_path)
    linked: list[Identity | None] = []

    def link(conn: socket.socket, name: str, forget: object, identity: Identity | None) -> Any:
        linked.append(identity)

        class _Link:
            def start(self) -> None:
                pass

            def close(self) -> None:
                conn.close()

            def join(self, timeout: float) -> None:
                pass

        return _Link()

    refusals = StripedCounter()
    listener = TcpListener(
        "write",
        "127.0.0.1",
        0,
        link,
        max_connections=100,
        max_handshakes=2,
        admission=admission,
        refusals=refusals,
    )
    listener.start()
    silent = [socket.create_connection(("127.0.0.1", listener.port), timeout=WAIT_S)]
    try:
        silent.append(socket.create_connection(("127.0.0.1", listener.port), timeout=WAIT_S))
        wait_for(lambda: len(listener._handshaking) == 2, WAIT_S, "two handshakes waiting")
        # A third silent one: the first is closed to make room, the second waits on.
        silent.append(socket.create_connection(("127.0.0.1", listener.port), timeout=WAIT_S))
        assert _closed_by_server(silent[0])
        assert refusals.value() == 1
        # A writer that handshakes gets in while two silent ones wait.
        raw = socket.create_connection(("127.0.0.1", listener.port), timeout=WAIT_S)
        with dialer.wrap_socket(raw, server_hostname="127.0.0.1"):
            wait_for(lambda: linked, WAIT_S, "the writer linked")
        assert linked == [Identity("app", AccessRole.WRITER)]
    finally:
        for s in silent:
            s.close()
        listener.close()
