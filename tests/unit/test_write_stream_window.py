"""The gRPC write stream's window (tserver/write_stream.py): it stops pulling a client's
frames while the bytes of its unanswered writes fill the window, and ends a stream whose
answers wait to be written (its client does not read) past the deadline. It once read
8,000 writes of 66 KB in 2.8 s with 38 answered."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from raftlet.proto import tablet_pb2
from raftlet.tserver.tablet_replica import WriteCallbacks
from raftlet.tserver.write_stream import StreamWindows, WriteStreamSession
from tests.unit.inline_pool import InlinePool

LIMIT = 16 * 1024 * 1024
WINDOW = 64 * 1024
WRITE_BYTES = 10 * 1024


class Replica:
    """Holds every write until ``answer_all``, or answers at once when ``at_once``."""

    def __init__(self, at_once: bool = False) -> None:
        self.at_once = at_once
        self.taken = 0
        self.waiting: list[tuple[int, WriteCallbacks]] = []

    def write(self, request: tablet_pb2.WriteRequest, callbacks: WriteCallbacks) -> None:
        self.taken += 1
        if self.at_once:
            callbacks.respond(tablet_pb2.WriteResponse(op_index=request.request_id.seq_no))
        else:
            self.waiting.append((request.request_id.seq_no, callbacks))

    def answer_all(self) -> None:
        waiting, self.waiting = self.waiting, []
        for seq, callbacks in waiting:
            callbacks.respond(tablet_pb2.WriteResponse(op_index=seq))


class Aborted(Exception):
    pass


class FakeContext:
    def __init__(self, frames: list[tablet_pb2.WriteStreamRequestPB], *, reads: bool) -> None:
        self._frames = list(frames)
        self.reads = 0
        self.written: list[tablet_pb2.WriteStreamResultPB] = []
        self._client_reads = reads
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def peer(self) -> str:
        return "ipv4:192.0.2.7:5555"

    async def read(self) -> Any:
        self.reads += 1
        return self._frames.pop(0) if self._frames else grpc.aio.EOF

    async def write(self, message: tablet_pb2.WriteStreamResponsePB) -> None:
        if not self._client_reads:  # HTTP/2 flow control: never taken
            await asyncio.Event().wait()
        self.written.extend(message.results)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise Aborted(details)


class WindowFull(logging.Handler):
    """Sets ``event`` when the stream says its window is full (logged on the loop, just
    before it stops reading)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.event: asyncio.Event | None = None
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if "window is full" in record.getMessage() and self.event is not None:
            self.event.set()


@pytest.fixture
def window_full() -> Iterator[WindowFull]:
    handler = WindowFull()
    log = logging.getLogger("raftlet.tserver.write_stream")
    log.addHandler(handler)
    yield handler
    log.removeHandler(handler)


def _frames(n: int) -> list[tablet_pb2.WriteStreamRequestPB]:
    frames = []
    for i in range(n):
        frame = tablet_pb2.WriteStreamRequestPB()
        item = frame.items.add(id=i)
        item.request.tablet_id = "t"
        item.request.request_id.seq_no = i
        item.request.ops.add().cells.add(column="v").value.string_value = "x" * WRITE_BYTES
        frames.append(frame)
    return frames


def _session(replica: Replica, **kw: Any) -> WriteStreamSession:
    return WriteStreamSession(
        asyncio.get_running_loop(),
        InlinePool(),  # type: ignore[arg-type]
        lambda _tablet: replica,  # type: ignore[arg-type,return-value]
        lambda _server: "",
        max_frame_bytes=LIMIT,
        window_bytes=WINDOW,
        **kw,
    )


def test_the_stream_stops_reading_while_its_window_is_full(window_full: WindowFull) -> None:
    frames = 60  # ~600 KB, far under the 4,096 writes that once were its only bound

    async def run() -> None:
        window_full.event = asyncio.Event()
        replica = Replica()
        context = FakeContext(_frames(frames), reads=True)
        serving = asyncio.ensure_future(_session(replica).serve(context))  # type: ignore[arg-type]
        await asyncio.wait_for(window_full.event.wait(), timeout=20)
        fit = WINDOW // (WRITE_BYTES + 64) + 1
        assert fit <= replica.taken == context.reads <= fit + 1 < frames
        assert "192.0.2.7:5555" in window_full.messages[-1]
        # Answered, the writes make room: the stream reads on, to the end.
        while not serving.done():
            taken = replica.taken
            replica.answer_all()
            more = lambda t=taken: replica.taken > t or serving.done()  # noqa: E731
            await asyncio.wait_for(_until(more), 20)
        await serving
        assert sorted(r.id for r in context.written) == list(range(frames))

    asyncio.run(run())


def test_the_streams_of_one_connection_share_its_window(window_full: WindowFull) -> None:
    """A connection may carry 64 streams: a window each let one connection hold 64 (32
    streams that never read took a leader to 2.8 GB)."""

    async def run() -> None:
        window_full.event = asyncio.Event()
        windows = StreamWindows(window_bytes=WINDOW)
        replica = Replica()
        first, second = FakeContext(_frames(60), reads=True), FakeContext(_frames(60), reads=True)
        with windows.of(first.peer()) as w1, windows.of(second.peer()) as w2:
            assert w1 is w2
            one = asyncio.ensure_future(_session(replica, window=w1).serve(first))  # type: ignore[arg-type]
            await asyncio.wait_for(window_full.event.wait(), timeout=20)
            two = asyncio.ensure_future(_session(replica, window=w2).serve(second))  # type: ignore[arg-type]
            await asyncio.wait_for(_until(lambda: w1.log.times >= 2), 20)
            assert second.reads == 0  # the window was full: the second stream read nothing
            assert replica.taken == first.reads
            while not (one.done() and two.done()):
                replica.answer_all()
                await asyncio.sleep(0)
            await one
            await two
        assert len(windows) == 0  # let go with its last stream
        assert len(first.written) == len(second.written) == 60

    asyncio.run(run())


def test_a_stream_whose_answers_are_not_read_is_ended_after_the_deadline(
    window_full: WindowFull,
) -> None:
    async def run() -> None:
        replica = Replica(at_once=True)
        context = FakeContext(_frames(200), reads=False)
        session = _session(replica, answer_deadline_s=0.2)
        with pytest.raises(Aborted):
            await asyncio.wait_for(session.serve(context), timeout=20)  # type: ignore[arg-type]
        assert context.aborted is not None
        assert context.aborted[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert replica.taken < 200

    asyncio.run(run())


async def _until(predicate: Any) -> None:
    """Yield to the loop until ``predicate()`` holds (the caller bounds it with a timeout);
    the loop runs the session meanwhile, which is what makes it true."""
    while not predicate():
        await asyncio.sleep(0)
