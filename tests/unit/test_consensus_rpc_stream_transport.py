"""consensus/rpc/stream_transport.py, against the server side
(tserver/consensus_stream_server.py): the consensus stream between two servers, over a real
grpc.aio server on loopback: answers
come back matched to their requests, many tablets' messages share one frame, the follower's
worker does not wait for an answer, and a broken stream loses only what was in flight."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from raftlet.client.aio_channels import AsyncChannelPool
from raftlet.client.channels import channel_options, server_options
from raftlet.consensus.core import Entry, Message, MessageType
from raftlet.consensus.rpc.codec import update_request_from_message
from raftlet.consensus.rpc.stream_transport import StreamHub, _frames, encode_item
from raftlet.consensus.workers import WorkerPool
from raftlet.proto import consensus_pb2 as pb
from raftlet.proto import consensus_pb2_grpc
from raftlet.tserver.consensus_stream_server import StreamSession
from raftlet.tserver.errors import UnknownTablet
from tests.waiting import wait_for

LEADER, FOLLOWER = "ts1", "ts2"


def _append(tablet: str, index: int, payload: int = 1) -> Message:
    """An append of one entry of ``payload`` bytes after ``index``."""
    del tablet  # the tablet travels beside the message, not in it
    return Message(
        MessageType.APPEND,
        LEADER,
        FOLLOWER,
        term=1,
        log_term=1,
        index=index,
        entries=(Entry(1, index + 1, data=b"x" * payload),),
        commit=index,
    )


def test_an_item_is_a_frame_of_one_request() -> None:
    request = update_request_from_message(_append("t1", 7), "t1")
    frame = pb.ConsensusFramePB.FromString(encode_item(300, request))
    (item,) = frame.items
    assert item.seq == 300
    assert item.WhichOneof("kind") == "update"
    assert item.update == request
    # Items concatenate into one frame: the wire form of a repeated field.
    two = pb.ConsensusFramePB.FromString(encode_item(1, request) + encode_item(2, request))
    assert [i.seq for i in two.items] == [1, 2]


@dataclass
class FakeHandler:
    """Stands for ConsensusRequestHandler: records each request and keeps its ``done``, so
    the test decides when (and from which thread) the answer becomes ready."""

    started: list[tuple[pb.UpdateConsensusRequest, Callable[[Any], None]]] = field(
        default_factory=list
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, req: Any, done: Callable[[Any], None]) -> None:
        if req.tablet_id == "missing":
            raise UnknownTablet(req.tablet_id)
        with self.lock:
            self.started.append((req, done))

    def count(self) -> int:
        with self.lock:
            return len(self.started)


class _Servicer(consensus_pb2_grpc.ConsensusServiceServicer):
    def __init__(self, pool: WorkerPool, handler: FakeHandler, max_frame_bytes: int) -> None:
        self.pool = pool
        self.handler = handler
        self.max_frame_bytes = max_frame_bytes
        self.frames = 0
        self.tasks: set[asyncio.Task[Any]] = set()

    async def Stream(self, request_iterator: Any, context: Any) -> None:
        servicer = self

        class Counting(StreamSession):
            def _receive(self, frame: pb.ConsensusFramePB) -> None:
                servicer.frames += 1
                super()._receive(frame)

        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        session = Counting(
            asyncio.get_running_loop(),
            self.pool,
            self.handler,  # type: ignore[arg-type]
            max_frame_bytes=self.max_frame_bytes,
        )
        await session.serve(context)


class Loop:
    """An event loop on its own thread, as the tablet server runs one."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@dataclass
class Pair:
    loop: Loop
    hub: StreamHub
    servicer: _Servicer
    handler: FakeHandler
    pool: WorkerPool
    addr: str


@contextlib.contextmanager
def _pair(max_frame_bytes: int) -> Iterator[Pair]:
    """A hub and a peer server that both hold messages to ``max_frame_bytes``, as two
    tablet servers do to the peer limit (the server's own gRPC limit included)."""
    loop = Loop()
    # One thread: if it waited for an answer, nothing else could run on the pool.
    pool = WorkerPool("consensus", min_threads=1, max_threads=1)
    handler = FakeHandler()
    servicer = _Servicer(pool, handler, max_frame_bytes)

    async def start_server() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(options=server_options(max_frame_bytes))
        consensus_pb2_grpc.add_ConsensusServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = loop.run(start_server())
    channels = AsyncChannelPool(channel_options(max_message_bytes=max_frame_bytes))
    hub = StreamHub(loop.loop, channels, timeout_s=30.0, max_frame_bytes=max_frame_bytes)
    try:
        yield Pair(loop, hub, servicer, handler, pool, f"127.0.0.1:{port}")
    finally:
        loop.run(hub.close())
        loop.run(channels.close())
        loop.run(server.stop(0))
        pool.stop(timeout=10)
        loop.close()


@pytest.fixture
def pair() -> Iterator[Pair]:
    with _pair(4 << 20) as p:
        yield p


TIGHT = 2048


@pytest.fixture
def tight_pair() -> Iterator[Pair]:
    """Peers that accept messages of at most ``TIGHT`` bytes."""
    with _pair(TIGHT) as p:
        yield p


class Answers:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.got: list[Message | None] = []

    def __call__(self, answer: Message | None) -> None:
        with self.lock:
            self.got.append(answer)

    def count(self) -> int:
        with self.lock:
            return len(self.got)


def _ok(request: pb.UpdateConsensusRequest) -> pb.UpdateConsensusResponse:
    index = request.prev_log_index + len(request.entries)
    return pb.UpdateConsensusResponse(
        responder_uuid=FOLLOWER, responder_term=request.caller_term, last_log_index=index
    )


def test_answers_come_back_matched_and_the_worker_does_not_wait(pair: Pair) -> None:
    transport = pair.hub.transport("t1", {FOLLOWER: pair.addr})
    answers = Answers()
    transport.send(_append("t1", 5), answers)
    wait_for(lambda: pair.handler.count() == 1, what="the follower starts the request")
    # The request was stepped and the pool's only thread went back to the pool: nothing
    # waits for the answer, which becomes ready later on another thread (durability's).
    probe = threading.Event()
    assert pair.pool.mailbox("probe", lambda batch: probe.set()).post(1)
    wait_for(probe.is_set, what="the pool's thread runs other work meanwhile")
    assert answers.count() == 0
    request, done = pair.handler.started[0]
    assert request.tablet_id == "t1"
    threading.Thread(target=done, args=(_ok(request),)).start()
    wait_for(lambda: answers.count() == 1, what="the answer reaches the sender")
    (answer,) = answers.got
    assert answer is not None
    assert answer.type is MessageType.APPEND_RESPONSE
    assert (answer.src, answer.dst, answer.index) == (FOLLOWER, LEADER, 6)


def test_messages_queued_together_leave_as_one_frame(pair: Pair) -> None:
    transports = [pair.hub.transport(f"t{i}", {FOLLOWER: pair.addr}) for i in range(5)]
    answers = Answers()
    transports[0].send(_append("t0", 1), answers)  # opens the stream
    wait_for(lambda: pair.handler.count() == 1, what="the stream is up")
    frames_before = pair.servicer.frames
    # Hold the loop while 50 messages of 5 tablets are queued: they must go out together.
    release = threading.Event()
    pair.loop.loop.call_soon_threadsafe(release.wait)
    for i in range(50):
        transports[i % 5].send(_append(f"t{i % 5}", 10 + i), answers)
    release.set()
    wait_for(lambda: pair.handler.count() == 51, what="all 50 reach the follower")
    assert pair.servicer.frames - frames_before == 1
    tablets = [req.tablet_id for req, _ in pair.handler.started[1:]]
    assert tablets == [f"t{i % 5}" for i in range(50)]  # in the order they were sent
    for req, done in pair.handler.started:
        done(_ok(req))
    wait_for(lambda: answers.count() == 51, what="every answer comes back")
    assert all(a is not None for a in answers.got)


def test_a_refused_request_is_a_lost_message(pair: Pair) -> None:
    transport = pair.hub.transport("missing", {FOLLOWER: pair.addr})
    answers = Answers()
    transport.send(_append("missing", 1), answers)
    wait_for(lambda: answers.count() == 1, what="the refusal comes back")
    assert answers.got == [None]


def test_a_broken_stream_loses_what_was_in_flight_and_reconnects(pair: Pair) -> None:
    transport = pair.hub.transport("t1", {FOLLOWER: pair.addr})
    answers = Answers()
    transport.send(_append("t1", 1), answers)
    wait_for(lambda: pair.handler.count() == 1, what="the request arrives")
    for task in list(pair.servicer.tasks):  # the follower server ends the stream
        pair.loop.loop.call_soon_threadsafe(task.cancel)
    wait_for(lambda: answers.count() == 1, what="the in-flight request is given up")
    assert answers.got == [None]
    # The next message opens a new stream.
    transport.send(_append("t1", 2), answers)
    wait_for(lambda: pair.handler.count() == 2, what="the next request arrives again")
    request, done = pair.handler.started[1]
    done(_ok(request))
    wait_for(lambda: answers.count() == 2, what="its answer comes back")
    assert answers.got[1] is not None


def test_an_unreachable_peer_answers_none_and_a_closed_transport_refuses(pair: Pair) -> None:
    transport = pair.hub.transport("t1", {FOLLOWER: "127.0.0.1:1"})  # nobody listens
    answers = Answers()
    transport.send(_append("t1", 1), answers)
    wait_for(lambda: answers.count() == 1, what="the send is given up")
    assert answers.got == [None]
    transport.close()
    transport.send(_append("t1", 2), answers)
    assert answers.got == [None, None]


def test_what_is_queued_together_leaves_in_frames_the_peer_accepts(tight_pair: Pair) -> None:
    """Twenty requests of ~650 bytes queued at once would be one ~13 KiB frame, which a peer
    accepting 2 KiB refuses (the stream breaks, every request is lost, the resend breaks it
    again). Cut at the limit, every request arrives and is answered."""
    pair = tight_pair
    transports = [pair.hub.transport(f"t{i}", {FOLLOWER: pair.addr}) for i in range(4)]
    answers = Answers()
    transports[0].send(_append("t0", 1, 600), answers)  # opens the stream
    wait_for(lambda: pair.handler.count() == 1, what="the stream is up")
    frames_before = pair.servicer.frames
    release = threading.Event()
    pair.loop.loop.call_soon_threadsafe(release.wait)
    for i in range(20):
        transports[i % 4].send(_append(f"t{i % 4}", 10 + i, 600), answers)
    release.set()
    wait_for(lambda: pair.handler.count() == 21, what="all 20 reach the follower")
    frames = pair.servicer.frames - frames_before
    item = len(encode_item(1, update_request_from_message(_append("t0", 10, 600), "t0")))
    per_frame = TIGHT // item  # whole items only
    assert per_frame >= 2
    assert frames == -(-20 // per_frame)  # as few frames as fit, none refused
    tablets = [req.tablet_id for req, _ in pair.handler.started[1:]]
    assert tablets == [f"t{i % 4}" for i in range(20)]  # still in the order sent
    for req, done in pair.handler.started:
        done(_ok(req))
    wait_for(lambda: answers.count() == 21, what="every answer comes back")
    assert all(a is not None for a in answers.got)


def test_answers_ready_together_leave_in_frames_the_peer_accepts(tight_pair: Pair) -> None:
    """The follower's side: 1000 answers (~10 KiB together) made ready at once leave in
    several frames under the limit, not one the leader's channel would refuse."""
    pair = tight_pair
    n = 1000
    transport = pair.hub.transport("t1", {FOLLOWER: pair.addr})
    answers = Answers()
    for i in range(n):
        transport.send(_append("t1", i, 1), answers)
    wait_for(lambda: pair.handler.count() == n, what="all requests reach the follower")
    assert sum(_ok(req).ByteSize() for req, _ in pair.handler.started) > 4 * TIGHT
    release = threading.Event()
    pair.loop.loop.call_soon_threadsafe(release.wait)  # the answers queue up meanwhile
    try:
        for req, done in pair.handler.started:
            done(_ok(req))
    finally:
        release.set()
    wait_for(lambda: answers.count() == n, what="every answer comes back")
    assert all(a is not None for a in answers.got)


def test_a_request_no_peer_would_accept_is_lost_alone(tight_pair: Pair) -> None:
    """A request over the peers' limit is never queued (it would break the stream for
    every tablet, for ever): it is reported lost, and the next one goes through."""
    pair = tight_pair
    big, small = (
        pair.hub.transport("big", {FOLLOWER: pair.addr}),
        pair.hub.transport("t1", {FOLLOWER: pair.addr}),
    )
    lost, answers = Answers(), Answers()
    big.send(_append("big", 1, TIGHT), lost)
    assert lost.got == [None]  # at once, from send
    small.send(_append("t1", 1, 10), answers)
    wait_for(lambda: pair.handler.count() == 1, what="the small request arrives")
    request, done = pair.handler.started[0]
    assert request.tablet_id == "t1"
    done(_ok(request))
    wait_for(lambda: answers.count() == 1, what="its answer comes back")
    assert answers.got[0] is not None


def test_frames_are_cut_greedily_and_never_split_an_item() -> None:
    items = [b"a" * 5, b"b" * 5, b"c" * 9, b"d" * 1, b"e" * 12]
    assert _frames(items, 10) == [b"a" * 5 + b"b" * 5, b"c" * 9 + b"d", b"e" * 12]
    assert _frames([], 10) == []
    assert b"".join(_frames(items, 1)) == b"".join(items)
