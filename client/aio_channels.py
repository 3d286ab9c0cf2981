"""``grpc.aio`` channels for the asyncio client: one per server address, as ``channels``.

``AsyncChannelPool`` is ``ChannelPool`` for ``grpc.aio``: a channel is opened the first time
an address is used (inside the running event loop, which a ``grpc.aio`` channel is bound
to), kept until ``await close()``, and counted, with the sync pool's bookkeeping
(``channels.ChannelsByAddress``) and options (``channels.channel_options``: short reconnect
backoff, no proxy, 64 MiB messages), and no ``wait_for_ready``, so a dead server fails fast
and the retry policy moves on. ``channel(address)`` is the raw channel, for streams of other
services (the tablet server's consensus streams to its peers).

``AsyncServerStub`` / ``AsyncStubProvider`` are the seam the asyncio client uses, so unit
tests plug in fakes. ``GrpcAsyncServerStub.write`` goes over the server's plain-TCP write
port (``aio_tcp_writes``: when the server has one and is dialed directly; a TLS client
only when given ``tcp_ssl``, the same TLS for Python's ``ssl``),
else its write stream (``aio_write_stream``), unless built with ``write_stream=False``. A
failed call raises a ``grpc.RpcError`` (``grpc.aio.AioRpcError``, or ``StreamedRpcError``
for a streamed write) with the ``code()``/``details()``/``trailing_metadata()`` that
``retry.classify`` reads.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar, cast

import grpc

from raftlet.client.aio_tcp_writes import TcpWritesTo
from raftlet.client.aio_write_stream import AsyncWriteStream, StreamedRpcError, unary_call
from raftlet.client.channels import CHANNEL_OPTIONS, ChannelsByAddress
from raftlet.client.retry import within
from raftlet.proto import admin_pb2, admin_pb2_grpc, tablet_pb2, tablet_pb2_grpc

__all__ = ["AsyncChannelPool", "AsyncServerStub", "AsyncStubProvider", "GrpcAsyncServerStub"]

T = TypeVar("T")


class AsyncServerStub(Protocol):
    """The RPCs the asyncio client makes to one server. ``timeout`` is in seconds."""

    address: str

    async def write(
        self, request: tablet_pb2.WriteRequest, timeout: float
    ) -> tablet_pb2.WriteResponse: ...

    async def list_tablets(self, timeout: float) -> tablet_pb2.ListTabletsResponse: ...

    async def get_cluster_config(self, timeout: float) -> tablet_pb2.GetClusterConfigResponse: ...

    async def leader_step_down(
        self, request: admin_pb2.LeaderStepDownRequest, timeout: float
    ) -> admin_pb2.LeaderStepDownResponse: ...


class AsyncStubProvider(Protocol):
    def stub(self, address: str) -> AsyncServerStub: ...


class GrpcAsyncServerStub:
    """``AsyncServerStub`` over a shared ``grpc.aio.Channel``."""

    def __init__(
        self,
        address: str,
        channel: grpc.aio.Channel,
        write_stream: bool = True,
        tcp_writes: bool = False,
        tcp_ssl: ssl.SSLContext | None = None,
    ) -> None:
        self.address = address
        self._tablet = tablet_pb2_grpc.TabletServiceStub(channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(channel)
        # Writes go on the server's WriteStream (many in flight, few messages) unless the
        # client asked for one unary Write call per write.
        self._stream = AsyncWriteStream(address, channel) if write_stream else None
        # ...and over its plain-TCP write port instead, when it has one we may use.
        self._tcp = (
            TcpWritesTo(address, self._tablet, tcp_ssl) if tcp_writes and write_stream else None
        )

    async def write(
        self, request: tablet_pb2.WriteRequest, timeout: float
    ) -> tablet_pb2.WriteResponse:
        if self._tcp is not None:
            tcp = self._tcp.open_stream()  # the usual case: open already, nothing to wait for
            if tcp is None:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + timeout
                tcp = await self._tcp.stream(timeout)
                timeout = within(timeout, deadline, loop.time)  # what the wait left
            if tcp is not None:
                return await tcp.write(request, timeout)
        if self._stream is not None:
            try:
                return await self._stream.write(request, timeout)
            except StreamedRpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                # A server without WriteStream: one unary call per write from now on.
                stream, self._stream = self._stream, None
                await stream.close()
        return cast(
            tablet_pb2.WriteResponse,
            await unary_call(lambda: self._tablet.Write(request, timeout=timeout)),
        )

    async def close(self) -> None:
        if self._tcp is not None:
            await self._tcp.close()
        if self._stream is not None:
            await self._stream.close()

    async def list_tablets(self, timeout: float) -> tablet_pb2.ListTabletsResponse:
        return cast(
            tablet_pb2.ListTabletsResponse,
            await unary_call(
                lambda: self._tablet.ListTablets(tablet_pb2.ListTabletsRequest(), timeout=timeout)
            ),
        )

    async def get_cluster_config(self, timeout: float) -> tablet_pb2.GetClusterConfigResponse:
        request = tablet_pb2.GetClusterConfigRequest()
        return cast(
            tablet_pb2.GetClusterConfigResponse,
            await unary_call(lambda: self._tablet.GetClusterConfig(request, timeout=timeout)),
        )

    async def leader_step_down(
        self, request: admin_pb2.LeaderStepDownRequest, timeout: float
    ) -> admin_pb2.LeaderStepDownResponse:
        return cast(
            admin_pb2.LeaderStepDownResponse,
            await unary_call(lambda: self._admin.LeaderStepDown(request, timeout=timeout)),
        )


class AsyncChannelPool:
    """``grpc.aio`` channels (and their stubs) by address; use from one event loop."""

    def __init__(
        self,
        options: Sequence[tuple[str, int]] = CHANNEL_OPTIONS,
        *,
        on_created: Callable[[str], None] | None = None,
        write_stream: bool = True,
        credentials: grpc.ChannelCredentials | None = None,
        tcp_writes: bool = True,
        tcp_ssl: ssl.SSLContext | None = None,
    ) -> None:
        # A connection of its own per pool: gRPC otherwise puts every channel of a process
        # to one address with equal options on one connection, and each AsyncClient keeps a
        # write stream per server open -- a process's 65th client found all 64 streams a
        # server allows a connection taken, and its writes waited out their deadline.
        self._options = [*options, ("grpc.use_local_subchannel_pool", 1)]
        self._credentials = credentials  # None: plaintext (client.tls)
        self._write_stream = write_stream
        # A TLS client (credentials) uses the tcp write ports only with their TLS, tcp_ssl:
        # never in clear what it would send encrypted over gRPC.
        self._tcp_writes = tcp_writes and (credentials is None or tcp_ssl is not None)
        self._tcp_ssl = tcp_ssl
        self._channels: ChannelsByAddress[grpc.aio.Channel] = ChannelsByAddress(
            self._open, on_created
        )
        self._stubs: dict[str, GrpcAsyncServerStub] = {}

    def _open(self, address: str) -> grpc.aio.Channel:
        if self._credentials is not None:
            return grpc.aio.secure_channel(address, self._credentials, options=self._options)
        return grpc.aio.insecure_channel(address, options=self._options)

    def channel(self, address: str) -> grpc.aio.Channel:
        """The channel to ``address`` ("host:port"); ``ClientClosed`` once closed."""
        return self._channels.get(address)

    def stub(self, address: str) -> AsyncServerStub:
        stub = self._stubs.get(address)
        if stub is None:
            stub = GrpcAsyncServerStub(
                address,
                self._channels.get(address),
                self._write_stream,
                self._tcp_writes,
                self._tcp_ssl,
            )
            self._stubs[address] = stub
        return stub

    @property
    def channels_created(self) -> int:
        """How many channels this pool ever opened: one per address, never per call."""
        return self._channels.created

    def addresses(self) -> list[str]:
        return self._channels.addresses()

    async def close(self) -> None:
        """Close every channel (calls still in flight on them are cancelled)."""
        channels = self._channels.close()
        stubs = list(self._stubs.values())
        self._stubs.clear()
        for stub in stubs:
            await stub.close()
        for channel in channels:
            await channel.close()
