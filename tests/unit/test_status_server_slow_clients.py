"""The status server under slow and hostile HTTP clients (issue #15, item 5).

A probe with 64 clients each trickling one byte at a time made `/healthz` -- the liveness
probe -- answer 503 every time: each slow client held one of the 64 request threads, and the
per-read timeout never fired while bytes kept coming. Now heads are read by one selector
loop with a deadline for the whole head, so slow clients hold no thread and are cut at the
deadline, and `/healthz` is answered by the loop itself.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from raftlet.metrics.registry import MetricRegistry
from raftlet.metrics.status_server import PageRequest, PageResponse, StatusServer
from tests.waiting import wait_for

HOST = "127.0.0.1"
WAIT = 30.0
SLOW_CLIENTS = 64
HEAD_TIMEOUT_S = 1.5


def _get(server: StatusServer, path: str, timeout: float = WAIT) -> bytes:
    """A whole exchange for ``path``; the raw answer."""
    with socket.create_connection((HOST, server.port), timeout=timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` (EOF or reset); never blocks."""
    try:
        sock.setblocking(False)
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@contextlib.contextmanager
def _trickling(server: StatusServer, n: int) -> Iterator[list[socket.socket]]:
    """``n`` connections that each send one byte of a request head, then another byte every
    0.1 s, until the server closes them or the block ends (a slowloris)."""
    socks = [socket.create_connection((HOST, server.port), timeout=WAIT) for _ in range(n)]
    head = b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"y" * 10_000
    stop = threading.Event()

    def trickle() -> None:
        for i in range(len(head)):
            for sock in socks:
                with contextlib.suppress(OSError):
                    sock.send(head[i : i + 1])
            if stop.wait(0.1):  # the pace of the attack, not a synchronisation
                return

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        yield socks
    finally:
        stop.set()
        thread.join(WAIT)
        for sock in socks:
            sock.close()


@pytest.fixture
def server() -> Iterator[StatusServer]:
    with StatusServer(MetricRegistry(), HOST, 0, request_timeout_s=HEAD_TIMEOUT_S) as s:
        yield s


def test_healthz_answers_while_64_clients_trickle_their_requests(server: StatusServer) -> None:
    with _trickling(server, SLOW_CLIENTS) as socks:
        started = time.monotonic()
        for _ in range(5):
            t0 = time.monotonic()
            answer = _get(server, "/healthz", timeout=2.0)
            assert answer.startswith(b"HTTP/1.0 200")
            assert answer.endswith(b"OK")
            assert time.monotonic() - t0 < 2.0
        # Pages served by request threads too: the slow clients hold none of them.
        assert _get(server, "/metrics", timeout=2.0).startswith(b"HTTP/1.0 200")
        # The slow ones are cut once their head is late, though they keep sending.
        wait_for(lambda: all(_closed_by_server(s) for s in socks), what="slow clients cut")
        elapsed = time.monotonic() - started
        assert elapsed < HEAD_TIMEOUT_S + 10  # at the deadline, not at some later idle read
        assert _get(server, "/healthz").endswith(b"OK")


def test_the_oldest_unfinished_connection_makes_room_for_a_new_one() -> None:
    with StatusServer(MetricRegistry(), HOST, 0, max_pending=4, request_timeout_s=WAIT) as server:
        socks = [socket.create_connection((HOST, server.port), timeout=WAIT) for _ in range(6)]
        try:
            # Accepted in order; the fifth and sixth push out the first two.
            wait_for(lambda: _closed_by_server(socks[0]) and _closed_by_server(socks[1]))
            assert not any(_closed_by_server(s) for s in socks[2:])
            assert _get(server, "/healthz").endswith(b"OK")
        finally:
            for s in socks:
                s.close()


def test_a_head_over_the_limit_is_431(server: StatusServer) -> None:
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 500) for i in range(60))  # ~30 KiB
    with socket.create_connection((HOST, server.port), timeout=WAIT) as sock:
        sock.sendall(b"GET /metrics HTTP/1.0\r\n" + headers + b"\r\n")
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.0 431"), answer[:80]


def test_a_client_that_does_not_read_its_answer_frees_the_thread() -> None:
    big = b"z" * (64 << 20)  # far more than the socket buffers on both sides hold

    def huge(request: PageRequest) -> PageResponse:
        return PageResponse(big, "text/plain")

    with StatusServer(
        MetricRegistry(), HOST, 0, max_connections=1, request_timeout_s=HEAD_TIMEOUT_S
    ) as server:
        server.register_page("/huge", huge)
        with socket.create_connection((HOST, server.port), timeout=WAIT) as reader:
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.sendall(b"GET /huge HTTP/1.0\r\n\r\n")
            # It never reads. The only request thread is freed at the response deadline:
            # then other pages are served again (503 until then).
            wait_for(lambda: _get(server, "/metrics").startswith(b"HTTP/1.0 200"))
