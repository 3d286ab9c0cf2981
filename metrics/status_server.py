"""The HTTP status server: metrics, thread stacks and health on a port of its own.

Pages: `/metrics` (Prometheus text, the registry's metrics then the process's
CPU time, `metrics.process`), `/metrics.json` (Kudu-style JSON, with
`?metrics=` and the other filters of `metrics.export_json`), `/stacks` (every thread's stack),
`/healthz` ("OK"), `/` (the list of pages). Other components add pages with
`register_page(path, handler)`; the tablet server adds `/tablets` and `/tablets.json`.

Built on the standard library: a selector loop on one daemon thread accepts connections and
reads every request head (request line and headers) without blocking; only a complete head
is handed to a request thread (`http.server.BaseHTTPRequestHandler` parses and answers it),
so a slow client costs a socket and a small buffer, never a thread. It is a debugging and
scraping port, not a service: HTTP/1.0, one request per connection, so `stop()` never waits
on idle keep-alive connections.

Safety rules -- a bad or slow request must never hurt the server, nor hold up `/healthz`
(the liveness probe: a probe that fails restarts the server):
- unknown path → 404; a method other than GET/HEAD → 405 (with `Allow`); a request line
  longer than `max_request_line` (8 KiB by default, which bounds the query string) → 414;
  a head (request line and headers) over `max_request_line + max_header_bytes` → 431; a
  malformed request → 400 (the standard library's parser).
- a page handler that raises → 500 with a one-line message; the traceback goes to the log,
  and the server goes on serving. Handlers build the whole body before anything is sent, so
  a failure never leaves a half-written response.
- the whole request head must arrive within `request_timeout_s` of the accept (not per
  read: a client trickling a byte at a time is cut at the deadline all the same); a
  connection that misses it is closed without an answer. At most `max_pending` connections
  may be mid-head; a new one beyond that closes the oldest (the slowest: a real request's
  head arrives in one packet).
- at most `max_connections` requests are answered at once, each on its own thread (the rest
  get an immediate 503), and an answer must be taken by the client within
  `request_timeout_s` (a client that stops reading a big page frees its thread then).
- `inline` pages (`/healthz`) are answered by the loop thread itself, as soon as their head
  is in, whatever the request threads are doing: such a handler must be instant and must not
  block. The answer is written without blocking (it fits any socket buffer).
- nothing is printed to stderr: request and error logs go to `logging` (at debug level; a
  page that fails, at warning).
"""

from __future__ import annotations

import contextlib
import gzip
import html
import io
import json
import logging
import selectors
import socket
import ssl
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import raftlet
from raftlet.cluster import bare_host, host_port
from raftlet.cluster.identity import peer_cert_uris
from raftlet.metrics import export_json, export_prometheus
from raftlet.metrics.human import human_duration, utc_time
from raftlet.metrics.process import ProcessCollector
from raftlet.metrics.registry import MetricRegistry

__all__ = [
    "HttpError",
    "PageGuard",
    "PageHandler",
    "PageRequest",
    "PageResponse",
    "StatusServer",
    "format_stacks",
]

_log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_LINE = 8 * 1024
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
# A request head normally arrives in one packet; 5 s is generous for a real client and
# short enough that slow ones cannot hold many sockets for long.
DEFAULT_REQUEST_TIMEOUT_S = 5.0
DEFAULT_MAX_CONNECTIONS = 64
# Connections whose head is still arriving: each holds a socket and at most one head's bytes.
DEFAULT_MAX_PENDING = 256
_RECV_BYTES = 16 * 1024
_ACCEPTS_PER_WAKEUP = 64  # so a flood of connects cannot starve the reads of the others
_BUSY_REPLY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
# Lingering close after an error answer (see _RequestHandler.finish): at most this long and
# this many bytes of the client's unread request are drained before the socket is closed.
_LINGER_S = 2.0
_LINGER_BYTES = 1 << 20


def _address(client_address: object) -> str:
    if isinstance(client_address, tuple) and len(client_address) >= 2:
        host, port = client_address[0], client_address[1]
        return host_port(str(host), port)
    return str(client_address)


@dataclass(frozen=True, slots=True)
class PageRequest:
    """What a page handler sees of a request."""

    method: str  # "GET" or "HEAD" (the body of a HEAD response is dropped for you)
    path: str  # without the query string
    query: Mapping[str, list[str]]  # parse_qs(keep_blank_values=True) of the query string
    headers: Mapping[str, str] = field(default_factory=dict)
    # The URIs in the subjectAltName of the client's verified TLS certificate (HTTPS only).
    peer_uris: Sequence[str] = ()
    # The client's address, "host:port" (for logs: who asked).
    peer: str = ""

    def param(self, name: str, default: str | None = None) -> str | None:
        """The last value of query parameter `name`, or `default`."""
        values = self.query.get(name)
        return values[-1] if values else default


@dataclass(frozen=True, slots=True)
class PageResponse:
    """A complete response; build it with `text`, `html` or `json`."""

    body: bytes
    content_type: str
    status: int = 200

    @classmethod
    def text(cls, text: str, status: int = 200) -> PageResponse:
        return cls(text.encode(), "text/plain; charset=utf-8", status)

    @classmethod
    def html(cls, markup: str, status: int = 200) -> PageResponse:
        return cls(markup.encode(), "text/html; charset=utf-8", status)

    @classmethod
    def json(cls, obj: Any, status: int = 200) -> PageResponse:
        body = (json.dumps(obj, indent=2) + "\n").encode()
        return cls(body, export_json.CONTENT_TYPE, status)


class HttpError(Exception):
    """Raise from a page handler to answer with an error status (e.g. 400 for a bad query)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


PageHandler = Callable[[PageRequest], PageResponse]
# Runs before every page; raises HttpError (401, 403) to refuse the request.
PageGuard = Callable[[PageRequest], None]


def format_stacks() -> str:
    """Every live thread's current stack, with its name and ids (the `/stacks` page).

    Joins `sys._current_frames()` (ident → frame, for every thread, including ones started
    through `_thread` that `threading` does not know by name) with `threading.enumerate()`.
    """
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate() if t.ident is not None}
    parts = [f"{len(frames)} threads\n"]

    def sort_key(ident: int) -> tuple[str, int]:
        thread = threads.get(ident)
        return (thread.name if thread is not None else "", ident)

    for ident in sorted(frames, key=sort_key):
        thread = threads.get(ident)
        if thread is not None:
            header = (
                f'Thread "{thread.name}" ident={ident} native_id={thread.native_id} '
                f"daemon={thread.daemon}"
            )
        else:
            header = f'Thread "<not started by threading>" ident={ident}'
        stack = "".join(traceback.format_stack(frames[ident]))
        parts.append(f"\n{header}\n{stack}")
    del frames  # frames reference every thread's locals; do not keep them alive
    return "".join(parts)


class _ResponseWriter(io.RawIOBase):
    """The request thread's ``wfile``: every write must be taken by the client before one
    deadline (set at the first write), so a client that stops reading frees the thread."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        super().__init__()
        self._sock = sock
        self._timeout_s = timeout_s
        self._deadline: float | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self._deadline is None:
            self._deadline = time.monotonic() + self._timeout_s
        view = memoryview(data).cast("B")
        total = len(view)
        while view:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the client did not take the response in time")
            self._sock.settimeout(remaining)
            sent = self._sock.send(view)
            view = view[sent:]
        return total


class _HeadInProgress:
    """A connection whose request head is still arriving (the loop thread's alone)."""

    __slots__ = ("address", "buf", "deadline", "sock")

    def __init__(self, sock: socket.socket, address: Any, deadline: float) -> None:
        self.sock = sock
        self.address = address
        self.deadline = deadline
        self.buf = bytearray()


def _head_complete(buf: bytes | bytearray) -> bool:
    """Is ``buf`` a whole request head as the standard library's parser reads it: a request
    line, then header lines up to an empty one? A line of fewer than three words (HTTP/0.9,
    or junk the parser refuses) has no headers, so it is complete by itself."""
    end = buf.find(b"\n")
    if end < 0:
        return False
    if len(bytes(buf[:end]).split()) < 3:
        return True
    return buf.find(b"\n\r\n", end) >= 0 or buf.find(b"\n\n", end) >= 0


class _Server:
    """The listening socket, the loop that reads request heads, and the request threads."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[_RequestHandler],
        status_server: StatusServer,
        *,
        max_connections: int,
        max_pending: int,
        request_timeout_s: float,
        max_head_bytes: int,
    ) -> None:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        # SO_REUSEADDR (create_server's default on POSIX): a restarted server rebinds its port
        # while connections of the last one are in TIME_WAIT.
        self.socket = socket.create_server(address, family=family, backlog=128)
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self.status_server = status_server
        self._handler = handler
        self._slots = threading.BoundedSemaphore(max_connections)
        self._max_pending = max_pending
        self._timeout_s = request_timeout_s
        self._max_head = max_head_bytes
        self._pending: dict[socket.socket, _HeadInProgress] = {}  # oldest first (insertion order)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stopping = False

    # --- the loop thread --------------------------------------------------------------

    def serve_forever(self) -> None:
        sel = self._selector
        sel.register(self.socket, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stopping:
                timeout = None
                if self._pending:
                    oldest = next(iter(self._pending.values()))
                    timeout = max(0.0, oldest.deadline - time.monotonic())
                for key, _ in sel.select(timeout):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        self._read(key.data)
                self._expire()
        finally:
            for pending in list(self._pending.values()):
                self._drop(pending)
            sel.close()

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKEUP):
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                _log.debug("status server: accept failed", exc_info=True)
                return
            if len(self._pending) >= self._max_pending:
                self._drop(next(iter(self._pending.values())))  # the slowest goes
            sock.setblocking(False)
            pending = _HeadInProgress(sock, address, time.monotonic() + self._timeout_s)
            self._pending[sock] = pending
            self._selector.register(sock, selectors.EVENT_READ, pending)

    def _read(self, pending: _HeadInProgress) -> None:
        try:
            data = pending.sock.recv(_RECV_BYTES)
            # TLS may hold decrypted bytes the selector cannot see: take them now.
            while isinstance(pending.sock, ssl.SSLSocket) and pending.sock.pending():
                data += pending.sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            # Not a whole record yet, or (with TLS) the handshake, which recv drives on
            # this non-blocking socket, needs more from the client.
            return
        except OSError:
            self._drop(pending)
            return
        if not data:  # the client closed its side: a partial head still gets its 400
            if pending.buf:
                self._dispatch(pending, too_large=False)
            else:
                self._drop(pending)
            return
        pending.buf += data
        limit = self.status_server._max_request_line
        if b"\n" not in pending.buf[: limit + 1] and len(pending.buf) > limit:
            self._dispatch(pending, too_large=False)  # the handler answers 414
        elif len(pending.buf) > self._max_head:
            self._dispatch(pending, too_large=True)
        elif _head_complete(pending.buf):
            self._dispatch(pending, too_large=False)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if oldest.deadline > now:
                return
            _log.debug("status server: %s sent no whole request in time", oldest.address)
            self._drop(oldest)

    def _forget(self, pending: _HeadInProgress) -> None:
        del self._pending[pending.sock]
        self._selector.unregister(pending.sock)

    def _drop(self, pending: _HeadInProgress) -> None:
        self._forget(pending)
        pending.sock.close()

    def _dispatch(self, pending: _HeadInProgress, *, too_large: bool) -> None:
        self._forget(pending)
        sock, head = pending.sock, bytes(pending.buf)
        if not too_large and self._is_inline(head):
            self._answer_inline(sock, pending.address, head)
            return
        if not self._slots.acquire(blocking=False):
            # Answered here, without a thread, so a flood costs one short write each.
            with contextlib.suppress(OSError):
                sock.send(_BUSY_REPLY)
            sock.close()
            return
        try:
            threading.Thread(
                target=self._serve_request,
                args=(sock, pending.address, head, too_large),
                name="status-request",
                daemon=True,  # stop() must not hang on a slow client
            ).start()
        except BaseException:
            self._slots.release()  # the thread that would release it never started
            sock.close()
            raise

    def _is_inline(self, head: bytes) -> bool:
        words = head.split(b"\n", 1)[0].split()
        if len(words) not in (2, 3) or words[0] not in (b"GET", b"HEAD"):
            return False
        path = urlsplit(words[1].decode("latin-1")).path
        return path in self.status_server._inline_pages

    def _answer_inline(self, sock: socket.socket, address: Any, head: bytes) -> None:
        out = io.BytesIO()
        try:
            self._handler(cast(Any, (sock, head, False, out)), address, cast(Any, self))
            sock.send(out.getvalue())  # non-blocking: a few hundred bytes always fit
        except Exception:
            _log.debug("status server: inline answer to %s failed", address, exc_info=True)
        finally:
            sock.close()

    # --- request threads --------------------------------------------------------------

    def _serve_request(self, sock: socket.socket, address: Any, head: bytes, large: bool) -> None:
        try:
            sock.setblocking(True)
            self._handler(cast(Any, (sock, head, large, None)), address, cast(Any, self))
        except Exception:
            # E.g. a client that hangs up mid-response. Not a server problem; keep it out of
            # the operator's terminal.
            _log.debug("status server: error serving %s", address, exc_info=True)
        finally:
            with contextlib.suppress(OSError):
                sock.close()
            self._slots.release()

    # --- stop -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Ask the loop to end; returns at once (join its thread to wait)."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def server_close(self) -> None:
        self.socket.close()
        self._wake_r.close()
        self._wake_w.close()


class _RequestHandler(BaseHTTPRequestHandler):
    """Parses and answers one request whose head the loop has read.

    ``request`` is ``(socket, head, head_too_large, inline_out)``: the head is read from
    memory; the answer goes to the socket (with ``_ResponseWriter``'s deadline), or to
    ``inline_out`` when the loop thread answers it itself.
    """

    server: Any  # the _Server (not a socketserver.BaseServer)
    # One request per connection (see the module docstring).
    protocol_version = "HTTP/1.0"
    server_version = "raftlet-status"
    timeout = DEFAULT_REQUEST_TIMEOUT_S  # set per server in StatusServer.start()
    max_request_line = DEFAULT_MAX_REQUEST_LINE
    _head_too_large = False
    _inline = False
    # send_error's default body is an HTML page; a one-line text body suits curl and tests.
    error_message_format = "%(code)d %(message)s\n"
    error_content_type = "text/plain; charset=utf-8"

    # Set when we answer before reading the whole request (an error): see finish().
    _linger = False

    def setup(self) -> None:
        sock, head, self._head_too_large, inline_out = self.request
        self.connection = sock
        self.rfile = cast(io.BufferedIOBase, io.BytesIO(head))
        if inline_out is not None:
            self._inline = True
            self.wfile = cast(io.BufferedIOBase, inline_out)
        else:
            self.wfile = cast(io.BufferedIOBase, _ResponseWriter(sock, self.timeout))

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        self._linger = True
        super().send_error(code, message, explain)

    def finish(self) -> None:
        if self._inline:
            return  # the loop sends what is in the buffer; it must not block on a linger
        with contextlib.suppress(OSError):
            self.wfile.flush()
        if self._linger:
            self._lingering_close()

    def _lingering_close(self) -> None:
        """Half-close, then drain what the client is still sending, before the close.

        Closing a socket with unread input makes the kernel send a reset, and a reset can
        destroy our error response in the client's receive buffer before it reads it (a
        client still sending a 20 KB URL never sees its 414). Bounded in time and bytes, so
        a client cannot hold the thread by streaming forever.
        """
        sock = self.connection
        try:
            sock.shutdown(socket.SHUT_WR)  # the client sees the end of our answer now
            deadline = time.monotonic() + _LINGER_S
            budget = _LINGER_BYTES
            while budget > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                sock.settimeout(remaining)
                data = sock.recv(min(65536, budget))
                if not data:
                    break
                budget -= len(data)
        except OSError:
            pass  # reset, timeout: the close that follows is all that is left to do

    def handle_one_request(self) -> None:
        # The standard library's version, with our request-line limit instead of its 64 KiB
        # and 405 (not 501) for methods we do not serve.
        try:
            if self._head_too_large:
                self.requestline = ""
                self.request_version = ""
                self.command = ""
                self.close_connection = True
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
                return
            limit = self.max_request_line
            self.raw_requestline = self.rfile.readline(limit + 1)
            if len(self.raw_requestline) > limit:
                self.requestline = ""
                self.request_version = ""
                self.command = ""
                self.close_connection = True
                self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return  # parse_request has sent the error (400, 505, 431, …)
            if self.command not in ("GET", "HEAD"):
                # Any request body stays unread: close after this answer, lingering.
                self.close_connection = True
                self._linger = True
                self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
                self._send_body(
                    b"405 Method Not Allowed\n",
                    "text/plain; charset=utf-8",
                    extra_headers={"Allow": "GET, HEAD"},
                )
                return
            self._serve()
            self.wfile.flush()
        except TimeoutError as e:
            self.log_error("request timed out: %r", e)
            self.close_connection = True

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        page = self.server.status_server._pages.get(parts.path)
        if page is None:
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        request = PageRequest(
            method=self.command,
            path=parts.path,
            query=parse_qs(parts.query, keep_blank_values=True),
            headers=dict(self.headers.items()),
            peer_uris=peer_cert_uris(self.connection),
            peer=_address(self.client_address),
        )
        try:
            guard = self.server.status_server.guard
            if guard is not None:
                guard(request)
            response = page(request)
        except HttpError as e:
            self.send_error(e.status, _one_line(e.message))
            return
        except Exception as e:
            _log.warning("status page %s failed", parts.path, exc_info=True)
            self.send_error(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                f"Internal Server Error: page {parts.path} failed ({type(e).__name__})",
            )
            return
        self.send_response(response.status)
        body, extra = response.body, {}
        if len(body) >= _GZIP_LEAST_BYTES and _accepts_gzip(self.headers.get("Accept-Encoding")):
            # Prometheus asks for gzip; a 64-tablet server's /metrics is 1 MB of text that
            # compresses twentyfold (review r34b).
            body = gzip.compress(body, compresslevel=_GZIP_LEVEL)
            extra = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"}
        self._send_body(body, response.content_type, extra)

    def _send_body(
        self, body: bytes, content_type: str, extra_headers: Mapping[str, str] | None = None
    ) -> None:
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        # Metrics and stacks are live: a cache in between would show stale numbers.
        self.send_header("Cache-Control", "no-store")
        for name, value in (extra_headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def version_string(self) -> str:
        # The `Server` header; the default adds the Python version, which is nobody's business.
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:
        # Every request and every error response passes through here; the standard library
        # writes them to stderr.
        _log.debug("status server %s: " + format, self.address_string(), *args)


# Pages smaller than this go as they are: compressing them saves less than it costs.
_GZIP_LEAST_BYTES = 4096
# zlib's fastest level: a 64-tablet /metrics page shrinks to about a twentieth anyway.
_GZIP_LEVEL = 1


def _accepts_gzip(header: str | None) -> bool:
    """Whether an Accept-Encoding header takes gzip (``gzip``, ``gzip;q=0.5``, ``*``), and
    not with ``q=0``: gzip named takes precedence over ``*``."""
    weights: dict[str, float] = {}
    for part in (header or "").split(","):
        coding, _, params = part.strip().partition(";")
        q = params.strip().lower()
        try:
            weight = float(q[2:]) if q.startswith("q=") else 1.0
        except ValueError:
            weight = 0.0
        weights[coding.strip().lower()] = weight
    named = [weights[c] for c in ("gzip", "x-gzip") if c in weights]
    return max(named) > 0 if named else weights.get("*", 0.0) > 0


def _one_line(message: str) -> str:
    # send_error puts the message in the status line: no CR/LF, and keep it short.
    return " ".join(message.split())[:200]


class StatusServer:
    """The status server. `start()` binds and serves in a daemon thread; `stop()` undoes it.

    server = StatusServer(registry, "127.0.0.1", 0)
    server.start()
    server.port                       # the bound port (ephemeral when 0 was asked)
    server.register_page("/tablets", handler)
    server.stop()
    """

    def __init__(
        self,
        registry: MetricRegistry,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_request_line: int = DEFAULT_MAX_REQUEST_LINE,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_pending: int = DEFAULT_MAX_PENDING,
        server_name: str = "",
        ssl_context: ssl.SSLContext | None = None,
        guard: PageGuard | None = None,
    ) -> None:
        self.registry = registry
        self.ssl_context = ssl_context
        self.guard = guard
        self.server_name = server_name
        self._started_wall = time.time()
        self._started_mono = time.monotonic()
        # An IPv6 literal may come as the config writes it, "[::1]": the socket wants it bare
        # (``url()`` puts the brackets back).
        self.host = bare_host(host)
        self._requested_port = port
        self._max_request_line = max_request_line
        self._max_header_bytes = max_header_bytes
        self._request_timeout_s = request_timeout_s
        self._max_connections = max_connections
        self._max_pending = max_pending
        self._lock = threading.Lock()  # start/stop/register_page
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        # Copy-on-write: request threads read the current dict without the lock.
        self._pages: dict[str, PageHandler] = {}
        self._inline_pages: frozenset[str] = frozenset()  # answered on the loop thread
        self._process = ProcessCollector(registry)
        self.register_page("/", self._index_page)
        self.register_page("/metrics", self._metrics_page)
        self.register_page("/metrics.json", self._metrics_json_page)
        self.register_page("/stacks", self._stacks_page)
        self.register_page("/healthz", self._healthz_page, inline=True)

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Bind and start serving. Raises OSError if the port cannot be bound."""
        with self._lock:
            if self._server is not None:
                raise RuntimeError("status server already started")
            handler = type(
                "_BoundRequestHandler",
                (_RequestHandler,),
                {"timeout": self._request_timeout_s, "max_request_line": self._max_request_line},
            )
            server = _Server(
                (self.host, self._requested_port),
                handler,
                self,
                max_connections=self._max_connections,
                max_pending=self._max_pending,
                request_timeout_s=self._request_timeout_s,
                max_head_bytes=self._max_request_line + self._max_header_bytes,
            )
            if self.ssl_context is not None:
                # The one place TLS enters: accepted sockets are TLS sockets. Their handshake
                # is driven by the loop's non-blocking reads (``_read``), under the same
                # deadline as the request head, so a slow handshake holds up no one.
                server.socket = self.ssl_context.wrap_socket(
                    server.socket, server_side=True, do_handshake_on_connect=False
                )
            thread = threading.Thread(
                target=server.serve_forever,
                name=f"status-server:{server.server_address[1]}",
                daemon=True,
            )
            thread.start()
            self._server, self._thread = server, thread
            _log.info("status server listening on %s", self.url())

    def stop(self) -> None:
        """Stop accepting, join the serving thread and close the listening socket.

        Idempotent. Requests already being answered finish on their own daemon threads.
        """
        with self._lock:
            server, thread = self._server, self._thread
            self._server = self._thread = None
        if server is None or thread is None:
            return
        server.shutdown()
        thread.join()  # the loop has closed every connection still sending its head
        server.server_close()

    def __enter__(self) -> StatusServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (meaningful only while started)."""
        server = self._server
        if server is None:
            raise RuntimeError("status server is not started")
        return int(server.server_address[1])

    @property
    def thread(self) -> threading.Thread | None:
        """The serving thread while started (for tests and /stacks readers)."""
        return self._thread

    def url(self, path: str = "/", *, host: str | None = None) -> str:
        """The URL of ``path`` here: https under TLS. ``host`` names the server instead of the
        address it is bound to (which may be 0.0.0.0: no one can dial that)."""
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{host_port(self.host if host is None else host, self.port)}{path}"

    # --- pages -------------------------------------------------------------------------

    def register_page(
        self, path: str, handler: PageHandler, *, replace: bool = False, inline: bool = False
    ) -> None:
        """Serve `handler(request)` at exactly `path` (no query, no prefix matching).

        May be called before or after `start()`. Registering a taken path is an error unless
        `replace=True`, so two components cannot silently fight over one page. An `inline`
        page is answered on the loop thread, never waiting for a request thread (see the
        module docstring): only for handlers that return at once with a small body.
        """
        if not path.startswith("/") or "?" in path or "#" in path:
            raise ValueError(f"page path must start with '/' and have no query: {path!r}")
        with self._lock:
            if path in self._pages and not replace:
                raise ValueError(f"status page {path!r} is already registered")
            self._pages = {**self._pages, path: handler}
            pages = set(self._inline_pages)
            if inline:
                pages.add(path)
            else:
                pages.discard(path)
            self._inline_pages = frozenset(pages)

    def pages(self) -> Sequence[str]:
        return sorted(self._pages)

    def banner(self) -> str:
        """Which server this is, its version and uptime: the first line of every page."""
        who = f"{self.server_name} · " if self.server_name else ""
        up = human_duration(time.monotonic() - self._started_mono)
        return (
            f"{who}raftlet {raftlet.__version__} · up {up} (since {utc_time(self._started_wall)})"
        )

    def html_page(self, title: str, body: str) -> PageResponse:
        """An HTML page with the server's banner above ``body`` (markup, already escaped)."""
        name = html.escape(self.server_name or "raftlet")
        return PageResponse.html(
            f"<html><head><title>{name}: {html.escape(title)}</title></head><body>"
            f"<p>{html.escape(self.banner())}</p><h1>{html.escape(title)}</h1>{body}"
            "</body></html>\n"
        )

    def _index_page(self, request: PageRequest) -> PageResponse:
        links = "".join(
            f'<li><a href="{html.escape(p)}">{html.escape(p)}</a></li>' for p in self.pages()
        )
        return self.html_page("status pages", f"<ul>{links}</ul>")

    def _metrics_page(self, request: PageRequest) -> PageResponse:
        # ``name[]=...`` (repeatable) asks for those metrics only, as a Prometheus
        # federation or a CPU reading (``raftlet write``) does: the whole page of a server
        # of 64 tablets is 12,000 lines (most of them histogram buckets).
        names = request.query.get("name[]")
        body = export_prometheus.generate_prometheus_text(
            self.registry, [self._process], frozenset(names) if names else None
        )
        return PageResponse(body, export_prometheus.CONTENT_TYPE)

    def _metrics_json_page(self, request: PageRequest) -> PageResponse:
        try:
            options = export_json.options_from_query(request.query)
        except ValueError as e:
            raise HttpError(HTTPStatus.BAD_REQUEST, str(e)) from e
        body = export_json.generate_json_text(self.registry, options, self._process.figures())
        return PageResponse(body, export_json.CONTENT_TYPE)

    def _stacks_page(self, request: PageRequest) -> PageResponse:
        return PageResponse.text(f"{self.banner()}\n\n{format_stacks()}")

    def _healthz_page(self, request: PageRequest) -> PageResponse:
        return PageResponse.text("OK")
