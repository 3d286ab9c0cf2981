"""The server side of the consensus stream (``consensus_stream`` is the client side).

One ``StreamSession`` per incoming stream: frames are read on the loop and queued; one work
item on the consensus service pool at a time drains the queue in arrival order and steps
each request with ``ConsensusRequestHandler.start``, which returns at once.  The answer is
completed later by the thread that made it durable (a follower's append is acknowledged
only once it is on disk) and posted back to the loop, which writes all the answers ready at
that moment as one frame.  So no thread waits on a follower's fsync.

Known limit: the queue is drained by one work item, so a request whose replica blocks (its
lock held by a thread waiting on a full WAL queue) holds up the requests behind it for other
tablets, as it would hold one of the consensus pool's threads with unary calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import grpc

from raftlet.proto import common_pb2
from raftlet.proto import consensus_pb2 as pb
from raftlet.tserver.consensus_rpc import ConsensusRequestHandler, WireResponse
from raftlet.tserver.loop_outbox import LoopOutbox
from raftlet.tserver.rpc_dispatch import status_for
from raftlet.tserver.service_pool import InboundCall, ServicePool

__all__ = ["StreamSession"]


class StreamSession:
    """One incoming consensus stream (server side)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        pool: ServicePool,
        handler: ConsensusRequestHandler,
    ) -> None:
        self._loop = loop
        self._pool = pool
        self._handler = handler
        self._lock = threading.Lock()
        self._inbox: list[pb.ConsensusItemPB] = []
        self._draining = False  # a pool work item is draining the inbox
        self._outbox: LoopOutbox[pb.ConsensusItemPB] = LoopOutbox(loop)

    async def serve(self, context: grpc.aio.ServicerContext) -> None:
        """Read frames until the caller closes its side; answer as answers become ready.

        Cancelling the task that runs this (the server is stopping) ends the call normally,
        so the peer sees its stream end at once and treats what was in flight as lost."""
        async def write(items: list[pb.ConsensusItemPB]) -> None:
            await context.write(pb.ConsensusFramePB(items=items))

        writer = asyncio.ensure_future(self._outbox.drain_to(write))
        try:
            while True:
                frame = await context.read()
                if frame is grpc.aio.EOF:
                    break
                self._receive(frame)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        finally:
            self._outbox.close()
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer

    def _receive(self, frame: pb.ConsensusFramePB) -> None:
        with self._lock:
            self._inbox.extend(frame.items)
            if self._draining:
                return
            self._draining = True
        if not self._pool.offer(InboundCall("Stream", self._drain)):
            # Queue full or the pool stopping: answer every waiting request at once, as the
            # unary call would have been refused (the leader resends on its next beat).
            with self._lock:
                refused, self._inbox = self._inbox, []
                self._draining = False
            error = common_pb2.ServerErrorPB(
                code=common_pb2.ServerErrorPB.SERVICE_QUEUE_FULL,
                message="consensus service queue full",
            )
            for item in refused:
                self._post(pb.ConsensusItemPB(seq=item.seq, failed=error))

    def _drain(self, call: InboundCall) -> None:
        """Pool thread: step every queued request, in arrival order."""
        while True:
            with self._lock:
                items, self._inbox = self._inbox, []
                if not items:
                    self._draining = False
                    break
            for item in items:
                self._start(item)
        call.respond(None)

    def _start(self, item: pb.ConsensusItemPB) -> None:
        seq = item.seq
        kind = item.WhichOneof("kind")
        if kind not in ("update", "vote", "timeout_now"):
            error = common_pb2.ServerErrorPB(
                code=common_pb2.ServerErrorPB.INVALID_ARGUMENT,
                message=f"consensus stream: item {seq} holds no request ({kind})",
            )
            self._post(pb.ConsensusItemPB(seq=seq, failed=error))
            return

        def done(response: WireResponse) -> None:
            self._post(_answer_item(seq, response))

        try:
            self._handler.start(getattr(item, kind), done)
        except Exception as exc:  # unknown tablet, malformed or misaddressed request
            _, message, error_pb = status_for(exc)
            if error_pb is None:
                error_pb = common_pb2.ServerErrorPB(message=message)
            self._post(pb.ConsensusItemPB(seq=seq, failed=error_pb))

    def _post(self, item: pb.ConsensusItemPB) -> None:
        self._outbox.post(item)


def _answer_item(seq: int, response: WireResponse) -> pb.ConsensusItemPB:
    if isinstance(response, pb.UpdateConsensusResponse):
        return pb.ConsensusItemPB(seq=seq, update_response=response)
    if isinstance(response, pb.RequestVoteResponse):
        return pb.ConsensusItemPB(seq=seq, vote_response=response)
    return pb.ConsensusItemPB(seq=seq, timeout_now_response=response)
