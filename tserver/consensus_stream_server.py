"""The server side of the consensus stream (``consensus.rpc.stream_transport`` is the client
side).

One ``StreamSession`` per incoming stream: frames are read on the loop and posted to the
session's mailbox on the server's replica worker pool (``consensus.workers``), which steps
the requests in arrival order with ``ConsensusRequestHandler.start``; that returns at once.
Running on the replica pool rather than a service pool of its own means the committed
entries a request releases go on to the apply stage on the same thread, with no other
thread to wake.  The answer is
completed later by the thread that made it durable (a follower's append is acknowledged
only once it is on disk) and posted back to the loop, which writes all the answers ready at
that moment as one frame -- or several, none over the peers' message limit
(``tserver.message_limits``).  So no thread waits on a follower's fsync.

Known limit: one mailbox per stream, so a request whose replica blocks (its lock held by a
thread waiting on a full WAL queue) holds up the requests behind it for other tablets, as it
would hold one of the consensus pool's threads with unary calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable

import grpc

from raftlet.consensus.rpc.codec import WireRequest
from raftlet.consensus.workers import WorkerPool
from raftlet.proto import common_pb2
from raftlet.proto import consensus_pb2 as pb
from raftlet.tserver.consensus_handler import ConsensusRequestHandler, WireResponse
from raftlet.tserver.loop_outbox import LoopOutbox
from raftlet.tserver.message_limits import chunks_by_size
from raftlet.tserver.rpc_dispatch import status_for

__all__ = ["StreamSession", "item_byte_size", "step_item"]

_sessions = itertools.count(1)
# How long a stream that ends waits for a write of its under way (see ``serve``): a message
# to a peer that reads takes milliseconds; one that does not read is not waited for longer.
_WRITE_END_WAIT_S = 1.0


class StreamSession:
    """One incoming consensus stream (server side)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        workers: WorkerPool,
        handler: ConsensusRequestHandler,
        check: Callable[[WireRequest], None] | None = None,
        *,
        max_frame_bytes: int,
    ) -> None:
        self._loop = loop
        self._max_frame_bytes = max_frame_bytes
        self._handler = handler
        # Raises for a request this stream's authenticated peer may not send (security).
        self._check = check
        self._inbox = workers.mailbox(f"consensus-stream-{next(_sessions)}", self._drain)
        self._outbox: LoopOutbox[pb.ConsensusItemPB] = LoopOutbox(loop)

    async def serve(self, context: grpc.aio.ServicerContext) -> None:
        """Read frames until the caller closes its side; answer as answers become ready.

        Cancelling the task that runs this (the server is stopping) ends the call normally,
        so the peer sees its stream end at once and treats what was in flight as lost."""

        idle = asyncio.Event()  # no write of this call under way
        idle.set()

        async def write(items: list[pb.ConsensusItemPB]) -> None:
            idle.clear()
            try:
                frame = pb.ConsensusFramePB(items=items)
                if frame.ByteSize() <= self._max_frame_bytes:  # one C call: the usual case
                    await context.write(frame)
                    return
                for chunk in chunks_by_size(items, item_byte_size, self._max_frame_bytes):
                    await context.write(pb.ConsensusFramePB(items=chunk))
            finally:
                idle.set()

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
            self._inbox.close(timeout=0)  # what was read is still stepped; nothing more
            self._outbox.close()
            if not idle.is_set():
                # A write cancelled under way left gRPC's core sending a message as the call
                # ended: it refused the call's status (ExecuteBatchError, "too many
                # operations"), the call never finished, and a stopping server waited out its
                # whole 5 s grace.  Let the write end first -- unless the peer reads nothing.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(idle.wait(), _WRITE_END_WAIT_S)
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer

    def _receive(self, frame: pb.ConsensusFramePB) -> None:
        self._inbox.post(frame)

    def _drain(self, frames: list[pb.ConsensusFramePB]) -> None:
        """Pool thread: step every request received so far, in arrival order."""
        for frame in frames:
            for item in frame.items:
                self._start(item)

    def _start(self, item: pb.ConsensusItemPB) -> None:
        step_item(item, self._handler, self._check, self._post)

    def _post(self, item: pb.ConsensusItemPB) -> None:
        self._outbox.post(item)


def step_item(
    item: pb.ConsensusItemPB,
    handler: ConsensusRequestHandler,
    check: Callable[[WireRequest], None] | None,
    post: Callable[[pb.ConsensusItemPB], None],
) -> None:
    """Step the request in ``item`` and return at once; ``post`` gets the item that answers
    it (the same ``seq``), now if it is refused, else once the answer may leave."""
    seq = item.seq
    kind = item.WhichOneof("kind")
    if kind not in ("update", "vote", "timeout_now"):
        error = common_pb2.ServerErrorPB(
            code=common_pb2.ServerErrorPB.INVALID_ARGUMENT,
            message=f"consensus stream: item {seq} holds no request ({kind})",
        )
        post(pb.ConsensusItemPB(seq=seq, failed=error))
        return

    def done(response: WireResponse) -> None:
        post(_answer_item(seq, response))

    try:
        if check is not None:
            check(getattr(item, kind))
        handler.start(getattr(item, kind), done)
    except Exception as exc:  # unknown tablet, malformed or misaddressed request
        _, message, error_pb = status_for(exc)
        if error_pb is None:
            error_pb = common_pb2.ServerErrorPB(message=message)
        post(pb.ConsensusItemPB(seq=seq, failed=error_pb))


def item_byte_size(item: pb.ConsensusItemPB) -> int:
    """What ``item`` takes in a frame, before its field framing (``chunks_by_size``)."""
    return item.ByteSize()


def _answer_item(seq: int, response: WireResponse) -> pb.ConsensusItemPB:
    if isinstance(response, pb.UpdateConsensusResponse):
        return pb.ConsensusItemPB(seq=seq, update_response=response)
    if isinstance(response, pb.RequestVoteResponse):
        return pb.ConsensusItemPB(seq=seq, vote_response=response)
    return pb.ConsensusItemPB(seq=seq, timeout_now_response=response)
