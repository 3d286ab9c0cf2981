"""chaos/link_proxy.py: a cut link moves no bytes but keeps its connections (a partition,
not a crash), heal delivers what waited, reset closes, and a ProxyNetwork cuts the right
links for a partition and releases every port and its thread on close.

"Nothing arrives" is asserted by a receive with a timeout that must expire; every wait for
something that should happen has a deadline."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from raftlet.chaos.link_proxy import CHUNK_BYTES, LinkProxy, ProxyNetwork
from raftlet.cluster import parse_host_port
from tests import waiting

QUIET_S = 0.3  # how long "nothing arrives" is watched for
WAIT_S = 10.0


def _addr(address: str) -> tuple[str, int]:
    return parse_host_port(address)


def recv_exactly(sock: socket.socket, n: int, timeout: float = WAIT_S) -> bytes:
    sock.settimeout(timeout)
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise AssertionError(f"EOF after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def assert_silent(sock: socket.socket, what: str) -> None:
    """Nothing (not even an EOF) arrives on ``sock`` for QUIET_S."""
    sock.settimeout(QUIET_S)
    try:
        data = sock.recv(1024)
    except TimeoutError:
        return
    raise AssertionError(f"{what}: expected nothing, got {data!r}")


class Target:
    """A listening socket the test accepts on itself, so it holds both ends of a link."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted: list[socket.socket] = []

    def accept(self, timeout: float = WAIT_S) -> socket.socket:
        self.listener.settimeout(timeout)
        sock, _ = self.listener.accept()
        self.accepted.append(sock)
        return sock

    def close(self) -> None:
        for s in [self.listener, *self.accepted]:
            s.close()


class EchoServer:
    """Echoes every connection's bytes back, one thread per connection."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self._conns.append(sock)
            t = threading.Thread(target=self._echo, args=(sock,), daemon=True)
            self._threads.append(t)
            t.start()

    @staticmethod
    def _echo(sock: socket.socket) -> None:
        try:
            while data := sock.recv(CHUNK_BYTES):
                sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        # shutdown() wakes the accept() blocked in the other thread; close() alone may not.
        for s in [self.listener, *self._conns]:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for t in [self._accepting, *self._threads]:
            t.join(WAIT_S)
            assert not t.is_alive()


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target()
    yield t
    t.close()


@pytest.fixture
def proxy(target: Target) -> Iterator[LinkProxy]:
    with LinkProxy(target.address, name="test") as p:
        yield p


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    e = EchoServer()
    yield e
    e.close()


def connect(address: str) -> socket.socket:
    return socket.create_connection(_addr(address), timeout=WAIT_S)


@pytest.fixture
def pair(proxy: LinkProxy, target: Target) -> Iterator[tuple[socket.socket, socket.socket]]:
    """(client end, target end) of one connection through ``proxy``."""
    client = connect(proxy.address)
    server = target.accept()
    yield client, server
    client.close()


# --- forwarding ------------------------------------------------------------------------------


def test_bytes_are_forwarded_both_ways_through_an_echo_server(echo: EchoServer) -> None:
    payload = os.urandom(3 * 1024 * 1024 + 17)  # many chunks, an odd tail
    with LinkProxy(echo.address) as proxy, connect(proxy.address) as client:
        sender = threading.Thread(target=client.sendall, args=(payload,))
        sender.start()
        assert recv_exactly(client, len(payload)) == payload
        sender.join(WAIT_S)
        # Many small messages, each answered before the next: the Raft pattern.
        for i in range(500):
            msg = b"m%05d" % i
            client.sendall(msg)
            assert recv_exactly(client, len(msg)) == msg
        assert proxy.bytes_forwarded == 2 * (len(payload) + 500 * 6)


def test_half_close_passes_each_fin_on_separately(
    proxy: LinkProxy, pair: tuple[socket.socket, socket.socket]
) -> None:
    client, server = pair
    client.sendall(b"request")
    client.shutdown(socket.SHUT_WR)
    assert recv_exactly(server, 7) == b"request"
    server.settimeout(WAIT_S)
    assert server.recv(10) == b""  # the client's FIN
    server.sendall(b"answer after the client's FIN")
    assert recv_exactly(client, 29) == b"answer after the client's FIN"
    server.close()
    client.settimeout(WAIT_S)
    assert client.recv(10) == b""
    waiting.wait_for(lambda: proxy.connection_count() == 0, WAIT_S, "the connection closed")


def test_a_closed_target_port_closes_the_client(target: Target) -> None:
    address = target.address
    target.listener.close()  # nothing listens there now
    with LinkProxy(address) as proxy:
        # The proxy accepts, its dial is refused, and it resets the client: the reset may
        # already be there when connect() returns, or reach the first recv().
        with contextlib.suppress(ConnectionResetError), connect(proxy.address) as client:
            client.settimeout(WAIT_S)
            assert client.recv(10) == b""
        waiting.wait_for(lambda: proxy.connection_count() == 0, WAIT_S, "the connection closed")


# --- cut, heal, reset ------------------------------------------------------------------------


def test_a_cut_stops_both_directions_and_heal_delivers_the_same_bytes(
    proxy: LinkProxy, pair: tuple[socket.socket, socket.socket]
) -> None:
    client, server = pair
    client.sendall(b"before")
    assert recv_exactly(server, 6) == b"before"

    proxy.cut()
    assert proxy.is_cut
    client.sendall(b"to the server")
    server.sendall(b"to the client")
    assert_silent(server, "target end while cut")
    assert_silent(client, "client end while cut")
    assert proxy.connection_count() == 1  # kept open, as behind a partition

    proxy.heal()
    assert recv_exactly(server, 13) == b"to the server"
    assert recv_exactly(client, 13) == b"to the client"


def test_a_cut_hides_a_close_until_heal(
    proxy: LinkProxy, pair: tuple[socket.socket, socket.socket]
) -> None:
    client, server = pair
    proxy.cut()
    server.sendall(b"last words")
    server.close()
    assert_silent(client, "client end while cut")  # neither the bytes nor the FIN
    proxy.heal()
    assert recv_exactly(client, 10) == b"last words"
    client.settimeout(WAIT_S)
    assert client.recv(10) == b""


def test_a_cut_pushes_back_on_the_sender(
    proxy: LinkProxy, pair: tuple[socket.socket, socket.socket]
) -> None:
    """A cut proxy stops reading, so the sender's kernel buffers fill and its writes stop:
    TCP flow control, not an unbounded buffer in the proxy."""
    client, server = pair
    proxy.cut()
    client.setblocking(False)
    sent = 0
    chunk = b"x" * CHUNK_BYTES
    while True:
        try:
            sent += client.send(chunk)
        except BlockingIOError:
            break
        assert sent < 256 * 1024 * 1024, "the sender was never pushed back"
    assert_silent(server, "target end while cut")
    proxy.heal()
    assert len(recv_exactly(server, sent, timeout=30)) == sent


def test_a_connection_made_during_a_cut_gets_nothing_until_heal(
    proxy: LinkProxy, target: Target
) -> None:
    proxy.cut()
    with connect(proxy.address) as client:  # accepted by the proxy...
        client.sendall(b"hello")
        with pytest.raises(TimeoutError):  # ...but the target is not even dialled
            target.accept(timeout=QUIET_S)
        assert_silent(client, "client end while cut")
        assert proxy.connection_count() == 1
        proxy.heal()
        server = target.accept()
        assert recv_exactly(server, 5) == b"hello"
        server.sendall(b"hi")
        assert recv_exactly(client, 2) == b"hi"


def test_reset_closes_every_connection_abortively(
    proxy: LinkProxy, target: Target, pair: tuple[socket.socket, socket.socket]
) -> None:
    client, server = pair
    assert proxy.reset() == 1
    for end in (client, server):
        end.settimeout(WAIT_S)
        with pytest.raises(ConnectionResetError):
            end.recv(10)
    assert proxy.connection_count() == 0
    # The link itself still works.
    with connect(proxy.address) as again:
        again.sendall(b"again")
        assert recv_exactly(target.accept(), 5) == b"again"


def test_reset_of_a_cut_link_keeps_it_cut(
    proxy: LinkProxy, target: Target, pair: tuple[socket.socket, socket.socket]
) -> None:
    proxy.cut()
    assert proxy.reset() == 1
    assert proxy.is_cut
    with connect(proxy.address) as client:
        client.sendall(b"x")
        with pytest.raises(TimeoutError):
            target.accept(timeout=QUIET_S)


def test_cut_and_heal_from_many_threads_leave_a_consistent_state(
    proxy: LinkProxy, pair: tuple[socket.socket, socket.socket]
) -> None:
    client, server = pair

    def flap() -> None:
        for _ in range(50):
            proxy.cut()
            proxy.heal()

    threads = [threading.Thread(target=flap) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not proxy.is_cut
    client.sendall(b"still here")
    assert recv_exactly(server, 10) == b"still here"


# --- ProxyNetwork ----------------------------------------------------------------------------


def network(n: int) -> ProxyNetwork:
    # Nothing needs to listen at the targets: these tests make no connection through them.
    return ProxyNetwork({f"ts{i}": f"127.0.0.1:{9000 + i}" for i in range(1, n + 1)})


def links_between(a: set[str], b: set[str]) -> set[tuple[str, str]]:
    return {(x, y) for x in a for y in b} | {(y, x) for x in a for y in b}


def test_one_proxy_per_directed_link_and_the_flag_for_each_server() -> None:
    with network(3) as net:
        assert sorted(net.links()) == sorted(
            (a, b) for a in ("ts1", "ts2", "ts3") for b in ("ts1", "ts2", "ts3") if a != b
        )
        assert len({net.proxy(*link).port for link in net.links()}) == 6
        assert net.proxy("ts1", "ts2").target == "127.0.0.1:9002"
        flag = net.peer_addresses_flag("ts1")
        assert flag == (
            f"ts2={net.proxy('ts1', 'ts2').address},ts3={net.proxy('ts1', 'ts3').address}"
        )
        assert net.peer_addresses("ts2") == {
            "ts1": net.proxy("ts2", "ts1").address,
            "ts3": net.proxy("ts2", "ts3").address,
        }
        assert net.cut_links() == set()


def test_cut_isolate_partition_and_heal_with_3_servers() -> None:
    with network(3) as net:
        net.cut("ts1", "ts2")
        assert net.cut_links() == {("ts1", "ts2")}
        net.cut_both("ts2", "ts3")
        assert net.cut_links() == {("ts1", "ts2"), ("ts2", "ts3"), ("ts3", "ts2")}
        net.heal()
        assert net.cut_links() == set()

        net.isolate("ts1")
        assert net.cut_links() == links_between({"ts1"}, {"ts2", "ts3"})
        assert net.proxy("ts1", "ts2").is_cut
        assert not net.proxy("ts2", "ts3").is_cut

        # partition replaces what was cut before.
        net.partition([{"ts1", "ts2"}, {"ts3"}])
        assert net.cut_links() == links_between({"ts1", "ts2"}, {"ts3"})
        net.partition([["ts1", "ts2", "ts3"]])
        assert net.cut_links() == set()
        net.partition([{"ts2", "ts3"}])  # ts1 in no group: isolated
        assert net.cut_links() == links_between({"ts1"}, {"ts2", "ts3"})
        net.heal()
        assert net.cut_links() == set()


def test_partition_with_5_servers() -> None:
    ids = {f"ts{i}" for i in range(1, 6)}
    with network(5) as net:
        net.partition([{"ts1", "ts2"}, {"ts3", "ts4", "ts5"}])
        assert net.cut_links() == links_between({"ts1", "ts2"}, {"ts3", "ts4", "ts5"})
        assert len(net.cut_links()) == 12

        net.partition([{"ts1", "ts2"}, {"ts3", "ts4"}])  # ts5 isolated
        expected = links_between({"ts1", "ts2"}, {"ts3", "ts4"}) | links_between(
            {"ts5"}, ids - {"ts5"}
        )
        assert net.cut_links() == expected
        assert len(expected) == 16

        net.partition([])  # everyone isolated: every link cut
        assert net.cut_links() == set(net.links())
        assert len(net.cut_links()) == 20

        net.heal()
        net.isolate("ts3")
        net.isolate("ts4")
        assert net.cut_links() == links_between({"ts3", "ts4"}, ids - {"ts3", "ts4"}) | {
            ("ts3", "ts4"),
            ("ts4", "ts3"),
        }


def test_bad_arguments_are_refused() -> None:
    with network(3) as net:
        with pytest.raises(ValueError, match=r"unknown server id 'ts9' \(known: ts1, ts2, ts3\)"):
            net.cut("ts1", "ts9")
        with pytest.raises(ValueError, match="two different servers"):
            net.cut("ts1", "ts1")
        with pytest.raises(ValueError, match="unknown server id"):
            net.isolate("nope")
        with pytest.raises(ValueError, match="'ts2' is in two groups"):
            net.partition([{"ts1", "ts2"}, {"ts2", "ts3"}])
        with pytest.raises(ValueError, match="unknown server id"):
            net.partition([{"ts1", "x"}])
        assert net.cut_links() == set()  # a refused partition changed nothing


def test_a_cut_is_per_direction(echo: EchoServer) -> None:
    """Link (a, b) carries what a dials b for; cutting it leaves b → a alone."""
    with ProxyNetwork({"a": echo.address, "b": echo.address}) as net:
        ab = connect(net.proxy("a", "b").address)
        ba = connect(net.proxy("b", "a").address)
        with ab, ba:
            net.cut("a", "b")
            ab.sendall(b"ab")
            ba.sendall(b"ba")
            assert recv_exactly(ba, 2) == b"ba"
            assert_silent(ab, "a → b while cut")
            net.heal()
            assert recv_exactly(ab, 2) == b"ab"


def test_close_releases_every_port_and_the_thread(echo: EchoServer) -> None:
    net = ProxyNetwork({"a": echo.address, "b": echo.address, "c": echo.address})
    ports = [net.proxy(*link).port for link in net.links()]
    client = connect(net.proxy("a", "b").address)
    client.sendall(b"x")
    assert recv_exactly(client, 1) == b"x"
    net.cut("a", "c")
    net.close()
    net.close()  # idempotent
    assert not any(t.name == "link-proxy-network" for t in threading.enumerate())
    client.settimeout(WAIT_S)
    with pytest.raises(ConnectionResetError):
        client.recv(1)
    client.close()
    for port in ports:  # each one can be listened on again
        socket.create_server(("127.0.0.1", port)).close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)


def test_a_standalone_proxy_stops_its_own_thread(target: Target) -> None:
    proxy = LinkProxy(target.address, name="standalone")
    thread = proxy.loop.thread
    assert thread.is_alive()
    proxy.close()
    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        proxy.cut()
