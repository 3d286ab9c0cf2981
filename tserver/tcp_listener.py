"""A listening socket whose connections each become a ``FrameLink``: the server side of the
plain-TCP paths (peers' consensus traffic, ``tserver.consensus_tcp_server``; clients' write
streams, ``tserver.write_tcp_server``).

One acceptor thread; each accepted connection is handed to ``make_link``, which wires what
its frames do and returns the link, not yet started. At most ``max_connections`` are open at
once: one more is closed as soon as it is accepted. Neither path carries TLS or checks an
identity, so the server opens these listeners only when it runs without TLS -- where anyone
who can reach the RPC port may make the same calls over gRPC.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import threading
from collections.abc import Callable

from raftlet.consensus.rpc.frame_link import FrameLink

__all__ = ["LinkFactory", "TcpListener"]

logger = logging.getLogger(__name__)

# (accepted socket, a name for logs, what the link must call when it closes) -> the link.
LinkFactory = Callable[[socket.socket, str, Callable[[FrameLink], None]], FrameLink]

_connections = itertools.count(1)


class TcpListener:
    def __init__(
        self, what: str, host: str, port: int, make_link: LinkFactory, *, max_connections: int
    ) -> None:
        self.what = what
        self._make_link = make_link
        self._max_connections = max_connections
        self._sock = socket.create_server((host, port))
        self.port: int = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._links: set[FrameLink] = set()
        self._closed = False
        self._acceptor = threading.Thread(
            target=self._accept, name=f"{what}-tcp:{self.port}", daemon=True
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
                logger.exception("%s tcp: accept failed", self.what)
                continue
            name = f"{self.what} from {peer[0]}:{peer[1]}#{next(_connections)}"
            link: FrameLink | None = None
            with self._lock:
                if not self._closed and len(self._links) < self._max_connections:
                    link = self._make_link(conn, name, self._forget)
                    self._links.add(link)
            if link is None:
                logger.warning(
                    "%s tcp: refusing %s: %d connections open",
                    self.what,
                    name,
                    self._max_connections,
                )
                conn.close()
                continue
            link.start()

    def _forget(self, link: FrameLink) -> None:
        with self._lock:
            self._links.discard(link)

    def connections(self) -> float:
        with self._lock:
            return float(len(self._links))

    def close(self) -> None:
        """Stop accepting and close every connection: the other ends see them break at once."""
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
