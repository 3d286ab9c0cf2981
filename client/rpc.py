"""One tablet RPC, routed to the right replica and retried until its deadline.

``call_tablet`` is how writes, scan pages and admin calls reach a tablet. Each attempt goes
to the server ``Router`` picks (pure, shared with ``aio_rpc``); a failure is classified
(``retry.classify``) and the router reacts by its *action*:

- BACKOFF_SAME (queue full, a stream refused, leader not ready): the same server again,
  after a backoff;
- FIND_LEADER (not leader): the hinted leader when the hint names another replica that is
  not known to be down — at once, the first time this call goes there — otherwise the
  cached leader is forgotten and the next attempt looks it up (``MetaCache.refresh_leaders``)
  or, if no replica claims leadership yet, tries the next replica, after a backoff;
- NEXT_REPLICA (unreachable, timed out, not running, no such replica): the server is marked
  down (for transport failures) and the next replica in ring order is tried — at once if
  this call has not failed there yet, else after a backoff; a server without the replica
  makes the next attempt look the tablet's replicas up again first (they may have moved).
  A leader's call that ran out of time marks nothing down: it goes to the same server again
  after a backoff -- unless that server has been silent for ``SILENCE_S``
  (``MetaState.silent``); then the next attempt at the tablet, of any call, looks the leader
  up first (done once a majority of its replicas answered, ``MetaState.leader_settled``)
  and goes to whichever replica leads, the same one if it still does; a leader in doubt that
  misses the look-up too is marked down, so the others are asked and their NOT_LEADER
  answers name the leader they elect. An attempt still in flight to a leader is cut short
  the same way (``_Watch``): once that server has been silent for ``SILENCE_S`` it looks the
  leader up (the one look-up at a time all threads share), and if another replica leads now
  the attempt is cancelled and retried there at once, as a DEADLINE_EXCEEDED with the same
  request id; if the server still leads, the attempt waits on (slow is not gone). A follower
  read that ran out of time moves on to the next replica, and marks the server down once it
  has been silent for ``SILENCE_S`` (``MetaState.timed_out``);
- FAIL: raised at once as ``InvalidArgument`` / ``RemoteError``.

``leader_only=False`` (follower reads) starts at ``prefer`` — the replica a scan is already
reading — or the leader when known, and fails over between replicas the same way.

The caller's ``call(stub, attempt_timeout_s, attempt_no)`` performs one attempt. A write uses
``attempt_no`` as ``RequestIdPB.attempt_no`` and keeps everything else of its request id, so
whichever server finally applies it, it is applied once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn, TypeVar

import grpc
from tenacity.wait import wait_base

from raftlet.client.channels import (
    ANSWER_WATCH,
    AttemptCutShort,
    CallFuture,
    ServerStub,
    StubProvider,
    wait_for_answer,
)
from raftlet.client.errors import TabletNotFound
from raftlet.client.meta_cache import SILENCE_S, MetaCache, MetaState, TabletInfo
from raftlet.client.retry import (
    DEFAULT_POLICIES,
    Action,
    Cause,
    RetriableFailure,
    RpcFailure,
    classify,
    classify_error_pb,
    fatal_error,
    run_with_retries,
    within,
)
from raftlet.client.stats import StatsRecorder
from raftlet.proto.common_pb2 import ServerErrorPB

__all__ = ["Router", "RpcContext", "call_tablet"]

R = TypeVar("R")

# The least of the time left a follower read's first attempt is cut to.
_LEAST_SHARE_S = 0.05
# How soon an attempt at a silent leader asks again after a look-up that found nobody else
# leading (an election under way): the look-ups of all threads are one per
# ``leader_refresh_interval_s`` anyway.
RECHECK_S = 0.05


@dataclass
class RpcContext:
    """What every tablet RPC of one ``Client`` shares."""

    meta: MetaCache
    stubs: StubProvider
    stats: StatsRecorder
    # The gRPC timeout of one attempt (never more than the time left to the deadline).
    attempt_timeout_s: float = 10.0
    policies: Mapping[Cause, wait_base] = field(default_factory=lambda: dict(DEFAULT_POLICIES))
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    # Waits up to the seconds given for a call in flight to end; whether it has.
    wait: Callable[[CallFuture, float], bool] = wait_for_answer


class Router:
    """Where the attempts of one tablet RPC go, and what a failure changes (pure: the
    leader look-up it may need is the caller's I/O, threaded or asyncio)."""

    def __init__(
        self, meta: MetaState, tablet: TabletInfo, leader_only: bool, prefer: str | None
    ) -> None:
        self.meta = meta
        self.tablet_id = tablet.tablet_id
        self.leader_only = leader_only
        self.next: str | None = prefer if prefer in tablet.replicas else None
        self.last: str | None = None
        self.sent_at = float("-inf")  # when the latest attempt went (``pick``)
        self.failed: set[str] = set()
        self.not_found: set[str] = set()
        # A server said it has no replica: look the replicas up before the next attempt.
        self.relocate = False
        # Every replica said so once: the replicas they were, to compare after a look-up.
        self.gone_from: set[str] | None = None

    @property
    def tablet(self) -> TabletInfo:
        """The tablet as the meta cache knows it now (its replicas move)."""
        return self.meta.tablet(self.tablet_id)

    def target(self, deadline: float) -> str:
        """The next attempt's server, looking the leader up first if needed (blocking)."""
        if self.needs_lookup():
            assert isinstance(self.meta, MetaCache)
            self.meta.refresh_leaders(deadline, tablet_id=self.tablet_id)
        return self.pick()

    def needs_lookup(self) -> bool:
        """True when the next attempt wants a leader nobody is known to be, or the replicas
        may have moved (call ``refresh_leaders`` before ``pick``)."""
        if self.relocate:
            self.relocate = False
            return True
        if self.next is not None or not self.leader_only:
            return False
        leader = self.meta.leader(self.tablet_id)
        return (
            leader is None or self.meta.is_down(leader) or self.meta.leader_in_doubt(self.tablet_id)
        )

    def pick(self) -> str:
        """The next attempt's server: the one a failure chose, else the known leader that is
        not down, else the next replica in ring order. Call it just before the call goes."""
        target = self._choose()
        self.sent_at = self.meta.now()
        return target

    def _choose(self) -> str:
        if self.gone_from is not None:
            # Every replica said it has none, and a look-up followed: unless the tablet
            # moved meanwhile, there is none to find.
            replicas = self.tablet.replicas
            if set(replicas) == self.gone_from:
                raise TabletNotFound(
                    f"no replica of tablet {self.tablet_id} found on {', '.join(replicas)}"
                )
            self.gone_from = None
            self.next = None
        if self.next is not None:
            target, self.next = self.next, None
            return target
        leader = self.meta.leader(self.tablet.tablet_id)
        if leader is not None and not self.meta.is_down(leader):
            return leader
        return self._rotate()

    def _rotate(self) -> str:
        """The replica after the last one tried, in ring order, skipping those known to be
        down unless all are."""
        replicas = list(self.tablet.replicas)
        start = replicas.index(self.last) + 1 if self.last in replicas else 0
        ring = replicas[start:] + replicas[:start]
        up = [r for r in ring if not self.meta.is_down(r)]
        return (up or ring)[0]

    def replaced(self, server: str) -> str | None:
        """The replica a look-up settled as the tablet's leader instead of ``server`` (where
        an attempt is in flight), if any."""
        tid = self.tablet_id
        leader = self.meta.leader(tid)
        if leader is None or leader == server or self.meta.leader_in_doubt(tid):
            return None
        return leader

    def cut_short(self, cut: AttemptCutShort, server: str, address: str) -> NoReturn:
        """An attempt at ``server`` was cancelled for the leader elected in its place: the
        next goes there, at once the first time this call does."""
        failure = classify(cut, server, address)
        self.last = server
        self.failed.add(server)
        self.next = cut.leader
        raise RetriableFailure(failure, retry_now=cut.leader not in self.failed)

    def time_for(self, attempt_timeout: float, left: float) -> float:
        """The gRPC timeout of a follower read's first attempt, given ``attempt_timeout``
        with ``left`` to the deadline: it keeps half for another replica (the first at a
        paused replica had taken all of a scan's time)."""
        if len(self.tablet.replicas) > 1:
            return min(attempt_timeout, max(left / 2, _LEAST_SHARE_S))
        return attempt_timeout

    def succeeded(self, target: str, result: object, address: str, what: str) -> None:
        """Check an answer: returns when it is a success (noting the server up and, for
        leader-only calls, the tablet's leader); raises as ``failed`` when the answer carries
        a ``ServerErrorPB``."""
        error = getattr(result, "error", None)
        if not isinstance(error, ServerErrorPB) or not (error.code or error.message):
            self.meta.mark_up(target)
            if self.leader_only:
                self.meta.set_leader(self.tablet.tablet_id, target)
            return
        self.failed_with(classify_error_pb(error, target, address), what)

    def failed_with(self, failure: RpcFailure, what: str) -> NoReturn:
        """Raise the fatal error, or ``RetriableFailure`` after choosing the next target."""
        if failure.action is Action.FAIL:
            if failure.cause is Cause.SCHEMA_MISMATCH:
                # The table is not what this client took it for: the next look-up of it
                # fetches the config again (``MetaState.table_view_stale``).
                self.meta.mark_stale()
            raise fatal_error(failure, what)
        retry_now = self.on_failure(failure)
        raise RetriableFailure(failure, retry_now=retry_now)

    def on_failure(self, f: RpcFailure) -> bool:
        """React to a failed attempt; True if the next attempt may go without a backoff."""
        server = f.server
        tid = self.tablet.tablet_id
        self.last = server
        if f.action is Action.BACKOFF_SAME:
            self.next = server
            return False
        first_time = server not in self.failed
        self.failed.add(server)
        if f.action is Action.FIND_LEADER:
            self.meta.forget_leader(tid, server)
            hint = f.leader_uuid
            if hint and hint not in self.meta.view.servers:
                # A leader the view does not list: the view is out of date.
                self.meta.leader_unlisted(f.leader_addr)
                self.relocate = True
                return False
            if (
                hint
                and hint != server
                and hint in self.tablet.replicas
                and not self.meta.is_down(hint)
            ):
                self.meta.set_leader(tid, hint)
                self.next = hint
                return hint not in self.failed
            return False
        # NEXT_REPLICA
        if f.cause is Cause.DEADLINE_EXCEEDED and self.leader_only:
            # A busy leader gets the call again after a backoff. Whether a silent one is
            # gone is for its group to say: the next attempt at the tablet, of this call or
            # another, asks who leads (a look-up that ends once a majority answered) and
            # goes back to it if it still does. (Marked down, a busy leader sent every
            # thread of the process to followers whose hints named it, and were ignored as
            # naming a server down.)
            if self.meta.silent(server, self.sent_at):
                self.meta.doubt_leader(tid, server)
                self.relocate = True
            else:
                self.next = server
            return False
        if f.cause is Cause.DEADLINE_EXCEEDED and not self.meta.timed_out(server, self.sent_at):
            # Slow, not gone (``MetaState.timed_out``): this read moves on, the process
            # does not.
            self.next = self._rotate()
            return False
        if f.cause is Cause.UNAVAILABLE:
            self.meta.mark_down(server)
        self.meta.forget_leader(tid, server)
        if f.cause is Cause.TABLET_NOT_FOUND:
            self.not_found.add(server)
            self.relocate = True
            if self.not_found >= set(self.tablet.replicas):
                # Decided after a fresh look-up (``pick``): the replicas may have moved.
                self.gone_from = set(self.tablet.replicas)
                self.not_found.clear()
                return True
        self.next = self._rotate()
        return first_time and self.next not in self.failed


class _Watch:
    """Waits for a leader-only attempt's call (``channels.answer_of``) and cuts it short once
    its server has been silent for ``SILENCE_S`` and a look-up found another replica leading.
    (Calls in flight to a paused leader each waited out their whole 10 s timeout, though a
    new leader was elected 1.5 s after the pause.)"""

    def __init__(self, ctx: RpcContext, router: Router, deadline: float) -> None:
        self.ctx = ctx
        self.router = router
        self.deadline = deadline
        self.target = ""

    def __call__(self, future: CallFuture) -> None:
        ctx, router, target = self.ctx, self.router, self.target
        meta, sent_at = ctx.meta, router.sent_at
        while not future.done():
            quiet = meta.quiet_left(target, sent_at)
            if quiet > 0:
                ctx.wait(future, quiet)
                continue
            # Whether it still leads is for its group to say; a slow leader that still claims
            # the tablet keeps the call (cancelled, it would only be sent again).
            meta.doubt_leader(router.tablet_id, target)
            meta.refresh_leaders(self.deadline, tablet_id=router.tablet_id)
            leader = router.replaced(target)
            if leader is not None and future.cancel():
                raise AttemptCutShort(
                    f"no answer from {target} for {SILENCE_S} s, and {leader} leads the "
                    "tablet now: cut short",
                    leader,
                )
            ctx.wait(future, RECHECK_S)


def call_tablet(
    ctx: RpcContext,
    tablet_id: str,
    call: Callable[[ServerStub, float, int], R],
    *,
    what: str,
    deadline: float,
    timeout_s: float,
    leader_only: bool = True,
    prefer: str | None = None,
) -> tuple[R, str]:
    """Run ``call`` against the right replica of ``tablet_id`` until it succeeds; returns its
    result and the uuid of the server that answered. Raises ``Timeout`` (or a subclass) when
    ``deadline`` passes, ``TabletNotFound``, ``InvalidArgument`` or ``RemoteError``."""
    router = Router(ctx.meta, ctx.meta.tablet(tablet_id), leader_only, prefer)
    watch = _Watch(ctx, router, deadline) if leader_only else None

    def attempt(attempt_no: int, attempt_timeout: float) -> tuple[R, str]:
        target = router.target(deadline)
        # A leader look-up may have taken some of the time left: the call keeps the rest.
        attempt_timeout = within(attempt_timeout, deadline, ctx.clock)
        if attempt_no == 0 and not router.leader_only:
            attempt_timeout = router.time_for(attempt_timeout, deadline - ctx.clock())
        address = ctx.meta.address(target)
        stub = ctx.stubs.stub(address)
        cut: AttemptCutShort | None = None
        if watch is not None:
            watch.target = target
        token = ANSWER_WATCH.set(watch)
        try:
            result = call(stub, attempt_timeout, attempt_no)
        except AttemptCutShort as e:
            cut = e
        except grpc.RpcError as e:
            failure = classify(e, target, address)
        else:
            router.succeeded(target, result, address, what)
            return result, target
        finally:
            ANSWER_WATCH.reset(token)
        if cut is not None:
            router.cut_short(cut, target, address)
        router.failed_with(failure, what)

    return run_with_retries(
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
