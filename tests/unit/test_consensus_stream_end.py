"""A consensus stream that ends (its server stopping cancels it) while an answer is being
written: the write ends first.  Cancelled under way, gRPC's core was still sending the
message as the handler returned and refused the call's status ("too many operations"): the
call never finished, and the stopping server waited out its whole 5 s grace (review r26v)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from raftlet.consensus.workers import WorkerPool
from raftlet.proto import consensus_pb2 as pb
from raftlet.tserver.consensus_stream_server import StreamSession


class BlockedWrite:
    """A servicer context whose peer sends nothing and whose first write hangs until
    ``release``d; it notes whether that write completed or was cancelled."""

    def __init__(self) -> None:
        self.writing = asyncio.Event()
        self.release = asyncio.Event()
        self.outcome = ""

    async def read(self) -> Any:
        await asyncio.Event().wait()  # until cancelled
        return grpc.aio.EOF

    async def write(self, frame: pb.ConsensusFramePB) -> None:
        self.writing.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.outcome = "cancelled"
            raise
        self.outcome = "written"


def test_a_stream_cancelled_mid_write_lets_the_write_end_first() -> None:
    pool = WorkerPool("stream-end-test", min_threads=1, max_threads=1)

    async def run() -> None:
        context = BlockedWrite()
        session = StreamSession(
            asyncio.get_running_loop(),
            pool,
            object(),  # type: ignore[arg-type]  # nothing is read, so nothing is stepped
            max_frame_bytes=1 << 20,
        )
        serving = asyncio.ensure_future(session.serve(context))  # type: ignore[arg-type]
        session._post(pb.ConsensusItemPB(seq=1))
        await asyncio.wait_for(context.writing.wait(), 5)
        serving.cancel()  # what end_streams does to every stream as the server stops
        for _ in range(20):
            await asyncio.sleep(0)  # let the cancellation reach the session
        assert not serving.done()  # it waits for the write under way
        context.release.set()
        await asyncio.wait_for(serving, 5)
        assert context.outcome == "written"

    try:
        asyncio.run(run())
    finally:
        pool.stop(timeout=5)
