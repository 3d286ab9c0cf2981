"""A WriteStream message carries at most ``MAX_WRITES_PER_MESSAGE`` writes: the server ends
a stream whose message has more with INVALID_ARGUMENT before any write of it is built or
started, and the asyncio client cuts its frames at the limit. One 4 MB message of ~2 million
empty writes took a server from 208 MB to 1.3 GB, and its event loop for minutes."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest

from raftlet.client.aio_channels import GrpcAsyncServerStub
from raftlet.proto import MAX_WRITES_PER_MESSAGE, tablet_pb2, tablet_pb2_grpc
from raftlet.tserver.tablet_replica import WriteCallbacks
from raftlet.tserver.write_stream import StreamWindows, WriteStreamSession
from tests.unit.aio_tablet_server import with_tablet_server, write_request
from tests.unit.inline_pool import InlinePool

LIMIT = 16 * 1024 * 1024
PEER = "ipv4:192.0.2.7:5555"


class Replica:
    """Answers every write at once; counts what it was given."""

    def __init__(self) -> None:
        self.taken = 0

    def write(self, request: tablet_pb2.WriteRequest, callbacks: WriteCallbacks) -> None:
        self.taken += 1
        callbacks.respond(tablet_pb2.WriteResponse(op_index=request.request_id.seq_no))


class Aborted(Exception):
    pass


class FakeContext:
    """The stream's server side: the frames to read, then what was written or aborted."""

    def __init__(self, frames: list[tablet_pb2.WriteStreamRequestPB]) -> None:
        self._frames = list(frames)
        self.written: list[tablet_pb2.WriteStreamResultPB] = []
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def peer(self) -> str:
        return PEER

    async def read(self) -> Any:
        return self._frames.pop(0) if self._frames else grpc.aio.EOF

    async def write(self, message: tablet_pb2.WriteStreamResponsePB) -> None:
        self.written.extend(message.results)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise Aborted(details)


def _frame(n: int, first_id: int = 0) -> tablet_pb2.WriteStreamRequestPB:
    """``n`` writes; empty ones (the attack: ~2 bytes each on the wire) unless told."""
    return tablet_pb2.WriteStreamRequestPB(
        items=[tablet_pb2.WriteStreamItemPB(id=first_id + i) for i in range(n)]
    )


def test_a_message_over_the_limit_ends_the_stream_before_any_write_is_started(
    caplog: pytest.LogCaptureFixture,
) -> None:
    over = MAX_WRITES_PER_MESSAGE + 904  # 5,000

    async def run() -> None:
        pool, replica, windows = InlinePool(), Replica(), StreamWindows()
        hostile = FakeContext([_frame(3), _frame(over, first_id=100)])
        honest = FakeContext([_frame(5, first_id=10_000)])
        with windows.of(PEER) as window:
            make = _session_maker(pool, replica, window)
            # Another stream of the same connection, open across the refusal.
            other = asyncio.ensure_future(make().serve(honest))  # type: ignore[arg-type]
            with pytest.raises(Aborted):
                await asyncio.wait_for(make().serve(hostile), timeout=10)  # type: ignore[arg-type]
            await asyncio.wait_for(other, timeout=10)
            # The refused stream let go of its share of the connection's window.
            assert window.outstanding == 0
            assert window.has_room()
        assert hostile.aborted is not None
        code, details = hostile.aborted
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert f"{over} writes" in details
        assert f"at most {MAX_WRITES_PER_MESSAGE}" in details
        # Only the first, small frame's writes were started; none of the large one's.
        assert replica.taken == 3 + 5
        assert sorted(r.id for r in honest.written) == list(range(10_000, 10_005))
        assert all(r.id < 100 for r in hostile.written)
        assert pool.metrics.failed_for("WriteStream", "INVALID_ARGUMENT").value() == 1
        refusals = [r for r in caplog.records if "one message may carry" in r.getMessage()]
        assert len(refusals) == 1
        assert refusals[0].levelno == logging.WARNING
        assert PEER in refusals[0].getMessage()

    with caplog.at_level(logging.WARNING, logger="raftlet.tserver.write_stream"):
        asyncio.run(run())


def test_a_message_at_the_limit_is_served() -> None:
    async def run() -> None:
        pool, replica, windows = InlinePool(), Replica(), StreamWindows()
        context = FakeContext([_frame(MAX_WRITES_PER_MESSAGE)])
        with windows.of(PEER) as window:
            session = _session_maker(pool, replica, window)()
            await asyncio.wait_for(session.serve(context), timeout=10)  # type: ignore[arg-type]
        assert context.aborted is None
        assert sorted(r.id for r in context.written) == list(range(MAX_WRITES_PER_MESSAGE))
        assert replica.taken == MAX_WRITES_PER_MESSAGE
        assert pool.metrics.failed_for("WriteStream", "INVALID_ARGUMENT").value() == 0

    asyncio.run(run())


def _session_maker(pool: InlinePool, replica: Replica, window: Any) -> Any:
    def make() -> WriteStreamSession:
        return WriteStreamSession(
            asyncio.get_running_loop(),
            pool,  # type: ignore[arg-type]
            lambda _tablet: replica,  # type: ignore[arg-type,return-value]
            lambda _server: "",
            max_frame_bytes=LIMIT,
            window=window,
        )

    return make


class SessionServicer(tablet_pb2_grpc.TabletServiceServicer):
    """The server's own write stream session on an in-process gRPC server; records the
    writes of each message it read."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.pool = InlinePool()
        self.windows = StreamWindows()
        self.frame_sizes: list[int] = []

    async def WriteStream(self, request_iterator: Any, context: Any) -> None:
        servicer = self

        class Recording:
            """``context`` with each message's size noted as the session reads it."""

            def __getattr__(self, name: str) -> Any:
                return getattr(context, name)

            async def read(self) -> Any:
                frame = await context.read()
                if frame is not grpc.aio.EOF:
                    servicer.frame_sizes.append(len(frame.items))
                return frame

        with self.windows.of(str(context.peer())) as window:
            session = _session_maker(self.pool, self.replica, window)()
            await session.serve(Recording())  # type: ignore[arg-type]


def test_the_async_client_cuts_its_messages_at_the_limit() -> None:
    """Writes started in one turn of the loop left as one message, however many: 5,000 of
    them would have had the stream ended, and every one of them failed."""
    n = MAX_WRITES_PER_MESSAGE + 904
    servicer = SessionServicer(Replica())

    async def run(stub: GrpcAsyncServerStub) -> None:
        responses = await asyncio.gather(
            *(stub.write(write_request(s), 30) for s in range(1, n + 1))
        )
        assert [r.op_index for r in responses] == list(range(1, n + 1))
        assert sum(servicer.frame_sizes) == n
        assert max(servicer.frame_sizes) == MAX_WRITES_PER_MESSAGE
        assert servicer.pool.metrics.failed_for("WriteStream", "INVALID_ARGUMENT").value() == 0

    asyncio.run(with_tablet_server(servicer, run, timeout_s=60))
