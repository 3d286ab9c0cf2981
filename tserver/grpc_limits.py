"""What one gRPC client may hold of the tablet server's resources.

A unary call's response lives in the server's memory until the client reads it, and HTTP/2
flow control lets a client decline to read: a client that opened hundreds of Scan calls on
one connection with a window of 0 (it never reads) grew a server from 73 MiB to over
800 MiB (issue #15). Three bounds, all applied where the gRPC server is built
(``tserver.server``):

- ``MAX_CONCURRENT_STREAMS`` (HTTP/2 ``SETTINGS_MAX_CONCURRENT_STREAMS``) per connection:
  beyond it the server refuses new streams (REFUSED_STREAM, which grpcio reports as
  UNAVAILABLE "... RST_STREAM with error code 7"). gRPC's clients hold calls over the cap
  back, but by their own count, while the server counts a call until its core lets go of
  it, a little after the client saw it end: a client near the cap has calls refused. So
  raftlet's clients keep fewer in flight on a connection (``client.channels``:
  ``MAX_CALLS_IN_FLIGHT``) and retry a refused one on the same server (``client.retry``:
  STREAM_REFUSED); a client of 60 threads had hundreds of writes refused before that.
- ``UnreadResponseBudget``, an interceptor: the bytes of unary responses that a connection
  has been answered but has not yet taken (from when the handler returns to when gRPC
  finishes the call), per connection (16 MiB) and per server (128 MiB). A connection over
  its budget, or one holding at least ``FAIR_SHARE_FLOOR_BYTES`` while the server is over
  its own, has new unary calls refused with RESOURCE_EXHAUSTED, so what a non-reading
  client can pin is bounded in bytes, and other clients are still served while one
  connection is stuck.
- ``MAX_CONCURRENT_RPCS`` (``grpc.aio.server(maximum_concurrent_rpcs=…)``), the last resort
  across every connection: a call beyond it is RESOURCE_EXHAUSTED before it is even
  dispatched. High, because long-lived streams (peers' consensus streams, clients' write
  streams) count too and must not be refused in normal operation.

Why these numbers: the server's service pools hold at most ~200 unary calls doing work
(queues plus threads), so 64 streams per connection leave a client all the parallelism it
can use (at 256, the never-reading client below grew the server by ~280 MiB, not ~125),
and 1024 concurrent
calls server-wide leave room for every long-lived stream of a large deployment on top of
that. The process holds a stuck response in several copies (the message, its serialized
bytes, the transport's frames): measured, 200 never-read 1 MiB Scan pages on one connection
took the server from 65 to ~800 MiB of RSS unbounded, and to ~170 MiB with these limits (the
16 MiB budget of that connection); eight such connections, ~670 MiB against ~1.9 GiB. A
scan page is at most half of ``--max_message_bytes``; a connection that holds nothing may
always be given one response, however large, so a small budget never makes a scan
impossible. Responses of reads (``DROPPABLE_METHODS``) are dropped when the size, known only
after the handler ran, would break a budget: many calls admitted together would otherwise
all be held. A write's response is never dropped (RESOURCE_EXHAUSTED tells the client the
write did not happen); write responses are tiny anyway. Streaming responses are not
counted: their flow is the stream's own business (the write stream stops reading a client
past its window of unanswered writes and bytes, ``tserver.write_stream``; a consensus stream
belongs to a peer).

- ``MAX_CONNECTIONS_PER_PORT`` (``grpc.max_allowed_incoming_connections``) and
  ``HANDSHAKE_TIMEOUT_MS`` (``grpc.server_handshake_timeout_ms``): connections, not calls.
  Each open connection costs the server a descriptor and ~40 KB, and the token port takes
  them from anyone (its caller shows a token only with a call): 4,000 held-open anonymous
  connections grew a server by ~160 MiB and 4,000 descriptors, and nothing stopped more but
  the process's descriptor limit -- which its WAL segments and peer links share, so running
  out would fail far more than new calls. gRPC counts the cap per listening port and closes
  a connection over it as soon as it is accepted, before any byte is read; one that has not
  finished its TLS handshake and HTTP/2 preface within 10 s (gRPC's default is 120 s) is
  closed too, so connections that never handshake free their place in the time the tcp
  ports give them (``tserver.tcp_admission``). Legitimate use is far below the cap: the
  threaded clients of a process share one connection per server, each asyncio client holds
  one of its own (``client.aio_channels``), a peer server two.

Limits these do not remove: a client with many connections multiplies the per-connection
bounds until the server-wide ones refuse everyone's new calls, which trades memory for
availability; authentication (TLS and roles) is what keeps such a client out.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

__all__ = [
    "HANDSHAKE_TIMEOUT_MS",
    "MAX_CONCURRENT_RPCS",
    "MAX_CONCURRENT_STREAMS",
    "MAX_CONNECTIONS_PER_PORT",
    "PER_CONNECTION_UNREAD_BYTES",
    "PER_SERVER_UNREAD_BYTES",
    "SCAN_METHOD",
    "UnreadResponseBudget",
    "server_limit_options",
]

MiB = 1 << 20
MAX_CONCURRENT_STREAMS = 64
MAX_CONCURRENT_RPCS = 1024
MAX_CONNECTIONS_PER_PORT = 2048
HANDSHAKE_TIMEOUT_MS = 10_000
PER_CONNECTION_UNREAD_BYTES = 16 * MiB
PER_SERVER_UNREAD_BYTES = 128 * MiB
# While the server is over its budget, connections holding less than this are still served.
FAIR_SHARE_FLOOR_BYTES = MiB
# Reads: a response of these may be dropped after the handler ran (RESOURCE_EXHAUSTED; the
# client retries the stateless call). A write's response never is: the write happened, and
# RESOURCE_EXHAUSTED tells a client that it did not.
SCAN_METHOD = "/raftlet.TabletService/Scan"
DROPPABLE_METHODS = frozenset(
    {
        SCAN_METHOD,
        "/raftlet.TabletService/ListTablets",
        "/raftlet.TabletService/GetClusterConfig",
        "/raftlet.AdminService/GetFlags",
        "/raftlet.AdminService/GetConsensusStatus",
    }
)


def server_limit_options(
    max_concurrent_streams: int = MAX_CONCURRENT_STREAMS,
    max_connections_per_port: int = MAX_CONNECTIONS_PER_PORT,
    handshake_timeout_ms: int = HANDSHAKE_TIMEOUT_MS,
) -> list[tuple[str, int]]:
    """gRPC server options for the per-connection and per-port limits (added to
    ``server_options``)."""
    return [
        ("grpc.max_concurrent_streams", max_concurrent_streams),
        ("grpc.max_allowed_incoming_connections", max_connections_per_port),
        ("grpc.server_handshake_timeout_ms", handshake_timeout_ms),
    ]


class UnreadResponseBudget(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # untyped grpc
    """Refuse new unary calls of a connection (or of everyone) holding too many unread
    response bytes. Thread-safe, though grpc.aio calls it from its one event loop."""

    def __init__(
        self,
        per_connection_bytes: int = PER_CONNECTION_UNREAD_BYTES,
        per_server_bytes: int = PER_SERVER_UNREAD_BYTES,
        on_dropped: Callable[[str, Any, Any], None] | None = None,
    ) -> None:
        self.per_connection_bytes = per_connection_bytes
        self.per_server_bytes = per_server_bytes
        # Told (method, request, response) of a response made and then dropped: what the
        # handler kept for the client's next call (a held scan) is no use to it.
        self._on_dropped = on_dropped
        self._lock = threading.Lock()
        self._by_peer: dict[str, int] = {}  # connection (client ip:port) -> unread bytes
        self._total = 0

    def unread_bytes(self, peer: str | None = None) -> int:
        """Unread response bytes of connection ``peer``, or of the whole server."""
        with self._lock:
            return self._total if peer is None else self._by_peer.get(peer, 0)

    def _refusal(self, peer: str, nbytes: int = 0) -> str | None:
        """Why connection ``peer`` may not have ``nbytes`` more of responses held for it,
        or None. A connection holding nothing may always have one (however large: a
        budget below one scan page must not make scans impossible)."""
        with self._lock:
            return self._refusal_locked(peer, nbytes)

    def _refusal_locked(self, peer: str, nbytes: int) -> str | None:
        mine = self._by_peer.get(peer, 0)
        total = self._total
        if mine == 0 and nbytes:
            return None
        if mine + nbytes > self.per_connection_bytes or (
            not nbytes and mine >= self.per_connection_bytes
        ):
            return (
                f"this connection has {mine} bytes of responses it has not read (at most "
                f"{self.per_connection_bytes}); read them before starting more calls"
            )
        # Over the server's budget, only connections that hold a real share are refused
        # (a client with nothing unread is still served: the stuck ones are the problem).
        if total + nbytes >= self.per_server_bytes and mine + nbytes >= FAIR_SHARE_FLOOR_BYTES:
            return (
                f"the server holds {total} bytes of responses clients have not read (at "
                f"most {self.per_server_bytes}); retry later"
            )
        return None

    def _try_hold(self, peer: str, nbytes: int, droppable: bool) -> str | None:
        """Hold ``nbytes`` for ``peer``; if ``droppable`` and over budget, hold nothing and
        say why. Checked and held under one lock, so concurrent calls cannot all slip in."""
        with self._lock:
            refusal = self._refusal_locked(peer, nbytes) if droppable else None
            if refusal is None:
                self._by_peer[peer] = self._by_peer.get(peer, 0) + nbytes
                self._total += nbytes
            return refusal

    def _release(self, peer: str, nbytes: int) -> None:
        with self._lock:
            left = self._by_peer.get(peer, 0) - nbytes
            if left > 0:
                self._by_peer[peer] = left
            else:
                self._by_peer.pop(peer, None)  # no entry per past connection
            self._total -= nbytes

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler  # streaming responses are not counted (see the module docstring)
        behaviour = handler.unary_unary
        droppable = handler_call_details.method in DROPPABLE_METHODS

        async def budgeted(request: Any, context: grpc.aio.ServicerContext) -> Any:
            peer = context.peer() or ""
            refusal = self._refusal(peer)
            if refusal is not None:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
            response = await behaviour(request, context)
            nbytes = response.ByteSize() if hasattr(response, "ByteSize") else 0
            if nbytes:
                # Held from now until gRPC finishes the call: the response has then been
                # handed to the connection in full (or the call failed and dropped it).
                refusal = self._try_hold(peer, nbytes, droppable)
                if refusal is not None:
                    # Checked again with the size known: calls admitted together would
                    # otherwise all be held. Only a read may be dropped after it ran.
                    if self._on_dropped is not None:
                        self._on_dropped(handler_call_details.method, request, response)
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
                context.add_done_callback(lambda _call: self._release(peer, nbytes))
            return response

        return grpc.unary_unary_rpc_method_handler(
            budgeted,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
