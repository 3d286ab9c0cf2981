"""tserver/deferred_answers.py, and the write port's use of it: the answers a pass posts
inside ``together()`` leave as one frame per client connection when it ends, each exactly
once, in the order they were posted; outside a block, or past the frame limit, one each."""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any

import pytest

from raftlet.consensus.rpc.frame_link import FrameLink, frame
from raftlet.proto import tablet_pb2
from raftlet.tserver import deferred_answers
from raftlet.tserver.service_pool import InboundCall
from raftlet.tserver.tablet_replica import WriteCallbacks
from raftlet.tserver.write_tcp_server import write_links


def test_outside_a_block_nothing_is_deferred() -> None:
    flushed: list[list[int]] = []
    assert deferred_answers.defer("k", 1, flushed.append) is False
    assert flushed == []


def test_a_block_flushes_each_key_once_in_order_also_when_it_raises() -> None:
    flushed: list[tuple[str, list[int]]] = []

    def flush_to(key: str) -> Any:
        return lambda items: flushed.append((key, items))

    def a_failing_pass() -> None:
        with deferred_answers.together():
            for i in range(6):
                key = "ab"[i % 2]
                assert deferred_answers.defer(key, i, flush_to(key))
                with deferred_answers.together():  # nested: part of the outer block
                    pass
            assert flushed == []
            raise RuntimeError("the pass failed: its answers are owed all the same")

    with pytest.raises(RuntimeError):
        a_failing_pass()
    assert flushed == [("a", [0, 2, 4]), ("b", [1, 3, 5])]
    assert deferred_answers.defer("a", 9, flush_to("a")) is False


def test_a_failing_flush_does_not_stop_the_others() -> None:
    flushed: list[list[int]] = []

    def broken(_items: list[int]) -> None:
        raise ValueError("a bug")

    with deferred_answers.together():
        deferred_answers.defer("x", 1, broken)
        deferred_answers.defer("y", 2, flushed.append)
    assert flushed == [[2]]


def test_another_threads_answers_are_not_held() -> None:
    flushed: list[list[int]] = []
    with deferred_answers.together():
        outside: list[bool] = []
        t = threading.Thread(target=lambda: outside.append(deferred_answers.defer("k", 1, print)))
        t.start()
        t.join()
        assert outside == [False]
        deferred_answers.defer("k", 2, flushed.append)
    assert flushed == [[2]]


# --- the write port -----------------------------------------------------------------------------


class _InlinePool:
    stopped = False

    def offer(self, call: InboundCall, requests: int = 1) -> bool:
        call.run(call)
        return True


class _HeldReplica:
    """Keeps every write's callbacks: the test answers them when and how it wants."""

    def __init__(self) -> None:
        self.callbacks: dict[int, WriteCallbacks] = {}
        self.arrived = threading.Condition()

    def write(self, request: tablet_pb2.WriteRequest, callbacks: WriteCallbacks) -> None:
        with self.arrived:
            self.callbacks[request.request_id.seq_no] = callbacks
            self.arrived.notify_all()


def _recv_frames(sock: socket.socket, count: int) -> list[tablet_pb2.WriteStreamResponsePB]:
    out: list[tablet_pb2.WriteStreamResponsePB] = []
    buf = b""
    sock.settimeout(10)
    while len(out) < count:
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
            (n,) = struct.unpack(">I", buf[:4])
            out.append(tablet_pb2.WriteStreamResponsePB.FromString(buf[4 : 4 + n]))
            buf = buf[4 + n :]
        if len(out) < count:
            buf += sock.recv(65536)
    return out


@pytest.fixture
def port() -> Any:
    server_end, client_end = socket.socketpair()
    replica = _HeldReplica()
    make = write_links(
        _InlinePool(),  # type: ignore[arg-type]
        lambda _tablet: replica,  # type: ignore[arg-type,return-value]
        lambda _server: "",
        max_frame_bytes=2048,
        send_timeout_s=5,
    )
    link: FrameLink = make(server_end, "write from test", lambda _link: None, None)
    link.start()
    yield client_end, replica
    link.close()
    client_end.close()


def _send_writes(client: socket.socket, replica: _HeldReplica, n: int) -> None:
    request = tablet_pb2.WriteStreamRequestPB()
    for i in range(n):
        item = request.items.add(id=i)
        item.request.tablet_id = "kv-p0"
        item.request.request_id.client_id = "c"
        item.request.request_id.seq_no = i
    client.sendall(frame(request.SerializeToString()))
    with replica.arrived:
        assert replica.arrived.wait_for(lambda: len(replica.callbacks) == n, 10)


def _answer(replica: _HeldReplica, seq: int, errors: int = 0) -> None:
    response = tablet_pb2.WriteResponse(op_index=seq + 100, op_term=1)
    for i in range(errors):
        response.row_errors.add(
            row_index=i, code=tablet_pb2.RowErrorPB.KEY_EXISTS, message="x" * 20
        )
    replica.callbacks[seq].respond(response)


def test_a_passs_answers_leave_in_one_frame(port: Any) -> None:
    client, replica = port
    _send_writes(client, replica, 8)
    with deferred_answers.together():
        for seq in (3, 1, 0, 2, 7, 5, 4, 6):
            _answer(replica, seq)
    (message,) = _recv_frames(client, 1)
    assert [r.id for r in message.results] == [3, 1, 0, 2, 7, 5, 4, 6]
    assert [r.response.op_index for r in message.results] == [
        103,
        101,
        100,
        102,
        107,
        105,
        104,
        106,
    ]


def test_answers_outside_a_pass_and_over_the_limit_leave_one_by_one(port: Any) -> None:
    client, replica = port
    _send_writes(client, replica, 6)
    _answer(replica, 0)
    _answer(replica, 0)  # a second answer to one write is dropped, as ever
    assert [m.results[0].id for m in _recv_frames(client, 1)] == [0]
    with deferred_answers.together():
        for seq in range(1, 6):
            _answer(replica, seq, errors=30)  # ~500 bytes each: 5 together pass 2048
    messages = _recv_frames(client, 5)
    assert [[r.id for r in m.results] for m in messages] == [[1], [2], [3], [4], [5]]
