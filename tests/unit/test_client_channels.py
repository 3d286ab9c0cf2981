"""client/channels.py and client/aio_channels.py: the one channel layer -- a channel per
address, shared by stubs and raw users, counted, refused once closed, on options defined once.
No server is needed (a gRPC channel connects only when a call is made) but for the
limit on calls in flight."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from raftlet.client.aio_channels import AsyncChannelPool
from raftlet.client.channels import (
    CHANNEL_OPTIONS,
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_CALLS_IN_FLIGHT,
    ChannelPool,
    NoCallSlot,
    channel_options,
    server_options,
)
from raftlet.client.errors import ClientClosed
from raftlet.client.retry import Action, Cause, classify, refused_before_log
from raftlet.proto import tablet_pb2, tablet_pb2_grpc
from raftlet.tserver.grpc_limits import MAX_CONCURRENT_STREAMS, server_limit_options
from tests.waiting import wait_for


def test_channel_pool_keeps_one_channel_per_address() -> None:
    opened: list[str] = []
    pool = ChannelPool(on_created=opened.append)
    try:
        a = pool.channel("127.0.0.1:2")
        assert pool.channel("127.0.0.1:2") is a
        assert pool.channel("127.0.0.1:1") is not a
        # A stub rides on the address's channel: no third channel.
        stub = pool.stub("127.0.0.1:2")
        assert pool.stub("127.0.0.1:2") is stub
        assert stub.address == "127.0.0.1:2"
        assert pool.channels_created == 2
        assert opened == ["127.0.0.1:2", "127.0.0.1:1"]
        assert pool.addresses() == ["127.0.0.1:1", "127.0.0.1:2"]
        assert pool.options == CHANNEL_OPTIONS
    finally:
        pool.close()
    with pytest.raises(ClientClosed, match="closed"):
        pool.channel("127.0.0.1:1")
    with pytest.raises(ClientClosed, match="closed"):
        pool.stub("127.0.0.1:2")
    assert pool.addresses() == []


def test_client_options() -> None:
    options = dict(CHANNEL_OPTIONS)
    assert options["grpc.enable_http_proxy"] == 0
    assert options["grpc.max_reconnect_backoff_ms"] == 1000
    assert options["grpc.max_receive_message_length"] == DEFAULT_MAX_MESSAGE_BYTES
    # A client sends what gRPC allows; the server's cap decides.
    assert "grpc.max_send_message_length" not in options
    assert "grpc.keepalive_time_ms" not in options


def test_peer_options_share_the_server_cap_and_match_its_server_options() -> None:
    peer = dict(channel_options(max_message_bytes=4 << 20, keepalive=True))
    assert peer["grpc.max_send_message_length"] == 4 << 20
    assert peer["grpc.max_receive_message_length"] == 4 << 20
    assert peer["grpc.enable_http_proxy"] == 0
    server = dict(server_options(4 << 20))
    assert server["grpc.max_receive_message_length"] == 4 << 20
    assert server["grpc.keepalive_permit_without_calls"] == 1
    # The server must accept pings at least as often as the channels send them.
    assert server["grpc.http2.min_ping_interval_without_data_ms"] <= peer["grpc.keepalive_time_ms"]


def test_a_stub_held_across_close_fails_as_client_closed() -> None:
    """A writer thread that took its stub before another thread closed the client met grpc's
    ValueError("Cannot invoke RPC on closed channel!") instead of ClientClosed."""
    pool = ChannelPool()
    stub = pool.stub("127.0.0.1:1")
    pool.close()
    with pytest.raises(ClientClosed, match="closed"):
        stub.write(tablet_pb2.WriteRequest(), timeout=1.0)
    with pytest.raises(ClientClosed, match="closed"):
        stub.scan(tablet_pb2.ScanRequest(), timeout=1.0)
    with pytest.raises(ClientClosed, match="closed"):
        stub.list_tablets_future(timeout=1.0)


def test_async_pool_keeps_one_channel_per_address() -> None:
    async def run() -> None:
        opened: list[str] = []
        pool = AsyncChannelPool(on_created=opened.append)
        channel = pool.channel("127.0.0.1:1")
        assert pool.channel("127.0.0.1:1") is channel
        stub = pool.stub("127.0.0.1:1")
        assert pool.stub("127.0.0.1:1") is stub
        pool.stub("127.0.0.1:2")
        assert pool.channels_created == 2
        assert opened == ["127.0.0.1:1", "127.0.0.1:2"]
        assert pool.addresses() == ["127.0.0.1:1", "127.0.0.1:2"]
        await pool.close()
        with pytest.raises(ClientClosed, match="closed"):
            pool.channel("127.0.0.1:1")
        with pytest.raises(ClientClosed, match="closed"):
            pool.stub("127.0.0.1:1")

    asyncio.run(asyncio.wait_for(run(), timeout=30))


def test_an_async_stub_held_across_close_fails_as_cancelled() -> None:
    """grpc.aio refuses a call on a closed channel with its own UsageError, which escaped
    the retry loop; CANCELLED is what that loop turns into ClientClosed once closed."""

    async def run() -> None:
        pool = AsyncChannelPool()
        stub = pool.stub("127.0.0.1:1")
        await pool.close()
        for call in (stub.list_tablets, stub.get_cluster_config):
            with pytest.raises(grpc.RpcError) as failed:
                await call(1.0)
            assert failed.value.code() is grpc.StatusCode.CANCELLED

    asyncio.run(asyncio.wait_for(run(), timeout=30))


def test_a_server_cannot_listen_on_a_port_another_server_holds() -> None:
    """gRPC binds with SO_REUSEPORT on Linux unless told not to: a second server on a port
    in use started, and the kernel split the clients' connections between two clusters."""
    first = grpc.server(ThreadPoolExecutor(1), options=server_options())
    second = grpc.server(ThreadPoolExecutor(1), options=server_options())
    try:
        port = first.add_insecure_port("127.0.0.1:0")
        first.start()
        try:
            taken = second.add_insecure_port(f"127.0.0.1:{port}")
        except RuntimeError:  # newer grpcio raises; older returns 0
            taken = 0
        assert taken == 0
    finally:
        first.stop(None)
        second.stop(None)


class _HeldWrites(tablet_pb2_grpc.TabletServiceServicer):  # type: ignore[misc]  # untyped grpc
    """Writes that wait for ``release``, counting how many are in the handler at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0

    def Write(self, request: tablet_pb2.WriteRequest, context: Any) -> tablet_pb2.WriteResponse:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        self.release.wait(30)
        with self._lock:
            self.now -= 1
        return tablet_pb2.WriteResponse(op_index=1)


def test_the_stubs_of_a_process_keep_at_most_its_calls_in_flight_and_the_rest_wait() -> None:
    """More threads than slots, over two pools (two clients of one process, which gRPC
    puts on one connection): the server never sees more than the slots at once (a server
    refuses streams over its per-connection cap, and counts ended ones a little longer than
    the client), and every call still completes once slots free up."""
    servicer = _HeldWrites()
    server = grpc.server(ThreadPoolExecutor(100), options=server_limit_options())
    tablet_pb2_grpc.add_TabletServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    pools = [ChannelPool(), ChannelPool()]
    try:
        stubs = [pool.stub(f"127.0.0.1:{port}") for pool in pools]
        assert MAX_CALLS_IN_FLIGHT < MAX_CONCURRENT_STREAMS
        with ThreadPoolExecutor(MAX_CALLS_IN_FLIGHT + 30) as callers:
            calls = [
                callers.submit(stubs[i % 2].write, tablet_pb2.WriteRequest(), 30.0)
                for i in range(MAX_CALLS_IN_FLIGHT + 30)
            ]
            deadline = time.monotonic() + 30
            while servicer.now < MAX_CALLS_IN_FLIGHT and time.monotonic() < deadline:
                servicer.release.wait(0.01)
            assert servicer.now == MAX_CALLS_IN_FLIGHT
            servicer.release.set()
            assert all(c.result(timeout=30).op_index == 1 for c in calls)
        assert servicer.most == MAX_CALLS_IN_FLIGHT
    finally:
        for pool in pools:
            pool.close()
        server.stop(None)


def test_a_call_with_no_slot_by_its_deadline_fails_saying_it_was_never_sent() -> None:
    """It used to go out with no time left, and its DEADLINE_EXCEEDED blamed the server
    though every server thread was idle (a reviewer's 34 scanning threads), marked it down
    for the whole process, and said a write never sent may have been applied."""
    servicer = _HeldWrites()
    server = grpc.server(ThreadPoolExecutor(100), options=server_limit_options())
    tablet_pb2_grpc.add_TabletServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    pool = ChannelPool()
    try:
        stub = pool.stub(f"127.0.0.1:{port}")
        with ThreadPoolExecutor(MAX_CALLS_IN_FLIGHT) as callers:
            held = [
                callers.submit(stub.write, tablet_pb2.WriteRequest(), 30.0)
                for _ in range(MAX_CALLS_IN_FLIGHT)
            ]
            wait_for(lambda: servicer.now == MAX_CALLS_IN_FLIGHT, 30, "every slot taken")
            with pytest.raises(NoCallSlot) as failed:
                stub.write(tablet_pb2.WriteRequest(), 0.2)
            # Busy, as a full server says: the same server later, and never sent.
            assert failed.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "never sent" in failed.value.details()
            assert "none ended within 200 ms" in failed.value.details()
            cause = classify(failed.value)
            assert (cause.cause, cause.action) == (Cause.NO_CALL_SLOT, Action.BACKOFF_SAME)
            assert refused_before_log(cause)
            assert f"{MAX_CALLS_IN_FLIGHT} calls in flight to 127.0.0.1:{port}" in str(failed.value)
            assert servicer.most == MAX_CALLS_IN_FLIGHT  # the server never saw it
            servicer.release.set()
            assert all(c.result(timeout=30).op_index == 1 for c in held)
    finally:
        pool.close()
        server.stop(None)
