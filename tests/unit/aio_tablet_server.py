"""A tablet servicer served by an in-process grpc.aio server on loopback, for tests of the
asyncio client's write paths against it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from raftlet.client.aio_channels import GrpcAsyncServerStub
from raftlet.proto import tablet_pb2, tablet_pb2_grpc


async def with_tablet_server(
    servicer: Any,
    body: Callable[[GrpcAsyncServerStub], Awaitable[None]],
    receive_limit: int | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Serve ``servicer`` on loopback and run ``body`` with a stub of it; ``receive_limit``:
    the largest message the server takes (gRPC's default if None)."""
    options = [] if receive_limit is None else [("grpc.max_receive_message_length", receive_limit)]
    server = grpc.aio.server(options=options)
    tablet_pb2_grpc.add_TabletServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = GrpcAsyncServerStub(f"127.0.0.1:{port}", channel)
    try:
        async with asyncio.timeout(timeout_s):
            await body(stub)
    finally:
        await stub.close()
        await channel.close()
        await server.stop(0)


def write_request(seq: int) -> tablet_pb2.WriteRequest:
    """An empty write to tablet t1 by client c with sequence number ``seq``."""
    req = tablet_pb2.WriteRequest(tablet_id="t1")
    req.request_id.client_id = "c"
    req.request_id.seq_no = seq
    return req
