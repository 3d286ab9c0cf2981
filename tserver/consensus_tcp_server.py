"""The server side of the tcp consensus transport (``consensus.rpc.tcp_transport`` is the
client side): a listening socket, and one ``FrameLink`` per peer that dialed it.

A connection's reader thread steps each request as it arrives (``step_item``, as the gRPC
stream's session does on a pool thread), in arrival order; the answer is sent on the same
connection by whichever thread completes it -- a follower's append by the WAL appender that
made it durable, with one non-blocking ``send``.  So a request crosses one thread hand-off
on a follower (reader → appender) and its answer none.

The listener carries no TLS and checks no identity, so the server starts it only when it
runs without TLS, where anyone who can reach the RPC port may send the same requests on
``ConsensusService.Stream``.  A connection that sends a frame over the peers' message limit
or one that does not decode is closed; at most ``max_connections`` are open at once (a peer
server needs one).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import threading
from collections.abc import Callable

from raftlet.consensus.rpc.codec import WireRequest
from raftlet.consensus.rpc.frame_link import FrameLink, LinkClosed, frame
from raftlet.proto import consensus_pb2 as pb
from raftlet.tserver.consensus_handler import ConsensusRequestHandler
from raftlet.tserver.consensus_stream_server import step_item

__all__ = ["TcpConsensusListener"]

logger = logging.getLogger(__name__)

_connections = itertools.count(1)


class TcpConsensusListener:
    def __init__(
        self,
        host: str,
        port: int,
        handler: ConsensusRequestHandler,
        *,
        max_frame_bytes: int,
        send_timeout_s: float,
        check: Callable[[WireRequest], None] | None = None,
        max_connections: int = 64,
    ) -> None:
        self._handler = handler
        self._check = check
        self._max_frame_bytes = max_frame_bytes
        self._send_timeout_s = send_timeout_s
        self._max_connections = max_connections
        self._sock = socket.create_server((host, port))
        self.port: int = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._links: set[FrameLink] = set()
        self._closed = False
        self._acceptor = threading.Thread(
            target=self._accept, name=f"consensus-tcp:{self.port}", daemon=True
        )

    def start(self) -> None:
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                if self._closed:
                    return
                logger.exception("consensus tcp: accept failed")
                continue
            with self._lock:
                refuse = self._closed or len(self._links) >= self._max_connections
                if not refuse:
                    link = self._link(conn, f"from {peer[0]}:{peer[1]}")
                    self._links.add(link)
            if refuse:
                logger.warning(
                    "consensus tcp: refusing %s: %d connections open", peer, self._max_connections
                )
                conn.close()
                continue
            link.start()

    def _link(self, conn: socket.socket, name: str) -> FrameLink:
        holder: list[FrameLink] = []

        def post(item: pb.ConsensusItemPB) -> None:
            body = pb.ConsensusFramePB(items=[item]).SerializeToString()
            with contextlib.suppress(LinkClosed):  # the asker is gone: the answer is lost
                holder[0].send(frame(body))

        def on_frame(body: bytes) -> None:
            try:
                items = pb.ConsensusFramePB.FromString(body).items
            except Exception as exc:  # DecodeError: a broken or hostile peer
                logger.warning("consensus tcp %s: undecodable frame (%s): closing", name, exc)
                holder[0].close()
                return
            for item in items:
                step_item(item, self._handler, self._check, post)

        link = FrameLink(
            conn,
            f"{name}#{next(_connections)}",
            on_frame,
            self._forget,
            max_frame_bytes=self._max_frame_bytes,
            send_timeout_s=self._send_timeout_s,
        )
        holder.append(link)
        return link

    def _forget(self, link: FrameLink) -> None:
        with self._lock:
            self._links.discard(link)

    def connections(self) -> float:
        with self._lock:
            return float(len(self._links))

    def close(self) -> None:
        """Stop accepting and close every connection: the peers see them break at once."""
        with self._lock:
            self._closed = True
            links = list(self._links)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes accept
        self._acceptor.join(timeout=5.0)
        self._sock.close()
        for link in links:
            link.close()
        for link in links:
            link.join(timeout=5.0)
