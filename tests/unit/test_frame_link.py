"""FrameLink: length-prefixed frames over one socket, read and written by plain threads."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from raftlet.cluster.identity import AccessRole
from raftlet.consensus.rpc import frame_link
from raftlet.consensus.rpc.frame_link import FrameLink, LinkClosed, frame
from raftlet.consensus.rpc.receive_limits import ReceiveBudget, ReceiveLimits
from raftlet.deploy.certs import ClientSpec, CreatedCerts, create_certs
from raftlet.metrics.every_interval import EveryInterval
from tests.waiting import wait_for

LIMIT = 32 * 1024 * 1024


class End:
    """One end of a link, remembering what it received and whether it closed."""

    def __init__(
        self,
        sock: socket.socket,
        name: str,
        receive_limits: ReceiveLimits | None = None,
        **kw: float,
    ) -> None:
        self.frames: list[bytes] = []
        self.closes = 0
        self.got = threading.Condition()
        self.bursts = 0  # on_burst_end calls: reads that brought whole frames in
        self.link = FrameLink(
            sock,
            name,
            self._on_frame,
            self._on_close,
            max_frame_bytes=int(kw.get("limit", LIMIT)),
            send_timeout_s=kw.get("send_timeout_s", 10.0),
            on_burst_end=self._on_burst_end,
            receive_limits=receive_limits,
        ).start()

    def _on_burst_end(self) -> None:
        with self.got:
            self.bursts += 1

    def _on_frame(self, body: bytes) -> None:
        with self.got:
            self.frames.append(body)
            self.got.notify_all()

    def _on_close(self, _link: FrameLink) -> None:
        with self.got:
            self.closes += 1
            self.got.notify_all()

    def wait_frames(self, n: int, timeout: float = 20.0) -> list[bytes]:
        with self.got:
            assert self.got.wait_for(lambda: len(self.frames) >= n, timeout), len(self.frames)
            return list(self.frames)

    def wait_closed(self, timeout: float = 20.0) -> None:
        with self.got:
            assert self.got.wait_for(lambda: self.closes > 0, timeout)

    def stays_open(self, for_s: float) -> bool:
        """Still open after ``for_s`` (a wait for a close that must not come)."""
        with self.got:
            return not self.got.wait_for(lambda: self.closes > 0, for_s)


@pytest.fixture(params=["plain", "tls"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[socket.socket, socket.socket]]:
    """Both ends of one connection: a socketpair, or loopback TCP with mutual TLS (where
    every SSL call must stay on one thread at a time, FrameLink's lock)."""
    if request.param == "plain":
        a, b = socket.socketpair()
    else:
        a, b = _tls_sockets(request.getfixturevalue("certs"))
    yield a, b
    for s in (a, b):
        s.close()


def test_frames_arrive_whole_and_in_order_both_ways(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = End(pair[0], "a"), End(pair[1], "b")
    try:
        sizes = [0, 1, 3, 70_000, 5, 4 * 1024 * 1024, 2]  # some span many recv calls
        bodies = [os.urandom(n) for n in sizes]
        for body in bodies:
            a.link.send(frame(body))
            b.link.send(frame(body[::-1]))
        assert b.wait_frames(len(bodies)) == bodies
        assert a.wait_frames(len(bodies)) == [x[::-1] for x in bodies]
    finally:
        a.link.close()
        b.link.close()
    a.wait_closed()
    b.wait_closed()


def test_the_peer_closing_closes_the_link_once_and_later_sends_fail(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = End(pair[0], "a"), End(pair[1], "b")
    b.link.close()
    a.wait_closed()
    b.wait_closed()
    with pytest.raises(LinkClosed):
        a.link.send(frame(b"late"))
    a.link.close()  # idempotent
    a.link.join(5)
    assert (a.closes, b.closes) == (1, 1)


def test_a_frame_over_the_limit_is_refused_by_the_sender_and_closes_the_reader(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a = End(pair[0], "a", limit=100)
    with pytest.raises(ValueError, match="exceeds the link's limit of 100"):
        a.link.send(frame(b"x" * 101))
    assert not a.link.closed  # refusing to send breaks nothing
    # A peer that announces a frame over the limit is broken or hostile: closed, unread.
    pair[1].sendall(struct.pack(">I", 101) + b"x" * 101)
    a.wait_closed()
    assert a.frames == []


def test_links_closed_on_what_is_no_frame_are_said_once_a_minute_and_text_as_text(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review r34b: each HTTP request or junk line sent to a plaintext consensus or write
    port logged a WARNING of "a frame of 1195725856 bytes": 400 lines in a second."""
    now = [0.0]
    monkeypatch.setattr(frame_link, "_OVERSIZED_LOG", EveryInterval(60.0, lambda: now[0]))
    caplog.set_level(logging.WARNING, logger=frame_link.__name__)

    def refused(payload: bytes) -> None:
        a, b = socket.socketpair()
        end = End(a, "port from 127.0.0.1:5#1", limit=100)
        b.sendall(payload)
        end.wait_closed()
        for s in (a, b):
            s.close()

    for _ in range(5):
        refused(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "link port from 127.0.0.1:5#1: what it sent is not raftlet's framing (it begins "
        "b'GET / HT', as text or an HTTP request would): closing; said at most once a minute"
    ]
    now[0] += 61
    refused(frame(b"x" * 5) + struct.pack(">I", 101))  # a frame, then one over the limit
    assert caplog.records[-1].getMessage() == (
        "link port from 127.0.0.1:5#1: a frame of 101 bytes exceeds the limit of 100: "
        "closing; said at most once a minute (4 more such link(s) closed since the last line)"
    )


def test_a_peer_that_reads_nothing_breaks_the_link_after_the_send_timeout(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a = End(pair[0], "a", send_timeout_s=0.5)
    big = frame(b"y" * (8 * 1024 * 1024))  # more than the socket buffers hold
    a.link.send(big)  # never blocks: what the kernel did not take waits for the writer
    a.wait_closed(timeout=20)
    with pytest.raises(LinkClosed):
        a.link.send(frame(b"z"))


def test_tcp_connection_between_two_links() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    finally:
        listener.close()
    a, b = End(client, "client"), End(server, "server")
    for k in range(100):
        a.link.send(frame(b"req%d" % k))
    assert b.wait_frames(100)[-1] == b"req99"
    a.link.close()
    b.wait_closed()
    a.wait_closed()  # the closing side reports its own close too


def test_lazy_frames_leave_together_and_before_the_next_ordinary_one(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = End(pair[0], "a"), End(pair[1], "b")
    try:
        # A burst of lazy frames (every tablet's heartbeat) leaves as one write: the reader
        # takes them in with far fewer reads than frames.
        for k in range(50):
            a.link.send(frame(b"hb%d" % k), lazy=True)
        assert b.wait_frames(50) == [b"hb%d" % k for k in range(50)]
        assert b.bursts < 10, b.bursts
        # Lazy frames waiting when an ordinary one is sent go first, in that same send.
        a.link.send(frame(b"lazy"), lazy=True)
        a.link.send(frame(b"now"))
        assert b.wait_frames(52)[50:] == [b"lazy", b"now"]
        # A lazy frame alone still leaves, once the delay is up.
        a.link.send(frame(b"alone"), lazy=True)
        assert b.wait_frames(53)[-1] == b"alone"
    finally:
        a.link.close()
        b.link.close()


class _FullOnce(socket.socket):
    """A socket whose first send finds the kernel's buffer full (EAGAIN), as a peer that
    stopped reading would leave it."""

    full_once = True

    def send(self, data: object, flags: int = 0) -> int:  # type: ignore[override]
        if self.full_once:
            self.full_once = False
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return super().send(data, flags)  # type: ignore[arg-type]


def test_a_send_the_kernel_takes_none_of_goes_whole_to_the_writer() -> None:
    """The chaos suite's find: a full socket buffer on the non-blocking first try must queue
    the frame, not raise into the caller (which holds the consensus lock)."""
    a, b = socket.socketpair()
    flaky = _FullOnce(a.family, a.type, a.proto, fileno=a.detach())
    sender, receiver = End(flaky, "a"), End(b, "b")
    try:
        sender.link.send(frame(b"first"))
        sender.link.send(frame(b"second"))
        assert receiver.wait_frames(2) == [b"first", b"second"]
    finally:
        sender.link.close()
        receiver.link.close()


# --- over TLS ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CreatedCerts:
    """A throwaway CA, a server certificate and a writer's, as ``raftlet certs create``."""
    return create_certs(
        tmp_path_factory.mktemp("certs"),
        servers=["s1"],
        clients=[ClientSpec("app", AccessRole.WRITER)],
        days=1,
    )


def _tls_sockets(certs: CreatedCerts) -> tuple[ssl.SSLSocket, ssl.SSLSocket]:
    """Both ends of a loopback TCP connection, TLS handshaken (mutual, as the tcp ports)."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(certs.servers["s1"].cert, certs.servers["s1"].key)
    server_ctx.load_verify_locations(certs.ca)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=str(certs.ca))
    client_ctx.load_cert_chain(certs.clients["app"].cert, certs.clients["app"].key)
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[ssl.SSLSocket] = []

    def accept() -> None:
        conn, _ = listener.accept()
        conn.settimeout(10)
        accepted.append(server_ctx.wrap_socket(conn, server_side=True))

    acceptor = threading.Thread(target=accept)
    acceptor.start()
    try:
        raw = socket.create_connection(listener.getsockname(), timeout=10)
        client = client_ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    finally:
        acceptor.join(10)
        listener.close()
    assert accepted, "the server side's handshake did not finish"
    return client, accepted[0]


def test_sends_from_many_threads_both_ways_while_both_readers_are_busy(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    # Both ways at once: over TLS every link's reader takes records in while its own
    # senders and writer thread put others out on the same SSL object.
    a, b = End(pair[0], "a"), End(pair[1], "b")
    per_thread, threads = 100, 4
    body_of = {t: bytes([t]) * 60_000 for t in range(threads)}

    def sender(end: End, t: int) -> None:
        for k in range(per_thread):
            end.link.send(frame(body_of[t] + struct.pack(">I", k)))

    workers = [
        threading.Thread(target=sender, args=(end, t)) for end in (a, b) for t in range(threads)
    ]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        for end in (a, b):
            got = end.wait_frames(per_thread * threads, timeout=60)
            seen: dict[int, list[int]] = {t: [] for t in range(threads)}
            for body in got:
                t = body[0]
                assert body[:-4] == body_of[t]
                seen[t].append(struct.unpack(">I", body[-4:])[0])
            assert all(seen[t] == list(range(per_thread)) for t in range(threads))
        assert not a.link.closed
        assert not b.link.closed
    finally:
        a.link.close()
        b.link.close()


# --- receive limits: what the links a server accepts may hold while frames arrive ---------


def _limits(budget_bytes: int = 1 << 30, deadline_s: float = 0.5) -> ReceiveLimits:
    return ReceiveLimits(
        ReceiveBudget(budget_bytes), frame_deadline_s=deadline_s, reserve_above_bytes=1024
    )


def test_a_frame_that_stops_arriving_closes_the_link_at_its_deadline(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    limits = _limits(deadline_s=0.5)
    a = End(pair[0], "a", limits)
    started = time.monotonic()
    pair[1].sendall(struct.pack(">I", 100_000) + b"x" * 50_000)  # half a frame, then nothing
    a.wait_closed(timeout=20)
    assert time.monotonic() - started >= 0.5
    assert a.frames == []
    assert limits.budget.held() == 0  # what it reserved is given back


def test_a_frame_trickling_in_is_held_to_its_first_bytes_deadline(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    # A byte every 0.2 s does not keep a frame alive: its deadline runs from its first bytes.
    a = End(pair[0], "a", _limits(deadline_s=1.0))
    pair[1].sendall(struct.pack(">I", 100) + b"x")
    started = time.monotonic()
    while a.stays_open(0.2):
        assert time.monotonic() - started < 20, "the trickling frame was never cut off"
        try:
            pair[1].sendall(b"x")
        except (BrokenPipeError, ConnectionResetError):
            break  # cut off between the look and this byte: its close is on its way
    a.wait_closed(timeout=20)
    assert time.monotonic() - started >= 1.0
    assert a.frames == []


def test_an_idle_link_between_frames_is_not_closed_by_the_deadline(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a = End(pair[0], "a", _limits(deadline_s=0.3))
    pair[1].sendall(frame(b"one"))
    a.wait_frames(1)
    assert a.stays_open(1.0)  # three deadlines with nothing begun
    pair[1].sendall(frame(b"two"))
    assert a.wait_frames(2) == [b"one", b"two"]
    a.link.close()


@contextlib.contextmanager
def _limited_links(limits: ReceiveLimits, n: int) -> Iterator[list[tuple[End, socket.socket]]]:
    """``n`` links sharing ``limits``, each with the plain socket of its other end (what
    the test sends raw bytes on); all closed after the block."""
    pairs = [socket.socketpair() for _ in range(n)]
    links = [(End(ours, f"link{i}", limits), theirs) for i, (ours, theirs) in enumerate(pairs)]
    try:
        yield links
    finally:
        for end, _ in links:
            end.link.close()
        for s in itertools.chain.from_iterable(pairs):
            s.close()


def test_a_large_frame_waits_for_the_ports_budget_and_then_arrives_whole() -> None:
    limits = _limits(budget_bytes=1_000_000, deadline_s=30.0)
    with _limited_links(limits, 2) as [(a, to_a), (b, to_b)]:
        body_a, body_b = os.urandom(600_000), os.urandom(600_000)
        to_a.sendall(frame(body_a)[:100_000])  # a holds 600,000 of 1,000,000
        wait_for(lambda: limits.budget.held() == 600_000, what="a's reservation")
        sender = threading.Thread(target=to_b.sendall, args=(frame(body_b),))
        # More than one read's worth: b reads the start of its frame, finds no room for the
        # rest and stops reading; TCP holds the sender back.
        sender.start()
        assert b.stays_open(0.5)
        assert b.frames == []
        to_a.sendall(frame(body_a)[100_000:])
        assert a.wait_frames(1) == [body_a]
        assert b.wait_frames(1) == [body_b]  # room once a's frame was whole
        sender.join(10)
        wait_for(lambda: limits.budget.held() == 0, what="every reservation given back")


def test_a_frame_that_finds_no_room_within_its_deadline_closes_only_its_link() -> None:
    limits = _limits(budget_bytes=300_000, deadline_s=0.5)
    with _limited_links(limits, 3) as [(a, to_a), (b, to_b), (c, to_c)]:
        to_a.sendall(struct.pack(">I", 200_000) + b"a")  # reserved, then stalls
        wait_for(lambda: limits.budget.held() == 200_000, what="a's reservation")
        to_b.sendall(struct.pack(">I", 200_000) + b"b")  # no room
        b.wait_closed(timeout=20)
        a.wait_closed(timeout=20)  # a's own deadline passes too
        assert limits.budget.held() == 0
        # Small frames never wait for the budget, whatever it holds.
        limits.budget.reserve(300_000, 1.0)
        to_c.sendall(frame(b"small"))
        assert c.wait_frames(1) == [b"small"]
        limits.budget.release(300_000)


def test_a_link_closed_while_its_frame_waits_for_room_ends_at_once() -> None:
    limits = _limits(budget_bytes=300_000, deadline_s=60.0)
    limits.budget.reserve(300_000, 1.0)  # every byte held elsewhere
    with _limited_links(limits, 1) as [(a, peer)]:
        peer.sendall(struct.pack(">I", 200_000) + b"x")
        assert a.stays_open(0.3)
        started = time.monotonic()
        a.link.close()
        a.wait_closed(timeout=20)
        assert time.monotonic() - started < 10  # not the frame's 60 s
    limits.budget.release(300_000)


def test_a_budget_grants_a_frame_larger_than_itself_once_nothing_else_is_held() -> None:
    budget = ReceiveBudget(100)
    assert budget.reserve(500, 0.0)  # the port's frame limit decides what is too large
    assert not budget.reserve(1, 0.05)
    budget.release(500)
    assert budget.reserve(60, 0.0)
    assert not budget.reserve(60, 0.05)
    assert budget.held() == 60


def _link_threads(name: str) -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.endswith(f":{name}")}


def test_a_link_starts_its_writer_only_when_a_send_must_wait(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """A thousand idle client connections held a thousand idle writer threads besides their
    readers (review r32a): a link whose sends the kernel takes at once needs no writer."""
    a = End(pair[0], "idle-a")
    b: End | None = None
    try:
        a.link.send(frame(b"small"))
        assert _link_threads("idle-a") == {"link-read:idle-a"}
        # Nobody reads the other end yet: the kernel's buffers take a part of this frame at
        # most, and the rest is queued for the writer, which starts for it.
        big = os.urandom(32 * 1024 * 1024 - 64)
        a.link.send(frame(big))
        assert "link-write:idle-a" in _link_threads("idle-a")
        b = End(pair[1], "idle-b")
        assert b.wait_frames(2) == [b"small", big]
    finally:
        a.link.close()
        if b is not None:
            b.link.close()
    assert b is not None
    a.wait_closed()
    b.wait_closed()
    a.link.join(5)
    assert not _link_threads("idle-a")
    assert pair[0].fileno() == -1  # closed once both of its threads ended


def test_a_writer_that_cannot_start_closes_the_link() -> None:
    """Out of threads (the condition a connection storm makes), the queued bytes had no one
    to send them, the socket was never closed, and the send raised a RuntimeError."""
    left, right = socket.socketpair()
    a = End(left, "no-writer")
    try:

        def refuse() -> None:
            raise RuntimeError("can't start new thread")

        a.link._writer.start = refuse  # type: ignore[method-assign]
        with pytest.raises(LinkClosed, match="no writer thread"):
            a.link.send(frame(os.urandom(32 * 1024 * 1024 - 64)))  # nobody reads right
        a.wait_closed()
        a.link.join(5)
        wait_for(lambda: left.fileno() == -1, 5, "the socket closed")
        with pytest.raises(LinkClosed):
            a.link.send(frame(b"late"))
    finally:
        right.close()
        left.close()
