"""TabletService.WriteStream: many independent writes on one long-lived stream.

A client with many writes in flight sends them as frames (``WriteStreamRequestPB``) on one
stream per server; each write is answered on its own, as soon as it is done and in any
order, by the ``id`` the client gave it (``WriteStreamResultPB``). A unary ``Write`` costs a
gRPC call on each side per write; here a frame of any size costs one read, one work item on
the tablet service pool, and its answers share the messages written back.

Each write goes exactly the way a unary Write goes -- ``TabletReplica.write``: lock-free term
binding, the result tracker, validation, the prepare queue -- and fails with the status and
``ServerErrorPB`` the unary call would have (``rpc_dispatch.status_for``), carried in its
result item. A full service queue refuses the frame's writes with RESOURCE_EXHAUSTED, so
the client backs off as it would for a unary call. Answers ready together leave as one
message, or several if one would pass ``max_frame_bytes`` (the client limit; a write with
thousands of row errors has an answer of megabytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

import grpc

from raftlet.proto import tablet_pb2
from raftlet.proto.common_pb2 import ServerErrorPB
from raftlet.tserver.errors import ServiceUnavailable
from raftlet.tserver.loop_outbox import LoopOutbox
from raftlet.tserver.message_limits import chunks_by_size
from raftlet.tserver.rpc_dispatch import (
    QUEUE_FULL_MESSAGE,
    SHUTTING_DOWN_MESSAGE,
    LeaderAddrLookup,
    status_for,
)
from raftlet.tserver.service_pool import InboundCall, ServicePool
from raftlet.tserver.tablet_replica import TabletReplica, WriteCallbacks

__all__ = ["ReplicaLookup", "WriteStreamSession", "offer_writes"]

ReplicaLookup = Callable[[str], TabletReplica]


class ServiceQueueFull(Exception):
    """The tablet service pool refused a frame: its queue is full."""


class WriteStreamSession:
    """One client's write stream (server side)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        pool: ServicePool,
        replica_of: ReplicaLookup,
        leader_addr: LeaderAddrLookup,
        *,
        max_frame_bytes: int,
    ) -> None:
        self._pool = pool
        self._max_frame_bytes = max_frame_bytes
        self._replica_of = replica_of
        self._leader_addr = leader_addr
        self._outbox: LoopOutbox[tablet_pb2.WriteStreamResultPB] = LoopOutbox(loop)
        # Writes received and not yet answered (loop only), and an event set when none are.
        self._outstanding = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def serve(self, context: grpc.aio.ServicerContext) -> None:
        """Read frames until the client closes its side; answer each write when done.

        Cancelling the task that runs this (the server is stopping) ends the call normally;
        the client sees its stream end and retries what was unanswered elsewhere."""

        async def write(results: list[tablet_pb2.WriteStreamResultPB]) -> None:
            message = tablet_pb2.WriteStreamResponsePB(results=results)
            if message.ByteSize() <= self._max_frame_bytes:  # one C call: the usual case
                await context.write(message)
            else:
                for chunk in chunks_by_size(results, _byte_size, self._max_frame_bytes):
                    await context.write(tablet_pb2.WriteStreamResponsePB(results=chunk))
            self._outstanding -= len(results)
            if self._outstanding <= 0:
                self._idle.set()

        writer = asyncio.ensure_future(self._outbox.drain_to(write))
        try:
            while True:
                frame = await context.read()
                if frame is grpc.aio.EOF:
                    break
                self._receive(list(frame.items))
            # The client is done writing: answer everything it sent before ending the call.
            await self._idle.wait()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            # Ended by the server (shutdown, after its replicas stopped): what they answered
            # meanwhile -- UNAVAILABLE for writes still waiting -- still goes out.
            writer.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._outbox.flush_to(write)
        finally:
            self._outbox.close()
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer

    def _receive(self, items: list[tablet_pb2.WriteStreamItemPB]) -> None:
        if not items:
            return
        self._outstanding += len(items)
        self._idle.clear()
        offer_writes(self._pool, items, self._replica_of, self._leader_addr, self._outbox.post)


def offer_writes(
    pool: ServicePool,
    items: list[tablet_pb2.WriteStreamItemPB],
    replica_of: ReplicaLookup,
    leader_addr: LeaderAddrLookup,
    post: Callable[[tablet_pb2.WriteStreamResultPB], None],
) -> None:
    """Hand a frame's writes to the tablet service pool as one call; ``post`` gets each
    write's result, once, from whichever thread finishes it (at once if the pool refuses
    the frame: shutting down, or its queue is full, as a unary Write would be refused)."""

    def start_all(call: InboundCall) -> None:
        for item in items:
            _start(item, replica_of, leader_addr, post)
        call.respond(None)

    if not pool.offer(InboundCall("WriteStream", start_all)):
        refusal = (
            ServiceUnavailable(SHUTTING_DOWN_MESSAGE)
            if pool.stopped
            else ServiceQueueFull(QUEUE_FULL_MESSAGE)
        )
        for item in items:
            post(_failed(item.id, refusal, leader_addr))


def _start(
    item: tablet_pb2.WriteStreamItemPB,
    replica_of: ReplicaLookup,
    leader_addr: LeaderAddrLookup,
    post: Callable[[tablet_pb2.WriteStreamResultPB], None],
) -> None:
    write_id = item.id
    answered = threading.Lock()  # the first answer wins, as for an InboundCall

    def respond(response: object) -> None:
        if answered.acquire(blocking=False):
            assert isinstance(response, tablet_pb2.WriteResponse)
            post(tablet_pb2.WriteStreamResultPB(id=write_id, response=response))

    def fail(exc: BaseException) -> None:
        if answered.acquire(blocking=False):
            post(_failed(write_id, exc, leader_addr))

    try:
        replica = replica_of(item.request.tablet_id)
        replica.write(item.request, WriteCallbacks(respond, fail))
    except Exception as exc:  # unknown tablet, not leader, bad rows: as the unary call
        fail(exc)


def _failed(
    write_id: int, exc: BaseException, leader_addr: LeaderAddrLookup
) -> tablet_pb2.WriteStreamResultPB:
    if isinstance(exc, ServiceQueueFull):
        code, details = grpc.StatusCode.RESOURCE_EXHAUSTED, QUEUE_FULL_MESSAGE
        error: ServerErrorPB | None = ServerErrorPB(
            code=ServerErrorPB.SERVICE_QUEUE_FULL, message=QUEUE_FULL_MESSAGE
        )
    else:
        code, details, error = status_for(exc, leader_addr)
    result = tablet_pb2.WriteStreamResultPB(
        id=write_id, status_code=code.value[0], status_message=details
    )
    if error is not None:
        result.error.CopyFrom(error)
    return result


def _byte_size(result: tablet_pb2.WriteStreamResultPB) -> int:
    return result.ByteSize()
