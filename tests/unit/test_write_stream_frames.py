"""tserver/write_stream.py: the answers to a frame of writes leave in messages of at most
``max_frame_bytes`` -- answers with many row errors are large, and one message over the
server's limit would end the client's stream -- each answer once, none lost."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from raftlet.consensus.core import NotLeaderError
from raftlet.proto import tablet_pb2
from raftlet.proto.common_pb2 import ServerErrorPB
from raftlet.tserver.service_pool import InboundCall, ServicePool
from raftlet.tserver.tablet_replica import WriteCallbacks
from raftlet.tserver.write_stream import WriteStreamSession, offer_writes
from tests.unit.inline_pool import InlinePool

LIMIT = 4096
ERRORS_PER_WRITE = 20  # ~40 bytes each: an answer of ~800 bytes


class AnsweringReplica:
    """Answers every write at once with ``ERRORS_PER_WRITE`` row errors."""

    def write(self, request: tablet_pb2.WriteRequest, callbacks: WriteCallbacks) -> None:
        response = tablet_pb2.WriteResponse(op_index=request.request_id.seq_no, op_term=1)
        for i in range(ERRORS_PER_WRITE):
            response.row_errors.add(
                row_index=i, code=tablet_pb2.RowErrorPB.KEY_EXISTS, message=f"key {i} present"
            )
        callbacks.respond(response)


class FakeContext:
    """The stream's server side: the frames to read, then the messages written."""

    def __init__(self, frames: list[tablet_pb2.WriteStreamRequestPB]) -> None:
        self._frames = list(frames)
        self.written: list[tablet_pb2.WriteStreamResponsePB] = []

    async def read(self) -> Any:
        return self._frames.pop(0) if self._frames else grpc.aio.EOF

    async def write(self, message: tablet_pb2.WriteStreamResponsePB) -> None:
        self.written.append(message)


def _served(frame: tablet_pb2.WriteStreamRequestPB, pool: InlinePool, replica: Any) -> FakeContext:
    """One stream of ``frame`` served to its end, every write going to ``replica``."""

    async def serve() -> FakeContext:
        context = FakeContext([frame])
        session = WriteStreamSession(
            asyncio.get_running_loop(),
            pool,  # type: ignore[arg-type]
            lambda _tablet: replica,
            lambda _server: "",
            max_frame_bytes=LIMIT,
        )
        await asyncio.wait_for(session.serve(context), timeout=10)  # type: ignore[arg-type]
        return context

    return asyncio.run(serve())


def test_the_answers_to_a_frame_leave_in_messages_under_the_limit() -> None:
    n = 50
    frame = tablet_pb2.WriteStreamRequestPB()
    for i in range(n):
        item = frame.items.add(id=i)
        item.request.tablet_id = "kv-p0"
        item.request.request_id.client_id = "c"
        item.request.request_id.seq_no = i

    context = _served(frame, InlinePool(), AnsweringReplica())
    results = [r for message in context.written for r in message.results]
    assert sorted(r.id for r in results) == list(range(n))  # each answered once
    assert all(r.response.op_index == r.id for r in results)
    assert sum(m.ByteSize() for m in context.written) > 5 * LIMIT
    assert all(m.ByteSize() <= LIMIT for m in context.written)


class RefusingReplica:
    """Every write refused as a follower refuses it."""

    def write(self, request: tablet_pb2.WriteRequest, callbacks: WriteCallbacks) -> None:
        raise NotLeaderError("ts2", 3)


def test_a_refused_write_of_a_stream_is_counted_by_its_status() -> None:
    """Each write of a stream (or of the tcp write port) answered with an error counts in
    ``rpcs_failed_total``, as a unary Write's failure does: refusals were counted nowhere."""
    frame = tablet_pb2.WriteStreamRequestPB()
    for i in range(3):
        frame.items.add(id=i).request.tablet_id = "kv-p0"
    pool = InlinePool()
    context = _served(frame, pool, RefusingReplica())
    results = [r for message in context.written for r in message.results]
    assert {r.status_code for r in results} == {grpc.StatusCode.FAILED_PRECONDITION.value[0]}
    # Counted as redirects (error=NOT_LEADER), which `raftlet metrics` keeps off its errors.
    assert pool.metrics.failed_for("WriteStream", "FAILED_PRECONDITION", "NOT_LEADER").value() == 3
    assert pool.metrics.failed_for("WriteStream", "FAILED_PRECONDITION").value() == 0


def test_a_frame_refused_for_a_full_queue_counts_an_overflow_per_write() -> None:
    """Review r34b: the overflow counter said 126 where clients had 592 writes refused --
    a frame of writes is one call for the pool, and it counted the call."""
    pool = ServicePool("tablet", num_threads=1, queue_length=1)  # not started: nothing drains
    assert pool.offer(InboundCall("Write", lambda _call: None))  # the one place taken
    posted: list[tablet_pb2.WriteStreamResultPB] = []
    items = [tablet_pb2.WriteStreamItemPB(id=i) for i in range(5)]
    offer_writes(pool, items, lambda _tablet: None, lambda _server: "", posted.append)
    assert [r.error.code for r in posted] == [ServerErrorPB.SERVICE_QUEUE_FULL] * 5
    assert pool.metrics.queue_overflow_for("WriteStream").value() == 5
    assert pool.metrics.queue_overflow.value() == 5
    full = pool.metrics.failed_for("WriteStream", "RESOURCE_EXHAUSTED", "SERVICE_QUEUE_FULL")
    assert full.value() == 5  # the two counters agree
    pool.stop()
