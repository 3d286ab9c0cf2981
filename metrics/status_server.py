"""The HTTP status server: metrics, thread stacks and health on a port of its own.

Pages: `/metrics` (Prometheus text, the registry's metrics then the process's
CPU time, `metrics.process`), `/metrics.json` (Kudu-style JSON, with
`?metrics=` and the other filters of `metrics.export_json`), `/stacks` (every thread's stack),
`/healthz` ("OK"), `/` (the list of pages). Other components add pages with
`register_page(path, handler)`; the tablet server adds `/tablets` and `/tablets.json`.

Built on the standard library (`http.server.ThreadingHTTPServer`, one daemon thread per
connection, the accept loop in a daemon thread of its own), because a status page needs no
framework. It is a debugging and scraping port, not a service: HTTP/1.0, one request per
connection, so `stop()` never waits on idle keep-alive connections.

Safety rules — a bad request must never hurt the server:
- unknown path → 404; a method other than GET/HEAD → 405 (with `Allow`); a request line
  longer than `max_request_line` (8 KiB by default, which bounds the query string) → 414;
  a malformed request → 400 (the standard library's parser).
- a page handler that raises → 500 with a one-line message; the traceback goes to the log,
  and the server goes on serving. Handlers build the whole body before anything is sent, so
  a failure never leaves a half-written response.
- a connection that sends nothing is dropped after `request_timeout` seconds, and at most
  `max_connections` are served at once (the rest get an immediate 503), so neither a slow
  nor a flooding client can pile up threads without bound.
- nothing is printed to stderr: request and error logs go to `logging` at debug level.
"""

from __future__ import annotations

import contextlib
import html
import json
import logging
import socket
import ssl
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import raftlet
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
DEFAULT_REQUEST_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 64
# Lingering close after an error answer (see _RequestHandler.finish): at most this long and
# this many bytes of the client's unread request are drained before the socket is closed.
_LINGER_S = 2.0
_LINGER_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class PageRequest:
    """What a page handler sees of a request."""

    method: str  # "GET" or "HEAD" (the body of a HEAD response is dropped for you)
    path: str  # without the query string
    query: Mapping[str, list[str]]  # parse_qs(keep_blank_values=True) of the query string
    headers: Mapping[str, str] = field(default_factory=dict)
    # The URIs in the subjectAltName of the client's verified TLS certificate (HTTPS only).
    peer_uris: Sequence[str] = ()

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


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with a connection cap and errors routed to `logging`."""

    # Connection threads are daemons: stop() must not hang on a slow client, and a request
    # in flight when the process exits has nobody left to care about its answer.
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        status_server: StatusServer,
        max_connections: int,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.status_server = status_server
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            # Answer inline (no thread) so a flood costs one short write per connection.
            with contextlib.suppress(OSError):
                request.sendall(
                    b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n"
                    b"Connection: close\r\n\r\n"
                )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()  # the thread that would release it never started
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver's default prints a traceback to stderr, e.g. whenever a client hangs
        # up mid-response. Not a server problem; keep it out of the operator's terminal.
        _log.debug("status server: error serving %s", client_address, exc_info=True)


class _RequestHandler(BaseHTTPRequestHandler):
    server: _Server
    # One request per connection (see the module docstring).
    protocol_version = "HTTP/1.0"
    server_version = "raftlet-status"
    timeout = DEFAULT_REQUEST_TIMEOUT_S  # set per server in StatusServer.start()
    max_request_line = DEFAULT_MAX_REQUEST_LINE
    # send_error's default body is an HTML page; a one-line text body suits curl and tests.
    error_message_format = "%(code)d %(message)s\n"
    error_content_type = "text/plain; charset=utf-8"

    # Set when we answer before reading the whole request (an error): see finish().
    _linger = False

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        self._linger = True
        super().send_error(code, message, explain)

    def finish(self) -> None:
        super().finish()  # flushes the response
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
            peer_uris=_peer_uris(self.connection),
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
        self._send_body(response.body, response.content_type)

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


def _peer_uris(connection: Any) -> tuple[str, ...]:
    if not isinstance(connection, ssl.SSLSocket):
        return ()
    cert = connection.getpeercert()  # verified against the CA, or None if none was sent
    if not cert:
        return ()
    sans = cast(tuple[tuple[str, str], ...], cert.get("subjectAltName", ()))
    return tuple(value for kind, value in sans if kind == "URI")


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
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
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
        self.host = host
        self._requested_port = port
        self._max_request_line = max_request_line
        self._request_timeout_s = request_timeout_s
        self._max_connections = max_connections
        self._lock = threading.Lock()  # start/stop/register_page
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        # Copy-on-write: request threads read the current dict without the lock.
        self._pages: dict[str, PageHandler] = {}
        self._process = ProcessCollector(registry)
        self.register_page("/", self._index_page)
        self.register_page("/metrics", self._metrics_page)
        self.register_page("/metrics.json", self._metrics_json_page)
        self.register_page("/stacks", self._stacks_page)
        self.register_page("/healthz", self._healthz_page)

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
                (self.host, self._requested_port), handler, self, self._max_connections
            )
            if self.ssl_context is not None:
                # The one place TLS enters: accepted sockets are TLS sockets. The handshake
                # runs on the connection's thread at its first read (not in the accept
                # loop, where one slow client would hold up every other), under the
                # request timeout.
                server.socket = self.ssl_context.wrap_socket(
                    server.socket, server_side=True, do_handshake_on_connect=False
                )
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.1},  # how long shutdown() may wait for the loop
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
        server.shutdown()  # returns once serve_forever has left its loop
        thread.join()
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

    def url(self, path: str = "/") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{host}:{self.port}{path}"

    # --- pages -------------------------------------------------------------------------

    def register_page(self, path: str, handler: PageHandler, *, replace: bool = False) -> None:
        """Serve `handler(request)` at exactly `path` (no query, no prefix matching).

        May be called before or after `start()`. Registering a taken path is an error unless
        `replace=True`, so two components cannot silently fight over one page.
        """
        if not path.startswith("/") or "?" in path or "#" in path:
            raise ValueError(f"page path must start with '/' and have no query: {path!r}")
        with self._lock:
            if path in self._pages and not replace:
                raise ValueError(f"status page {path!r} is already registered")
            self._pages = {**self._pages, path: handler}

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
        body = export_prometheus.generate_prometheus_text(self.registry, [self._process])
        return PageResponse(body, export_prometheus.CONTENT_TYPE)

    def _metrics_json_page(self, request: PageRequest) -> PageResponse:
        try:
            options = export_json.options_from_query(request.query)
        except ValueError as e:
            raise HttpError(HTTPStatus.BAD_REQUEST, str(e)) from e
        body = export_json.generate_json_text(self.registry, options)
        return PageResponse(body, export_json.CONTENT_TYPE)

    def _stacks_page(self, request: PageRequest) -> PageResponse:
        return PageResponse.text(f"{self.banner()}\n\n{format_stacks()}")

    def _healthz_page(self, request: PageRequest) -> PageResponse:
        return PageResponse.text("OK")
