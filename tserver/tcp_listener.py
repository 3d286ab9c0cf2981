"""A listening socket whose connections each become a ``FrameLink``: the server side of the
plain-TCP paths (peers' consensus traffic, ``tserver.consensus_tcp_server``; clients' write
streams, ``tserver.write_tcp_server``).

One acceptor thread; each accepted connection is handed to ``make_link``, which wires what
its frames do and returns the link, not yet started. At most ``max_connections`` are open at
once (counting those still in their TLS handshake): one more is closed as soon as it is
accepted, counted in ``refusals`` and logged at most once a minute with how many were
refused since the last line (a client reopening each refused connection at once made a line
each: 19,438 in 50 s). At most ``max_handshakes`` of them are still in their TLS handshake:
a new connection past that closes the oldest such one, also counted in ``refusals``. Before
its handshake a connection has shown nothing, yet held a thread for up to 10 s, and a
storm of them from anyone who could reach the write port -- 1,024 before the cap, a
thousand threads -- stalled a server for seconds and cost it its leaderships, and on the
consensus port kept real peers out (review r32a). Closing the oldest rather than refusing
the newest lets a peer whose handshake takes milliseconds in while a storm goes on, as
long as fewer than ``max_handshakes`` newer connections come meanwhile.
What the links hold while frames arrive is bounded by the factory's
``consensus.rpc.receive_limits``; a connection whose other end vanished is found out by
TCP keepalive.

Without TLS (``admission`` None) a connection is linked at once and its caller is unknown
-- as on the plaintext gRPC port, anyone who can reach it may make the same calls. With TLS
each new connection gets a thread of its own that does the handshake and checks the caller's
certificate (``tserver.tcp_admission``) before the link starts reading, so a slow or hostile
peer never holds up the acceptor; ``make_link`` then gets the caller's identity.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

from raftlet.cluster import bare_host, host_port
from raftlet.cluster.identity import Identity
from raftlet.consensus.rpc.frame_link import FrameLink
from raftlet.metrics.counter import StripedCounter
from raftlet.metrics.every_interval import EveryInterval
from raftlet.tserver.tcp_admission import TcpAdmission

__all__ = ["LinkFactory", "TcpListener"]

logger = logging.getLogger(__name__)

# (accepted socket -- handshaken under TLS, a name for logs, what the link must call when it
# closes, the caller's certificate identity or None without TLS) -> the link.
LinkFactory = Callable[
    [socket.socket, str, Callable[[FrameLink], None], Identity | None], FrameLink
]

_connections = itertools.count(1)


def _handshakes_for(max_connections: int) -> int:
    """How many connections may be in their TLS handshake at once: a handshake takes a few
    milliseconds, so a quarter of the port's connections, at most 64, is plenty."""
    return max(1, min(64, max_connections // 4))


# Where a port the kernel would not hand out by itself starts (below its ephemeral range).
_LOWEST_PICKED_PORT = 10_000


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening socket on ``host`` (a name, an IPv4 address, or an IPv6 one with or
    without its brackets, as in ``[::1]:7051``) and ``port``; 0 picks a free one *below* the
    kernel's ephemeral range.  Why not let the kernel pick: launchers (``raftlet cluster
    up``, the test harnesses) reserve every server's RPC port up front by asking the kernel
    for one, then start the servers one by one; a listener of an early server picked by the
    kernel could take a later server's reserved port before it binds it."""
    host, family = _bind_host(host)
    if port != 0:
        return socket.create_server((host, port), family=family)
    high = _ephemeral_low()
    if high > _LOWEST_PICKED_PORT:
        for candidate in random.sample(range(_LOWEST_PICKED_PORT, high), 32):
            try:
                return socket.create_server((host, candidate), family=family)
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
    return socket.create_server((host, 0), family=family)


def _bind_host(host: str) -> tuple[str, socket.AddressFamily]:
    # The config writes an IPv6 literal in brackets ("[::1]:7051", which gRPC binds as is);
    # the socket API wants it bare, and an AF_INET6 socket: an AF_INET one would look the
    # literal up as a host name and fail ("Name or service not known").
    bare = bare_host(host)
    return bare, socket.AF_INET6 if ":" in bare else socket.AF_INET


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


# A connection whose other end vanished without a word (its machine lost power, a cable
# pulled) and which has nothing to send is found out by TCP keepalive: probes after a
# minute of silence, every 10 s, given up after 6 unanswered -- about two minutes. Sending
# links find out sooner (their send timeout).
_KEEPALIVE = (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6))


def _keep_alive(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in _KEEPALIVE:
            if hasattr(socket, option):  # Linux names; other systems keep their defaults
                conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


# accept() errors that are the process's, not the connection's: each try fails alike until
# something is freed, so the acceptor waits between tries.
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_RETRY_S = 0.5
_RESOURCE_ERROR_LOG_S = 60.0
_REFUSAL_LOG_S = 60.0


class TcpListener:
    def __init__(
        self,
        what: str,
        host: str,
        port: int,
        make_link: LinkFactory,
        *,
        max_connections: int,
        max_handshakes: int | None = None,
        admission: TcpAdmission | None = None,
        refusals: StripedCounter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        # Connections closed as soon as accepted because ``max_connections`` were open, or
        # in their handshake to make room for a newer one.
        self.refusals = refusals if refusals is not None else StripedCounter()
        self._make_link = make_link
        self._max_connections = max_connections
        self._max_handshakes = (
            max_handshakes if max_handshakes is not None else _handshakes_for(max_connections)
        )
        self._admission = admission
        self._sock = bind_listener(host, port)
        self.port: int = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._links: set[FrameLink] = set()
        # Accepted, not yet admitted (TLS), oldest first.
        self._handshaking: dict[ssl.SSLSocket, None] = {}
        self._closed = False
        self._closing = threading.Event()  # wakes an acceptor waiting out a resource error
        self._resource_error_log = EveryInterval(_RESOURCE_ERROR_LOG_S, clock)
        self._refusal_log = EveryInterval(_REFUSAL_LOG_S, clock)
        self._acceptor = threading.Thread(
            target=self._accept, name=f"{what}-tcp:{self.port}", daemon=True
        )

    def start(self) -> None:
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._sock.accept()
            except OSError as exc:
                if self._closed:
                    return
                if exc.errno in _OUT_OF_RESOURCES:
                    self._wait_out(exc)
                else:
                    logger.exception("%s tcp: accept failed", self.what)
                continue
            name = f"{self.what} from {host_port(peer[0], peer[1])}#{next(_connections)}"
            _keep_alive(conn)
            if self._admission is None:
                self._link(conn, name, None)
                continue
            try:
                tls = self._admission.wrap(conn)
            except (OSError, ValueError) as e:
                logger.debug("%s tcp: %s: %s", self.what, name, e)
                conn.close()
                continue
            oldest: ssl.SSLSocket | None = None
            with self._lock:
                if len(self._handshaking) >= self._max_handshakes:
                    oldest = next(iter(self._handshaking))
                    del self._handshaking[oldest]
                if self._has_room():
                    self._handshaking[tls] = None
                    admitting = True
                else:
                    admitting = False
            if oldest is not None:
                self.refusals.increment()
                # Its thread's handshake fails at once, and the thread ends.
                with contextlib.suppress(OSError):
                    socket.socket.shutdown(oldest, socket.SHUT_RDWR)  # the TCP's, not TLS's
                self._say_refused(f"a handshake pending when {name} came")
            if not admitting:
                self._refuse(tls, name)
                continue
            threading.Thread(
                target=self._admit, args=(tls, name), name=f"tls:{name}", daemon=True
            ).start()

    def _has_room(self) -> bool:
        # Under the lock. Handshakes count: each holds a thread and a socket.
        return not self._closed and (
            len(self._links) + len(self._handshaking) < self._max_connections
        )

    def _refuse(self, conn: socket.socket, name: str) -> None:
        conn.close()
        self.refusals.increment()
        self._say_refused(name)

    def _say_refused(self, latest: str) -> None:
        refused = self._refusal_log.due()
        if refused is not None:
            logger.warning(
                "%s tcp: refused %d connection(s) since the last such line, the latest %s: "
                "it takes at most %d connections, %d of them in their TLS handshake "
                "(said at most once a minute)",
                self.what,
                refused,
                latest,
                self._max_connections,
                self._max_handshakes,
            )

    def _admit(self, tls: ssl.SSLSocket, name: str) -> None:
        """A new TLS connection's own thread: handshake, check the caller, then link it."""
        assert self._admission is not None
        try:
            identity = self._admission.admit(tls, name)
        finally:
            with self._lock:
                self._handshaking.pop(tls, None)
        if identity is not None:
            self._link(tls, name, identity)

    def _link(self, conn: socket.socket, name: str, identity: Identity | None) -> None:
        link: FrameLink | None = None
        with self._lock:
            # Without TLS the room is checked here; with it, it was before the handshake.
            if (identity is not None or self._has_room()) and not self._closed:
                link = self._make_link(conn, name, self._forget, identity)
                self._links.add(link)
        if link is None:
            if self._closed:  # shutting down, not full: nothing to count or say
                conn.close()
            else:
                self._refuse(conn, name)
            return
        link.start()

    def _forget(self, link: FrameLink) -> None:
        with self._lock:
            self._links.discard(link)

    def _wait_out(self, exc: OSError) -> None:
        """Out of file descriptors (or memory), the connection stays queued and ``accept``
        fails again at once: it spun a core and logged a traceback per try. Wait a little
        before the next try, and say so once a minute."""
        if self._resource_error_log.due() is not None:
            logger.error(
                "%s tcp: cannot accept connections (%s); retrying every %g s. Out of file "
                "descriptors? The server's limit is `ulimit -n` (LimitNOFILE in systemd)",
                self.what,
                exc.strerror or exc,
                _ACCEPT_RETRY_S,
            )
        self._closing.wait(_ACCEPT_RETRY_S)

    def connections(self) -> float:
        with self._lock:
            return float(len(self._links))

    def close(self) -> None:
        """Stop accepting and close every connection: the other ends see them break at once."""
        with self._lock:
            self._closed = True
            links = list(self._links)
            handshaking = list(self._handshaking)
        self._closing.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes accept
        for tls in handshaking:  # their handshakes fail at once; their threads end
            with contextlib.suppress(OSError):
                socket.socket.shutdown(tls, socket.SHUT_RDWR)  # the TCP's, not the TLS's
        if self._acceptor.ident is not None:  # a server whose start failed never started it
            self._acceptor.join(timeout=5.0)
        self._sock.close()
        for link in links:
            link.close()
        for link in links:
            link.join(timeout=5.0)
