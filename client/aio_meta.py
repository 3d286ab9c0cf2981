"""``AsyncMetaCache``: the meta cache of ``meta_cache`` with its RPCs made over asyncio.

The state and every decision on it are ``meta_cache.MetaState``, shared with the threaded
client; this module only does its two kinds of I/O as coroutines, with the same rules:

- ``load``: ``GetClusterConfig`` from leaders the view does not list, the seeds, then
  any known server (``MetaCache.config_addresses``), retried with
  ``retry.run_with_retries_async`` until the deadline (``Timeout``);
- ``refresh_leaders``: ``ListTablets`` on every server at once, believed through
  ``MetaState.learn_leaders`` (and, for one tablet, done once ``MetaState.leader_settled``);
  serialized by an ``asyncio.Lock`` and rate-limited (``leader_refresh_interval_s``), so 64
  writes that lost their leader together cost one round of ``ListTablets``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import grpc

from raftlet.client.aio_channels import AsyncStubProvider
from raftlet.client.errors import InvalidArgument, RaftletError
from raftlet.client.meta_cache import (
    CONFIG_TIMEOUT_S,
    LIST_TABLETS_TIMEOUT_S,
    STRAGGLER_S,
    Answers,
    ClusterView,
    MetaState,
)
from raftlet.client.retry import (
    Action,
    Cause,
    ConfigFetchRefusals,
    RetriableFailure,
    RpcFailure,
    classify,
    fatal_error,
    run_with_retries_async,
)
from raftlet.client.stats import StatsRecorder
from raftlet.proto import tablet_pb2

__all__ = ["AsyncMetaCache"]


class AsyncMetaCache(MetaState):
    def __init__(
        self,
        seeds: Sequence[str],
        stubs: AsyncStubProvider,
        stats: StatsRecorder,
        *,
        rpc_timeout_s: float = 10.0,
        down_ttl_s: float = 1.0,
        leader_refresh_interval_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        token_ports: bool = False,
    ) -> None:
        super().__init__(seeds, stats, down_ttl_s=down_ttl_s, clock=clock, token_ports=token_ports)
        self._sleep = sleep
        self._stubs = stubs
        self._rpc_timeout_s = rpc_timeout_s
        self._refresh_interval_s = leader_refresh_interval_s
        self._refresh_lock: asyncio.Lock | None = None  # made in the loop that uses it
        self._last_refresh = float("-inf")
        # Look-up calls still out when the answers already settled the look-up.
        self._unread: set[asyncio.Future[tablet_pb2.ListTabletsResponse | RpcFailure]] = set()

    async def reload_if_stale(self, table: str) -> None:
        """Fetch the config again when it proved out of date for ``table``
        (``MetaState.table_view_stale``); a fetch that fails keeps the view there is."""
        if self.table_view_stale(table):
            await self._fetch_again()

    async def table_changed(self, table: str) -> bool:
        """``MetaCache.table_changed``, awaited."""
        if not self.may_fetch_again():
            return False
        before = self.fingerprint_of(table)
        return await self._fetch_again() and self.fingerprint_of(table) != before

    async def _fetch_again(self) -> bool:
        """``MetaCache._fetch_again``, awaited."""
        try:
            await self.load(self._clock() + CONFIG_TIMEOUT_S, CONFIG_TIMEOUT_S)
        except RaftletError:
            self._last_load = self._clock()
            return False
        return True

    async def load(self, deadline: float, timeout_s: float) -> ClusterView:
        """Fetch the cluster config (``MetaCache.config_addresses``' order), retrying until
        ``deadline``; raises ``Timeout`` if none answers."""

        refusals = ConfigFetchRefusals()

        async def attempt(_n: int, attempt_timeout: float) -> ClusterView:
            end = self._clock() + attempt_timeout
            last: RpcFailure | None = None
            addresses = self.config_addresses()
            refusals.new_round(len(addresses))
            for addr in addresses:
                left = end - self._clock()
                if left <= 0:
                    break
                try:
                    pb = await self._stubs.stub(addr).get_cluster_config(
                        min(left, self._rpc_timeout_s, CONFIG_TIMEOUT_S)
                    )
                except grpc.RpcError as e:
                    last = classify(e, address=addr)
                    if refusals.final(last):
                        # Not retried until the deadline (30 s of "invalid bearer token").
                        raise fatal_error(last, "fetching the cluster config") from None
                    continue
                self._stats.config_fetch()
                return self.install(pb)
            raise RetriableFailure(
                last or RpcFailure(Cause.UNAVAILABLE, Action.NEXT_REPLICA, "", "no seed address")
            )

        if not self.seeds:
            raise InvalidArgument("a client needs at least one server address")
        return await run_with_retries_async(
            attempt,
            what=f"fetching the cluster config from {', '.join(self.seeds)}",
            deadline=deadline,
            timeout_s=timeout_s,
            clock=self._clock,
            sleep=self._sleep,
            on_retry=lambda f: self._stats.retry(f.cause),
        )

    async def list_tablets(
        self,
        timeout: float,
        enough: Callable[[Answers], bool] | None = None,
        nearly: Callable[[Answers], bool] | None = None,
    ) -> Answers:
        """``MetaCache.list_tablets``, awaited."""

        async def one(uuid: str, address: str) -> tablet_pb2.ListTabletsResponse | RpcFailure:
            try:
                return await self._stubs.stub(address).list_tablets(timeout)
            except grpc.RpcError as e:
                return classify(e, uuid, address)

        calls = {
            asyncio.ensure_future(one(s.uuid, s.rpc_addr)): s.uuid
            for s in self.view.servers.values()
        }
        out: Answers = {}
        pending = set(calls)
        loop = asyncio.get_running_loop()
        cut_at: float | None = None
        try:
            while pending and not (enough is not None and enough(out)):
                if cut_at is None and nearly is not None and nearly(out):
                    cut_at = loop.time() + STRAGGLER_S
                wait = None if cut_at is None else max(0.0, cut_at - loop.time())
                ended, pending = await asyncio.wait(
                    pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                )
                if not ended:
                    break
                # Every task that ended is read, even after one failed (the client closed
                # under it): asyncio logs each exception never read, thousands at a close
                # with writes in flight (review r30b).
                failed = [e for e in map(_failure, ended) if e is not None]
                if failed:
                    raise failed[0]
                for task in ended:
                    out[calls[task]] = task.result()
        finally:
            # Left to end by their own deadlines, unread: a grpc.aio call cancelled kept its
            # connection open past the client's close from another loop.
            for task in pending:
                self._unread.add(task)
                task.add_done_callback(self._forget)
        return out

    def _forget(self, task: asyncio.Future[tablet_pb2.ListTabletsResponse | RpcFailure]) -> None:
        self._unread.discard(task)
        _failure(task)

    async def refresh_leaders(
        self, deadline: float, *, force: bool = False, tablet_id: str | None = None
    ) -> None:
        """Learn every tablet's leader from the servers' own claims; with ``tablet_id``,
        without waiting for more answers once that tablet's are settled. Returns early —
        keeping what is cached — when another task refreshed within
        ``leader_refresh_interval_s`` or the deadline is too close."""
        left = deadline - self._clock()
        if left <= 0:
            return
        if self._refresh_lock is None:
            self._refresh_lock = asyncio.Lock()
        lock = self._refresh_lock
        try:
            async with asyncio.timeout(left):
                await lock.acquire()
        except TimeoutError:
            return
        try:
            if self.view_outdated():
                await self._fetch_again()
            now = self._clock()
            if not force and now - self._last_refresh < self._refresh_interval_s:
                return
            left = deadline - now
            if left <= 0:
                return
            sent_at = self._clock()
            answers = await self.list_tablets(
                min(left, LIST_TABLETS_TIMEOUT_S, self._rpc_timeout_s),
                None if tablet_id is None else partial(self.leader_settled, tablet_id),
                None if tablet_id is None else partial(self.leader_heard, tablet_id),
            )
            self._stats.leader_refresh()
            self.learn_leaders(answers, sent_at)
            if tablet_id is not None:
                self.unanswered_doubt(tablet_id, answers)
            self._last_refresh = self._clock()
        finally:
            lock.release()


def _failure(task: asyncio.Future[Any]) -> BaseException | None:
    """What ``task``, done, raised (so asyncio counts it as read); None if it returned or
    was cancelled."""
    return None if task.cancelled() else task.exception()
