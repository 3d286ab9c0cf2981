"""A client's write window on the write port (tserver/write_tcp_server.py): the reader stops
taking in a connection's frames once the bytes of its unanswered writes and of its answers
not yet sent fill the window, lets a write larger than the window in when it has room,
closes a connection that leaves its answers unread past the deadline, and refuses a frame
of more writes than the window -- without answering any of it."""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from raftlet.consensus.rpc.frame_link import FrameLink
from raftlet.consensus.rpc.receive_limits import ReceiveBudget, ReceiveLimits
from raftlet.proto import tablet_pb2
from raftlet.tserver.tablet_replica import WriteCallbacks
from raftlet.tserver.write_tcp_server import write_links
from tests.unit.inline_pool import InlinePool
from tests.waiting import wait_for

LIMIT = 16 * 1024 * 1024
WINDOW = 64 * 1024
WRITE_BYTES = 10 * 1024  # a frame of one write: ~10 KB
HELD = "held"  # the tablet whose writes wait until the test answers them
ROW_ERRORS = 400  # an answer of ~16 KB on the tablet "big-answers"


class Replica:
    """Writes to HELD wait for ``answer_all``; others are answered at once (with many row
    errors on "big-answers")."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.taken: dict[str, int] = {}
        self.waiting: list[tuple[int, WriteCallbacks]] = []

    def write(self, request: tablet_pb2.WriteRequest, callbacks: WriteCallbacks) -> None:
        with self.lock:
            self.taken[request.tablet_id] = self.taken.get(request.tablet_id, 0) + 1
            if request.tablet_id == HELD:
                self.waiting.append((request.request_id.seq_no, callbacks))
                return
        response = tablet_pb2.WriteResponse(op_index=request.request_id.seq_no)
        if request.tablet_id == "big-answers":
            for i in range(ROW_ERRORS):
                response.row_errors.add(row_index=i, message=f"row {i}: no such key " + "x" * 16)
        callbacks.respond(response)

    def count(self, tablet: str) -> int:
        with self.lock:
            return self.taken.get(tablet, 0)

    def answer_all(self) -> None:
        with self.lock:
            waiting, self.waiting = self.waiting, []
        for seq, callbacks in waiting:
            callbacks.respond(tablet_pb2.WriteResponse(op_index=seq))


class Warnings(logging.Handler):
    """The write port's warnings, waited on: a window-full one is logged just before its
    reader starts waiting."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def count(self, text: str) -> int:
        return sum(text in m for m in list(self.messages))


@pytest.fixture
def warnings() -> Iterator[Warnings]:
    handler = Warnings()
    loggers = [
        logging.getLogger("raftlet.tserver." + m) for m in ("write_stream", "write_tcp_server")
    ]
    for log in loggers:
        log.addHandler(handler)
    yield handler
    for log in loggers:
        log.removeHandler(handler)


class Port:
    """The write port's link factory, with connections made by socketpair."""

    def __init__(self, replica: Replica, deadline_s: float = 60.0, **kw: int) -> None:
        self.make = write_links(
            InlinePool(),  # type: ignore[arg-type]
            lambda _tablet: replica,  # type: ignore[arg-type,return-value]
            lambda _server: "",
            max_frame_bytes=LIMIT,
            send_timeout_s=120.0,
            receive_limits=ReceiveLimits(ReceiveBudget(4 * LIMIT), frame_deadline_s=deadline_s),
            **kw,
        )
        self.links: list[FrameLink] = []
        self.clients: list[socket.socket] = []
        self.closed: list[FrameLink] = []

    def connect(self) -> socket.socket:
        server, client = socket.socketpair()
        link = self.make(server, f"write from test#{len(self.links)}", self.closed.append, None)
        self.links.append(link.start())
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for link in self.links:
            link.close()
            link.join(5.0)


def _frame(tablet: str, first_id: int, count: int = 1, pad: int = WRITE_BYTES) -> bytes:
    request = tablet_pb2.WriteStreamRequestPB()
    for i in range(first_id, first_id + count):
        item = request.items.add(id=i)
        item.request.tablet_id = tablet
        item.request.request_id.seq_no = i
        item.request.ops.add().cells.add(column="v").value.string_value = "x" * pad
    body = request.SerializeToString()
    return struct.pack(">I", len(body)) + body


def _send_in_background(sock: socket.socket, data: bytes) -> threading.Thread:
    """Send all of ``data``; a server that stops reading holds the sender up (TCP), so on
    a thread of its own, which ends when the test closes the socket."""

    def send() -> None:
        with contextlib.suppress(OSError):  # closed by the test
            sock.sendall(data)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _read_answers(sock: socket.socket, n: int) -> list[tablet_pb2.WriteStreamResultPB]:
    sock.settimeout(20.0)
    buf = b""
    results: list[tablet_pb2.WriteStreamResultPB] = []
    while len(results) < n:
        chunk = sock.recv(1 << 20)
        assert chunk, "the server closed the connection"
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">I", buf)[0]:
            (length,) = struct.unpack_from(">I", buf)
            results.extend(tablet_pb2.WriteStreamResponsePB.FromString(buf[4 : 4 + length]).results)
            buf = buf[4 + length :]
    return results


def test_a_connection_whose_writes_are_unanswered_stops_being_read_at_its_window(
    warnings: Warnings,
) -> None:
    replica = Replica()
    port = Port(replica, window_bytes=WINDOW)
    try:
        greedy = port.connect()
        frames = 60  # ~600 KB: over the window many times, under its old bound of 4,096 writes
        _send_in_background(greedy, b"".join(_frame(HELD, i) for i in range(frames)))
        wait_for(lambda: warnings.count("window is full") >= 1, what="the window to fill")
        # Taken in: the frames that fit, and the one that filled it; not one more.
        fit = WINDOW // (WRITE_BYTES + 64) + 1
        assert fit <= replica.count(HELD) <= fit + 1 < frames
        assert "write from test#0" in warnings.messages[-1]

        # Another client still writes on its own connection meanwhile.
        other = port.connect()
        other.sendall(_frame("other", 0))
        assert [r.id for r in _read_answers(other, 1)] == [0]

        # As writes are answered (and the answers read), the reader takes in more.
        drained = threading.Thread(target=_read_answers, args=(greedy, frames), daemon=True)
        drained.start()
        while replica.count(HELD) < frames:
            taken = replica.count(HELD)
            replica.answer_all()
            wait_for(lambda t=taken: replica.count(HELD) > t, what="more writes taken in")  # type: ignore[misc]
        replica.answer_all()
        drained.join(20.0)
        assert not drained.is_alive()
    finally:
        port.close()


def test_answers_the_client_does_not_read_fill_its_window(warnings: Warnings) -> None:
    replica = Replica()
    port = Port(replica, window_bytes=WINDOW)
    try:
        silent = port.connect()  # never reads its answers, of ~16 KB each
        frames = 400
        _send_in_background(
            silent, b"".join(_frame("big-answers", i, pad=10) for i in range(frames))
        )
        wait_for(lambda: warnings.count("window is full") >= 1, what="the window to fill")
        taken = replica.count("big-answers")
        # Answered at once, so only unsent answers can have filled the window: what the
        # kernel's buffers took, plus the window.
        assert taken < frames
        assert port.links[0].unsent_bytes > WINDOW
        assert not port.closed  # a client that reads slowly is held back, not closed
    finally:
        port.close()


def test_a_client_that_leaves_its_answers_unread_past_the_deadline_is_closed(
    warnings: Warnings,
) -> None:
    replica = Replica()
    port = Port(replica, deadline_s=0.5, window_bytes=WINDOW)
    try:
        silent = port.connect()
        _send_in_background(silent, b"".join(_frame("big-answers", i, pad=10) for i in range(400)))
        wait_for(lambda: bool(port.closed), what="the silent client's connection to close")
        assert warnings.count("has not read its answers") == 1
        assert port.links[0].unsent_bytes == 0  # its answers are let go
    finally:
        port.close()


def test_a_write_larger_than_the_window_is_taken_in_when_it_has_room() -> None:
    replica = Replica()
    port = Port(replica, window_bytes=WINDOW)
    try:
        client = port.connect()
        client.sendall(_frame(HELD, 0, pad=4 * WINDOW) + _frame(HELD, 1))
        wait_for(lambda: replica.count(HELD) == 1, what="the large write to be taken in")
        replica.answer_all()
        wait_for(lambda: replica.count(HELD) == 2, what="the next write to be taken in")
        replica.answer_all()
        assert sorted(r.id for r in _read_answers(client, 2)) == [0, 1]
    finally:
        port.close()


def test_a_frame_of_more_writes_than_the_window_closes_the_link_unanswered(
    warnings: Warnings,
) -> None:
    replica = Replica()
    port = Port(replica, max_outstanding=8)
    try:
        client = port.connect()
        # Empty items (2 bytes each), as a hostile client sends them: each would have been
        # answered, at ~20 times the bytes it took.
        client.sendall(struct.pack(">I", 2 * 9) + b"\x0a\x00" * 9 + _frame("other", 0))
        client.settimeout(20.0)
        assert client.recv(1 << 16) == b""  # closed, with no answer to anything
        assert replica.count("") == replica.count("other") == 0
        assert warnings.count("a frame of 9 writes") == 1
        wait_for(lambda: bool(port.closed), what="the link to close")

        # Up to the window in one frame is fine.
        client = port.connect()
        client.sendall(_frame("other", 0, count=8, pad=1))
        assert len(_read_answers(client, 8)) == 8
    finally:
        port.close()
