"""Clients' write streams over plain TCP: ``TabletService.WriteStream``'s messages without
gRPC (the client side: ``client.aio_tcp_writes``).

Why: on the leader, a write's trip through ``grpc.aio`` -- gRPC's event-engine thread, its
poller, the event loop, and back for the answer -- was most of the CPU a write cost once the
peers' traffic had left gRPC (docs/benchmarks.md, "Client writes over tcp"). Here a
connection's reader thread decodes each frame (a ``WriteStreamRequestPB``) and hands its
writes to the tablet service pool as one call (``offer_writes``, exactly what the gRPC
stream does: the bounded pool and its overflow accounting stay in the path), and the
results go back from the thread that finishes them -- the apply stage, with one
non-blocking ``send`` per connection per pass: a round's answers to one connection leave as
one frame (a ``WriteStreamResponsePB``; ``tserver.deferred_answers``).

A client that sends writes faster than it reads their answers is held back by its window
(``tserver.write_stream``, shared with the gRPC stream): once ``max_outstanding`` writes of
one connection are unanswered, or ``window_bytes`` are held for it -- the bytes of the
frames whose writes are not answered yet, plus the answers the kernel has not taken yet
(``FrameLink.unsent_bytes``) -- its reader stops reading, and TCP pushes back on the
client; a WARNING names it. Counting the answers is what holds back a client that does not
read: an answer counts as done only once it left, not once it was queued. A connection
whose answers wait unsent while it is held back for longer than ``answer_deadline_s`` is
closed (the client retries on another with the same request ids). A frame over the client
limit, one with more writes than ``max_outstanding``, or one that does not decode, closes
the connection without answering any of it (the client refuses frames over the limit
before sending, from the limit ``WriteEndpoint`` gave it). The listener: ``tserver.tcp_listener``;
under TLS it admits only certificates with the writer role or above
(``tserver.tcp_admission``), as the gRPC ``WriteStream`` does.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

from raftlet.cluster.identity import Identity
from raftlet.consensus.rpc.frame_link import FrameLink, LinkClosed, frame
from raftlet.consensus.rpc.receive_limits import FRAME_DEADLINE_S, ReceiveLimits
from raftlet.proto import tablet_pb2
from raftlet.tserver import deferred_answers
from raftlet.tserver.rpc_dispatch import LeaderAddrLookup
from raftlet.tserver.service_pool import ServicePool
from raftlet.tserver.tcp_listener import LinkFactory
from raftlet.tserver.write_stream import (
    MAX_OUTSTANDING_WRITES,
    WRITE_WINDOW_BYTES,
    ReplicaLookup,
    WindowLog,
    offer_writes,
)

__all__ = ["WRITE_TCP_METHOD", "write_links"]

# What refusals on this port are logged as (the gRPC port logs its method names).
WRITE_TCP_METHOD = "/raftlet.TabletService/WriteTcp"

logger = logging.getLogger(__name__)


class _Connection:
    def __init__(
        self, name: str, max_outstanding: int, window_bytes: int, answer_deadline_s: float
    ) -> None:
        self.name = name
        self.link: FrameLink | None = None
        self.outstanding = 0  # writes received and not yet answered
        self.held = 0  # bytes of the frames those writes came in
        self.max_outstanding = max_outstanding
        self.window_bytes = window_bytes
        self.answer_deadline_s = answer_deadline_s
        # The counts are kept under the plain lock (a Condition's own `with` is Python code,
        # paid by every write); the condition is for the reader, when the window is full.
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)
        self.waiting = False  # the reader waits for room (under the lock)
        self.log = WindowLog()

    def received(self, count: int, nbytes: int) -> None:
        with self.lock:
            self.outstanding += count
            self.held += nbytes

    def answered(self, count: int = 1) -> None:
        with self.lock:
            # A frame's bytes are let go as its writes are answered, each write taking an
            # equal share of what is held: no per-write bookkeeping, and nothing is left
            # held once every write is answered.
            if count >= self.outstanding:
                self.held = 0
            else:
                self.held -= self.held * count // self.outstanding
            self.outstanding -= count
            if self.waiting and self._has_room():
                self.room.notify_all()

    def sent(self) -> None:
        """The link's writer handed answers to the kernel: the reader may have room now."""
        with self.lock:
            if self.waiting and self._has_room():
                self.room.notify_all()

    def _has_room(self) -> bool:
        link = self.link
        unsent = 0 if link is None else link.unsent_bytes
        return self.outstanding < self.max_outstanding and self.held + unsent <= self.window_bytes

    def wait_for_room(self) -> None:
        """The reader: hold off reading while the connection's window is full."""
        if self._has_room():
            return  # only this thread adds: a stale count is too high, and is looked at again
        link = self.link
        assert link is not None
        self.log.full(
            self.name,
            self.outstanding,
            self.held + link.unsent_bytes,
            self.max_outstanding,
            self.window_bytes,
        )
        stuck_since: float | None = None  # answers waited unsent from then on
        with self.room:
            self.waiting = True
            try:
                while not self._has_room() and not link.closed:
                    # Closing notifies nobody: look again now and then.
                    self.room.wait(1.0)
                    if not link.unsent_bytes:
                        stuck_since = None
                        continue
                    now = time.monotonic()
                    if stuck_since is None:
                        stuck_since = now
                    elif now - stuck_since > self.answer_deadline_s:
                        logger.warning(
                            "write tcp %s: the client has not read its answers for %g s "
                            "(%d bytes wait to be sent, %d writes unanswered): closing; a "
                            "client must read its answers to keep writing",
                            self.name,
                            self.answer_deadline_s,
                            link.unsent_bytes,
                            self.outstanding,
                        )
                        link.close()
                        return
            finally:
                self.waiting = False


def write_links(
    pool: ServicePool,
    replica_of: ReplicaLookup,
    leader_addr: LeaderAddrLookup,
    *,
    max_frame_bytes: int,
    send_timeout_s: float,
    max_outstanding: int = MAX_OUTSTANDING_WRITES,
    window_bytes: int = WRITE_WINDOW_BYTES,
    receive_limits: ReceiveLimits | None = None,
) -> LinkFactory:
    """The ``TcpListener`` link factory of the write port. A connection's window: at most
    ``max_outstanding`` writes (and so writes per frame) and about ``window_bytes`` of
    frames and unsent answers (one frame more, however large, when it had room); answers
    left unsent for ``receive_limits``' frame deadline while it is full close it."""
    answer_deadline_s = (
        receive_limits.frame_deadline_s if receive_limits is not None else FRAME_DEADLINE_S
    )

    def make(
        conn: socket.socket,
        name: str,
        on_close: Callable[[FrameLink], None],
        peer: Identity | None,  # admitted already: the role is all that mattered
    ) -> FrameLink:
        connection = _Connection(name, max_outstanding, window_bytes, answer_deadline_s)

        def send_frame(results: list[tablet_pb2.WriteStreamResultPB]) -> None:
            link = connection.link
            assert link is not None
            try:
                body = tablet_pb2.WriteStreamResponsePB(results=results).SerializeToString()
                if len(results) > 1 and len(body) > max_frame_bytes:
                    for result in results:  # together over the limit: one frame each
                        send_frame([result])
                    return
                link.send(frame(body))
            except LinkClosed:  # the client is gone: it retries, with the same request id
                pass
            except ValueError:  # an answer over the limit (thousands of row errors)
                logger.warning("write tcp %s: an answer over the frame limit: closing", name)
                link.close()
            except Exception:  # a bug: lose the link (the client retries), not the caller
                logger.exception("write tcp %s: answering failed", name)
                link.close()

        def send(results: list[tablet_pb2.WriteStreamResultPB]) -> None:
            try:
                send_frame(results)
            finally:
                connection.answered(len(results))

        def post(result: tablet_pb2.WriteStreamResultPB) -> None:
            # The apply stage answers a round's writes together: one frame for all of this
            # connection's (tserver.deferred_answers).
            if not deferred_answers.defer(connection, result, send):
                send([result])

        def on_frame(body: bytes) -> None:
            link = connection.link
            assert link is not None
            try:
                request = tablet_pb2.WriteStreamRequestPB.FromString(body)
            except Exception as exc:  # DecodeError: a broken or hostile client
                logger.warning("write tcp %s: undecodable frame (%s): closing", name, exc)
                link.close()
                return
            # Counted before any item becomes a Python object: a frame of empty items costs
            # ~2 bytes each on the wire and an answer of ~40 each (issue: 2 MB of them took
            # a server to 650 MB). No honest client sends more than the window in one frame.
            count = len(request.items)
            if count > connection.max_outstanding:
                logger.warning(
                    "write tcp %s: a frame of %d writes, over the %d a connection may have "
                    "unanswered: closing without answering it; send at most %d per frame",
                    name,
                    count,
                    connection.max_outstanding,
                    connection.max_outstanding,
                )
                link.close()
                return
            if not count:
                return
            connection.received(count, len(body))
            offer_writes(pool, list(request.items), replica_of, leader_addr, post)
            connection.wait_for_room()

        connection.link = FrameLink(
            conn,
            name,
            on_frame,
            on_close,
            max_frame_bytes=max_frame_bytes,
            send_timeout_s=send_timeout_s,
            receive_limits=receive_limits,
            on_sent=connection.sent,
        )
        return connection.link

    return make
