"""Writes over ``TabletService.WriteStream``: one long-lived stream per server, many writes in
flight on it, each answered on its own.

``AsyncWriteStream.write(request, timeout)`` behaves like the unary ``Write`` call -- it
returns the ``WriteResponse`` or raises a ``grpc.RpcError`` whose ``code()``, ``details()``
and trailing ``ServerErrorPB`` are what the unary call would have failed with -- so the
asyncio client's routing and retry code (``retry.classify``) cannot tell them apart. What
differs is the cost: every write started in one turn of the event loop leaves in one frame,
and answers come back batched the same way, instead of one gRPC call per write.

The stream opens on first use and again after it breaks. A broken stream fails every write
still waiting on it with UNAVAILABLE (the retry policy sends it again, with the same
request id, so it is applied at most once); a write not answered within its ``timeout``
fails with DEADLINE_EXCEEDED.

A frame over a gRPC message limit breaks the stream with RESOURCE_EXHAUSTED "message larger
than max (size vs. limit)". The stream then knows the limit: a waiting write that would not
fit a frame of its own fails with that error (the retry policy does not retry it: it would
fail again), the others with UNAVAILABLE as above, and from then on frames are cut to the
limit, so writes that fit alone never break the stream together. A frame carries at most
``MAX_WRITES_PER_MESSAGE`` writes however small they are: the server ends a stream that
sends more in one message (INVALID_ARGUMENT).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from raftlet.client.retry import CREDENTIALS_REFUSED, too_large
from raftlet.proto import ERROR_METADATA_KEY, MAX_WRITES_PER_MESSAGE, tablet_pb2
from raftlet.proto.common_pb2 import ServerErrorPB

__all__ = [
    "WRITE_STREAM_METHOD",
    "AsyncWriteStream",
    "StreamedRpcError",
    "expire",
    "unary_call",
    "write_result",
]

T = TypeVar("T")

WRITE_STREAM_METHOD = "/raftlet.TabletService/WriteStream"

_STATUS_BY_VALUE = {s.value[0]: s for s in grpc.StatusCode}
# After a failed write, how long the stream's reader may take to bring the call's status:
# the call has ended, so its status is on its way; the bound is for a reader stuck anyway.
_STATUS_WAIT_S = 1.0


class StreamedRpcError(grpc.RpcError):  # type: ignore[misc]  # grpc ships no types
    """A write's failure as a unary call would have raised it."""

    def __init__(
        self, code: grpc.StatusCode, details: str, error: ServerErrorPB | None = None
    ) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self._error = error
        # gRPC's message-size error that ended the stream, if that is what ended it.
        self.size_error = ""

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        if self._error is None:
            return ()
        return ((ERROR_METADATA_KEY, self._error.SerializeToString()),)


async def unary_call(start: Callable[[], Awaitable[T]]) -> T:
    """Start one ``grpc.aio`` call (``start()``) and await it. Closing its channel cancels
    it, and grpc.aio then raises ``CancelledError`` in the awaiting task -- which escaped
    ``except Exception`` and read as the caller's own task being cancelled when a client
    was closed during a leader look-up. Unless this task itself is being cancelled, that is
    the call's failure: CANCELLED, which the retry loop turns into ``ClientClosed`` once
    closed. A channel closed before the call starts (grpc.aio's ``UsageError``) is the
    same."""
    try:
        return await start()
    except grpc.aio.UsageError:
        raise StreamedRpcError(grpc.StatusCode.CANCELLED, "the channel is closed") from None
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        raise StreamedRpcError(
            grpc.StatusCode.CANCELLED, "the call was cancelled: its channel closed"
        ) from None


def expire(pending: dict[int, asyncio.Future[tablet_pb2.WriteResponse]], write_id: int) -> None:
    """A write's deadline passed before its answer came: DEADLINE_EXCEEDED, as for a call."""
    future = pending.pop(write_id, None)
    if future is not None and not future.done():
        future.set_exception(
            StreamedRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        )


def write_result(
    future: asyncio.Future[tablet_pb2.WriteResponse], result: tablet_pb2.WriteStreamResultPB
) -> None:
    """Complete a write's ``future`` with its streamed ``result``: the response, or the
    error the unary call would have raised."""
    if result.status_code == 0:
        future.set_result(result.response)
        return
    code = _STATUS_BY_VALUE.get(result.status_code, grpc.StatusCode.UNKNOWN)
    error = result.error if result.HasField("error") else None
    future.set_exception(StreamedRpcError(code, result.status_message, error))


# A stream refused before it took any write: the write was not applied, and a retry meets
# the same refusal (no WriteStream: the caller falls back to unary calls; not allowed: the
# caller is told why, at once, as the unary call would tell it).
_REFUSED_STREAM = CREDENTIALS_REFUSED | {grpc.StatusCode.UNIMPLEMENTED}


def _stream_failed(code: grpc.StatusCode, details: str | None) -> StreamedRpcError:
    """What a write waiting on a stream that ended gets.  The stream's own status says
    nothing of the write (which may or may not have been applied), so it is UNAVAILABLE --
    retriable, and the request id keeps a retry from applying it twice -- unless the
    server refused the stream itself (``_REFUSED_STREAM``): then that status.  (Every
    write once retried a PERMISSION_DENIED as UNAVAILABLE until its deadline.)"""
    if code in _REFUSED_STREAM:
        return StreamedRpcError(code, details or f"WriteStream refused: {code.name}")
    failure = StreamedRpcError(
        grpc.StatusCode.UNAVAILABLE, f"write stream ended: {code.name}: {details or ''}"
    )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and details and too_large(details):
        failure.size_error = details
    return failure


async def _status_or(
    reader: asyncio.Future[StreamedRpcError | None], failure: StreamedRpcError
) -> StreamedRpcError:
    """Why the stream ended, when a write on it failed: what its reader got, if it gets
    anything within ``_STATUS_WAIT_S``, else the write's own ``failure``.  A write on a call
    the server has already ended -- at once, with UNIMPLEMENTED, for a server without
    WriteStream -- can fail with the library's own error instead ("RPC already finished",
    or an INTERNAL one; now and then, on a loaded machine -- a full test run hit it); the
    reader gets the server's status, which is what tells the caller to fall back to unary
    calls, where UNAVAILABLE would have it open the same refused stream again."""
    await asyncio.wait({reader}, timeout=_STATUS_WAIT_S)
    if reader.done() and not reader.cancelled() and reader.exception() is None:
        return reader.result() or failure
    return failure


def _frames(
    items: list[tablet_pb2.WriteStreamItemPB], limit: int | None
) -> list[tablet_pb2.WriteStreamRequestPB]:
    """``items`` in frames of at most ``MAX_WRITES_PER_MESSAGE`` writes and ``limit`` bytes
    (by count alone when no limit is known); an item too large for any frame goes alone,
    and fails as it must."""
    per = MAX_WRITES_PER_MESSAGE
    if limit is None:
        return [
            tablet_pb2.WriteStreamRequestPB(items=items[i : i + per])
            for i in range(0, len(items), per)
        ]
    frames: list[tablet_pb2.WriteStreamRequestPB] = []
    frame = tablet_pb2.WriteStreamRequestPB()
    used = 0
    for item in items:
        # An item's field tag and length prefix: at most 6 bytes below 2 GiB.
        size = item.ByteSize() + 6
        if frame.items and (used + size > limit or len(frame.items) == per):
            frames.append(frame)
            frame, used = tablet_pb2.WriteStreamRequestPB(), 0
        frame.items.append(item)
        used += size
    frames.append(frame)
    return frames


class AsyncWriteStream:
    """The write stream to one server; use from the event loop that owns ``channel``."""

    def __init__(self, address: str, channel: grpc.aio.Channel) -> None:
        self.address = address
        self._method = channel.stream_stream(
            WRITE_STREAM_METHOD,
            request_serializer=tablet_pb2.WriteStreamRequestPB.SerializeToString,
            response_deserializer=tablet_pb2.WriteStreamResponsePB.FromString,
        )
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tablet_pb2.WriteResponse]] = {}
        # The request of each pending write, to tell after a size error which ones can
        # never fit a frame; and that limit, once a size error taught it.
        self._requests: dict[int, tablet_pb2.WriteRequest] = {}
        self._frame_limit: int | None = None
        self._queue: list[tablet_pb2.WriteStreamItemPB] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def write(
        self, request: tablet_pb2.WriteRequest, timeout: float
    ) -> tablet_pb2.WriteResponse:
        if self._closed:
            raise StreamedRpcError(grpc.StatusCode.CANCELLED, "the client is closed")
        loop = asyncio.get_running_loop()
        write_id = next(self._ids)
        future: asyncio.Future[tablet_pb2.WriteResponse] = loop.create_future()
        self._pending[write_id] = future
        self._requests[write_id] = request
        self._queue.append(tablet_pb2.WriteStreamItemPB(id=write_id, request=request))
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name=f"write-stream:{self.address}")
        expiry = loop.call_later(timeout, expire, self._pending, write_id)
        try:
            return await future
        finally:
            expiry.cancel()
            self._pending.pop(write_id, None)
            self._requests.pop(write_id, None)

    async def _run(self) -> None:
        """Open the stream; write what is queued, one frame per turn; until it breaks.

        The stream stays open while idle (one is cheap, and reopening costs a round trip),
        so a single writer pays for one frame each way per write and no call setup."""
        call = self._method()
        reader = asyncio.ensure_future(self._read(call))
        error: StreamedRpcError | None = None
        try:
            while not self._closed:
                self._wake.clear()
                if self._queue:
                    items, self._queue = self._queue, []
                    for frame in _frames(items, self._frame_limit):
                        await call.write(frame)
                    continue
                waker = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait({reader, waker}, return_when=asyncio.FIRST_COMPLETED)
                waker.cancel()
                if reader.done():
                    break
        except grpc.aio.AioRpcError as exc:
            error = await _status_or(reader, _stream_failed(exc.code(), exc.details()))
        except (grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
            error = await _status_or(reader, _stream_failed(grpc.StatusCode.UNAVAILABLE, str(exc)))
        finally:
            reader.cancel()
            call.cancel()
            if error is None and reader.done() and not reader.cancelled():
                with contextlib.suppress(Exception):
                    error = reader.result()
            self._fail_waiting(error)
            if self._queue and not self._closed:
                # Queued after the stream ended: a fresh stream takes them.
                self._task = asyncio.get_running_loop().create_task(self._run())

    async def _read(self, call: Any) -> StreamedRpcError | None:
        try:
            while True:
                frame = await call.read()
                if frame is grpc.aio.EOF:
                    return None
                for result in frame.results:
                    self._answer(result)
        except grpc.aio.AioRpcError as exc:
            return _stream_failed(exc.code(), exc.details())

    def _answer(self, result: tablet_pb2.WriteStreamResultPB) -> None:
        future = self._pending.pop(result.id, None)
        if future is not None and not future.done():  # else expired already
            write_result(future, result)

    def _fail_waiting(self, error: StreamedRpcError | None) -> None:
        """Every write sent on the ended stream and not answered: UNAVAILABLE, retriable --
        except, after a size error, the writes too large to ever fit a frame."""
        failure = error or StreamedRpcError(
            grpc.StatusCode.UNAVAILABLE, "the write stream ended before answering"
        )
        size_error = error is not None and error.size_error
        if size_error:
            found = too_large(size_error)
            if found is not None:
                self._frame_limit = found[2]
        queued = {item.id for item in self._queue}
        for write_id, future in list(self._pending.items()):
            if write_id in queued or future.done():
                continue
            del self._pending[write_id]
            request = self._requests.pop(write_id, None)
            own = self._too_large(write_id, request) if size_error and request else None
            if own is not None:
                future.set_exception(StreamedRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, own))
            else:
                future.set_exception(failure)

    def _too_large(self, write_id: int, request: tablet_pb2.WriteRequest) -> str | None:
        """gRPC's size error for ``request`` alone in a frame, if it is over the limit: the
        frame's own error gave the size of the whole frame, other writes and all."""
        alone = tablet_pb2.WriteStreamRequestPB(
            items=[tablet_pb2.WriteStreamItemPB(id=write_id, request=request)]
        ).ByteSize()
        limit = self._frame_limit
        if limit is None or alone <= limit:
            return None
        return f"CLIENT: Sent message larger than max ({alone} vs. {limit})"

    async def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for future in self._pending.values():
            if not future.done():
                future.set_exception(
                    StreamedRpcError(grpc.StatusCode.CANCELLED, "the client is closed")
                )
        self._pending.clear()
        self._requests.clear()
