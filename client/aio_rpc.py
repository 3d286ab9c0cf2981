"""One tablet RPC over asyncio, routed and retried as ``rpc.call_tablet`` does.

The routing (``rpc.Router``: hinted leader, leader look-up, next replica, servers marked
down), the classification of failures (``retry.classify``) and the deadline-bounded,
per-cause backoff (``retry.run_with_retries_async``) are the threaded client's own; only the
attempt and the backoff are awaited instead of blocking a thread, so many RPCs can be in
flight from one event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from tenacity.wait import wait_base

from raftlet.client.aio_channels import AsyncServerStub, AsyncStubProvider
from raftlet.client.aio_meta import AsyncMetaCache
from raftlet.client.retry import (
    DEFAULT_POLICIES,
    Cause,
    classify,
    run_with_retries_async,
    within,
)
from raftlet.client.rpc import Router
from raftlet.client.stats import StatsRecorder

__all__ = ["AsyncRpcContext", "call_tablet_async"]

R = TypeVar("R")


@dataclass
class AsyncRpcContext:
    """What every tablet RPC of one ``AsyncClient`` shares."""

    meta: AsyncMetaCache
    stubs: AsyncStubProvider
    stats: StatsRecorder
    attempt_timeout_s: float = 10.0
    policies: Mapping[Cause, wait_base] = field(default_factory=lambda: dict(DEFAULT_POLICIES))
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep


async def call_tablet_async(
    ctx: AsyncRpcContext,
    tablet_id: str,
    call: Callable[[AsyncServerStub, float, int], Awaitable[R]],
    *,
    what: str,
    deadline: float,
    timeout_s: float,
    leader_only: bool = True,
    prefer: str | None = None,
) -> tuple[R, str]:
    """Await ``call(stub, attempt_timeout_s, attempt_no)`` against the right replica of
    ``tablet_id`` until it succeeds; returns its result and the uuid of the server that
    answered. Raises what ``rpc.call_tablet`` raises."""
    router = Router(ctx.meta, ctx.meta.tablet(tablet_id), leader_only, prefer)

    async def attempt(attempt_no: int, attempt_timeout: float) -> tuple[R, str]:
        if router.needs_lookup():
            await ctx.meta.refresh_leaders(deadline, tablet_id=router.tablet_id)
            # The look-up may have taken some of the time left: the call keeps the rest.
            attempt_timeout = within(attempt_timeout, deadline, ctx.clock)
        if attempt_no == 0 and not router.leader_only:
            attempt_timeout = router.time_for(attempt_timeout, deadline - ctx.clock())
        target = router.pick()
        address = ctx.meta.address(target)
        stub = ctx.stubs.stub(address)
        try:
            result = await call(stub, attempt_timeout, attempt_no)
        except grpc.RpcError as e:
            failure = classify(e, target, address)
        else:
            router.succeeded(target, result, address, what)
            return result, target
        router.failed_with(failure, what)

    return await run_with_retries_async(
        attempt,
        what=what,
        deadline=deadline,
        timeout_s=timeout_s,
        attempt_timeout_s=ctx.attempt_timeout_s,
        policies=ctx.policies,
        on_retry=lambda f: ctx.stats.retry(f.cause),
        clock=ctx.clock,
        sleep=ctx.sleep,
    )
