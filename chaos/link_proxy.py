"""Per-link TCP proxies: cut the network between two tablet servers without root.

On loopback every server shares one ``lo``, so nothing below the processes can drop one
server's packets to another (``deploy/netns.py`` can, as root). Instead each server dials
each peer through a proxy of its own for that *directed link* (src → dst): ``ProxyNetwork``
runs one ``LinkProxy`` per ordered pair of servers and gives server src the
``--peer_addresses`` value that routes its consensus traffic through its links. Clients
still dial every server directly, so the nemesis can partition the servers from each other
while a workload keeps reaching all of them.

What a cut does, and why: it must look like a network partition, not like a crashed peer.
A crashed peer's connections fail fast (RST, refused connects) and a Raft node reacts at
once; behind a partition, bytes simply stop, connections stay up, and only timeouts tell.
So a cut link

- stops reading both sockets of every connection on it: nothing moves in either direction,
  and TCP flow control pushes back on both senders once the kernel buffers fill;
- keeps those connections open and notices nothing about them (not even an EOF);
- still accepts new connections, but does not dial the target for them, and moves nothing.

``heal`` resumes forwarding: whatever was buffered then flows, as after TCP retransmission
once a partition heals; waiting connections dial their target. ``reset`` is the harsher
fault: it closes the link's connections abortively (RST), as a middlebox dropping state
would. A link carries the connections src *opened* to dst, so cutting (src, dst) stops src's
requests to dst and dst's answers to them; dst's own requests to src travel on link
(dst, src). ``cut_both``, ``isolate`` and ``partition`` cut both.

One background thread runs an asyncio event loop for every proxy of a network (``ProxyLoop``);
each connection is driven by readiness callbacks on its two non-blocking sockets, 64 KiB per
``recv``, one ``send`` per chunk, no per-byte Python. A direction reads only when its buffer
is empty, so a proxy holds at most 64 KiB per direction and never outruns a slow reader. Cut,
heal and reset are run on the loop and return once the loop has applied them, so a test that
cuts a link and then sends knows the bytes will not get through.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import itertools
import logging
import socket
import struct
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TypeVar

from raftlet.cluster import ClusterConfig, host_port, parse_host_port

__all__ = ["LinkProxy", "ProxyLoop", "ProxyNetwork"]

logger = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
# How long a caller waits for the loop to apply a command: only a wedged loop takes long.
_CALL_TIMEOUT_S = 30.0
# After a failed accept (out of file descriptors), before accepting again.
_ACCEPT_RETRY_S = 0.1
_T = TypeVar("_T")


class ProxyLoop:
    """One daemon thread running an asyncio loop that serves any number of ``LinkProxy``.

    Everything about sockets happens on this thread; other threads hand it work with
    ``call``, which waits for the result, so a command has taken effect when it returns.
    """

    def __init__(self, name: str = "link-proxy") -> None:
        self._loop = asyncio.new_event_loop()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def call(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the loop's thread and return its result (or raise its exception)."""
        if self._closed:
            raise RuntimeError("the proxy loop is closed")
        if threading.current_thread() is self._thread:
            return fn()
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as e:
                    future.set_exception(e)

        self._loop.call_soon_threadsafe(run)
        return future.result(_CALL_TIMEOUT_S)

    def close(self) -> None:
        """Stop the loop and join its thread; the loop's own sockets are closed. Close the
        proxies first (they release their sockets on the loop). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_CALL_TIMEOUT_S)
        if self._thread.is_alive():
            raise RuntimeError(f"proxy loop thread {self._thread.name} did not stop")
        self._loop.close()


class _Direction:
    """Bytes moving one way, from ``src`` to ``dst``: at most one chunk buffered."""

    __slots__ = ("buf", "dst", "eof", "shut", "src")

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src = src
        self.dst = dst
        self.buf = b""
        self.eof = False  # src sent FIN
        self.shut = False  # ...and it was passed on: dst's write side is shut down

    @property
    def done(self) -> bool:
        return self.shut


class _Connection:
    """One proxied connection: the accepted client socket and, once the link is open, the
    socket dialled to the target. Lives on the loop thread only."""

    def __init__(self, proxy: LinkProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.loop = proxy.loop.loop
        self.client = client
        self.upstream: socket.socket | None = None
        self.connecting = False
        self.closed = False
        self.up: _Direction | None = None  # client → target
        self.down: _Direction | None = None  # target → client
        # What each socket is registered for with the loop: (reading, writing).
        self._registered: dict[socket.socket, tuple[bool, bool]] = {}

    # --- registration ----------------------------------------------------------------

    def sync(self) -> None:
        """Register exactly the callbacks the connection's state and its link call for:
        the one place that decides what moves (nothing, on a cut link)."""
        if self.closed or self.connecting:
            return
        is_open = not self.proxy.is_cut
        if self.upstream is None:
            if is_open:
                self._dial()
            return
        assert self.up is not None
        assert self.down is not None
        self._want(
            self.client, self._wants_read(self.up, is_open), self._wants_write(self.down, is_open)
        )
        self._want(
            self.upstream, self._wants_read(self.down, is_open), self._wants_write(self.up, is_open)
        )

    @staticmethod
    def _wants_read(d: _Direction, is_open: bool) -> bool:
        return is_open and not d.eof and not d.buf

    @staticmethod
    def _wants_write(d: _Direction, is_open: bool) -> bool:
        return is_open and bool(d.buf)

    def _want(self, sock: socket.socket, read: bool, write: bool) -> None:
        was_read, was_write = self._registered.get(sock, (False, False))
        if read != was_read:
            if read:
                src_dir = self.up if sock is self.client else self.down
                assert src_dir is not None
                self.loop.add_reader(sock, self._guarded, self._on_readable, src_dir)
            else:
                self.loop.remove_reader(sock)
        if write != was_write:
            if write:
                dst_dir = self.down if sock is self.client else self.up
                assert dst_dir is not None
                self.loop.add_writer(sock, self._guarded, self._on_writable, dst_dir)
            else:
                self.loop.remove_writer(sock)
        self._registered[sock] = (read, write)

    def _guarded(self, callback: Callable[..., None], *args: object) -> None:
        """Run a readiness callback; a bug in it closes this connection instead of leaving
        the callback registered to fail again on every turn of the loop."""
        try:
            callback(*args)
        except Exception:
            logger.exception("%s: connection failed", self.proxy.name)
            self.close(rst=True)

    # --- dialling the target -----------------------------------------------------------

    def _dial(self) -> None:
        family, addr = self.proxy.target_sockaddr
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as e:  # out of descriptors: this connection fails, the loop goes on
            self.abort(f"socket: {e}")
            return
        self.upstream = sock
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = sock.connect_ex(addr)
        if err == 0:
            self._connected()
        elif err in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            self.connecting = True
            self.loop.add_writer(sock, self._guarded, self._on_connect_done)
            self._registered[sock] = (False, True)
        else:
            self.abort(f"connect to {self.proxy.target}: {errno.errorcode.get(err, err)}")

    def _on_connect_done(self) -> None:
        assert self.upstream is not None
        self.loop.remove_writer(self.upstream)
        self._registered[self.upstream] = (False, False)
        self.connecting = False
        err = self.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            # The target is down: the client learns it as it would without the proxy.
            self.abort(f"connect to {self.proxy.target}: {errno.errorcode.get(err, err)}")
            return
        self._connected()

    def _connected(self) -> None:
        assert self.upstream is not None
        self.up = _Direction(self.client, self.upstream)
        self.down = _Direction(self.upstream, self.client)
        self.sync()

    # --- moving bytes ------------------------------------------------------------------

    def _on_readable(self, d: _Direction) -> None:
        if self.closed or self.proxy.is_cut:
            return
        try:
            data = d.src.recv(CHUNK_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.abort(f"recv: {e}")
            return
        if data:
            self.proxy.bytes_forwarded += len(data)
            d.buf = data
            self._send(d)
        else:
            d.eof = True
            self._pass_eof(d)
        self._maybe_finish()

    def _on_writable(self, d: _Direction) -> None:
        if self.closed or self.proxy.is_cut:
            return
        self._send(d)
        self._maybe_finish()

    def _send(self, d: _Direction) -> None:
        """Write as much of ``d.buf`` as the socket takes now; the rest waits for writable."""
        try:
            sent = d.dst.send(d.buf)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as e:
            self.abort(f"send: {e}")
            return
        d.buf = d.buf[sent:]
        if not d.buf and d.eof:
            self._pass_eof(d)

    def _pass_eof(self, d: _Direction) -> None:
        """Half-close: the source's FIN becomes a FIN to the destination once the buffer
        is flushed; the other direction keeps flowing."""
        if d.buf or d.shut:
            return
        d.shut = True
        try:
            d.dst.shutdown(socket.SHUT_WR)
        except OSError as e:
            self.abort(f"shutdown: {e}")

    def _maybe_finish(self) -> None:
        if self.closed:
            return
        assert self.up is not None
        assert self.down is not None
        if self.up.done and self.down.done:
            self.close(rst=False)
        else:
            self.sync()

    # --- closing -----------------------------------------------------------------------

    def abort(self, why: str) -> None:
        logger.debug("%s: connection aborted: %s", self.proxy.name, why)
        self.close(rst=True)

    def close(self, *, rst: bool) -> None:
        """Close both sockets; ``rst``: abortively (SO_LINGER 0), so each end sees a reset."""
        if self.closed:
            return
        self.closed = True
        for sock in (self.client, self.upstream):
            if sock is None:
                continue
            self.loop.remove_reader(sock)
            self.loop.remove_writer(sock)
            if rst:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        self._registered.clear()
        self.proxy.forget(self)


def _resolve(target: str) -> tuple[socket.AddressFamily, tuple[str, int]]:
    """``host:port`` as a socket address, resolved once: the loop then never blocks (or
    starts an executor thread) on name resolution."""
    host, port = parse_host_port(target)
    host = host.strip("[]")
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"cannot resolve {target!r}")
    family, _, _, _, sockaddr = infos[0]
    return family, (str(sockaddr[0]), int(sockaddr[1]))


class LinkProxy:
    """One listening port (``address``) forwarding every connection to ``target``.

    Runs on ``loop`` if given (shared with other proxies), else on a loop of its own that
    ``close`` stops. Thread-safe: ``cut``, ``heal`` and ``reset`` apply before they return.
    """

    def __init__(
        self,
        target: str,
        *,
        loop: ProxyLoop | None = None,
        listen_host: str = "127.0.0.1",
        name: str = "",
    ) -> None:
        self.target = target
        self.target_sockaddr = _resolve(target)
        self.name = name or f"proxy→{target}"
        self._owns_loop = loop is None
        self.loop = loop if loop is not None else ProxyLoop(f"link-proxy {self.name}")
        self._cut = False  # written by the loop thread only
        self.bytes_forwarded = 0  # written by the loop thread only
        self._connections: set[_Connection] = set()
        self._closed = False
        self._listener = socket.create_server((listen_host, 0), backlog=128)
        try:
            self._listener.setblocking(False)
            host, port = self._listener.getsockname()[:2]
            self.port: int = port
            self.address = host_port(host, port)
            self.loop.call(self._start)
        except BaseException:
            self._listener.close()
            if self._owns_loop:
                self.loop.close()
            raise

    def __repr__(self) -> str:
        state = "cut" if self.is_cut else "open"
        return f"LinkProxy({self.name}: {self.address} → {self.target}, {state})"

    @property
    def is_cut(self) -> bool:
        """Whether the link is cut (as of the last ``cut``/``heal`` that returned)."""
        return self._cut

    # --- commands (any thread) ---------------------------------------------------------

    def cut(self) -> None:
        """Stop moving bytes on every connection, present and future, until ``heal``."""
        self.loop.call(lambda: self._set_cut(True))

    def heal(self) -> None:
        """Resume forwarding; buffered bytes flow and waiting connections dial the target."""
        self.loop.call(lambda: self._set_cut(False))

    def reset(self) -> int:
        """Close every connection abortively (RST to both ends); returns how many. The
        link's cut state is unchanged, and new connections are served as before."""
        return self.loop.call(self._reset)

    def connection_count(self) -> int:
        """Connections open now (accepted and not yet closed)."""
        return self.loop.call(lambda: len(self._connections))

    def close(self) -> None:
        """Close the listener and every connection (RST); stop the loop if it is ours."""
        if self._closed:
            return
        self._closed = True
        try:
            self.loop.call(self._close_sockets)
        finally:
            if self._owns_loop:
                self.loop.close()

    def __enter__(self) -> LinkProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- on the loop -------------------------------------------------------------------

    def _start(self) -> None:
        self.loop.loop.add_reader(self._listener, self._on_accept)

    def _on_accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and the like: pause, rather than spin on it
                logger.warning("%s: accept failed: %s", self.name, e)
                self._pause_accepting()
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, sock)
            self._connections.add(conn)
            conn.sync()

    def _pause_accepting(self) -> None:
        self.loop.loop.remove_reader(self._listener)

        def resume() -> None:
            if not self._closed:
                self.loop.loop.add_reader(self._listener, self._on_accept)

        self.loop.loop.call_later(_ACCEPT_RETRY_S, resume)

    def _set_cut(self, cut: bool) -> None:
        if self._cut == cut:
            return
        self._cut = cut
        for conn in list(self._connections):
            conn.sync()

    def _reset(self) -> int:
        conns = list(self._connections)
        for conn in conns:
            conn.close(rst=True)
        return len(conns)

    def _close_sockets(self) -> None:
        self.loop.loop.remove_reader(self._listener)
        self._listener.close()
        self._reset()

    def forget(self, conn: _Connection) -> None:
        """A connection closed itself (called on the loop)."""
        self._connections.discard(conn)


Link = tuple[str, str]


class ProxyNetwork:
    """A ``LinkProxy`` for every directed link between the given servers, on one loop.

    ``servers`` maps each server id to the address it really listens on. Server src reaches
    dst at ``proxy(src, dst).address``; start src with ``--peer_addresses
    {peer_addresses_flag(src)}``. ``cut``, ``cut_both`` and ``isolate`` cut links (adding to
    what is cut); ``partition`` sets the whole network at once; ``heal`` opens every link.
    Each command applies to all its links in one step on the loop, before it returns.
    """

    def __init__(self, servers: Mapping[str, str], *, listen_host: str = "127.0.0.1") -> None:
        if len(set(servers)) != len(servers):
            raise ValueError("server ids must be unique")
        self.servers = dict(servers)
        self._loop = ProxyLoop("link-proxy-network")
        self._proxies: dict[Link, LinkProxy] = {}
        self._closed = False
        try:
            for src, dst in itertools.permutations(self.servers, 2):
                self._proxies[(src, dst)] = LinkProxy(
                    self.servers[dst], loop=self._loop, listen_host=listen_host, name=f"{src}→{dst}"
                )
        except BaseException:
            self.close()
            raise

    @classmethod
    def for_config(cls, config: ClusterConfig) -> ProxyNetwork:
        """Links between every server of ``config``, to their configured RPC addresses."""
        return cls({s.id: s.rpc_addr for s in config.servers})

    # --- addresses ---------------------------------------------------------------------

    def proxy(self, src: str, dst: str) -> LinkProxy:
        """The proxy that carries src's connections to dst."""
        self._check(src, dst)
        return self._proxies[(src, dst)]

    def links(self) -> list[Link]:
        return list(self._proxies)

    def peer_addresses(self, src: str) -> dict[str, str]:
        """``{dst: address src dials for dst}`` for every other server."""
        self._check(src)
        return {dst: p.address for (s, dst), p in self._proxies.items() if s == src}

    def peer_addresses_flag(self, src: str) -> str:
        """The ``--peer_addresses`` value for server ``src`` (empty if it has no peers)."""
        return ",".join(f"{dst}={addr}" for dst, addr in self.peer_addresses(src).items())

    # --- faults ------------------------------------------------------------------------

    def cut(self, src: str, dst: str) -> None:
        """Cut src's connections to dst (both byte directions of each; not dst → src's)."""
        self._check(src, dst)
        self._apply(cut={(src, dst)})

    def cut_both(self, a: str, b: str) -> None:
        """Cut a → b and b → a: the two servers cannot talk at all."""
        self._check(a, b)
        self._apply(cut={(a, b), (b, a)})

    def isolate(self, sid: str) -> None:
        """Cut every link from and to ``sid``; the other links stay as they are."""
        self._check(sid)
        self._apply(cut={link for link in self._proxies if sid in link})

    def partition(self, groups: Sequence[Collection[str]]) -> None:
        """Exactly the links between different groups cut, those within a group open;
        a server in no group is isolated. Replaces whatever was cut before."""
        group_of: dict[str, int] = {}
        for i, group in enumerate(groups):
            for sid in group:
                self._check(sid)
                if sid in group_of:
                    raise ValueError(f"server {sid!r} is in two groups")
                group_of[sid] = i
        cut = {
            (src, dst)
            for src, dst in self._proxies
            if src not in group_of or group_of[src] != group_of.get(dst)
        }
        self._apply(cut=cut, heal=set(self._proxies) - cut)

    def heal(self) -> None:
        """Open every link."""
        self._apply(heal=set(self._proxies))

    def reset(self, src: str, dst: str) -> int:
        """Close src → dst's connections abortively (RST); returns how many. A cut stays
        cut; an open link serves the reconnects."""
        return self.proxy(src, dst).reset()

    def cut_links(self) -> set[Link]:
        """The directed links that are cut now."""
        return {link for link, p in self._proxies.items() if p.is_cut}

    # --- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Close every proxy (listeners and connections) and stop the loop's thread."""
        if self._closed:
            return
        self._closed = True
        proxies = list(self._proxies.values())
        try:
            for p in proxies:
                p.close()
        finally:
            self._loop.close()

    def __enter__(self) -> ProxyNetwork:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- helpers -----------------------------------------------------------------------

    def _check(self, *sids: str) -> None:
        for sid in sids:
            if sid not in self.servers:
                known = ", ".join(self.servers)
                raise ValueError(f"unknown server id {sid!r} (known: {known})")
        if len(sids) == 2 and sids[0] == sids[1]:
            raise ValueError(f"a link joins two different servers, got {sids[0]!r} twice")

    def _apply(self, *, cut: Iterable[Link] = (), heal: Iterable[Link] = ()) -> None:
        """Cut and heal links in one step on the loop: no moment where half of a partition
        is in place."""
        cut_proxies = [self._proxies[link] for link in cut]
        heal_proxies = [self._proxies[link] for link in heal]

        def apply() -> None:
            for p in cut_proxies:
                p._set_cut(True)
            for p in heal_proxies:
                p._set_cut(False)

        self._loop.call(apply)
