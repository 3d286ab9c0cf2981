"""TabletService.WriteStream: many independent writes on one long-lived stream.

A client with many writes in flight sends them as frames (``WriteStreamRequestPB``) on one
stream per server; each write is answered on its own, as soon as it is done and in any
order, by the ``id`` the client gave it (``WriteStreamResultPB``). A unary ``Write`` costs a
gRPC call on each side per write; here a frame costs one read, one work item on the tablet
service pool, and its answers share the messages written back.

A frame carries at most ``MAX_WRITES_PER_MESSAGE`` (4,096) writes. One with more ends the
stream with INVALID_ARGUMENT naming the limit before anything is built from its writes --
each write costs a Python object, a pool task and an answer of ~40 bytes, and one 4 MB
message of ~2 million empty writes took a server from 208 MB to 1.3 GB and its event loop
for minutes (its peers heard nothing from it) -- as the tcp write port closes such a frame.

Each write goes exactly the way a unary Write goes -- ``TabletReplica.write``: lock-free term
binding, the result tracker, validation, the prepare queue -- and fails with the status and
``ServerErrorPB`` the unary call would have (``rpc_dispatch.status_for``), carried in its
result item. A full service queue refuses the frame's writes with RESOURCE_EXHAUSTED, so
the client backs off as it would for a unary call. Answers ready together leave as one
message, or several if one would pass ``max_frame_bytes`` (the client limit; a write with
thousands of row errors has an answer of megabytes).

A client's window: the streams of one connection (``StreamWindow``, shared) stop pulling
frames while ``MAX_OUTSTANDING_WRITES`` of its writes are unanswered or
``WRITE_WINDOW_BYTES`` are held for it (the frames of unanswered writes, and answers being
written), so HTTP/2 flow control pushes back on a client that
sends faster than its writes are applied or than it reads their answers (8,000 writes of
66 KB once took a leader to 780 MB and 81 s to drain); a WARNING names it. A stream whose
answers have waited to be written for ``ANSWER_DEADLINE_S`` while it is held back is ended
with RESOURCE_EXHAUSTED. The plain-TCP write port (``tserver.write_tcp_server``) keeps the
same window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from raftlet.consensus.rpc.receive_limits import FRAME_DEADLINE_S
from raftlet.proto import MAX_WRITES_PER_MESSAGE, tablet_pb2
from raftlet.proto.common_pb2 import ServerErrorPB
from raftlet.tserver.errors import ServiceUnavailable
from raftlet.tserver.loop_outbox import LoopOutbox
from raftlet.tserver.message_limits import chunks_by_size
from raftlet.tserver.rpc_dispatch import (
    QUEUE_FULL_MESSAGE,
    SHUTTING_DOWN_MESSAGE,
    LeaderAddrLookup,
    error_name,
    status_for,
)
from raftlet.tserver.service_pool import InboundCall, ServicePool
from raftlet.tserver.tablet_replica import TabletReplica, WriteCallbacks
from raftlet.tserver.write_frame_guard import TooManyWrites

__all__ = [
    "MAX_OUTSTANDING_WRITES",
    "WRITE_WINDOW_BYTES",
    "ReplicaLookup",
    "StreamWindow",
    "StreamWindows",
    "WindowLog",
    "WriteStreamSession",
    "offer_writes",
]

ReplicaLookup = Callable[[str], TabletReplica]

logger = logging.getLogger(__name__)

MiB = 1 << 20
# A client connection's window. By count: far more than the writes a client needs in
# flight to keep a leader's pipeline busy (the write path's own queues hold a few hundred).
# By bytes: 4 MiB is four of the 1 MiB APPEND batches a leader replicates at a time
# (tserver.message_limits), so a single client still fills every replication round, while
# 1,024 connections at their windows hold ~4 GiB of frames at worst (several times that
# once parsed) rather than one client alone gigabytes. A frame larger than the window is
# still taken in whole when it has room (one write may be as large as --max_message_bytes).
# Never below the writes one message may carry: the tcp port closes a frame of more writes
# than the window, and the clients cut their frames at MAX_WRITES_PER_MESSAGE.
MAX_OUTSTANDING_WRITES = MAX_WRITES_PER_MESSAGE
WRITE_WINDOW_BYTES = 4 * MiB
# Answers of a stream held back that wait this long to be written end it (the tcp port uses
# --tcp_frame_deadline_s, which is this by default).
ANSWER_DEADLINE_S = FRAME_DEADLINE_S
# A client that keeps its window full starts a new episode every frame: say so at most once
# a minute per connection.
_WINDOW_LOG_INTERVAL_S = 60.0


class WindowLog:
    """The WARNING that a client's window is full: once per episode, at most once a
    ``_WINDOW_LOG_INTERVAL_S`` per stream or connection."""

    def __init__(self) -> None:
        self._last: float | None = None
        self._unsaid = 0
        self.times = 0  # episodes, said or not

    def full(self, peer: str, writes: int, nbytes: int, max_writes: int, max_bytes: int) -> None:
        self.times += 1
        now = time.monotonic()
        if self._last is not None and now - self._last < _WINDOW_LOG_INTERVAL_S:
            self._unsaid += 1
            return
        since = f"; {self._unsaid} times more since the last warning" if self._unsaid else ""
        self._last, self._unsaid = now, 0
        logger.warning(
            "write stream %s: its window is full (%d writes unanswered of at most %d, %d "
            "bytes held of at most %d): not reading from it until its writes are answered "
            "and it reads the answers; the client should wait for answers before sending "
            "more%s",
            peer,
            writes,
            max_writes,
            nbytes,
            max_bytes,
            since,
        )


class StreamWindow:
    """The window of one client connection's write streams (loop only): gRPC lets a
    connection carry up to 64 streams, and a window per stream let one connection hold 64
    windows (32 streams that never read took a leader to 2.8 GB). Writes received and not
    answered, the bytes of their frames, the bytes of answers being written, and an event
    set when a stream may read again. Each stream that reads still takes one frame in once
    it saw room, so a connection holds at most the window and one frame a stream."""

    def __init__(self, max_outstanding: int, window_bytes: int) -> None:
        self.max_outstanding = max_outstanding
        self.window_bytes = window_bytes
        self.outstanding = 0
        self.held = 0
        self.writing = 0
        self.room = asyncio.Event()
        self.log = WindowLog()
        self.streams = 0  # sessions using it (``StreamWindows``)

    def has_room(self) -> bool:
        return (
            self.outstanding < self.max_outstanding
            and self.held + self.writing <= self.window_bytes
        )

    def took(self, count: int, nbytes: int) -> None:
        self.outstanding += count
        self.held += nbytes

    def answered(self, count: int) -> None:
        # Each answered write lets go of an equal share of the bytes held (as on the tcp
        # port): nothing is left held once every write is answered.
        if count >= self.outstanding:
            self.held = 0
        else:
            self.held -= self.held * count // self.outstanding
        self.outstanding = max(0, self.outstanding - count)
        self.wake()

    def wake(self) -> None:
        if self.has_room():
            self.room.set()


class StreamWindows:
    """One ``StreamWindow`` per client connection (its gRPC peer address), shared by the
    connection's write streams while any is open (loop only)."""

    def __init__(
        self,
        max_outstanding: int = MAX_OUTSTANDING_WRITES,
        window_bytes: int = WRITE_WINDOW_BYTES,
    ) -> None:
        self._max_outstanding = max_outstanding
        self._window_bytes = window_bytes
        self._windows: dict[str, StreamWindow] = {}

    @contextlib.contextmanager
    def of(self, peer: str) -> Iterator[StreamWindow]:
        window = self._windows.get(peer)
        if window is None:
            window = self._windows[peer] = StreamWindow(self._max_outstanding, self._window_bytes)
        window.streams += 1
        try:
            yield window
        finally:
            window.streams -= 1
            if not window.streams:
                del self._windows[peer]

    def __len__(self) -> int:
        return len(self._windows)


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
        max_outstanding: int = MAX_OUTSTANDING_WRITES,
        window_bytes: int = WRITE_WINDOW_BYTES,
        answer_deadline_s: float = ANSWER_DEADLINE_S,
        window: StreamWindow | None = None,
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
        # The connection's window (``StreamWindow``; the stream's own without one), and
        # this stream's answer being written: its size, and since when.
        self._window = window or StreamWindow(max_outstanding, window_bytes)
        self._answer_deadline_s = answer_deadline_s
        self._writing = 0
        self._writing_since = 0.0

    async def serve(self, context: grpc.aio.ServicerContext) -> None:
        """Read frames until the client closes its side; answer each write when done.

        Cancelling the task that runs this (the server is stopping) ends the call normally;
        the client sees its stream end and retries what was unanswered elsewhere."""

        async def write(results: list[tablet_pb2.WriteStreamResultPB]) -> None:
            message = tablet_pb2.WriteStreamResponsePB(results=results)
            size = message.ByteSize()
            # Until gRPC took it (a client that does not read holds the write up here).
            self._writing, self._writing_since = size, time.monotonic()
            window.writing += size
            try:
                if size <= self._max_frame_bytes:  # one C call: the usual case
                    await context.write(message)
                else:
                    for chunk in chunks_by_size(results, _byte_size, self._max_frame_bytes):
                        await context.write(tablet_pb2.WriteStreamResponsePB(results=chunk))
            finally:
                self._writing = 0
                window.writing -= size
            self._answered(len(results))

        window = self._window

        writer = asyncio.ensure_future(self._outbox.drain_to(write))
        try:
            while True:
                if not window.has_room():
                    await self._wait_for_room(context)
                frame = await context.read()
                if frame is grpc.aio.EOF:
                    break
                if isinstance(frame, TooManyWrites):  # counted, never parsed
                    await self._refuse(context, f"more than {MAX_WRITES_PER_MESSAGE}")
                if len(frame.items) > MAX_WRITES_PER_MESSAGE:
                    await self._refuse(context, str(len(frame.items)))
                self._receive(frame)
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
            if self._outstanding:  # ended with writes unanswered: the window lets them go
                window.answered(self._outstanding)
                self._outstanding = 0

    def _receive(self, frame: tablet_pb2.WriteStreamRequestPB) -> None:
        count = len(frame.items)
        if not count:
            return
        self._outstanding += count
        # A C call over the frame's bytes (gRPC does not say how many it read); the tcp
        # port, where speed matters, has the length for free.
        self._window.took(count, frame.ByteSize())
        self._idle.clear()
        offer_writes(
            self._pool, list(frame.items), self._replica_of, self._leader_addr, self._outbox.post
        )

    async def _refuse(self, context: grpc.aio.ServicerContext, count: str) -> None:
        """End the stream: its frame has more writes than one message may carry (``count``
        of them). Counted before the message was parsed (``tserver.write_frame_guard``), or
        by the parsed frame's length: no write of it becomes a Python object, a pool task
        or an answer. Writes of earlier frames still unanswered go unanswered, as when the
        tcp port closes such a frame's connection; the client retries them with the same
        request ids."""
        self._pool.metrics.failed_for(
            "WriteStream", grpc.StatusCode.INVALID_ARGUMENT.name
        ).increment()
        logger.warning(
            "write stream %s: a message of %s writes, over the %d one message may carry: "
            "ending the stream without answering it",
            context.peer(),
            count,
            MAX_WRITES_PER_MESSAGE,
        )
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"a WriteStream message of {count} writes: at most {MAX_WRITES_PER_MESSAGE} "
            f"writes per message; send them in messages of at most {MAX_WRITES_PER_MESSAGE}",
        )

    def _answered(self, count: int) -> None:
        count = min(count, self._outstanding)
        self._outstanding -= count
        if self._outstanding <= 0:
            self._idle.set()
        self._window.answered(count)

    async def _wait_for_room(self, context: grpc.aio.ServicerContext) -> None:
        """Stop pulling frames while the window is full; end a stream whose answers wait
        to be written for longer than the deadline (its client does not read them)."""
        peer = str(context.peer())
        window = self._window
        window.log.full(
            peer,
            window.outstanding,
            window.held + window.writing,
            window.max_outstanding,
            window.window_bytes,
        )
        while not window.has_room():
            window.room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(window.room.wait(), timeout=1.0)
            if self._writing and time.monotonic() - self._writing_since > self._answer_deadline_s:
                logger.warning(
                    "write stream %s: the client has not read its answers for %g s: ending "
                    "the stream; a client must read its answers to keep writing",
                    peer,
                    self._answer_deadline_s,
                )
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the stream's answers were not read for {self._answer_deadline_s:g} s "
                    "while its window was full; read the answers to keep writing",
                )


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
            _start(item, replica_of, leader_addr, post, pool)
        call.respond(None)

    if not pool.offer(InboundCall("WriteStream", start_all), requests=len(items)):
        refusal = (
            ServiceUnavailable(SHUTTING_DOWN_MESSAGE)
            if pool.stopped
            else ServiceQueueFull(QUEUE_FULL_MESSAGE)
        )
        for item in items:
            post(_failed(item.id, refusal, leader_addr, pool))


def _start(
    item: tablet_pb2.WriteStreamItemPB,
    replica_of: ReplicaLookup,
    leader_addr: LeaderAddrLookup,
    post: Callable[[tablet_pb2.WriteStreamResultPB], None],
    pool: ServicePool,
) -> None:
    write_id = item.id
    answered = threading.Lock()  # the first answer wins, as for an InboundCall

    def respond(response: object) -> None:
        if answered.acquire(blocking=False):
            assert isinstance(response, tablet_pb2.WriteResponse)
            post(tablet_pb2.WriteStreamResultPB(id=write_id, response=response))

    def fail(exc: BaseException) -> None:
        if answered.acquire(blocking=False):
            post(_failed(write_id, exc, leader_addr, pool))

    try:
        replica = replica_of(item.request.tablet_id)
        replica.write(item.request, WriteCallbacks(respond, fail))
    except Exception as exc:  # unknown tablet, not leader, bad rows: as the unary call
        fail(exc)


def _failed(
    write_id: int, exc: BaseException, leader_addr: LeaderAddrLookup, pool: ServicePool
) -> tablet_pb2.WriteStreamResultPB:
    if isinstance(exc, ServiceQueueFull):
        code, details = grpc.StatusCode.RESOURCE_EXHAUSTED, QUEUE_FULL_MESSAGE
        error: ServerErrorPB | None = ServerErrorPB(
            code=ServerErrorPB.SERVICE_QUEUE_FULL, message=QUEUE_FULL_MESSAGE
        )
    else:
        code, details, error = status_for(exc, leader_addr)
    pool.metrics.failed_for("WriteStream", code.name, error_name(error)).increment()
    result = tablet_pb2.WriteStreamResultPB(
        id=write_id, status_code=code.value[0], status_message=details
    )
    if error is not None:
        result.error.CopyFrom(error)
    return result


def _byte_size(result: tablet_pb2.WriteStreamResultPB) -> int:
    return result.ByteSize()
