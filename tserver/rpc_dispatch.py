"""The glue between grpc.aio handlers and service pools, and the one error → status map.

A servicer method on the event loop (the reactor) does nothing but

    return await dispatch(pool, "Write", context, lambda call: replica.write(request, call))

`dispatch` offers the call to the service's pool (never blocking: a full queue is answered
RESOURCE_EXHAUSTED at once), then awaits a future that the call's completion resolves — from
a service thread, or much later from a tablet's apply thread — through
`loop.call_soon_threadsafe`, because an asyncio future may only be touched on its loop.
Errors become gRPC statuses only here, in `status_for`, so every service answers the same
situation with the same status and `ServerErrorPB`.

Nothing here may block: it all runs on the event loop, which serves every RPC of the server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn

import grpc

from raftlet.consensus.core import (
    ConfigChangeDeferred,
    ConfigChangeRefused,
    NotLeaderError,
    ProposalDropped,
    TermMismatch,
)
from raftlet.consensus.raft_consensus import LeaderNotReady, ReplicaFailed
from raftlet.consensus.rpc.codec import MalformedRequest, WrongServerUuid
from raftlet.proto import ERROR_METADATA_KEY
from raftlet.proto.common_pb2 import ServerErrorPB
from raftlet.tserver.errors import (
    CopySessionNotFound,
    DeadlineExceeded,
    DeadlineExceededInQueue,
    FilesNotRemovable,
    InvalidRequest,
    LeadershipLost,
    ReplicaBusy,
    SchemaMismatch,
    ServiceUnavailable,
    StaleRequest,
    TabletFailed,
    UnknownTablet,
    WriteTooLarge,
)
from raftlet.tserver.security import SenderMismatch
from raftlet.tserver.service_pool import InboundCall, ServicePool
from raftlet.tserver.write_memory import MemoryLimitExceeded

__all__ = [
    "MAX_MESSAGE_BYTES",
    "LeaderAddrLookup",
    "abort_with",
    "bounded_message",
    "dispatch",
    "error_name",
    "status_for",
]

logger = logging.getLogger(__name__)

# Maps a server uuid to its RPC address ("host:port"), or "" if unknown. Called on the event
# loop, so it must be a cheap in-memory lookup (the cluster config), never I/O.
LeaderAddrLookup = Callable[[str], str]

QUEUE_FULL_MESSAGE = "service queue full"
SHUTTING_DOWN_MESSAGE = "server shutting down"


async def dispatch(
    pool: ServicePool,
    method: str,
    context: grpc.aio.ServicerContext,
    run: Callable[[InboundCall], None],
    *,
    leader_addr_lookup: LeaderAddrLookup | None = None,
) -> object:
    """Run `run` on a thread of `pool` and return what it responds with.

    Aborts the RPC (the awaiting coroutine raises grpc's abort exception) with
    RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE when the pool is stopping, and the
    status `status_for` picks when the call fails.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[object] = loop.create_future()

    def on_result(result: object) -> None:
        _post(loop, _resolve, fut, result)

    def on_error(exc: BaseException) -> None:
        _post(loop, _reject, fut, exc)

    # gRPC gives the time left, the pool compares against its monotonic clock.
    remaining = context.time_remaining()
    deadline = None if remaining is None else time.monotonic() + remaining
    call = InboundCall(method, run, deadline=deadline, on_result=on_result, on_error=on_error)
    if not pool.offer(call):
        if pool.stopped:
            pool.metrics.failed_for(method, "UNAVAILABLE").increment()
            await abort_with(context, grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN_MESSAGE, None)
        pool.metrics.failed_for(method, "RESOURCE_EXHAUSTED", "SERVICE_QUEUE_FULL").increment()
        await abort_with(
            context,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            QUEUE_FULL_MESSAGE,
            ServerErrorPB(code=ServerErrorPB.SERVICE_QUEUE_FULL, message=QUEUE_FULL_MESSAGE),
        )
    try:
        # If the client cancels or its deadline passes, gRPC cancels this coroutine and with
        # it the future; the call still completes on its thread, and `_resolve`/`_reject`
        # then find the future done and drop the answer nobody waits for.
        return await fut
    except Exception as exc:
        code, message, error = status_for(exc, leader_addr_lookup)
        pool.metrics.failed_for(method, code.name, error_name(error)).increment()
        await abort_with(context, code, message, error)


async def abort_with(
    context: grpc.aio.ServicerContext,
    code: grpc.StatusCode,
    message: str,
    error: ServerErrorPB | None,
) -> NoReturn:
    """Fail the RPC with `code`, carrying `error` serialized in the trailing metadata."""
    trailing: tuple[tuple[str, bytes], ...] = ()
    if error is not None:
        trailing = ((ERROR_METADATA_KEY, error.SerializeToString()),)
    await context.abort(code, message, trailing)
    raise AssertionError("ServicerContext.abort returned")  # it always raises


# The longest message (UTF-8 bytes) a status carries.  It travels twice in the call's
# trailers -- percent-encoded in grpc-message, up to 3 bytes a byte, and in the ServerErrorPB
# -- and a client drops the call as RESOURCE_EXHAUSTED past 16 KiB of metadata: an error
# quoting a client's 20,000-character column name once did that, hiding INVALID_ARGUMENT.
MAX_MESSAGE_BYTES = 1024


def bounded_message(msg: str) -> str:
    """``msg``, cut to ``MAX_MESSAGE_BYTES`` (saying how long it was) when longer."""
    raw = msg.encode("utf-8", "replace")
    if len(raw) <= MAX_MESSAGE_BYTES:
        return msg
    head = raw[: MAX_MESSAGE_BYTES - 64].decode("utf-8", "ignore")
    return f"{head}... (cut: the message was {len(raw)} bytes)"


def status_for(
    exc: BaseException, leader_addr_lookup: LeaderAddrLookup | None = None
) -> tuple[grpc.StatusCode, str, ServerErrorPB | None]:
    """The gRPC status, details and structured error a client sees for `exc`.

    Order matters: the consensus errors are all ProposalDropped subclasses, so the specific
    ones are matched first.
    """
    S = grpc.StatusCode
    E = ServerErrorPB
    msg = bounded_message(str(exc) or type(exc).__name__)
    if isinstance(exc, SenderMismatch):
        # A peer's certificate and its request disagree about who sends it: a forgery. The
        # error carries the code too, for answers that have no gRPC status of their own (a
        # consensus stream's or tcp port's ``failed`` item).
        return S.PERMISSION_DENIED, msg, E(code=E.PERMISSION_DENIED, message=msg)
    if isinstance(exc, FilesNotRemovable):
        # The server answered and the operator must act: not UNAVAILABLE, which is what a
        # server that is down gives, and which membership commands ride over.
        return S.FAILED_PRECONDITION, msg, None
    if isinstance(exc, DeadlineExceededInQueue | DeadlineExceeded):
        return S.DEADLINE_EXCEEDED, msg, None
    if isinstance(exc, MemoryLimitExceeded):
        return S.RESOURCE_EXHAUSTED, msg, E(code=E.MEMORY_LIMIT, message=msg)
    if isinstance(exc, ReplicaBusy):
        return S.RESOURCE_EXHAUSTED, msg, None
    if isinstance(exc, TabletFailed):
        return S.UNAVAILABLE, msg, E(code=E.TABLET_NOT_RUNNING, message=msg)
    if isinstance(exc, LeadershipLost):
        hint = _with_leader(E.LEADERSHIP_LOST, msg, exc.leader_id, leader_addr_lookup)
        return S.UNAVAILABLE, msg, hint
    if isinstance(exc, ServiceUnavailable):
        return S.UNAVAILABLE, msg, None
    if isinstance(exc, UnknownTablet):
        return S.NOT_FOUND, msg, E(code=E.TABLET_NOT_FOUND, message=msg)
    if isinstance(exc, CopySessionNotFound):
        return S.NOT_FOUND, f"no tablet copy session {msg}", None
    if isinstance(exc, SchemaMismatch):
        return S.INVALID_ARGUMENT, msg, E(code=E.SCHEMA_MISMATCH, message=msg)
    if isinstance(exc, WriteTooLarge):
        return S.INVALID_ARGUMENT, msg, E(code=E.WRITE_TOO_LARGE, message=msg)
    if isinstance(exc, InvalidRequest | MalformedRequest):
        # A consensus request addressed to another server says so, so the caller knows its
        # address book is stale rather than its request malformed.
        wrong = isinstance(exc.__cause__, WrongServerUuid)
        code = E.WRONG_SERVER_UUID if wrong else E.INVALID_ARGUMENT
        return S.INVALID_ARGUMENT, msg, E(code=code, message=msg)
    if isinstance(exc, StaleRequest):
        return S.FAILED_PRECONDITION, msg, E(code=E.STALE_REQUEST, message=msg)
    if isinstance(exc, NotLeaderError | TermMismatch):
        # A moved term means the same to a client as "not leader": find the leader again.
        # Both carry the leader this replica believes in, so the client can skip a lookup.
        hint = _with_leader(E.NOT_LEADER, msg, exc.leader_id, leader_addr_lookup)
        return S.FAILED_PRECONDITION, msg, hint
    if isinstance(exc, ConfigChangeDeferred):
        # In a moment it will take it (a transfer ends, the no-op commits): retried on the
        # same server, as a leader not ready yet is.
        return S.UNAVAILABLE, msg, E(code=E.LEADER_NOT_READY, message=msg)
    if isinstance(exc, ConfigChangeRefused):
        # Not retried by the client: the operator (or the CLI) decides what to do about it.
        return S.FAILED_PRECONDITION, msg, E(code=E.UNKNOWN, message=msg)
    if isinstance(exc, LeaderNotReady):
        # Retriable on the same server: it is the leader, just not ready for writes yet.
        return S.UNAVAILABLE, msg, E(code=E.LEADER_NOT_READY, message=msg)
    if isinstance(exc, ReplicaFailed):
        return S.UNAVAILABLE, msg, E(code=E.TABLET_NOT_RUNNING, message=msg)
    if isinstance(exc, ProposalDropped):
        # Only the core's own refusals are left: it is handing leadership over, or has not
        # committed an entry of its term -- what LeaderNotReady says when the lock-free check
        # sees it first. Unlabelled, a write caught by a leader change counted as an error.
        return S.UNAVAILABLE, msg, E(code=E.LEADER_NOT_READY, message=msg)
    # A bug or an unexpected failure: the traceback goes to the log, not to the client.
    logger.error("internal error answering an RPC", exc_info=(type(exc), exc, exc.__traceback__))
    return S.INTERNAL, f"internal server error ({type(exc).__name__})", None


def error_name(error: ServerErrorPB | None) -> str:
    """The ``error`` label of ``rpcs_failed`` for an answer carrying ``error``: its code's
    name, "" when it carries none."""
    return "" if error is None else ServerErrorPB.Code.Name(error.code)


def _with_leader(
    code: ServerErrorPB.Code,
    message: str,
    leader_uuid: str,
    lookup: LeaderAddrLookup | None,
) -> ServerErrorPB:
    """An error naming the leader this replica believes in, and its address if known."""
    return ServerErrorPB(
        code=code,
        message=message,
        leader_uuid=leader_uuid,
        leader_addr=_leader_addr(leader_uuid, lookup),
    )


def _leader_addr(leader_uuid: str, lookup: LeaderAddrLookup | None) -> str:
    if not leader_uuid or lookup is None:
        return ""
    try:
        return lookup(leader_uuid)
    except Exception:
        # The hint is an optimisation; a broken lookup must not turn NOT_LEADER into INTERNAL.
        logger.warning("leader address lookup failed for %s", leader_uuid, exc_info=True)
        return ""


def _post(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        # The loop is closed (server gone): there is nobody left to answer.
        logger.debug("event loop closed; dropping a completion")


def _resolve(fut: asyncio.Future[object], result: object) -> None:
    if not fut.done():
        fut.set_result(result)


def _reject(fut: asyncio.Future[object], exc: BaseException) -> None:
    if not fut.done():
        if not isinstance(exc, Exception):
            # A KeyboardInterrupt or CancelledError raised out of `await fut` would be taken
            # for the loop's or the task's own; what the handler failed with is just an error.
            wrapped = RuntimeError(f"call failed with {exc!r}")
            wrapped.__cause__ = exc
            exc = wrapped
        fut.set_exception(exc)
