"""The asyncio client's write stream against small in-process grpc.aio servers: writes
started together leave as one frame and are answered each on its own; a failed write raises
what the unary call would have; a server without WriteStream gets unary calls instead."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from raftlet.client.aio_channels import GrpcAsyncServerStub
from raftlet.client.aio_write_stream import StreamedRpcError
from raftlet.client.retry import Action, Cause, classify
from raftlet.proto import ERROR_METADATA_KEY, tablet_pb2, tablet_pb2_grpc
from raftlet.proto.common_pb2 import ServerErrorPB
from tests.unit.aio_tablet_server import with_tablet_server, write_request


class StreamingServer(tablet_pb2_grpc.TabletServiceServicer):
    """Answers each write with op_index = its seq_no, in reverse order within a frame;
    seq_no 0 is refused with NOT_LEADER."""

    def __init__(self) -> None:
        self.frames = 0
        self.unary = 0

    async def WriteStream(self, request_iterator: Any, context: Any) -> Any:
        async for frame in request_iterator:
            self.frames += 1
            results = []
            for item in reversed(frame.items):
                seq = item.request.request_id.seq_no
                if seq == 0:
                    results.append(
                        tablet_pb2.WriteStreamResultPB(
                            id=item.id,
                            status_code=grpc.StatusCode.FAILED_PRECONDITION.value[0],
                            status_message="not the leader",
                            error=ServerErrorPB(code=ServerErrorPB.NOT_LEADER, leader_uuid="ts9"),
                        )
                    )
                else:
                    response = tablet_pb2.WriteResponse(op_index=seq)
                    results.append(tablet_pb2.WriteStreamResultPB(id=item.id, response=response))
            yield tablet_pb2.WriteStreamResponsePB(results=results)

    async def Write(self, request: Any, context: Any) -> Any:
        self.unary += 1
        return tablet_pb2.WriteResponse(op_index=request.request_id.seq_no)


class UnaryOnlyServer(tablet_pb2_grpc.TabletServiceServicer):
    """A server from before WriteStream: the generated base answers it UNIMPLEMENTED."""

    def __init__(self) -> None:
        self.unary = 0

    async def Write(self, request: Any, context: Any) -> Any:
        self.unary += 1
        return tablet_pb2.WriteResponse(op_index=request.request_id.seq_no)


def test_writes_started_together_share_a_frame_and_get_their_own_answers() -> None:
    servicer = StreamingServer()

    async def body(stub: GrpcAsyncServerStub) -> None:
        responses = await asyncio.gather(*(stub.write(write_request(s), 10) for s in range(1, 51)))
        assert [r.op_index for r in responses] == list(range(1, 51))
        assert servicer.frames == 1
        assert servicer.unary == 0
        # The stream stays open: the next write is one more frame, not a new call.
        assert (await stub.write(write_request(77), 10)).op_index == 77
        assert servicer.frames == 2

    asyncio.run(with_tablet_server(servicer, body))


def test_a_refused_write_raises_what_the_unary_call_would() -> None:
    async def body(stub: GrpcAsyncServerStub) -> None:
        with pytest.raises(StreamedRpcError) as refused:
            await stub.write(write_request(0), 10)
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details() == "not the leader"
        ((key, raw),) = refused.value.trailing_metadata()
        assert key == ERROR_METADATA_KEY
        assert ServerErrorPB.FromString(raw).leader_uuid == "ts9"
        # The stream is still good for the next write.
        assert (await stub.write(write_request(5), 10)).op_index == 5

    asyncio.run(with_tablet_server(StreamingServer(), body))


def test_a_server_without_write_stream_gets_unary_writes() -> None:
    servicer = UnaryOnlyServer()

    async def body(stub: GrpcAsyncServerStub) -> None:
        assert (await stub.write(write_request(3), 10)).op_index == 3
        assert (await stub.write(write_request(4), 10)).op_index == 4
        assert servicer.unary == 2

    asyncio.run(with_tablet_server(servicer, body))


def _sized(seq: int, size: int) -> tablet_pb2.WriteRequest:
    req = write_request(seq)
    req.row_block.rows = b"x" * size
    return req


def test_a_frame_over_the_servers_limit_fails_only_the_write_that_never_fits() -> None:
    servicer = StreamingServer()
    limit = 64 << 10

    async def body(stub: GrpcAsyncServerStub) -> None:
        outcomes = await asyncio.gather(
            stub.write(_sized(1, 100 << 10), 10),
            stub.write(_sized(2, 100), 10),
            return_exceptions=True,
        )
        too_big, small = outcomes
        assert isinstance(too_big, StreamedRpcError)
        failure = classify(too_big)
        assert failure.cause is Cause.MESSAGE_TOO_LARGE
        assert failure.action is Action.FAIL
        # Its own size, not the frame's (which the small write's bytes made larger).
        alone = tablet_pb2.WriteStreamRequestPB(
            items=[tablet_pb2.WriteStreamItemPB(id=1, request=_sized(1, 100 << 10))]
        ).ByteSize()
        assert f"larger than max ({alone} vs. {limit})" in failure.message
        # The small write shared the broken frame: retriable, and it goes through alone.
        assert isinstance(small, StreamedRpcError)
        assert classify(small).action is Action.NEXT_REPLICA
        assert (await stub.write(_sized(2, 100), 10)).op_index == 2

    asyncio.run(with_tablet_server(servicer, body, receive_limit=limit))


def test_after_a_size_error_frames_are_cut_to_the_servers_limit() -> None:
    servicer = StreamingServer()
    limit = 64 << 10

    async def body(stub: GrpcAsyncServerStub) -> None:
        # Ten writes of 10 KiB: each fits, their frame does not.
        first = await asyncio.gather(
            *(stub.write(_sized(s, 10 << 10), 10) for s in range(1, 11)),
            return_exceptions=True,
        )
        assert all(isinstance(f, StreamedRpcError) for f in first)
        assert {classify(f).cause for f in first if isinstance(f, StreamedRpcError)} == {
            Cause.UNAVAILABLE
        }
        # The stream learned the limit: the same ten now go in frames that fit.
        again = await asyncio.gather(*(stub.write(_sized(s, 10 << 10), 10) for s in range(1, 11)))
        assert [r.op_index for r in again] == list(range(1, 11))
        assert servicer.frames >= 2

    asyncio.run(with_tablet_server(servicer, body, receive_limit=limit))


class _EndedCall:
    """A write stream the server ended with UNIMPLEMENTED before the client's first write
    went out: the write fails with ``write_error`` (what grpc.aio raises then varies), the
    read with the server's status."""

    def __init__(
        self, write_error: BaseException, status: grpc.StatusCode = grpc.StatusCode.UNIMPLEMENTED
    ) -> None:
        self._write_error = write_error
        self._status = status

    async def write(self, frame: Any) -> None:
        raise self._write_error

    async def read(self) -> Any:
        empty = grpc.aio.Metadata()
        raise grpc.aio.AioRpcError(self._status, empty, empty, f"refused: {self._status.name}")

    def cancel(self) -> bool:
        return True


class _EndedChannel:
    def __init__(
        self, write_error: BaseException, status: grpc.StatusCode = grpc.StatusCode.UNIMPLEMENTED
    ) -> None:
        self._write_error = write_error
        self._status = status

    def stream_stream(self, *_: Any, **__: Any) -> Any:
        return lambda: _EndedCall(self._write_error, self._status)


@pytest.mark.parametrize(
    "write_error",
    [
        asyncio.InvalidStateError("RPC already finished."),
        grpc.aio.AioRpcError(
            grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), "from Core"
        ),
    ],
    ids=["already-finished", "internal"],
)
def test_a_write_on_a_stream_the_server_refused_reports_the_servers_status(
    write_error: BaseException,
) -> None:
    """However the client library fails the write, the caller sees UNIMPLEMENTED -- what
    makes it fall back to unary calls -- not a retriable UNAVAILABLE that would open the
    same refused stream again."""
    from raftlet.client.aio_write_stream import AsyncWriteStream

    async def body() -> None:
        stream = AsyncWriteStream("127.0.0.1:1", _EndedChannel(write_error))  # type: ignore[arg-type]
        with pytest.raises(StreamedRpcError) as failed:
            await stream.write(write_request(1), 10)
        assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED
        await stream.close()

    asyncio.run(body())


@pytest.mark.parametrize(
    "status", [grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED]
)
def test_a_stream_refused_to_the_caller_fails_its_write_with_that_refusal(
    status: grpc.StatusCode,
) -> None:
    """A reader's certificate, a bad token: the stream is refused before it takes a write.
    Every write once failed UNAVAILABLE instead, and was retried until its deadline."""
    from raftlet.client.aio_write_stream import AsyncWriteStream

    async def body() -> None:
        ended = _EndedChannel(asyncio.InvalidStateError("RPC already finished."), status)
        stream = AsyncWriteStream("127.0.0.1:1", ended)  # type: ignore[arg-type]
        with pytest.raises(StreamedRpcError) as failed:
            await stream.write(write_request(1), 10)
        assert failed.value.code() == status
        await stream.close()

    asyncio.run(body())
