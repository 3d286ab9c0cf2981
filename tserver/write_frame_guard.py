"""A WriteStream message's writes, counted before protobuf builds them.

``tserver.write_stream`` ends a stream whose message carries more than
``MAX_WRITES_PER_MESSAGE`` writes, but gRPC had decoded the message first: an empty write is
two bytes on the wire, and one 16 MB message of 2.7 million of them cost ~140 MB of memory
as protobuf objects before the refusal -- eight at once took a server from 102 MB to 1.2 GB,
which its allocator kept (review r26v).  The tcp write port counts before it decodes; this
guard does the same for gRPC: it wraps the WriteStream deserializer, and a message with too
many writes becomes ``TooManyWrites`` -- never parsed -- which the stream refuses.

Counting costs one C pass over the bytes (``bytes.count``): each write of a message begins
with the byte 0x0A (field 1, length-delimited), so a message with at most the limit of those
bytes has at most the limit of writes.  Only a message with more -- values full of newlines,
or a hostile one -- is walked field by field, and the walk stops at the first write over the
limit: a few thousand steps at most.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from raftlet.proto import MAX_WRITES_PER_MESSAGE

__all__ = ["WRITE_STREAM_METHOD", "TooManyWrites", "WriteFrameGuard", "writes_over"]

WRITE_STREAM_METHOD = "/raftlet.TabletService/WriteStream"
_ITEM_TAG = b"\x0a"  # field 1 (items), wire type 2


class TooManyWrites:
    """In place of a WriteStream message with more than the limit of writes: ``count`` is
    how many the walk counted when it stopped (the limit + 1)."""

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        self.count = count


def writes_over(data: bytes, limit: int = MAX_WRITES_PER_MESSAGE) -> int:
    """0 if the encoded WriteStreamRequestPB ``data`` holds at most ``limit`` writes, else
    ``limit`` + 1.  Bytes that are no protobuf count 0: the parser then says what is wrong."""
    if data.count(_ITEM_TAG) <= limit:
        return 0
    count = 0
    pos, end = 0, len(data)
    try:
        while pos < end:
            tag, pos = _varint(data, pos)
            wire = tag & 7
            if wire == 2:
                length, pos = _varint(data, pos)
                pos += length
            elif wire == 0:
                _, pos = _varint(data, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                return 0
            if tag >> 3 == 1:
                count += 1
                if count > limit:
                    return count
    except (IndexError, ValueError):
        return 0
    return 0


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


class WriteFrameGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # untyped grpc
    """Wraps the WriteStream handler's deserializer with ``writes_over``."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if (
            handler is None
            or handler_call_details.method != WRITE_STREAM_METHOD
            or handler.request_deserializer is None
        ):
            return handler
        decode = handler.request_deserializer

        def guarded(data: bytes) -> Any:
            over = writes_over(data)
            return TooManyWrites(over) if over else decode(data)

        return handler._replace(request_deserializer=guarded)
