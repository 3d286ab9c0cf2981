"""One long-lived gRPC channel per server address, shared by everything a ``Client`` does.

A gRPC channel is a connection manager (name resolution, a TCP/HTTP2 connection, reconnects
with backoff), expensive to build and safe to share between threads; opening one per call
would pay a handshake per RPC and leak sockets under load. ``ChannelPool`` opens a channel
the first time an address is used, keeps it until ``close()``, and counts how many it ever
opened (``ClientStats.channels_created``) so a test can prove the sharing.

A channel to a server that was killed reconnects by itself when the server returns; the
reconnect backoff is capped low (``MAX_RECONNECT_BACKOFF_MS``) because gRPC's default grows to
two minutes, far longer than a tablet server restart. Calls never wait for a connection
(no ``wait_for_ready``): a dead server answers UNAVAILABLE at once, and the retry policy
moves on to another replica.

``ServerStub`` / ``StubProvider`` are the seam the rest of the client uses, so unit tests can
plug in fakes without a server.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, cast

import grpc

from raftlet.client.errors import ClientClosed
from raftlet.proto import admin_pb2, admin_pb2_grpc, tablet_pb2, tablet_pb2_grpc

__all__ = [
    "CHANNEL_OPTIONS",
    "ChannelPool",
    "GrpcServerStub",
    "ResultFuture",
    "ServerStub",
    "StubProvider",
]

MAX_RECONNECT_BACKOFF_MS = 1000

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    # Loopback and cluster-internal addresses must never go through an environment proxy.
    ("grpc.enable_http_proxy", 0),
    # Scan pages of wide rows can exceed gRPC's 4 MiB default.
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


class ResultFuture(Protocol):
    def result(self, timeout: float | None = None) -> Any: ...


class ServerStub(Protocol):
    """The RPCs the client makes to one server. ``timeout`` is in seconds."""

    address: str

    def write(
        self, request: tablet_pb2.WriteRequest, timeout: float
    ) -> tablet_pb2.WriteResponse: ...

    def scan(self, request: tablet_pb2.ScanRequest, timeout: float) -> tablet_pb2.ScanResponse: ...

    def list_tablets_future(self, timeout: float) -> ResultFuture:
        """Starts ListTablets; ``result()`` is a ``ListTabletsResponse`` or raises."""
        ...

    def get_cluster_config(self, timeout: float) -> tablet_pb2.GetClusterConfigResponse: ...

    def leader_step_down(
        self, request: admin_pb2.LeaderStepDownRequest, timeout: float
    ) -> admin_pb2.LeaderStepDownResponse: ...


class StubProvider(Protocol):
    def stub(self, address: str) -> ServerStub: ...


class GrpcServerStub:
    """``ServerStub`` over a shared ``grpc.Channel``."""

    def __init__(self, address: str, channel: grpc.Channel) -> None:
        self.address = address
        self._tablet = tablet_pb2_grpc.TabletServiceStub(channel)  # type: ignore[no-untyped-call]
        self._admin = admin_pb2_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]

    def write(self, request: tablet_pb2.WriteRequest, timeout: float) -> tablet_pb2.WriteResponse:
        return cast(tablet_pb2.WriteResponse, self._tablet.Write(request, timeout=timeout))

    def scan(self, request: tablet_pb2.ScanRequest, timeout: float) -> tablet_pb2.ScanResponse:
        return cast(tablet_pb2.ScanResponse, self._tablet.Scan(request, timeout=timeout))

    def list_tablets_future(self, timeout: float) -> ResultFuture:
        future = self._tablet.ListTablets.future(tablet_pb2.ListTabletsRequest(), timeout=timeout)
        return cast(ResultFuture, future)

    def get_cluster_config(self, timeout: float) -> tablet_pb2.GetClusterConfigResponse:
        return cast(
            tablet_pb2.GetClusterConfigResponse,
            self._tablet.GetClusterConfig(tablet_pb2.GetClusterConfigRequest(), timeout=timeout),
        )

    def leader_step_down(
        self, request: admin_pb2.LeaderStepDownRequest, timeout: float
    ) -> admin_pb2.LeaderStepDownResponse:
        return cast(
            admin_pb2.LeaderStepDownResponse,
            self._admin.LeaderStepDown(request, timeout=timeout),
        )


class ChannelPool:
    """Channels (and their stubs) by address, opened on first use, closed by ``close()``."""

    def __init__(
        self,
        *,
        options: list[tuple[str, int]] | None = None,
        on_created: Callable[[str], None] | None = None,
    ) -> None:
        self._options = list(CHANNEL_OPTIONS if options is None else options)
        self._on_created = on_created
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, GrpcServerStub] = {}
        self._closed = False
        self.created = 0

    def stub(self, address: str) -> ServerStub:
        stub = self._stubs.get(address)  # the common case takes no lock
        if stub is not None:
            return stub
        with self._lock:
            if self._closed:
                raise ClientClosed("the client is closed")
            stub = self._stubs.get(address)
            if stub is None:
                channel = grpc.insecure_channel(address, options=self._options)
                self._channels[address] = channel
                stub = GrpcServerStub(address, channel)
                self._stubs[address] = stub
                self.created += 1
                if self._on_created is not None:
                    self._on_created(address)
            return stub

    def addresses(self) -> list[str]:
        with self._lock:
            return list(self._channels)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        for channel in channels:
            channel.close()
