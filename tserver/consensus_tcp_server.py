"""The server side of the tcp consensus transport (``consensus.rpc.tcp_transport`` is the
client side): what a peer's connection to this server's consensus port does.

A connection's reader thread steps each request as it arrives (``step_item``, as the gRPC
stream's session does on a pool thread), in arrival order; the answer is sent on the same
connection by whichever thread completes it -- a follower's append by the WAL appender that
made it durable, with one non-blocking ``send``.  So a request crosses one thread hand-off
on a follower (reader → appender) and its answer none.  A frame over the peers' message
limit, one that does not decode, or one of more than ``MAX_ITEMS_PER_FRAME`` requests closes
the connection, with nothing answered of it: a peer sends one request per frame
(``consensus.rpc.tcp_transport``; a lazy burst is several frames in one write, not one frame
of several items), and answering each of a million empty items of one 2 MB frame took a
server from 166 MB to 1.09 GB.  The listener itself: ``tserver.tcp_listener``.

Under TLS only a server's certificate gets this far (``tserver.tcp_admission``), and each
request is checked as on the gRPC stream (``security.sender_check``): one that claims a
sender other than the certificate's server is answered ``failed``, and counted.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from raftlet.cluster.identity import Identity
from raftlet.consensus.rpc.frame_link import FrameLink, LinkClosed, frame
from raftlet.consensus.rpc.receive_limits import ReceiveLimits
from raftlet.proto import consensus_pb2 as pb
from raftlet.tserver.consensus_handler import ConsensusRequestHandler
from raftlet.tserver.consensus_stream_server import item_byte_size, step_item
from raftlet.tserver.message_limits import chunks_by_size
from raftlet.tserver.security import Authenticator, sender_check
from raftlet.tserver.tcp_listener import LinkFactory

__all__ = ["CONSENSUS_TCP_METHOD", "MAX_ITEMS_PER_FRAME", "consensus_links"]

# What refusals on this port are logged as (the gRPC port logs its method names).
CONSENSUS_TCP_METHOD = "/raftlet.ConsensusService/Tcp"

logger = logging.getLogger(__name__)

# Requests in one frame. The sender puts one in each (``_TcpPeer.send``: one
# ``encode_item`` per frame); the bound leaves room for a sender that batches a server's
# tablets (one item each) while keeping what a frame of empty items costs to a few KiB.
MAX_ITEMS_PER_FRAME = 64


def consensus_links(
    handler: ConsensusRequestHandler,
    *,
    max_frame_bytes: int,
    send_timeout_s: float,
    auth: Authenticator | None = None,
    receive_limits: ReceiveLimits | None = None,
) -> LinkFactory:
    """The ``TcpListener`` link factory of the consensus port; ``auth``: the server's, when
    it runs with TLS."""

    def make(
        conn: socket.socket,
        name: str,
        on_close: Callable[[FrameLink], None],
        peer: Identity | None,
    ) -> FrameLink:
        holder: list[FrameLink] = []
        check = sender_check(auth, peer, CONSENSUS_TCP_METHOD)

        # Answers made on the reader thread while it handles what one read brought in (a
        # burst of every tablet's heartbeat, say) leave together when it is done.
        burst: list[pb.ConsensusItemPB] = []
        reader: list[int] = []  # the reader thread's ident, once known

        def send(items: list[pb.ConsensusItemPB]) -> None:
            body = pb.ConsensusFramePB(items=items).SerializeToString()
            try:
                holder[0].send(frame(body))
            except LinkClosed:  # the asker is gone: the answers are lost, as Raft allows
                pass
            except Exception:  # a bug: lose these answers and the link, not the caller
                logger.exception("consensus tcp %s: answering failed", name)
                holder[0].close()

        def post(item: pb.ConsensusItemPB) -> None:
            if reader and reader[0] == threading.get_ident():
                burst.append(item)
            else:  # a durability callback's thread: it leaves now
                send([item])

        def on_burst_end() -> None:
            if burst:
                items = list(burst)
                burst.clear()
                # One frame unless that passes the peers' limit (many large answers).
                for chunk in chunks_by_size(items, item_byte_size, max_frame_bytes):
                    send(chunk)

        def on_frame(body: bytes) -> None:
            if not reader:
                reader.append(threading.get_ident())
            try:
                items = pb.ConsensusFramePB.FromString(body).items
            except Exception as exc:  # DecodeError: a broken or hostile peer
                logger.warning("consensus tcp %s: undecodable frame (%s): closing", name, exc)
                holder[0].close()
                return
            if len(items) > MAX_ITEMS_PER_FRAME:  # counted before any becomes an object
                logger.warning(
                    "consensus tcp %s: a frame of %d requests, over the %d a peer sends in "
                    "one: closing without answering it (is the peer a raftlet server of "
                    "this version?)",
                    name,
                    len(items),
                    MAX_ITEMS_PER_FRAME,
                )
                holder[0].close()
                return
            for item in items:
                step_item(item, handler, check, post)

        link = FrameLink(
            conn,
            name,
            on_frame,
            on_close,
            max_frame_bytes=max_frame_bytes,
            send_timeout_s=send_timeout_s,
            receive_limits=receive_limits,
            on_burst_end=on_burst_end,
        )
        holder.append(link)
        return link

    return make
