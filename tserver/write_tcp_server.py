"""Clients' write streams over plain TCP: ``TabletService.WriteStream``'s messages without
gRPC (the client side: ``client.aio_tcp_writes``).

Why: on the leader, a write's trip through ``grpc.aio`` -- gRPC's event-engine thread, its
poller, the event loop, and back for the answer -- was most of the CPU a write cost once the
peers' traffic had left gRPC (docs/benchmarks.md, "Client writes over tcp"). Here a
connection's reader thread decodes each frame (a ``WriteStreamRequestPB``) and hands its
writes to the tablet service pool as one call (``offer_writes``, exactly what the gRPC
stream does: the bounded pool and its overflow accounting stay in the path), and each
write's result is sent as its own frame (a ``WriteStreamResponsePB``) by the thread that
finishes it -- the apply stage, with one non-blocking ``send``.

A client that sends writes faster than it reads their answers is held back: once
``max_outstanding`` writes of one connection are unanswered, its reader stops reading until
some are answered, and TCP pushes back on the client. A frame over the client limit, or one
that does not decode, closes the connection (the client refuses such frames before
sending, from the limit ``WriteEndpoint`` gave it). The listener: ``tserver.tcp_listener``;
under TLS it admits only certificates with the writer role or above
(``tserver.tcp_admission``), as the gRPC ``WriteStream`` does.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from raftlet.cluster.identity import Identity
from raftlet.consensus.rpc.frame_link import FrameLink, LinkClosed, frame
from raftlet.consensus.rpc.receive_limits import ReceiveLimits
from raftlet.proto import tablet_pb2
from raftlet.tserver import deferred_answers
from raftlet.tserver.rpc_dispatch import LeaderAddrLookup
from raftlet.tserver.service_pool import ServicePool
from raftlet.tserver.tcp_listener import LinkFactory
from raftlet.tserver.write_stream import ReplicaLookup, offer_writes

__all__ = ["WRITE_TCP_METHOD", "write_links"]

# What refusals on this port are logged as (the gRPC port logs its method names).
WRITE_TCP_METHOD = "/raftlet.TabletService/WriteTcp"

logger = logging.getLogger(__name__)


class _Connection:
    def __init__(self, max_outstanding: int) -> None:
        self.link: FrameLink | None = None
        self.outstanding = 0  # writes received and not yet answered
        self.max_outstanding = max_outstanding
        # The count is kept under the plain lock (a Condition's own `with` is Python code,
        # paid by every write); the condition is for the reader, when the count is at the cap.
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)

    def received(self, count: int) -> None:
        with self.lock:
            self.outstanding += count

    def answered(self, count: int = 1) -> None:
        with self.lock:
            self.outstanding -= count
            if self.outstanding < self.max_outstanding <= self.outstanding + count:
                self.room.notify_all()

    def wait_for_room(self) -> None:
        """The reader: hold off reading while too many writes wait for their answers."""
        if self.outstanding < self.max_outstanding:
            return  # only this thread adds: a stale count is too high, and is looked at again
        link = self.link
        assert link is not None
        with self.room:
            while self.outstanding >= self.max_outstanding and not link.closed:
                self.room.wait(1.0)  # closing notifies nobody: look again now and then


def write_links(
    pool: ServicePool,
    replica_of: ReplicaLookup,
    leader_addr: LeaderAddrLookup,
    *,
    max_frame_bytes: int,
    send_timeout_s: float,
    max_outstanding: int = 4096,
    receive_limits: ReceiveLimits | None = None,
) -> LinkFactory:
    """The ``TcpListener`` link factory of the write port."""

    def make(
        conn: socket.socket,
        name: str,
        on_close: Callable[[FrameLink], None],
        peer: Identity | None,  # admitted already: the role is all that mattered
    ) -> FrameLink:
        connection = _Connection(max_outstanding)

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
                items = list(tablet_pb2.WriteStreamRequestPB.FromString(body).items)
            except Exception as exc:  # DecodeError: a broken or hostile client
                logger.warning("write tcp %s: undecodable frame (%s): closing", name, exc)
                link.close()
                return
            if not items:
                return
            connection.received(len(items))
            offer_writes(pool, items, replica_of, leader_addr, post)
            connection.wait_for_room()

        connection.link = FrameLink(
            conn,
            name,
            on_frame,
            on_close,
            max_frame_bytes=max_frame_bytes,
            send_timeout_s=send_timeout_s,
            receive_limits=receive_limits,
        )
        return connection.link

    return make
