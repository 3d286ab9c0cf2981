"""The stream consensus transport: one long-lived bidirectional gRPC stream per pair of servers.

Every tablet's consensus traffic from this server to a peer server travels on one stream,
``ConsensusService.Stream``; the peer's answers come back on the same stream.  Whatever is
queued for a peer when the event loop gets to it leaves as one ``ConsensusFramePB`` -- the
appends and heartbeats of all tablets together -- so a busy server sends few, large messages
and gRPC creates no thread and no call per message.

Client side (``StreamHub``, one per server, living on the server's event loop):
- ``StreamTransport`` is one replica's ``consensus.transport.Transport``.  ``send`` runs
  under the replica's consensus lock, on whichever thread steps it: it serializes the
  request there (``seq`` plus the request, as the bytes of one ``ConsensusItemPB``),
  appends it to the peer's outbox and wakes the loop only if it is not already due to
  look.  It never blocks.
- ``_PeerStream`` (one per peer address) owns the stream on the loop: it writes everything
  queued as one frame, matches answers to requests by ``seq`` and hands each answer to its
  ``on_response``.  A broken stream is Raft's lost message: every request in flight on it
  gets ``on_response(None)``, and the stream is opened again, after a backoff, when there is
  something to send.  Requests unanswered after ``timeout_s`` are dropped the same way.
- No frame is larger than ``max_frame_bytes``, the peers' message limit (the tablet server
  derives it in ``tserver.message_limits``): what is queued leaves as several frames if it
  must.  One frame over the limit would be refused by the peer, breaking the stream every
  tablet shares, and its resend the same way, for ever.  A single request over the limit,
  which the write path's size check keeps from happening, is never queued: ``send`` logs
  it and reports it lost.

The server side of the stream is ``tserver.consensus_stream_server.StreamSession``.  The
hub's ``grpc.aio`` channels come from the server's ``client.aio_channels.AsyncChannelPool``
(an ``AsyncChannelSource`` here), opened on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from raftlet.consensus.core import Message, MessageType
from raftlet.consensus.rpc.codec import MalformedResponse, decode_response, encode_request
from raftlet.consensus.rpc.grpc_transport import log_unsendable
from raftlet.consensus.transport import ResponseCallback
from raftlet.proto import consensus_pb2 as pb

__all__ = [
    "STREAM_METHOD",
    "AsyncChannelSource",
    "PeerHub",
    "StreamHub",
    "StreamTransport",
    "answer_of",
    "encode_item",
]

logger = logging.getLogger(__name__)

STREAM_METHOD = "/raftlet.ConsensusService/Stream"

# Field numbers of ConsensusItemPB's request kinds and of ConsensusFramePB.items: the client
# writes frames as bytes it joins itself, so a request is serialized once, on the sender's
# thread, and never copied into a frame message.
_ITEM_FIELD = {
    pb.UpdateConsensusRequest: pb.ConsensusItemPB.UPDATE_FIELD_NUMBER,
    pb.RequestVoteRequest: pb.ConsensusItemPB.VOTE_FIELD_NUMBER,
    pb.TimeoutNowRequest: pb.ConsensusItemPB.TIMEOUT_NOW_FIELD_NUMBER,
}
_SEQ_TAG = bytes([pb.ConsensusItemPB.SEQ_FIELD_NUMBER << 3])  # varint
_FRAME_ITEMS_TAG = bytes([pb.ConsensusFramePB.ITEMS_FIELD_NUMBER << 3 | 2])  # length-delimited

_BACKOFF_INITIAL_S = 0.05
_BACKOFF_MAX_S = 1.0
# How often an idle stream looks for requests whose answer is overdue.
_SWEEP_INTERVAL_S = 1.0


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_item(seq: int, request: Any) -> bytes:
    """One ``ConsensusItemPB`` holding ``request``, as the bytes of a frame's ``items`` entry."""
    body: bytes = request.SerializeToString()
    field = _ITEM_FIELD[type(request)]
    item = _SEQ_TAG + _varint(seq) + bytes([field << 3 | 2]) + _varint(len(body)) + body
    return _FRAME_ITEMS_TAG + _varint(len(item)) + item


def _identity(data: bytes) -> bytes:
    return data


@dataclass(slots=True)
class Pending:
    tablet_id: str
    message: Message
    on_response: ResponseCallback
    deadline: float


class _PeerStream:
    """The stream to one peer server (client side).  Everything but ``send`` runs on the loop."""

    def __init__(self, hub: StreamHub, addr: str) -> None:
        self.addr = addr
        self._hub = hub
        self._lock = threading.Lock()
        # (seq, item bytes, pending); appended by senders, taken by the loop.
        self._outbox: list[tuple[int, bytes, Pending]] = []
        self._due = False  # the loop has been asked to look at the outbox
        self._wake = asyncio.Event()
        self._pending: dict[int, Pending] = {}  # loop only; insertion order = send order
        self._closed = False
        self._sweeper: asyncio.TimerHandle | None = None  # while a stream is open
        self._task = hub.loop.create_task(self._run(), name=f"consensus-stream:{addr}")

    # --- any thread ----------------------------------------------------------------------

    def send(self, seq: int, item: bytes, pending: Pending, *, lazy: bool = False) -> None:
        # lazy: the loop batches whatever is queued when it looks anyway.
        with self._lock:
            if self._closed:
                closed = True
            else:
                closed = False
                self._outbox.append((seq, item, pending))
                wake, self._due = not self._due, True
        if closed:
            pending.on_response(None)
            return
        if wake:
            # RuntimeError: the loop is closed, the server is going away.
            with contextlib.suppress(RuntimeError):
                self._hub.loop.call_soon_threadsafe(self._wake.set)

    # --- the loop --------------------------------------------------------------------------

    def _stopping(self) -> bool:
        # A call, not the attribute: close() sets it while _run awaits, and a type checker
        # narrowing ``self._closed`` across those awaits would call the checks unreachable.
        return self._closed

    async def _run(self) -> None:
        backoff = _BACKOFF_INITIAL_S
        while not self._stopping():
            if not self._outbox:
                await self._wait_for_work()
            if self._stopping():
                break
            if not self._outbox:
                self._sweep()
                continue
            try:
                answered = await self._serve_one_stream()
            except Exception:  # a bug here must not end this peer's traffic for good
                logger.exception("consensus stream to %s failed", self.addr)
                answered = False
            if self._stopping():
                break
            backoff = _BACKOFF_INITIAL_S if answered else min(backoff * 2, _BACKOFF_MAX_S)
            await asyncio.sleep(backoff)

    async def _wait_for_work(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), _SWEEP_INTERVAL_S)
        self._wake.clear()

    async def _serve_one_stream(self) -> bool:
        """Open a stream and use it until it breaks; returns whether any answer came back."""
        call = self._hub.open_stream(self.addr)
        reader = asyncio.ensure_future(self._read(call))
        # One event wakes this loop for everything: new requests (send), the reader ending,
        # and a periodic look for overdue answers -- no task is made per frame.
        reader.add_done_callback(lambda _: self._wake.set())
        self._sweeper = self._hub.loop.call_later(_SWEEP_INTERVAL_S, self._sweep_soon)
        try:
            while not self._closed:
                self._wake.clear()
                for frame in _frames(self._take(), self._hub.max_frame_bytes):
                    await call.write(frame)
                self._sweep()
                if reader.done():
                    break
                if not self._outbox:
                    await self._wake.wait()
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
            logger.debug("consensus stream to %s: %s", self.addr, exc)
        finally:
            self._sweeper.cancel()
            answered = reader.done() and not reader.cancelled() and reader.result()
            reader.cancel()
            call.cancel()
            self._fail_all()
        return bool(answered)

    def _sweep_soon(self) -> None:
        """Loop timer: wake the stream's loop to drop overdue requests, every interval."""
        self._wake.set()
        self._sweeper = self._hub.loop.call_later(_SWEEP_INTERVAL_S, self._sweep_soon)

    def _take(self) -> list[bytes]:
        with self._lock:
            taken, self._outbox = self._outbox, []
            self._due = False
        for seq, _, pending in taken:
            self._pending[seq] = pending
        return [item for _, item, _ in taken]

    async def _read(self, call: Any) -> bool:
        answered = False
        try:
            while True:
                frame = await call.read()
                if frame is grpc.aio.EOF:
                    return answered
                answered = True
                for item in frame.items:
                    self._answer(item)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            logger.debug("consensus stream from %s: %s", self.addr, exc)
        except Exception:
            logger.exception("consensus stream from %s: reading an answer failed", self.addr)
        return answered

    def _answer(self, item: pb.ConsensusItemPB) -> None:
        pending = self._pending.pop(item.seq, None)
        if pending is not None:  # else overdue and dropped already
            deliver(pending, answer_of(pending, item))

    def _sweep(self) -> None:
        now = time.monotonic()
        while self._pending:
            seq, pending = next(iter(self._pending.items()))
            if pending.deadline > now:
                return
            del self._pending[seq]
            deliver(pending, None)

    def _fail_all(self) -> None:
        pending, self._pending = self._pending, {}
        for p in pending.values():
            deliver(p, None)

    async def close(self) -> None:
        with self._lock:
            self._closed = True
            queued, self._outbox = self._outbox, []
        self._wake.set()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._fail_all()
        for _, _, p in queued:
            deliver(p, None)


def answer_of(pending: Pending, item: pb.ConsensusItemPB) -> Message | None:
    """The message to step for ``item``, the answer to ``pending`` (None: nothing to step --
    the peer reported a failure, or its answer does not decode)."""
    kind = item.WhichOneof("kind")
    request = pending.message
    try:
        if kind == "failed":
            logger.debug(
                "%s: %s to %s failed: %s",
                pending.tablet_id,
                request.type.value,
                request.dst,
                item.failed.message,
            )
        elif kind in ("update_response", "vote_response"):
            return decode_response(request, getattr(item, kind))
    except MalformedResponse as exc:
        logger.debug("%s: dropping answer from %s: %s", pending.tablet_id, request.dst, exc)
    return None


def _frames(items: list[bytes], max_bytes: int) -> list[bytes]:
    """``items`` (each at most ``max_bytes``) joined, in order, into as few frames of at
    most ``max_bytes`` as a greedy cut gives."""
    frames: list[bytes] = []
    start, size = 0, 0
    for k, item in enumerate(items):
        if k > start and size + len(item) > max_bytes:
            frames.append(b"".join(items[start:k]))
            start, size = k, 0
        size += len(item)
    if start < len(items):
        frames.append(b"".join(items[start:]))
    return frames


def deliver(pending: Pending, answer: Message | None) -> None:
    try:
        pending.on_response(answer)
    except Exception:
        logger.exception("%s: on_response failed", pending.tablet_id)


class AsyncChannelSource(Protocol):
    """Where the hub gets its channels: the server's ``client.aio_channels.AsyncChannelPool``,
    used on ``loop`` only."""

    def channel(self, address: str) -> grpc.aio.Channel: ...


class StreamHub:
    """This server's streams to its peers, one per peer address, on ``loop``.  ``channels``
    belong to the caller, who closes them after ``close()``; they must send messages of
    ``max_frame_bytes``, and the peers accept them."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        channels: AsyncChannelSource,
        timeout_s: float,
        *,
        max_frame_bytes: int,
    ) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be positive, got {max_frame_bytes}")
        self.loop = loop
        self.timeout_s = timeout_s
        self.max_frame_bytes = max_frame_bytes
        self._channels = channels
        self._lock = threading.Lock()
        self._streams: dict[str, _PeerStream] = {}
        self._seq = 0
        self._closed = False

    def transport(self, tablet_id: str, addresses: Mapping[str, str]) -> StreamTransport:
        """The Transport of one replica; ``addresses`` maps peer node ids to RPC addresses."""
        return StreamTransport(self, tablet_id, addresses)

    def next_seq(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    def stream_to(self, addr: str) -> _PeerStream:
        stream = self._streams.get(addr)
        if stream is not None:
            return stream
        with self._lock:
            if self._closed:
                raise RuntimeError("the consensus streams are closed")
            stream = self._streams.get(addr)
            if stream is None:
                # Created from a sender thread: the task must be made on the loop's thread.
                stream = _create_on_loop(self.loop, lambda: _PeerStream(self, addr))
                self._streams[addr] = stream
        return stream

    def open_stream(self, addr: str) -> Any:
        """A new Stream call to ``addr`` (loop only); frames are written as bytes."""
        method = self._channels.channel(addr).stream_stream(
            STREAM_METHOD,
            request_serializer=_identity,
            response_deserializer=pb.ConsensusFramePB.FromString,
        )
        return method()

    async def close(self) -> None:
        with self._lock:
            self._closed = True
            streams = list(self._streams.values())
        for stream in streams:
            await stream.close()


def _create_on_loop(
    loop: asyncio.AbstractEventLoop, make: Callable[[], _PeerStream]
) -> _PeerStream:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        return make()

    async def on_loop() -> _PeerStream:
        return make()

    return asyncio.run_coroutine_threadsafe(on_loop(), loop).result(timeout=10)


class PeerSender(Protocol):
    """How a hub reaches one peer server: ``send`` queues a request and never blocks."""

    def send(self, seq: int, item: bytes, pending: Pending, *, lazy: bool = False) -> None:
        """``lazy``: it may wait a moment to leave with others (a heartbeat)."""
        ...


class PeerHub(Protocol):
    """What a ``StreamTransport`` needs of its server's hub: ``StreamHub``, or
    ``consensus.rpc.tcp_transport.TcpHub``."""

    timeout_s: float
    max_frame_bytes: int

    def next_seq(self) -> int: ...

    def stream_to(self, addr: str) -> PeerSender: ...


class StreamTransport:
    """One replica's ``Transport`` over its server's hub of peer connections."""

    def __init__(self, hub: PeerHub, tablet_id: str, addresses: Mapping[str, str]) -> None:
        self.tablet_id = tablet_id
        self._hub = hub
        self._addresses = dict(addresses)
        self._closed = False

    def send(self, message: Message, on_response: ResponseCallback) -> None:
        """Queue ``message`` for its peer and return at once; ``on_response`` gets the answer,
        or None if there is none to step (exactly once per send, from the loop or here)."""
        try:
            if self._closed:
                raise RuntimeError("transport is closed")
            addr = self._addresses.get(message.dst)
            if addr is None:
                raise LookupError(f"no address for peer {message.dst!r}")
            seq = self._hub.next_seq()
            item = encode_item(seq, encode_request(message, self.tablet_id))
            if len(item) > self._hub.max_frame_bytes:
                raise ValueError(
                    f"its {len(item)} bytes exceed the peers' message limit of "
                    f"{self._hub.max_frame_bytes}: no peer would accept it"
                )
            stream = self._hub.stream_to(addr)
        except Exception as exc:  # unknown peer, closed hub or transport, unencodable, too big
            log_unsendable(self.tablet_id, message, exc, closed=self._closed)
            on_response(None)
            return
        if message.type is MessageType.TIMEOUT_NOW:
            # Its answer carries nothing to step; the election it starts is the answer.
            callback: ResponseCallback = _ignore_answer(on_response)
        else:
            callback = on_response
        deadline = time.monotonic() + self._hub.timeout_s
        # Every tablet's routine heartbeat to a peer is due at the same tick: let them leave
        # together (a read or a transfer waiting on a heartbeat does not wait for that).
        lazy = message.routine
        stream.send(seq, item, Pending(self.tablet_id, message, callback, deadline), lazy=lazy)

    def close(self) -> None:
        """Refuse further sends; what is in flight is answered or dropped by its stream."""
        self._closed = True


def _ignore_answer(on_response: ResponseCallback) -> ResponseCallback:
    def callback(_answer: Message | None) -> None:
        on_response(None)

    return callback
