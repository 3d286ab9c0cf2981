"""rpc_dispatch: the error → status map, and dispatch through a real grpc.aio server.

The server is a generic handler with unary-unary bytes methods on 127.0.0.1, port 0; each
method body is one `dispatch` onto a service pool, like a real servicer. Every wait has a
timeout; nothing synchronises by sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import grpc
import pytest

from raftlet.consensus.core import (
    ConfigChangeDeferred,
    ConfigChangeRefused,
    NotLeaderError,
    ProposalDropped,
    TermMismatch,
)
from raftlet.consensus.raft_consensus import LeaderNotReady, ReplicaFailed
from raftlet.consensus.rpc.codec import MalformedRequest
from raftlet.proto import ERROR_METADATA_KEY
from raftlet.proto.common_pb2 import ServerErrorPB
from raftlet.tserver.errors import (
    DeadlineExceeded,
    DeadlineExceededInQueue,
    InvalidRequest,
    LeadershipLost,
    ReplicaBusy,
    ServiceUnavailable,
    StaleRequest,
    UnknownTablet,
)
from raftlet.tserver.rpc_dispatch import dispatch, status_for
from raftlet.tserver.security import SenderMismatch
from raftlet.tserver.service_pool import InboundCall, ServicePool

WAIT = 5.0
SERVICE = "raftlet.test.Svc"
S = grpc.StatusCode
E = ServerErrorPB

LEADERS = {"ts-2": "10.0.0.2:7050"}


def leader_addr(uuid: str) -> str:
    return LEADERS.get(uuid, "")


def run_async(coro: Coroutine[Any, Any, None]) -> None:
    """Each test gets its own loop; the timeout turns a hang into a failure."""

    async def bounded() -> None:
        await asyncio.wait_for(coro, timeout=30)

    asyncio.run(bounded())


# --- status_for ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "code", "error_code"),
    [
        (DeadlineExceededInQueue("tablet", "Write", 0.5), S.DEADLINE_EXCEEDED, None),
        (DeadlineExceeded("tablet kv-p0: the scan page was not done"), S.DEADLINE_EXCEEDED, None),
        (ServiceUnavailable("server shutting down"), S.UNAVAILABLE, None),
        # Its fate unknown, as a server shutting down leaves it, but a leader change.
        (LeadershipLost("stopped leading before it committed"), S.UNAVAILABLE, E.LEADERSHIP_LOST),
        # Retried on the same replica after a backoff: not sent to a follower, nor marked down.
        (ReplicaBusy("tablet kv-p0: 32 scans of it are open"), S.RESOURCE_EXHAUSTED, None),
        (UnknownTablet("t-1"), S.NOT_FOUND, E.TABLET_NOT_FOUND),
        (InvalidRequest("no key column"), S.INVALID_ARGUMENT, E.INVALID_ARGUMENT),
        # A peer's consensus request the codec refuses, as the consensus stream reports it.
        (MalformedRequest("entries not contiguous"), S.INVALID_ARGUMENT, E.INVALID_ARGUMENT),
        (StaleRequest("seq 3 < first incomplete 5"), S.FAILED_PRECONDITION, E.STALE_REQUEST),
        (NotLeaderError("ts-2", 4), S.FAILED_PRECONDITION, E.NOT_LEADER),
        (TermMismatch(4, 5, "ts-2"), S.FAILED_PRECONDITION, E.NOT_LEADER),
        (LeaderNotReady("no-op not committed"), S.UNAVAILABLE, E.LEADER_NOT_READY),
        (ReplicaFailed("log failed"), S.UNAVAILABLE, E.TABLET_NOT_RUNNING),
        # The core's own refusal while it hands leadership over: a leader change, retried.
        (
            ProposalDropped("leadership is being transferred to ts-2"),
            S.UNAVAILABLE,
            E.LEADER_NOT_READY,
        ),
        # Retried on the same leader; another operator's change in progress is not.
        (
            ConfigChangeDeferred("leadership is being transferred"),
            S.UNAVAILABLE,
            E.LEADER_NOT_READY,
        ),
        (ConfigChangeRefused("a change is in progress"), S.FAILED_PRECONDITION, E.UNKNOWN),
        # A forged Raft sender: the code rides in the error too, for a stream's or tcp
        # port's ``failed`` item, which has no gRPC status.
        (SenderMismatch("claims ts1, is ts3"), S.PERMISSION_DENIED, E.PERMISSION_DENIED),
    ],
)
def test_status_for_maps_typed_errors(
    exc: Exception, code: grpc.StatusCode, error_code: int | None
) -> None:
    got_code, message, error = status_for(exc, leader_addr)
    assert got_code == code
    assert message == str(exc)
    if error_code is None:
        assert error is None
    else:
        assert error is not None
        assert error.code == error_code
        assert error.message == str(exc)


def test_not_leader_carries_the_leader_hint() -> None:
    for exc in (NotLeaderError("ts-2", 4), TermMismatch(4, 5, "ts-2")):
        _, _, error = status_for(exc, leader_addr)
        assert error is not None
        assert (error.leader_uuid, error.leader_addr) == ("ts-2", "10.0.0.2:7050")
    # Unknown leader, no lookup, or a failing lookup: still NOT_LEADER, just no address.
    _, _, error = status_for(NotLeaderError("", 4), leader_addr)
    assert error is not None
    assert (error.code, error.leader_uuid, error.leader_addr) == (E.NOT_LEADER, "", "")
    _, _, error = status_for(NotLeaderError("ts-2", 4))
    assert error is not None
    assert (error.leader_uuid, error.leader_addr) == ("ts-2", "")

    def broken(uuid: str) -> str:
        raise KeyError(uuid)

    code, _, error = status_for(NotLeaderError("ts-9", 4), broken)
    assert code == S.FAILED_PRECONDITION
    assert error is not None
    assert (error.leader_uuid, error.leader_addr) == ("ts-9", "")


def test_unexpected_errors_are_internal_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise KeyError("secret-internal-detail")
    except KeyError as exc:
        code, message, error = status_for(exc)
    assert code == S.INTERNAL
    assert message == "internal server error (KeyError)"
    assert "secret" not in message
    assert error is None
    assert "secret-internal-detail" in caplog.text
    assert "Traceback" in caplog.text


# --- a real grpc.aio server ---------------------------------------------------------------

Handler = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]


class SignallingPool(ServicePool):
    """Reports each offer's outcome to the test, so it knows a call is queued or refused.

    offer runs on the event loop, so an asyncio.Queue may be used directly.
    """

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.offers: asyncio.Queue[tuple[str, bool]] = asyncio.Queue()

    def offer(self, call: InboundCall, requests: int = 1) -> bool:
        accepted = super().offer(call)
        self.offers.put_nowait((call.method, accepted))
        return accepted

    async def next_offer(self) -> tuple[str, bool]:
        return await asyncio.wait_for(self.offers.get(), WAIT)


def via(pool: ServicePool, method: str, run: Callable[[InboundCall], None]) -> Handler:
    """A servicer method: all it does on the loop is dispatch to the pool."""

    async def handler(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        result = await dispatch(pool, method, context, run, leader_addr_lookup=leader_addr)
        assert isinstance(result, bytes)
        return result

    return handler


@contextlib.asynccontextmanager
async def serve(handlers: dict[str, Handler]) -> AsyncIterator[grpc.aio.Channel]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE,
                {name: grpc.unary_unary_rpc_method_handler(h) for name, h in handlers.items()},
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop(grace=None)


async def call(channel: grpc.aio.Channel, method: str, timeout: float | None = WAIT) -> bytes:
    result = await channel.unary_unary(f"/{SERVICE}/{method}")(b"req", timeout=timeout)
    assert isinstance(result, bytes)
    return result


async def call_error(
    channel: grpc.aio.Channel, method: str, timeout: float | None = WAIT
) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(channel, method, timeout)
    return info.value


def server_error(err: grpc.aio.AioRpcError) -> ServerErrorPB | None:
    for key, value in err.trailing_metadata() or ():
        if key == ERROR_METADATA_KEY:
            return ServerErrorPB.FromString(value)
    return None


class Blocker:
    """Parks a service thread until released (threading events: it runs off the loop)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, call: InboundCall) -> None:
        self.started.set()
        self.release.wait(WAIT)
        call.respond(b"unblocked")

    async def wait_started(self) -> None:
        # Waited for on a helper thread: blocking the loop here would stall the server too.
        assert await asyncio.to_thread(self.started.wait, WAIT)


def respond(value: bytes) -> Callable[[InboundCall], None]:
    return lambda c: c.respond(value)


@contextlib.contextmanager
def started(*pools: ServicePool) -> Any:
    for p in pools:
        p.start()
    try:
        yield
    finally:
        for p in pools:
            assert p.stop(timeout=WAIT)


def test_full_queue_is_resource_exhausted_with_server_error() -> None:
    async def main() -> None:
        pool = SignallingPool("tablet", num_threads=1, queue_length=1)
        blocker = Blocker()
        handlers = {"Block": via(pool, "Block", blocker), "Echo": via(pool, "Echo", respond(b"e"))}
        with started(pool):
            async with serve(handlers) as ch:
                first = asyncio.create_task(call(ch, "Block"))
                assert await pool.next_offer() == ("Block", True)
                await blocker.wait_started()
                second = asyncio.create_task(call(ch, "Echo"))
                assert await pool.next_offer() == ("Echo", True)  # fills the queue

                err = await call_error(ch, "Echo")
                assert await pool.next_offer() == ("Echo", False)
                assert err.code() == S.RESOURCE_EXHAUSTED
                assert err.details() == "service queue full"
                error = server_error(err)
                assert error is not None
                assert error.code == E.SERVICE_QUEUE_FULL

                blocker.release.set()
                assert await first == b"unblocked"
                assert await second == b"e"
        assert pool.metrics.queue_overflow.value() == 1
        assert pool.metrics.queue_overflow_for("Echo").value() == 1

    run_async(main())


def test_typed_errors_reach_the_client_as_statuses() -> None:
    def not_leader(c: InboundCall) -> None:
        raise NotLeaderError("ts-2", 7)

    def not_found(c: InboundCall) -> None:
        c.fail(UnknownTablet("t-9"))

    def bug(c: InboundCall) -> None:
        raise ZeroDivisionError("oops")

    async def main() -> None:
        pool = ServicePool("tablet", num_threads=2, queue_length=4)
        handlers = {
            "NotLeaderError": via(pool, "NotLeaderError", not_leader),
            "NotFound": via(pool, "NotFound", not_found),
            "Bug": via(pool, "Bug", bug),
        }
        with started(pool):
            async with serve(handlers) as ch:
                err = await call_error(ch, "NotLeaderError")
                assert err.code() == S.FAILED_PRECONDITION
                error = server_error(err)
                assert error is not None
                assert error.code == E.NOT_LEADER
                assert (error.leader_uuid, error.leader_addr) == ("ts-2", "10.0.0.2:7050")

                err = await call_error(ch, "NotFound")
                assert err.code() == S.NOT_FOUND
                error = server_error(err)
                assert error is not None
                assert error.code == E.TABLET_NOT_FOUND

                err = await call_error(ch, "Bug")
                assert err.code() == S.INTERNAL
                assert err.details() == "internal server error (ZeroDivisionError)"
                assert server_error(err) is None

    run_async(main())


def test_deferred_completion_from_another_thread() -> None:
    handed: dict[str, InboundCall] = {}
    both_handed = threading.Barrier(3)  # two handlers and the apply thread

    def hand_over(c: InboundCall) -> None:
        handed[c.method] = c  # like a write: return without completing the call
        both_handed.wait(WAIT)

    def apply_thread() -> None:
        both_handed.wait(WAIT)
        handed["Apply"].respond(b"applied")
        handed["Stale"].fail(StaleRequest("seq 1 < first incomplete 2"))

    applier = threading.Thread(target=apply_thread, name="apply-test")

    async def main() -> None:
        # Two threads, so both handlers can be parked at the barrier at once.
        pool = ServicePool("tablet", num_threads=2, queue_length=2)
        handlers = {"Apply": via(pool, "Apply", hand_over), "Stale": via(pool, "Stale", hand_over)}
        with started(pool):
            async with serve(handlers) as ch:
                applier.start()
                ok = asyncio.create_task(call(ch, "Apply"))
                stale = asyncio.create_task(call_error(ch, "Stale"))
                assert await ok == b"applied"
                err = await stale
                assert err.code() == S.FAILED_PRECONDITION
                error = server_error(err)
                assert error is not None
                assert error.code == E.STALE_REQUEST
        applier.join(WAIT)

    run_async(main())


def test_deadline_reaches_the_call_and_expired_calls_are_dropped_in_queue() -> None:
    seen: dict[str, float | None] = {}
    expired_ran = threading.Event()

    def record(c: InboundCall) -> None:
        seen["remaining" if c.deadline is not None else "none"] = (
            None if c.deadline is None else c.deadline - time.monotonic()
        )
        c.respond(b"ok")

    def must_not_run(c: InboundCall) -> None:
        expired_ran.set()
        c.respond(b"ran")

    async def main() -> None:
        pool = SignallingPool("tablet", num_threads=1, queue_length=4)
        blocker = Blocker()
        handlers = {
            "Block": via(pool, "Block", blocker),
            "Record": via(pool, "Record", record),
            "Expire": via(pool, "Expire", must_not_run),
        }
        with started(pool):
            async with serve(handlers) as ch:
                # The client's timeout becomes the call's monotonic deadline; none, None.
                assert await call(ch, "Record", timeout=30) == b"ok"
                assert await call(ch, "Record", timeout=None) == b"ok"
                await pool.next_offer()
                await pool.next_offer()
                remaining = seen["remaining"]
                assert remaining is not None
                # gRPC converts the timeout to an absolute deadline and back, on clocks that
                # are not ours: allow a little slack above the timeout.
                assert 0 < remaining <= 31
                assert seen["none"] is None

                blocked = asyncio.create_task(call(ch, "Block"))
                await pool.next_offer()
                await blocker.wait_started()
                # Waits behind the blocker until its deadline passes.
                err = await call_error(ch, "Expire", timeout=0.5)
                assert await pool.next_offer() == ("Expire", True)
                assert err.code() == S.DEADLINE_EXCEEDED
                # The server's deadline is the client's plus the call's way there, which a
                # loaded machine makes long: released before it passed, the call ran.
                (queued,) = [c for c in list(pool._queue) if c.method == "Expire"]
                assert queued.deadline is not None
                for _ in range(3000):
                    if time.monotonic() > queued.deadline:
                        break
                    await asyncio.sleep(0.01)
                blocker.release.set()
                assert await blocked == b"unblocked"
                # One worker, FIFO: once this call is answered the expired one was dequeued.
                assert await call(ch, "Record") == b"ok"
        assert not expired_ran.is_set()
        assert pool.metrics.timed_out_in_queue.value() == 1

    run_async(main())


def test_loop_keeps_serving_while_a_handler_blocks() -> None:
    async def main() -> None:
        slow_pool = ServicePool("tablet", num_threads=1, queue_length=2)
        fast_pool = ServicePool("consensus", num_threads=1, queue_length=2)
        blocker = Blocker()
        handlers = {
            "Block": via(slow_pool, "Block", blocker),
            "Ping": via(fast_pool, "Ping", respond(b"pong")),
        }
        with started(slow_pool, fast_pool):
            async with serve(handlers) as ch:
                blocked = asyncio.create_task(call(ch, "Block"))
                await blocker.wait_started()
                # A thread of the slow pool is stuck; the loop must still carry other RPCs.
                for _ in range(3):
                    assert await call(ch, "Ping") == b"pong"
                assert not blocked.done()
                blocker.release.set()
                assert await blocked == b"unblocked"

    run_async(main())


def test_stopped_pool_is_unavailable_not_overflow() -> None:
    async def main() -> None:
        pool = ServicePool("tablet", num_threads=1, queue_length=1)
        pool.start()
        assert pool.stop(timeout=WAIT)
        async with serve({"Echo": via(pool, "Echo", respond(b"e"))}) as ch:
            err = await call_error(ch, "Echo")
        assert err.code() == S.UNAVAILABLE
        assert err.details() == "server shutting down"
        assert pool.metrics.queue_overflow.value() == 0

    run_async(main())


# --- dispatch without a server --------------------------------------------------------------


class Aborted(Exception):
    pass


class FakeContext:
    """The two ServicerContext methods dispatch uses."""

    def __init__(self, remaining: float | None = None) -> None:
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> None:
        raise Aborted(code, details, tuple(trailing_metadata))


def test_completion_after_the_rpc_was_cancelled_is_dropped_quietly() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop_errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, ctx: loop_errors.append(ctx))
        pool = ServicePool("tablet", num_threads=1, queue_length=2)
        blocker = Blocker()
        with started(pool):
            cancelled = asyncio.create_task(dispatch(pool, "Block", FakeContext(), blocker))
            await blocker.wait_started()
            cancelled.cancel()  # what grpc does when the client goes away
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            blocker.release.set()  # the handler now responds to a future nobody awaits
            # FIFO on one worker and on the loop: when this resolves, the dropped completion
            # has been delivered to the loop before it.
            assert await dispatch(pool, "Echo", FakeContext(), respond(b"e")) == b"e"
        assert loop_errors == []

    run_async(main())


def test_failure_with_a_base_exception_is_internal() -> None:
    async def main() -> None:
        pool = ServicePool("tablet", num_threads=1, queue_length=1)
        with started(pool), pytest.raises(Aborted) as info:
            await dispatch(pool, "Odd", FakeContext(), lambda c: c.fail(KeyboardInterrupt()))
        code, details, _ = info.value.args
        assert code == S.INTERNAL
        assert details == "internal server error (RuntimeError)"

    run_async(main())
