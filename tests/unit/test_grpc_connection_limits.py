"""The gRPC server's connection bounds (``tserver.grpc_limits.server_limit_options``): at
most so many connections per listening port, and a connection that never finishes its
handshake is closed. A server takes connections from anyone before a call shows who they
are (the token port especially), and each one holds a descriptor the WAL also needs."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from raftlet.tserver.grpc_limits import server_limit_options
from tests.waiting import wait_for

CAP = 3
# Short for the test that waits it out; long where connections must outlive the test.
SHORT_HANDSHAKE_MS = 1500
LONG_HANDSHAKE_MS = 120_000


class _Raw:
    """A TCP connection that sends nothing, and tells whether the server has closed it."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.setblocking(False)
        self._closed = False

    def closed_by_server(self) -> bool:
        while not self._closed:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return False
            except ConnectionResetError:
                data = b""
            self._closed = data == b""
        return True

    def close(self) -> None:
        self.sock.close()


@contextmanager
def _two_ports(handshake_ms: int) -> Iterator[tuple[int, int]]:
    server = grpc.server(
        ThreadPoolExecutor(4),
        options=server_limit_options(
            max_connections_per_port=CAP, handshake_timeout_ms=handshake_ms
        ),
    )
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    ports = (server.add_insecure_port("127.0.0.1:0"), server.add_insecure_port("127.0.0.1:0"))
    server.start()
    try:
        yield ports
    finally:
        server.stop(None)


def _check(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status)


def test_a_port_closes_connections_over_its_cap_and_the_other_port_still_serves() -> None:
    with _two_ports(LONG_HANDSHAKE_MS) as (full, other):
        held = [_Raw(full) for _ in range(CAP)]
        one_more = _Raw(full)
        try:
            wait_for(one_more.closed_by_server, 10, "the connection over the cap closed")
            assert not any(r.closed_by_server() for r in held)
            assert _check(other) == health_pb2.HealthCheckResponse.SERVING
        finally:
            for r in [*held, one_more]:
                r.close()


def test_connections_that_never_handshake_are_closed_and_free_their_places() -> None:
    with _two_ports(SHORT_HANDSHAKE_MS) as (port, _):
        held = [_Raw(port) for _ in range(CAP)]
        try:
            wait_for(
                lambda: all(r.closed_by_server() for r in held),
                10 + SHORT_HANDSHAKE_MS / 1000,
                "the silent connections closed at the handshake timeout",
            )
            assert _check(port) == health_pb2.HealthCheckResponse.SERVING
        finally:
            for r in held:
                r.close()
