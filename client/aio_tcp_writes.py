"""Writes over a server's plain-TCP write port: the write stream's messages
(``aio_write_stream``) on one asyncio TCP connection, without gRPC.

``TcpWriteStream.write(request, timeout)`` behaves as ``AsyncWriteStream.write`` does --
returns the ``WriteResponse`` or raises a ``StreamedRpcError`` with the status, details and
``ServerErrorPB`` the unary call would have failed with -- so the client's retry policy
cannot tell them apart. Frames are a 4-byte big-endian length, then a
``WriteStreamRequestPB`` (out) or ``WriteStreamResponsePB`` (in); every write started in one
turn of the event loop leaves in one frame.

The server gives the port, and the largest frame it takes, in ``TabletService.WriteEndpoint``
(``open_tcp_write_stream``). A frame over that limit would close the connection and fail
every write on it, so a write too large for a frame of its own fails alone, with gRPC's
"message larger than max" error (not retried); larger batches are cut into frames under it.
A connection that breaks fails every write still waiting on it with UNAVAILABLE (retried
with the same request id, so applied at most once); a write unanswered within its
``timeout`` fails with DEADLINE_EXCEEDED.

Against a TLS cluster the connection is TLS (``ssl_context``, from the client's
``TlsOptions``: its certificate presented, the server's verified by the host dialed); the
server admits writers only (``tserver.tcp_admission``), and a reader never gets this far:
``WriteEndpoint`` already needs the writer role.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
import struct

import grpc

from raftlet.client.aio_write_stream import StreamedRpcError, expire, unary_call, write_result
from raftlet.client.call_slots import NEVER_SENT
from raftlet.proto import MAX_WRITES_PER_MESSAGE, tablet_pb2, tablet_pb2_grpc

__all__ = ["TcpWriteStream", "TcpWritesTo", "open_tcp_write_stream"]

_HEADER = struct.Struct(">I")
_CONNECT_TIMEOUT_S = 5.0
# After the server had no tcp port for us, or could not be reached on it: when to ask again.
_RETRY_INITIAL_S = 1.0
_RETRY_MAX_S = 60.0


class TcpWritesTo:
    """The tcp write stream to one server, opened on first use and again after it broke;
    ``stream()`` is None while there is none to use (the caller uses the gRPC stream)."""

    def __init__(
        self,
        address: str,
        stub: tablet_pb2_grpc.TabletServiceStub,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.address = address
        self._stub = stub
        self._ssl = ssl_context
        self._stream: TcpWriteStream | None = None
        self._opening: asyncio.Future[TcpWriteStream | None] | None = None  # a task
        self._retry_at = 0.0
        self._backoff = _RETRY_INITIAL_S
        self._closed = False

    def open_stream(self) -> TcpWriteStream | None:
        """The stream, if one is open and unbroken (``stream()`` opens one)."""
        stream = self._stream
        return stream if stream is not None and not stream.broken else None

    async def stream(self, wait_s: float | None = None) -> TcpWriteStream | None:
        """The stream to write on, or None (use the gRPC stream). Opening one may take up
        to the connect timeout; a caller waits for it at most ``wait_s`` (its write's
        timeout), then gets ``DEADLINE_EXCEEDED`` -- as a call to a server that does not
        answer would, but saying it was never sent -- while the opening goes on for the
        writes after it."""
        if (ready := self.open_stream()) is not None:
            return ready
        stream = self._stream
        if self._opening is None:
            loop = asyncio.get_running_loop()
            if stream is not None and stream.answered:
                self._backoff = _RETRY_INITIAL_S  # it served: open the next one at once
            elif stream is not None:
                # It ended before it answered anything: a server over its connection limit
                # takes a connection and closes it.  A failed open, then: back off, and the
                # writes go on the gRPC stream meanwhile -- reopening at once (a connect is
                # "success") had every write fail on one such connection after another.
                self._stream = None
                self._retry_at = loop.time() + self._backoff
                self._backoff = min(self._backoff * 2, _RETRY_MAX_S)
            if self._closed or loop.time() < self._retry_at:
                return None
            # A task of its own: a writer that stops waiting does not cancel the opening.
            self._opening = asyncio.ensure_future(self._open())
        try:
            return await asyncio.wait_for(asyncio.shield(self._opening), wait_s)
        except TimeoutError:
            # Still DEADLINE_EXCEEDED (a server whose port does not open is left for another
            # replica), but said never sent: it was reported "may have been applied".
            raise StreamedRpcError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{NEVER_SENT}: the write port of {self.address} was still opening when the "
                "attempt's time ran out",
            ) from None

    async def _open(self) -> TcpWriteStream | None:
        loop = asyncio.get_running_loop()
        stream = None
        try:
            stream = await open_tcp_write_stream(self.address, self._stub, self._ssl)
            if stream is not None and self._stopping():  # closed while it opened
                await stream.close()
                stream = None
        finally:
            if stream is None:
                self._retry_at = loop.time() + self._backoff
                self._backoff = min(self._backoff * 2, _RETRY_MAX_S)
            self._stream = stream
            self._opening = None
        return stream

    def _stopping(self) -> bool:
        # A call: a type checker narrowing ``self._closed`` across an await would call the
        # check after it unreachable.
        return self._closed

    async def close(self) -> None:
        self._closed = True
        if self._stream is not None:
            await self._stream.close()
            self._stream = None


async def open_tcp_write_stream(
    address: str,
    stub: tablet_pb2_grpc.TabletServiceStub,
    ssl_context: ssl.SSLContext | None = None,
    timeout: float = 5.0,
) -> TcpWriteStream | None:
    """A connected write stream to the server at ``address`` (TLS with ``ssl_context``,
    the server verified by the host of ``address`` as gRPC verifies it), or None when it
    has no tcp write port, or advertises another address (we reach it through a proxy or
    NAT, which its port would bypass), or cannot be asked (a reader may not) or reached or
    handshaken with (the caller then uses the gRPC stream)."""
    try:
        # Closing the client's channels cancels the call: CANCELLED, not the opening task's
        # cancellation, which every writer waiting on it took for its own.
        answer = await unary_call(
            lambda: stub.WriteEndpoint(tablet_pb2.WriteEndpointRequest(), timeout=timeout)
        )
    except grpc.RpcError:
        return None
    if answer.port == 0 or answer.advertised_address != address:
        return None
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                host,
                answer.port,
                ssl=ssl_context,
                server_hostname=host if ssl_context is not None else None,
            ),
            _CONNECT_TIMEOUT_S,
        )
    except (OSError, TimeoutError):
        return None
    return TcpWriteStream(address, reader, writer, int(answer.max_frame_bytes))


def _unavailable(details: str) -> StreamedRpcError:
    return StreamedRpcError(grpc.StatusCode.UNAVAILABLE, details)


class TcpWriteStream:
    """One connection's writes; use from the event loop that opened it."""

    def __init__(
        self,
        address: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_frame_bytes: int,
    ) -> None:
        self.address = address
        self._reader = reader
        self._writer = writer
        self._max_frame_bytes = max_frame_bytes
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tablet_pb2.WriteResponse]] = {}
        self._queue: list[bytes] = []  # serialized WriteStreamItemPBs, as frame entries
        self._flush_due = False
        self._failure: StreamedRpcError | None = None
        self._answered = False
        self._reading = asyncio.get_running_loop().create_task(
            self._read(), name=f"tcp-writes:{address}"
        )

    @property
    def broken(self) -> bool:
        return self._failure is not None

    @property
    def answered(self) -> bool:
        """Whether the server answered anything on it (it took the connection, then)."""
        return self._answered

    async def write(
        self, request: tablet_pb2.WriteRequest, timeout: float
    ) -> tablet_pb2.WriteResponse:
        if self._failure is not None:
            raise self._failure
        write_id = next(self._ids)
        entry = tablet_pb2.WriteStreamRequestPB(
            items=[tablet_pb2.WriteStreamItemPB(id=write_id, request=request)]
        ).SerializeToString()
        if len(entry) > self._max_frame_bytes:
            # Worded as gRPC words a request it would not send, so the failure reads as
            # the request's (never sent, so never applied), not a response's.
            raise StreamedRpcError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"CLIENT: Sent message larger than max ({len(entry)} vs. {self._max_frame_bytes})",
            )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tablet_pb2.WriteResponse] = loop.create_future()
        self._pending[write_id] = future
        self._queue.append(entry)
        if not self._flush_due:
            self._flush_due = True
            loop.call_soon(self._flush)
        expiry = loop.call_later(timeout, expire, self._pending, write_id)
        try:
            return await future
        finally:
            expiry.cancel()
            self._pending.pop(write_id, None)

    def _flush(self) -> None:
        """Once per loop turn: everything queued, as few frames as the limits allow (bytes,
        and ``MAX_WRITES_PER_MESSAGE`` writes: the server closes a connection that sends
        more in one frame; a frame's entries concatenate into one ``WriteStreamRequestPB``)."""
        self._flush_due = False
        entries, self._queue = self._queue, []
        if self._failure is not None or not entries:
            return
        out: list[bytes] = []
        start, size = 0, 0
        for k, entry in enumerate(entries):
            if k > start and (
                size + len(entry) > self._max_frame_bytes or k - start == MAX_WRITES_PER_MESSAGE
            ):
                out.append(_HEADER.pack(size))
                out.extend(entries[start:k])
                start, size = k, 0
            size += len(entry)
        out.append(_HEADER.pack(size))
        out.extend(entries[start:])
        try:
            self._writer.writelines(out)
        except (OSError, RuntimeError) as exc:
            self._fail(_unavailable(f"write connection to {self.address} failed: {exc}"))

    async def _read(self) -> None:
        try:
            while True:
                (length,) = _HEADER.unpack(await self._reader.readexactly(_HEADER.size))
                body = await self._reader.readexactly(length)
                self._answered = True
                for result in tablet_pb2.WriteStreamResponsePB.FromString(body).results:
                    future = self._pending.pop(result.id, None)
                    if future is not None and not future.done():
                        write_result(future, result)
        except (OSError, asyncio.IncompleteReadError) as exc:
            self._fail(_unavailable(f"write connection to {self.address} ended: {exc!r}"))
        except asyncio.CancelledError:
            # By close(), or by the end of its event loop (asyncio.run cancels the tasks
            # left): closed now, while the loop can still close a transport.
            self._fail(StreamedRpcError(grpc.StatusCode.CANCELLED, "the event loop ended"))
            raise
        except Exception as exc:  # an answer that does not decode: the server is broken
            self._fail(_unavailable(f"write connection to {self.address}: {exc!r}"))

    def _fail(self, failure: StreamedRpcError) -> None:
        """The connection is done: every write waiting on it fails with ``failure``."""
        if self._failure is None:
            self._failure = failure
        self._writer.close()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(failure)

    async def close(self) -> None:
        self._fail(StreamedRpcError(grpc.StatusCode.CANCELLED, "the client is closed"))
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reading
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
