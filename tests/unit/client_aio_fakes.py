"""Fakes for the asyncio client's unit tests, on top of ``client_fakes``.

``AsyncFakeCluster`` is the ``AsyncStubProvider`` of the same scripted ``FakeServer``s the
threaded tests use: each coroutine yields to the event loop once (so concurrent calls really
interleave) and then answers from the server's script. ``AsyncFakeClock`` is ``FakeClock``
with an awaitable sleep: a backoff advances the clock and yields, nothing really waits.
"""

from __future__ import annotations

import asyncio
from typing import Any

from raftlet.client.aio import AsyncClient
from raftlet.proto import admin_pb2, tablet_pb2
from tests.unit.client_fakes import FakeClock, FakeCluster, FakeServer, addr, config_pb


class AsyncFakeServer:
    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.address = server.address

    async def write(
        self, request: tablet_pb2.WriteRequest, timeout: float
    ) -> tablet_pb2.WriteResponse:
        await asyncio.sleep(0)
        answer = self.server.write(request, timeout)
        if asyncio.iscoroutine(answer):  # a script entry may be a coroutine function
            answer = await answer
        return answer

    async def list_tablets(self, timeout: float) -> tablet_pb2.ListTabletsResponse:
        await asyncio.sleep(0)
        response: tablet_pb2.ListTabletsResponse = self.server.list_tablets_future(timeout).result()
        return response

    async def get_cluster_config(self, timeout: float) -> tablet_pb2.GetClusterConfigResponse:
        await asyncio.sleep(0)
        return self.server.get_cluster_config(timeout)

    async def leader_step_down(
        self, request: admin_pb2.LeaderStepDownRequest, timeout: float
    ) -> admin_pb2.LeaderStepDownResponse:
        await asyncio.sleep(0)
        return self.server.leader_step_down(request, timeout)


class AsyncFakeCluster:
    def __init__(self, cluster: FakeCluster | None = None) -> None:
        self.cluster = cluster or FakeCluster()
        self.servers = self.cluster.servers
        self._stubs = {s.address: AsyncFakeServer(s) for s in self.servers.values()}

    def stub(self, address: str) -> AsyncFakeServer:
        return self._stubs[address]

    def writes(self) -> list[tuple[str, tablet_pb2.WriteRequest]]:
        return self.cluster.writes()


class AsyncFakeClock(FakeClock):
    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)
        await asyncio.sleep(0)


async def fake_client(
    cluster: AsyncFakeCluster, clock: AsyncFakeClock | None = None, **kwargs: Any
) -> AsyncClient:
    """A connected ``AsyncClient`` of the fake cluster (its config scripted on ts1)."""
    clock = clock or AsyncFakeClock()
    cluster.servers["ts1"].script("config", config_pb())
    return await AsyncClient.connect(
        [addr("ts1")], stubs=cluster, clock=clock.clock, sleep=clock.async_sleep, **kwargs
    )


__all__ = ["AsyncFakeClock", "AsyncFakeCluster", "AsyncFakeServer", "fake_client"]
