"""The tcp consensus transport: one plain TCP connection per pair of servers, frames of
``ConsensusItemPB`` (``consensus.rpc.frame_link``), with the gRPC stream as its fallback.

Same messages as the stream transport (``consensus.rpc.stream_transport``): a request is a
``ConsensusFramePB`` ``items`` entry made by ``encode_item`` on the sender's thread, and its
answer comes back on the same connection with the same ``seq``.  What differs is the path:
a request leaves with one non-blocking ``send`` from the thread that made it, and an answer
is stepped by the connection's reader thread as soon as ``recv`` returns -- no event loop,
no gRPC thread, between two servers.

``TcpHub`` (one per server) finds out how to reach a peer with ``lookup(address)`` -- the
tablet server asks the peer's ``ConsensusService.PeerEndpoint`` -- which gives the peer's
tcp port, or None when the peer has no tcp listener (``--consensus_transport`` other than
tcp on its side, or an older server) or is not dialed directly (its address in our
``--peer_addresses`` is not the one it advertises: a proxy or NAT in between, which would
be bypassed).  With ``ssl_context`` (the cluster runs TLS) a connection is TLS with this
server's own certificate as the client certificate -- the peer admits only a server's
(``tserver.tcp_admission``) -- and the peer's certificate is verified against the CA and by
the host of its address, as the gRPC channels verify it.  Until a connection is up, and
whenever it is not, requests go on the gRPC stream (``StreamHub``), which always works; a
broken connection is Raft's lost message for what was in flight on it, and is dialed again
after a backoff. The backoff starts over, and the traffic is said to be on tcp, only once a
connection brought a frame back: a peer whose port is full accepts and closes at once, and a
connect alone proves nothing.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from raftlet.consensus.rpc.frame_link import FrameLink, LinkClosed, frame
from raftlet.consensus.rpc.stream_transport import (
    Pending,
    StreamHub,
    StreamTransport,
    answer_of,
    deliver,
)
from raftlet.proto import consensus_pb2 as pb

__all__ = ["Endpoint", "TcpHub"]

logger = logging.getLogger(__name__)

_BACKOFF_INITIAL_S = 0.5
_BACKOFF_MAX_S = 10.0
_CONNECT_TIMEOUT_S = 2.0
# How often requests whose answer is overdue are dropped.
_SWEEP_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a peer takes consensus frames over plain TCP."""

    host: str
    port: int


class _TcpPeer:
    """The connection to one peer server (client side), and the requests awaiting answers
    on it."""

    def __init__(self, hub: TcpHub, addr: str) -> None:
        self.addr = addr
        self._hub = hub
        self._lock = threading.Lock()
        self._link: FrameLink | None = None
        self._pending: dict[int, Pending] = {}  # on the current link; insertion = send order
        self._connecting = False
        self._next_attempt = 0.0
        self._backoff = _BACKOFF_INITIAL_S
        # The current link brought a frame: the peer takes our traffic on it.
        self._proven = False
        self._closed = False

    @property
    def connected(self) -> bool:
        return self._link is not None

    def send(self, seq: int, item: bytes, pending: Pending, *, lazy: bool = False) -> None:
        """Any thread, never blocks: on the connection if it is up, else on the stream."""
        link = self._link
        if link is not None:
            with self._lock:
                self._pending[seq] = pending
            try:
                link.send(frame(item), lazy=lazy)
                return
            except Exception as exc:  # closed, or a bug: never raise into the caller's lock
                if not isinstance(exc, LinkClosed):
                    logger.exception("consensus tcp to %s: send failed", self.addr)
                    link.close()
                with self._lock:
                    taken = self._pending.pop(seq, None)
                if taken is None:  # the link's close already reported it lost
                    return
        else:
            self._maybe_connect()
        self._hub.fallback.stream_to(self.addr).send(seq, item, pending)

    def _maybe_connect(self) -> None:
        now = self._hub.clock()
        with self._lock:
            # A send that saw no link may get here just after a dial succeeded: one
            # connection per peer, never a second (it would leak, open and unused).
            if self._closed or self._connecting or self._link is not None:
                return
            if now < self._next_attempt:
                return
            self._connecting = True
        threading.Thread(target=self._connect, name=f"tcp-dial:{self.addr}", daemon=True).start()

    def _connect(self) -> None:
        link: FrameLink | None = None
        try:
            endpoint = self._hub.lookup(self.addr)
            if endpoint is not None:
                sock = socket.create_connection(
                    (endpoint.host, endpoint.port), timeout=_CONNECT_TIMEOUT_S
                )
                context = self._hub.ssl_context
                if context is not None:  # the handshake, within the connect timeout
                    try:
                        sock = context.wrap_socket(sock, server_hostname=endpoint.host)
                    except BaseException:
                        sock.close()
                        raise
                link = FrameLink(
                    sock,
                    f"to {self.addr}",
                    self._on_frame,
                    self._on_close,
                    max_frame_bytes=self._hub.max_frame_bytes,
                    send_timeout_s=self._hub.timeout_s,
                )
        except ssl.SSLError as exc:  # a certificate or name that does not match: say why
            logger.info("consensus tcp to %s: TLS failed: %s", self.addr, exc)
        except OSError as exc:
            logger.debug("consensus tcp to %s: %s", self.addr, exc)
        except Exception:  # the lookup's bug must not stop us retrying
            logger.exception("consensus tcp to %s: finding its endpoint failed", self.addr)
        with self._lock:
            self._connecting = False
            if link is not None and not self._closed and self._link is None:
                # Neither the backoff reset nor "now on tcp" yet: a peer whose port is full
                # accepts and closes at once, which reset it every dial and logged each one
                # (``_on_frame`` does both once the peer answers).
                self._proven = False
                self._link = link.start()
                return
            self._next_attempt = self._hub.clock() + self._backoff
            self._backoff = min(self._backoff * 2, _BACKOFF_MAX_S)
        if link is not None:  # closed meanwhile
            link.start().close()

    def _on_frame(self, body: bytes) -> None:
        """The link's reader thread: answers, each to its request."""
        if not self._proven:
            self._prove()
        for item in pb.ConsensusFramePB.FromString(body).items:
            with self._lock:
                pending = self._pending.pop(item.seq, None)
            if pending is not None:  # else overdue and dropped already
                deliver(pending, answer_of(pending, item))

    def _prove(self) -> None:
        with self._lock:
            if self._proven or self._link is None:
                return
            self._proven = True
            self._backoff = _BACKOFF_INITIAL_S
        # "tcp over TLS" or "tcp without TLS": "plain tcp" (meaning "not gRPC") read to an
        # auditor as "unencrypted" on a TLS cluster.
        how = "tcp over TLS" if self._hub.ssl_context is not None else "tcp without TLS"
        logger.info("consensus traffic to %s now on %s", self.addr, how)

    def _on_close(self, link: FrameLink) -> None:
        with self._lock:
            if self._link is link:
                self._link = None
                # Grows as after a failed dial: a link closed before it brought a frame is
                # one; after one that did (the backoff reset), the first retry is prompt.
                self._next_attempt = self._hub.clock() + self._backoff
                self._backoff = min(self._backoff * 2, _BACKOFF_MAX_S)
            lost, self._pending = self._pending, {}
        for pending in lost.values():
            deliver(pending, None)

    def sweep(self, now: float) -> None:
        overdue: list[Pending] = []
        with self._lock:
            while self._pending:
                seq, pending = next(iter(self._pending.items()))
                if pending.deadline > now:
                    break
                del self._pending[seq]
                overdue.append(pending)
        for pending in overdue:
            deliver(pending, None)

    def close(self) -> FrameLink | None:
        with self._lock:
            self._closed = True
            link, self._link = self._link, None
        if link is not None:
            link.close()
        return link


class TcpHub:
    """This server's tcp connections to its peers, TLS with ``ssl_context``; the transports
    it makes fall back on ``fallback``'s streams, which the hub closes with itself."""

    def __init__(
        self,
        fallback: StreamHub,
        lookup: Callable[[str], Endpoint | None],
        ssl_context: ssl.SSLContext | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fallback = fallback
        self.clock = clock  # when to dial a peer again (the backoff)
        self.lookup = lookup
        self.ssl_context = ssl_context  # None: plain TCP (the cluster runs without TLS)
        self.timeout_s = fallback.timeout_s
        self.max_frame_bytes = fallback.max_frame_bytes
        self._lock = threading.Lock()
        self._peers: dict[str, _TcpPeer] = {}
        self._closed = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep, name="tcp-sweeper", daemon=True)
        self._sweeper.start()

    def transport(self, tablet_id: str, addresses: Mapping[str, str]) -> StreamTransport:
        """The Transport of one replica; ``addresses`` maps peer node ids to RPC addresses."""
        return StreamTransport(self, tablet_id, addresses)

    def next_seq(self) -> int:
        return self.fallback.next_seq()

    def stream_to(self, addr: str) -> _TcpPeer:
        peer = self._peers.get(addr)
        if peer is not None:
            return peer
        with self._lock:
            if self._closed.is_set():
                raise RuntimeError("the consensus connections are closed")
            return self._peers.setdefault(addr, _TcpPeer(self, addr))

    def connections(self) -> float:
        """How many peers are reached over tcp now (the others on the stream)."""
        return float(sum(1 for peer in list(self._peers.values()) if peer.connected))

    def _sweep(self) -> None:
        while not self._closed.wait(_SWEEP_INTERVAL_S):
            now = time.monotonic()
            for peer in list(self._peers.values()):
                peer.sweep(now)

    async def close(self) -> None:
        with self._lock:
            self._closed.set()
            peers = list(self._peers.values())
        links = [link for link in (peer.close() for peer in peers) if link is not None]
        for link in links:
            link.join(timeout=5.0)
        await self.fallback.close()
