"""One tablet RPC over asyncio, routed and retried as ``rpc.call_tablet`` does.

The routing (``rpc.Router``: hinted leader, leader look-up, next replica, servers marked
down), the classification of failures (``retry.classify``) and the deadline-bounded,
per-cause backoff (``retry.run_with_retries_async``) are the threaded client's own; only the
attempt and the backoff are awaited instead of blocking a thread, so many RPCs can be in
flight from one event loop. A leader-only attempt is cut short as the threaded client's is
(``rpc._Watch``): awaited alongside a watch (``_watch``) that, once the server has been
silent for ``SILENCE_S``, looks the leader up and, if another replica leads now, cancels the
call, which is retried there with the same request id.
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
from raftlet.client.channels import AttemptCutShort
from raftlet.client.meta_cache import SILENCE_S
from raftlet.client.retry import (
    DEFAULT_POLICIES,
    Cause,
    classify,
    run_with_retries_async,
    within,
)
from raftlet.client.rpc import RECHECK_S, Router
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
    # How a call's watch waits (``_watch``): not ``sleep``, a backoff's, which tests fake.
    pause: Callable[[float], Awaitable[None]] = asyncio.sleep


async def _watch(ctx: AsyncRpcContext, router: Router, deadline: float, target: str) -> str:
    """Returns the replica that leads the tablet instead of ``target`` once a look-up, made
    after ``target`` has been silent for ``SILENCE_S``, finds one; waits on while ``target``
    still leads (slow is not gone)."""
    meta, sent_at = ctx.meta, router.sent_at
    while True:
        quiet = meta.quiet_left(target, sent_at)
        if quiet > 0:
            await ctx.pause(quiet)
            continue
        meta.doubt_leader(router.tablet_id, target)
        await meta.refresh_leaders(deadline, tablet_id=router.tablet_id)
        leader = router.replaced(target)
        if leader is not None:
            return leader
        await ctx.pause(RECHECK_S)


async def _watched(
    ctx: AsyncRpcContext, router: Router, deadline: float, target: str, call: Awaitable[R]
) -> R:
    """``call``'s answer, or ``AttemptCutShort`` once ``_watch`` found another leader (the
    call cancelled). (Writes in flight to a paused leader each waited out their 10 s.)

    ``call`` is awaited in the caller's task, and the watch starts only once ``target``
    could have been silent for ``SILENCE_S``: a timer, not two tasks per call -- those cost
    the asyncio writer 0.04 ms of CPU a write at 64 in flight, a third more."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    found: list[str] = []
    watch: asyncio.Task[None] | None = None

    async def look() -> None:
        found.append(await _watch(ctx, router, deadline, target))
        task.cancel()  # the call; told apart from the caller's own cancel below

    def start_watch() -> None:
        nonlocal watch
        watch = loop.create_task(look())

    timer = loop.call_later(max(0.0, ctx.meta.quiet_left(target, router.sent_at)), start_watch)
    try:
        return await call
    except asyncio.CancelledError:
        if found and task.uncancel() == 0:
            raise AttemptCutShort(
                f"no answer from {target} for {SILENCE_S} s, and {found[0]} leads the tablet "
                "now: cut short",
                found[0],
            ) from None
        raise
    finally:
        timer.cancel()
        if watch is not None and not watch.done():
            watch.cancel()


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
        cut: AttemptCutShort | None = None
        try:
            if router.leader_only:
                result = await _watched(
                    ctx, router, deadline, target, call(stub, attempt_timeout, attempt_no)
                )
            else:
                result = await call(stub, attempt_timeout, attempt_no)
        except AttemptCutShort as e:
            cut = e
        except grpc.RpcError as e:
            failure = classify(e, target, address)
        else:
            router.succeeded(target, result, address, what)
            return result, target
        if cut is not None:
            router.cut_short(cut, target, address)
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
