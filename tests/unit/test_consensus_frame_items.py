"""The consensus port (tserver/consensus_tcp_server.py) takes one request per frame, as a
peer sends them: a frame of more closes the connection with none of it stepped or answered
(a million empty items in a 2 MB frame had each answered ``failed``, the server growing by
~500 times the frame). With TLS a request claiming a sender other than the caller's
certificate is answered ``failed`` PERMISSION_DENIED and counted."""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Callable
from typing import Any

import pytest

from raftlet.cluster.identity import AccessRole, Identity
from raftlet.consensus.rpc.frame_link import FrameLink
from raftlet.metrics.catalogue import RPC_AUTH_DENIALS
from raftlet.metrics.registry import MetricRegistry
from raftlet.proto import common_pb2
from raftlet.proto import consensus_pb2 as pb
from raftlet.tserver.consensus_tcp_server import consensus_links
from raftlet.tserver.security import Authenticator
from tests.integration.raw_frames import read_frame
from tests.waiting import wait_for

LIMIT = 1 << 20


class Handler:
    def __init__(self) -> None:
        self.started: list[Any] = []

    def start(self, request: Any, done: Callable[[Any], None]) -> None:
        self.started.append(request)
        done(pb.UpdateConsensusResponse(responder_term=request.caller_term))


def _link(
    handler: Handler,
    closed: list[FrameLink],
    auth: Authenticator | None = None,
    peer: Identity | None = None,
) -> tuple[FrameLink, socket.socket]:
    make = consensus_links(
        handler,  # type: ignore[arg-type]
        max_frame_bytes=LIMIT,
        send_timeout_s=10.0,
        auth=auth,
    )
    server, client = socket.socketpair()
    link = make(server, "consensus from test", closed.append, peer).start()
    client.settimeout(20.0)
    return link, client


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _update(seq: int) -> bytes:
    item = pb.ConsensusItemPB(seq=seq, update=pb.UpdateConsensusRequest(caller_term=seq))
    return pb.ConsensusFramePB(items=[item]).SerializeToString()


def test_a_frame_of_many_items_closes_the_link_with_nothing_answered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handler = Handler()
    closed: list[FrameLink] = []
    link, client = _link(handler, closed)
    try:
        with caplog.at_level(logging.WARNING, logger="raftlet.tserver.consensus_tcp_server"):
            # Empty items, then two real requests in one frame, then one more on its own.
            client.sendall(
                _frame(b"\x0a\x00" * 1000) + _frame(_update(1) + _update(2)) + _frame(_update(3))
            )
            assert client.recv(1 << 16) == b""  # closed, and no answer to anything
            wait_for(lambda: bool(closed), what="the link to close")
        assert handler.started == []
        assert "a frame of 1000 requests" in caplog.text
    finally:
        client.close()
        link.join(5.0)


def test_one_request_per_frame_is_answered_as_ever() -> None:
    handler = Handler()
    closed: list[FrameLink] = []
    link, client = _link(handler, closed)
    try:
        # Several frames in one write, as a peer's lazy burst of heartbeats leaves.
        client.sendall(b"".join(_frame(_update(seq)) for seq in (1, 2, 3)))
        answers: list[pb.ConsensusItemPB] = []
        buf = b""
        while len(answers) < 3:
            chunk = client.recv(1 << 16)
            assert chunk, "the server closed the connection"
            buf += chunk
            while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">I", buf)[0]:
                (length,) = struct.unpack_from(">I", buf)
                answers.extend(pb.ConsensusFramePB.FromString(buf[4 : 4 + length]).items)
                buf = buf[4 + length :]
        assert sorted(a.seq for a in answers) == [1, 2, 3]
        assert all(a.WhichOneof("kind") == "update_response" for a in answers)
        assert not closed
    finally:
        client.close()
        link.close()
        link.join(5.0)


def test_a_forged_sender_is_answered_permission_denied_and_counted() -> None:
    """README, Security: a forged Raft sender is refused PERMISSION_DENIED and counted in
    rpc_auth_denials{reason}; the tcp port answered it with code UNKNOWN (0)."""
    entity = MetricRegistry().entity("server", "ts3")
    auth = Authenticator(None, entity)
    handler = Handler()
    closed: list[FrameLink] = []
    link, client = _link(handler, closed, auth, Identity("ts3", AccessRole.SERVER))
    try:
        forged = pb.UpdateConsensusRequest(caller_uuid="ts1", dest_uuid="ts2", caller_term=9)
        frame = pb.ConsensusFramePB(items=[pb.ConsensusItemPB(seq=7, update=forged)])
        client.sendall(_frame(frame.SerializeToString()))
        (answer,) = pb.ConsensusFramePB.FromString(read_frame(client)).items
        assert answer.seq == 7
        assert answer.WhichOneof("kind") == "failed"
        assert answer.failed.code == common_pb2.ServerErrorPB.PERMISSION_DENIED
        assert "certificate" in answer.failed.message
        assert handler.started == []
        denials = entity.counter(RPC_AUTH_DENIALS, reason="sender_mismatch").value()
        assert denials == 1
        assert not closed
    finally:
        client.close()
        link.close()
        link.join(5.0)
