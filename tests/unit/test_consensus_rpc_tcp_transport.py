"""The tcp transport's dialer (consensus/rpc/tcp_transport.py) against a real consensus
port: a peer whose port is full accepts each connection and closes it at once, which must
not be taken for a working link -- the backoff was reset on every connect, so the peer was
redialed every 0.5 s forever, each time logging "now on plain tcp"."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raftlet.consensus.core.types import Message, MessageType
from raftlet.consensus.rpc import tcp_transport
from raftlet.consensus.rpc.stream_transport import Pending, encode_item
from raftlet.consensus.rpc.tcp_transport import Endpoint, TcpHub
from raftlet.proto import consensus_pb2 as pb
from raftlet.tserver.consensus_tcp_server import consensus_links
from raftlet.tserver.errors import UnknownTablet
from raftlet.tserver.tcp_listener import TcpListener
from tests.waiting import WAIT_S, wait_for

PEER = "127.0.0.1:7050"
ON_TCP = "now on tcp without TLS"


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Handler:
    """A peer's consensus handler that knows no tablet: every request is answered
    ``failed``, which is still an answer on the link."""

    def start(self, request: Any, done: Callable[[Any], None]) -> None:
        raise UnknownTablet(request.tablet_id)


class _Stream:
    def __init__(self) -> None:
        self.sent: list[int] = []

    def send(self, seq: int, item: bytes, pending: Pending, *, lazy: bool = False) -> None:
        self.sent.append(seq)


class _Fallback:
    """What the hub needs of the gRPC streams: requests sent without a link land here."""

    timeout_s = 10.0
    max_frame_bytes = 1 << 20

    def __init__(self) -> None:
        self.stream = _Stream()
        self._seq = 0

    def stream_to(self, addr: str) -> _Stream:
        return self.stream

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    async def close(self) -> None:
        pass


def _listener(max_connections: int) -> Iterator[TcpListener]:
    listener = TcpListener(
        "consensus",
        "127.0.0.1",
        0,
        consensus_links(
            _Handler(),  # type: ignore[arg-type]
            max_frame_bytes=1 << 20,
            send_timeout_s=10.0,
        ),
        max_connections=max_connections,
    )
    listener.start()
    try:
        yield listener
    finally:
        listener.close()


@pytest.fixture
def full_port() -> Iterator[TcpListener]:
    yield from _listener(0)


@pytest.fixture
def open_port() -> Iterator[TcpListener]:
    yield from _listener(4)


class _Dialer:
    def __init__(self, port: int) -> None:
        self.clock = _Clock()
        self.fallback = _Fallback()
        self.dialed_at: list[float] = []
        self.answers: list[object] = []

        def lookup(addr: str) -> Endpoint:
            self.dialed_at.append(self.clock.now)
            return Endpoint("127.0.0.1", port)

        self.hub = TcpHub(self.fallback, lookup, clock=self.clock)  # type: ignore[arg-type]
        self.peer = self.hub.stream_to(PEER)

    def send(self) -> None:
        seq = self.hub.next_seq()
        message = Message(MessageType.HEARTBEAT, "ts1", "ts2", 3)
        request = pb.UpdateConsensusRequest(tablet_id="t-1", caller_uuid="ts1", dest_uuid="ts2")
        pending = Pending("t-1", message, self.answers.append, self.clock.now + 10.0)
        self.peer.send(seq, encode_item(seq, request), pending)

    def settled(self) -> bool:
        """No dial under way, and no link up (the full port closed it). Under the peer's
        lock: the close sets when to dial next under it, with the hub's clock."""
        with self.peer._lock:
            return not self.peer._connecting and not self.peer.connected

    def close(self) -> None:
        asyncio.run(self.hub.close())


def test_a_peer_that_closes_each_connection_at_once_is_redialed_less_and_less_quietly(
    full_port: TcpListener, caplog: pytest.LogCaptureFixture
) -> None:
    dialer = _Dialer(full_port.port)
    try:
        with caplog.at_level(logging.INFO, logger=tcp_transport.__name__):
            for _ in range(10):  # a request every 0.6 s of the hub's clock
                dialer.send()
                wait_for(dialer.settled, WAIT_S, "the dial over and its link closed")
                dialer.clock.now += 0.6
    finally:
        dialer.close()
    # Each closed link counts as a failed dial: 0.5 s, then 1, 2, 4 s before the next.
    assert [round(t - 1000.0, 1) for t in dialer.dialed_at] == [0.0, 0.6, 1.8, 4.2]
    assert ON_TCP not in caplog.text
    # Every request went (or, sent on a link the peer then closed, was lost) as before.
    assert len(dialer.fallback.stream.sent) + len(dialer.answers) == 10


def test_a_link_that_answers_is_on_tcp_once_and_resets_the_backoff(
    open_port: TcpListener, caplog: pytest.LogCaptureFixture
) -> None:
    dialer = _Dialer(open_port.port)
    try:
        with caplog.at_level(logging.INFO, logger=tcp_transport.__name__):
            dialer.send()  # on the stream; dials
            wait_for(lambda: dialer.peer.connected, WAIT_S, "the link up")
            assert ON_TCP not in caplog.text  # connected, but nothing proves it works yet
            for _ in range(3):
                dialer.send()
            wait_for(lambda: len(dialer.answers) == 3, WAIT_S, "three answers on the link")
            assert caplog.text.count(ON_TCP) == 1
            # The link breaks: the next dial is as prompt as the first retry after a failure.
            backoff = dialer.peer._backoff
            for link in list(open_port._links):
                link.close()
            wait_for(lambda: not dialer.peer.connected, WAIT_S, "the link closed")
    finally:
        dialer.close()
    assert backoff == tcp_transport._BACKOFF_INITIAL_S
    assert dialer.peer._next_attempt == dialer.clock.now + tcp_transport._BACKOFF_INITIAL_S
    assert dialer.answers == [None, None, None]  # "failed" answers step nothing
    assert dialer.dialed_at == [1000.0]
