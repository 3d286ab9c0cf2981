"""Which failures are retried, where, after how long — and the deadline that bounds it all.

Every failed RPC is first *classified* (``classify``) from its gRPC status and the
``ServerErrorPB`` the server put in the ``raftlet-error-bin`` trailer (the server's map is
``tserver.rpc_dispatch.status_for``) into a ``Cause`` and an ``Action``:

=====================  ================================  =================================
cause                  when                              action
=====================  ================================  =================================
RESOURCE_EXHAUSTED     service queue full, the server's  BACKOFF_SAME: same server, backoff
                       write memory limit, or every
                       held-scan place of a replica
NO_CALL_SLOT           RESOURCE_EXHAUSTED "the call was  BACKOFF_SAME: the client's own
                       never sent ...": no slot of the   limit, never sent; its timeout is
                       process's calls to the server     a ``Timeout``, not ServerTooBusy
STREAM_REFUSED         UNAVAILABLE "… RST_STREAM with    BACKOFF_SAME: HTTP/2's REFUSED_STREAM,
                       error code 7": the connection's   sent before the server read anything
                       concurrent-call cap               (``tserver.grpc_limits``)
MESSAGE_TOO_LARGE      RESOURCE_EXHAUSTED "… message     FAIL at once (MessageTooLarge):
                       larger than max (N vs. M)" from   the same message fails again, so it
                       gRPC, either side, either way     is no overload to wait out
LEADER_NOT_READY       leader elected, not yet ready     BACKOFF_SAME
NOT_LEADER             not leader / term moved           FIND_LEADER: the hint, else refresh
LEADERSHIP_LOST        UNAVAILABLE: the leader stepped   FIND_LEADER; its fate unknown (the
                       down with the write in flight     next leader may commit it)
UNAVAILABLE            connection failed, shutting down  NEXT_REPLICA (refused before any log
                                                         when gRPC could not connect at all)
TABLET_NOT_RUNNING     replica failed or bootstrapping   NEXT_REPLICA
DEADLINE_EXCEEDED      one attempt's deadline passed     NEXT_REPLICA for a read; a leader's
                                                         call goes back to it, or looks the
                                                         leader up once it is silent (rpc)
TABLET_NOT_FOUND       the server has no such replica    NEXT_REPLICA (TabletNotFound when
                                                         every replica says so)
SCHEMA_MISMATCH        INVALID_ARGUMENT: made for        FAIL at once (InvalidArgument); the
                       another schema than the tablet's  client fetches the config again
PERMISSION_DENIED,     the server refused the caller:    FAIL at once (RemoteError, refused
UNAUTHENTICATED        a role, a token, a certificate    before any log)
CERTIFICATE_           UNAVAILABLE "…CERTIFICATE_VERIFY  NEXT_REPLICA: that server's certificate
UNVERIFIED             _FAILED": the client cannot       (expired, say) -- the others' may
                       verify the server's certificate   verify; a config fetch no server's
                                                         passes fails at once (the client's CA)
(anything else)        INVALID_ARGUMENT, INTERNAL, …     FAIL at once (InvalidArgument,
                                                         RemoteError)
=====================  ================================  =================================

``run_with_retries`` (``run_with_retries_async`` for coroutines: the same rules, the backoff
awaited) then drives the attempts with tenacity: the wait after a failure comes
from that cause's policy (``DEFAULT_POLICIES``: jittered exponential backoff; full jitter for
RESOURCE_EXHAUSTED so a burst of refused clients spreads out instead of returning together),
cut short so that no sleep runs into the deadline: it ends a *reserve* (``FINAL_ATTEMPT_S``,
at most a quarter of the timeout) before it, for one last attempt. When that attempt fails
too — or whenever less than the reserve is left after a failure — the last failure becomes
``Timeout`` (``ServerTooBusy`` if it was RESOURCE_EXHAUSTED, ``NotLeader`` if NOT_LEADER).
Each attempt gets ``min(time left, attempt_timeout_s)`` as its gRPC timeout, so the whole
operation ends within the deadline plus scheduling noise — possibly up to the reserve
earlier, when the last attempt fails fast.

Where the next attempt goes (the *Action*) is up to the caller (``client.rpc``); this module
only classifies and times. It keeps no state between operations.
"""

from __future__ import annotations

import asyncio
import enum
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import tenacity
from tenacity.wait import wait_base

from raftlet.client.call_slots import NEVER_SENT
from raftlet.client.errors import (
    InvalidArgument,
    MessageTooLarge,
    NotLeader,
    RaftletError,
    RemoteError,
    ServerTooBusy,
    Timeout,
)
from raftlet.proto import ERROR_METADATA_KEY
from raftlet.proto.common_pb2 import ServerErrorPB

__all__ = [
    "CREDENTIALS_REFUSED",
    "DEFAULT_POLICIES",
    "Action",
    "Cause",
    "ConfigFetchRefusals",
    "RetriableFailure",
    "RpcFailure",
    "certificate_unverified",
    "classify",
    "classify_error_pb",
    "classify_status",
    "closed_at_connect",
    "fatal_error",
    "run_with_retries",
    "run_with_retries_async",
    "server_error_of",
    "timeout_error",
    "within",
]

T = TypeVar("T")

# No attempt is started with less time than this left: it could only time out.
MIN_ATTEMPT_S = 0.002
# A backoff that would run into the deadline is cut short so that this much time (at most a
# quarter of the operation's timeout) is left for one last attempt.
FINAL_ATTEMPT_S = 0.05


class Cause(enum.StrEnum):
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    NO_CALL_SLOT = "NO_CALL_SLOT"
    STREAM_REFUSED = "STREAM_REFUSED"
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
    LEADER_NOT_READY = "LEADER_NOT_READY"
    NOT_LEADER = "NOT_LEADER"
    LEADERSHIP_LOST = "LEADERSHIP_LOST"
    UNAVAILABLE = "UNAVAILABLE"
    TABLET_NOT_RUNNING = "TABLET_NOT_RUNNING"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    TABLET_NOT_FOUND = "TABLET_NOT_FOUND"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    STALE_REQUEST = "STALE_REQUEST"
    SCHEMA_MISMATCH = "SCHEMA_MISMATCH"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    CERTIFICATE_UNVERIFIED = "CERTIFICATE_UNVERIFIED"
    REMOTE_ERROR = "REMOTE_ERROR"


class Action(enum.Enum):
    BACKOFF_SAME = "same server after a backoff"
    FIND_LEADER = "the hinted leader, else look the leader up"
    NEXT_REPLICA = "the next replica"
    FAIL = "fail at once"


# Failures that say the attempt was refused before its request could reach a log: they
# leave the operation "definitely not applied" (client.errors: may_have_applied).
_REFUSED = frozenset(
    {
        Cause.RESOURCE_EXHAUSTED,
        Cause.NO_CALL_SLOT,
        Cause.STREAM_REFUSED,
        Cause.LEADER_NOT_READY,
        Cause.NOT_LEADER,
        Cause.TABLET_NOT_FOUND,
        Cause.INVALID_ARGUMENT,
        Cause.STALE_REQUEST,
        Cause.SCHEMA_MISMATCH,
        # Refused by the server's interceptors, before any handler.
        Cause.PERMISSION_DENIED,
        Cause.UNAUTHENTICATED,
        # The TLS handshake failed: no call was sent.
        Cause.CERTIFICATE_UNVERIFIED,
    }
)

_RETRIABLE: dict[Cause, Action] = {
    Cause.RESOURCE_EXHAUSTED: Action.BACKOFF_SAME,
    Cause.NO_CALL_SLOT: Action.BACKOFF_SAME,
    Cause.STREAM_REFUSED: Action.BACKOFF_SAME,
    Cause.LEADER_NOT_READY: Action.BACKOFF_SAME,
    Cause.NOT_LEADER: Action.FIND_LEADER,
    # Not NEXT_REPLICA, as a plain UNAVAILABLE: that marked a healthy server down.
    Cause.LEADERSHIP_LOST: Action.FIND_LEADER,
    Cause.UNAVAILABLE: Action.NEXT_REPLICA,
    Cause.TABLET_NOT_RUNNING: Action.NEXT_REPLICA,
    Cause.DEADLINE_EXCEEDED: Action.NEXT_REPLICA,
    Cause.TABLET_NOT_FOUND: Action.NEXT_REPLICA,
    # That server's certificate (expired, say): the others' may verify. A config fetch that
    # no server's certificate passes fails at once (``MetaCache.load``): then it is the
    # client's CA.
    Cause.CERTIFICATE_UNVERIFIED: Action.NEXT_REPLICA,
}


# gRPC's own words when a message breaks a max_{send,receive}_message_length, on whichever
# side noticed ("CLIENT: " or "SERVER: " before them): (size vs. limit).
_TOO_LARGE = re.compile(r"\b(Sent|Received) message larger than max \((\d+) vs\. (\d+)\)")
# gRPC's words for a stream the server reset with HTTP/2's REFUSED_STREAM (code 7): over
# the connection's concurrent-stream cap, refused before the server read a byte of it.
_REFUSED_STREAM = re.compile(r"\bRST_STREAM with error code 7\b")
# gRPC's words for a call it failed at once because no connection to the server could be
# made (its load balancer had no connected transport to pick): the call was never sent.
_NEVER_CONNECTED = re.compile(r"\bfailed to connect to all addresses\b|\bDNS resolution failed\b")
# A connection closed at once by the server, or a failed handshake: what a TLS server does
# to a plaintext client, or to a certificate (or none) it does not accept.
_CLOSED_AT_CONNECT = re.compile(r"Socket closed|[Hh]andshake failed|CERTIFICATE_VERIFY_FAILED")
# OpenSSL's words when this client could not verify the server's certificate (signed by
# another CA than the client's --tls-ca, expired): no retry to that server changes that.
_CERTIFICATE_UNVERIFIED = re.compile(r"\bCERTIFICATE_VERIFY_FAILED\b")


def certificate_unverified(details: str) -> bool:
    """Whether ``details`` (a failed call's) say the client could not verify the server's
    certificate."""
    return _CERTIFICATE_UNVERIFIED.search(details) is not None


def too_large(details: str) -> tuple[str, int, int] | None:
    """``("Sent"|"Received", size, limit)`` if ``details`` is gRPC's message-size error."""
    m = _TOO_LARGE.search(details)
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


# A server's refusal of a write larger than it replicates (``WRITE_TOO_LARGE``).
_WRITE_TOO_LARGE = re.compile(r"\ba write of (\d+) bytes exceeds (\d+) bytes\b")


def classify_status(
    code: grpc.StatusCode, error: ServerErrorPB | None, details: str = ""
) -> tuple[Cause, Action]:
    """The cause and remedy of a call that failed with ``code``, the server's ``error`` and
    ``details`` (which tell a message over the size limit from a full queue)."""
    S = grpc.StatusCode
    E = ServerErrorPB
    ecode = error.code if error is not None else E.UNKNOWN
    if code == S.RESOURCE_EXHAUSTED and error is None and too_large(details):
        cause = Cause.MESSAGE_TOO_LARGE
    elif code == S.RESOURCE_EXHAUSTED and error is None and details.startswith(NEVER_SENT):
        cause = Cause.NO_CALL_SLOT
    elif code == S.RESOURCE_EXHAUSTED:
        cause = Cause.RESOURCE_EXHAUSTED
    elif code == S.UNAVAILABLE:
        if ecode == E.LEADER_NOT_READY:
            cause = Cause.LEADER_NOT_READY
        elif ecode == E.LEADERSHIP_LOST:
            cause = Cause.LEADERSHIP_LOST
        elif ecode == E.TABLET_NOT_RUNNING:
            cause = Cause.TABLET_NOT_RUNNING
        elif error is None and _REFUSED_STREAM.search(details):
            cause = Cause.STREAM_REFUSED
        elif error is None and certificate_unverified(details):
            # Retried as UNAVAILABLE, a membership command said "timed out after 30 s (36
            # attempts ...)" where every other command failed at once.
            cause = Cause.CERTIFICATE_UNVERIFIED
        else:
            cause = Cause.UNAVAILABLE
    elif code == S.FAILED_PRECONDITION and ecode in (E.NOT_LEADER, E.TERM_MOVED):
        cause = Cause.NOT_LEADER
    elif code == S.FAILED_PRECONDITION and ecode == E.STALE_REQUEST:
        cause = Cause.STALE_REQUEST
    elif code == S.DEADLINE_EXCEEDED:
        cause = Cause.DEADLINE_EXCEEDED
    elif code == S.CANCELLED:
        # Not this client's doing (its own deadlines are DEADLINE_EXCEEDED): a server that
        # shuts down cancels the calls it took in but had not started -- the server went
        # away, as UNAVAILABLE says. The next attempt reuses the request id, so a write
        # still applies once; a client closed meanwhile fails it as ClientClosed.
        cause = Cause.UNAVAILABLE
    elif code == S.NOT_FOUND:
        cause = Cause.TABLET_NOT_FOUND
    elif code == S.INVALID_ARGUMENT and ecode == E.SCHEMA_MISMATCH:
        cause = Cause.SCHEMA_MISMATCH
    elif code == S.INVALID_ARGUMENT and ecode == E.WRITE_TOO_LARGE:
        # The server's own cap on what it replicates: the same failure as a request over
        # gRPC's limit (the asyncio client's write stream meets that one first).
        cause = Cause.MESSAGE_TOO_LARGE
    elif code == S.INVALID_ARGUMENT:
        cause = Cause.INVALID_ARGUMENT
    elif code == S.PERMISSION_DENIED:
        cause = Cause.PERMISSION_DENIED
    elif code == S.UNAUTHENTICATED:
        cause = Cause.UNAUTHENTICATED
    else:
        cause = Cause.REMOTE_ERROR
    return cause, _RETRIABLE.get(cause, Action.FAIL)


@dataclass(frozen=True)
class RpcFailure:
    """One failed attempt, classified. ``server`` is the uuid (or address) it went to."""

    cause: Cause
    action: Action
    status: str
    message: str
    server: str = ""
    address: str = ""
    leader_uuid: str = ""
    leader_addr: str = ""

    def __str__(self) -> str:
        where = ""
        if self.server:
            addr = f" ({self.address})" if self.address and self.address != self.server else ""
            where = f" from {self.server}{addr}"
        elif self.address:
            where = f" from {self.address}"
        return f"{self.cause}{where}: {self.message}"


def refused_before_log(failure: RpcFailure) -> bool:
    """Whether ``failure`` says its attempt cannot have reached a replica's log."""
    if failure.cause is Cause.MESSAGE_TOO_LARGE:
        # The request itself was too large: the client could not send it, or the server
        # did not take it in. (A response too large says nothing of the request's fate.)
        return _request_too_large(failure.message)
    if failure.cause is Cause.UNAVAILABLE:
        # Only gRPC's own "could not connect": a connection that broke after the call went
        # out leaves its fate unknown.
        return _NEVER_CONNECTED.search(failure.message) is not None
    if failure.cause is Cause.DEADLINE_EXCEEDED:
        # Only the client's own word that it never sent it (the asyncio client's write
        # port still opening when the attempt's time ran out).
        return failure.message.startswith(NEVER_SENT)
    return failure.cause in _REFUSED


def _request_too_large(details: str) -> bool:
    return (
        "CLIENT: Sent message" in details
        or "SERVER: Received message" in details
        or _WRITE_TOO_LARGE.search(details) is not None
    )


def server_error_of(err: grpc.RpcError) -> ServerErrorPB | None:
    """The ``ServerErrorPB`` a server attached to a failed call, if any."""
    try:
        metadata = err.trailing_metadata() or ()
    except Exception:  # not a call object (e.g. a channel-level failure)
        return None
    for key, value in metadata:
        if key == ERROR_METADATA_KEY:
            try:
                return ServerErrorPB.FromString(value)
            except Exception:  # a garbled trailer must not hide the status itself
                return None
    return None


def classify(err: grpc.RpcError, server: str = "", address: str = "") -> RpcFailure:
    code = _call(err, "code")
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    details = _call(err, "details")
    error = server_error_of(err)
    cause, action = classify_status(code, error, str(details or ""))
    message = str(details) if details else (error.message if error is not None else code.name)
    return RpcFailure(
        cause=cause,
        action=action,
        status=code.name,
        message=message,
        server=server,
        address=address,
        leader_uuid=error.leader_uuid if error is not None else "",
        leader_addr=error.leader_addr if error is not None else "",
    )


_STATUS_OF_ERROR = {
    ServerErrorPB.NOT_LEADER: grpc.StatusCode.FAILED_PRECONDITION,
    ServerErrorPB.TERM_MOVED: grpc.StatusCode.FAILED_PRECONDITION,
    ServerErrorPB.STALE_REQUEST: grpc.StatusCode.FAILED_PRECONDITION,
    ServerErrorPB.LEADER_NOT_READY: grpc.StatusCode.UNAVAILABLE,
    ServerErrorPB.LEADERSHIP_LOST: grpc.StatusCode.UNAVAILABLE,
    ServerErrorPB.TABLET_NOT_RUNNING: grpc.StatusCode.UNAVAILABLE,
    ServerErrorPB.TABLET_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ServerErrorPB.SERVICE_QUEUE_FULL: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ServerErrorPB.MEMORY_LIMIT: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ServerErrorPB.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ServerErrorPB.WRONG_SERVER_UUID: grpc.StatusCode.INVALID_ARGUMENT,
    ServerErrorPB.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
}


def classify_error_pb(error: ServerErrorPB, server: str = "", address: str = "") -> RpcFailure:
    """Classify an error a server reported inside an OK response (the ``error`` field)."""
    code = _STATUS_OF_ERROR.get(error.code, grpc.StatusCode.UNKNOWN)
    cause, action = classify_status(code, error)
    return RpcFailure(
        cause=cause,
        action=action,
        status=ServerErrorPB.Code.Name(error.code),
        message=error.message or ServerErrorPB.Code.Name(error.code),
        server=server,
        address=address,
        leader_uuid=error.leader_uuid,
        leader_addr=error.leader_addr,
    )


def _call(err: grpc.RpcError, name: str) -> object:
    fn = getattr(err, name, None)
    if not callable(fn):
        return None
    try:
        return fn()
    except Exception:
        return None


# The statuses of a server refusing the caller itself (a bad token, a certificate without a
# role that may ask): every server of a cluster would, so no other is worth trying.
CREDENTIALS_REFUSED = frozenset(
    {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
)


def credentials_refused(failure: RpcFailure) -> bool:
    """Whether ``failure`` is the server refusing the caller itself (``CREDENTIALS_REFUSED``):
    every server takes the same tokens and CA, so no other server differs. (A server
    certificate the caller cannot verify may be that server's alone: one that expired.)"""
    return failure.status in {code.name for code in CREDENTIALS_REFUSED}


class ConfigFetchRefusals:
    """The failures of a config fetch, round by round (a round asks every server it knows
    once): whether the last one is an answer no retry changes. So it is when a server
    refuses the caller itself (``credentials_refused``); when no server's certificate
    verifies (the client's CA is not the cluster's -- one server's alone may have expired);
    and when every server closed the connection at the handshake in two rounds running (a
    client certificate of another CA was retried for 30 s; one round is not enough, as a
    server that stops closes connections too)."""

    def __init__(self) -> None:
        self._failures: list[RpcFailure] = []
        self._servers = 0
        self._closed_before = False

    def new_round(self, servers: int) -> None:
        self._failures = []
        self._servers = servers

    def final(self, failure: RpcFailure) -> bool:
        self._failures.append(failure)
        if credentials_refused(failure):
            return True
        if len(self._failures) < self._servers:
            return False
        if all(f.cause is Cause.CERTIFICATE_UNVERIFIED for f in self._failures):
            return True
        closed = all(_closed_at_connect(f) for f in self._failures)
        closed_twice, self._closed_before = closed and self._closed_before, closed
        return closed_twice


def fatal_error(failure: RpcFailure, what: str) -> RaftletError:
    """The exception for a failure that is not retried."""
    text = f"{what} failed: {failure}"
    if failure.cause is Cause.INVALID_ARGUMENT:
        return InvalidArgument(text)
    if failure.cause is Cause.SCHEMA_MISMATCH:
        return InvalidArgument(text, cause=str(failure.cause))
    if failure.cause is Cause.MESSAGE_TOO_LARGE:
        return _message_too_large(failure, what)
    if failure.cause is Cause.CERTIFICATE_UNVERIFIED:
        text += (
            " -- this client could not verify the server's certificate: is its CA (--tls-ca) "
            "the cluster's, and the certificate not expired?"
        )
    elif _closed_at_connect(failure):
        text += f" -- {_CLOSED_HINT}"
    return RemoteError(
        text, cause=str(failure.cause), may_have_applied=not refused_before_log(failure)
    )


def _message_too_large(failure: RpcFailure, what: str) -> MessageTooLarge:
    found = too_large(failure.message)
    _, size, limit = found if found else ("", 0, 0)
    request = _request_too_large(failure.message)
    which = "request" if request else "response"
    kind = "gRPC message limit"
    if (refused := _WRITE_TOO_LARGE.search(failure.message)) is not None:
        size, limit = int(refused.group(1)), int(refused.group(2))
        kind = "largest write the server replicates"
    text = (
        f"{what} failed: its {which} of {size} bytes is over the {kind} of "
        f"{limit} bytes (the server's --max_message_bytes, or the client channel's "
        f"max_message_bytes); not retried, the same message fails again "
        f"[{failure.status}{' from ' + failure.server if failure.server else ''}: "
        f"{failure.message}]"
    )
    return MessageTooLarge(text, size=size, limit=limit, may_have_applied=not request)


class RetriableFailure(Exception):
    """Raised by an attempt to ask for another one. ``retry_now`` skips the backoff (set when
    the next attempt goes to a server this operation has not yet heard from)."""

    def __init__(self, failure: RpcFailure, *, retry_now: bool = False) -> None:
        super().__init__(str(failure))
        self.failure = failure
        self.retry_now = retry_now


# Per-cause waits: tenacity strategies, called with the retry state (attempt_number counts
# every attempt of the operation, whatever its cause).
DEFAULT_POLICIES: Mapping[Cause, wait_base] = {
    # Full jitter: refused clients must not come back in lockstep.
    Cause.RESOURCE_EXHAUSTED: tenacity.wait_random_exponential(multiplier=0.01, max=0.5),
    # A call of this process's to the server ends soon (it waited for one already).
    Cause.NO_CALL_SLOT: tenacity.wait_random_exponential(multiplier=0.002, max=0.1),
    # The connection is at its cap for a moment only: a call of its own ends soon.
    Cause.STREAM_REFUSED: tenacity.wait_random_exponential(multiplier=0.002, max=0.1),
    Cause.LEADER_NOT_READY: tenacity.wait_exponential_jitter(multiplier=0.01, max=0.5, jitter=0.01),
    # An election takes one election timeout or two; poll for its result politely.
    Cause.NOT_LEADER: tenacity.wait_exponential_jitter(multiplier=0.01, max=0.5, jitter=0.02),
    Cause.LEADERSHIP_LOST: tenacity.wait_exponential_jitter(multiplier=0.01, max=0.5, jitter=0.02),
    Cause.UNAVAILABLE: tenacity.wait_exponential_jitter(multiplier=0.02, max=1.0, jitter=0.02),
    Cause.CERTIFICATE_UNVERIFIED: tenacity.wait_exponential_jitter(
        multiplier=0.02, max=1.0, jitter=0.02
    ),
    Cause.TABLET_NOT_RUNNING: tenacity.wait_exponential_jitter(
        multiplier=0.02, max=1.0, jitter=0.02
    ),
    Cause.DEADLINE_EXCEEDED: tenacity.wait_exponential_jitter(
        multiplier=0.02, max=1.0, jitter=0.02
    ),
    Cause.TABLET_NOT_FOUND: tenacity.wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.05),
}
_FALLBACK_WAIT = tenacity.wait_exponential_jitter(multiplier=0.02, max=1.0, jitter=0.02)


def timeout_error(
    what: str,
    timeout_s: float,
    attempts: int,
    last: RpcFailure | None,
    may_have_applied: bool = True,
    causes: Mapping[Cause, int] | None = None,
) -> Timeout:
    """The ``Timeout`` for a passed deadline, a subclass named by the cause most attempts
    failed with (``causes``, counted; else the last failure's); ``may_have_applied`` False
    only when every attempt was refused before any log."""
    tail = f"; last error: {last}" if last is not None else ""
    counted = ""
    if causes and len(causes) > 1:
        # The last attempt gets what time is left, often a sliver: its cause alone told a
        # scan refused 31 times as busy to try smaller pages.
        by_count = sorted(causes.items(), key=lambda kv: -kv[1])
        counted = ": " + ", ".join(f"{n} {cause}" for cause, n in by_count)
    text = (
        f"{what} timed out after {timeout_s:.3g} s "
        f"({attempts} attempt{'s' if attempts != 1 else ''}{counted}{tail})"
    )
    named = last.cause if last is not None else None
    if causes:
        top = max(causes.values())
        if named is None or causes.get(named, 0) < top:
            named = next(cause for cause, n in causes.items() if n == top)
    if last is not None and last.cause is Cause.NOT_LEADER and not last.leader_uuid:
        # The retries ran out with no replica knowing a leader: no election could be won.
        text += (
            ": the tablet has no leader, as when fewer than a majority of its replicas run "
            "(`raftlet cluster status` says which)"
        )
    if last is not None and last.cause is Cause.CERTIFICATE_UNVERIFIED:
        whose = f"the certificate of {last.server or last.address}"
    elif causes and Cause.CERTIFICATE_UNVERIFIED in causes:
        # The leader's, most likely: the others answer NOT_LEADER naming it (a review's
        # timeout named only that, and the expired certificate went unsaid).
        whose = "a server's certificate"
    else:
        whose = ""
    if whose:
        text += (
            f": this client could not verify {whose} -- expired, or of another CA than "
            "--tls-ca? (`raftlet cluster status` says)"
        )
    if last is not None and _closed_at_connect(last):
        # Retried to the deadline, it read like an outage (a reviewer's plaintext client
        # of a TLS cluster waited 30 s for "Socket closed").
        text += f": {_CLOSED_HINT}"
    error: Timeout
    if named in (Cause.RESOURCE_EXHAUSTED, Cause.STREAM_REFUSED):
        # Named by its own cause: a refused stream counted as RESOURCE_EXHAUSTED sent a
        # reviewer looking for a queue or memory overload that no server counter showed.
        error = ServerTooBusy(text, cause=named.value, may_have_applied=may_have_applied)
    elif named is Cause.NOT_LEADER:
        error = NotLeader(text, may_have_applied=may_have_applied)
    else:
        error = Timeout(text, may_have_applied=may_have_applied)
    error.attempts = attempts
    return error


_CLOSED_HINT = (
    "the server closed each connection before any call, as a TLS server does to a client "
    "without TLS, or with a certificate (or token port) it does not accept: check the "
    "client's CA, certificate and token"
)


def _closed_at_connect(failure: RpcFailure) -> bool:
    return failure.cause is Cause.UNAVAILABLE and closed_at_connect(failure.message)


def closed_at_connect(details: str) -> bool:
    """Whether ``details`` (of an UNAVAILABLE call) say the server closed the connection
    before any call: a TLS server refusing the client's handshake, not a server down."""
    return (
        _NEVER_CONNECTED.search(details) is not None
        and _CLOSED_AT_CONNECT.search(details) is not None
    )


def _failure_of(state: tenacity.RetryCallState) -> RetriableFailure | None:
    outcome = state.outcome
    if outcome is None or not outcome.failed:
        return None
    exc = outcome.exception()
    return exc if isinstance(exc, RetriableFailure) else None


def _reserve(timeout_s: float) -> float:
    return max(2 * MIN_ATTEMPT_S, min(FINAL_ATTEMPT_S, timeout_s / 4))


class _DeadlineStop(tenacity.stop.stop_base):
    """Stop once less than the final attempt's reserve is left: the attempt that just
    failed was the last one that fitted."""

    def __init__(self, deadline: float, reserve: float, clock: Callable[[], float]) -> None:
        self.deadline = deadline
        self.reserve = reserve
        self.clock = clock

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.deadline - self.clock() <= self.reserve


class _PerCauseWait(wait_base):
    def __init__(
        self,
        policies: Mapping[Cause, wait_base],
        deadline: float,
        reserve: float,
        clock: Callable[[], float],
    ) -> None:
        self.policies = policies
        self.deadline = deadline
        self.reserve = reserve
        self.clock = clock

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        failure = _failure_of(retry_state)
        if failure is None or failure.retry_now:
            wait = 0.0
        else:
            wait = float(self.policies.get(failure.failure.cause, _FALLBACK_WAIT)(retry_state))
        # Never sleep into the deadline: wake up with the reserve left for one last attempt.
        left = self.deadline - self.clock() - self.reserve
        return max(0.0, min(wait, left))


_LEAST_CALL_TIMEOUT_S = 0.001


class _RetryRun:
    """The bookkeeping of one operation's retries, shared by the threaded and the asyncio
    drivers: counting attempts, each attempt's timeout, the last failure, and tenacity's
    stop/wait/retry/before_sleep."""

    def __init__(
        self,
        *,
        what: str,
        deadline: float,
        timeout_s: float,
        attempt_timeout_s: float | None,
        policies: Mapping[Cause, wait_base],
        on_retry: Callable[[RpcFailure], None] | None,
        clock: Callable[[], float],
    ) -> None:
        self.what = what
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.attempt_timeout_s = attempt_timeout_s
        self.policies = policies
        self.on_retry = on_retry
        self.clock = clock
        self.attempts = 0
        self.last: RpcFailure | None = None
        self.causes: dict[Cause, int] = {}  # failed attempts by cause, in order first seen
        self.reserve = _reserve(timeout_s)
        # Some attempt's fate is unknown: it may be in a log (see client.errors).
        self.may_have_applied = False

    def next_attempt(self) -> tuple[int, float]:
        """``(attempt_no, attempt timeout)`` of the attempt about to start, or raises
        ``_DeadlinePassed`` when too little time is left to start one."""
        left = self.deadline - self.clock()
        if left < MIN_ATTEMPT_S:
            raise _DeadlinePassed()
        attempt_timeout = (
            left if self.attempt_timeout_s is None else min(left, self.attempt_timeout_s)
        )
        n = self.attempts
        self.attempts += 1
        return n, attempt_timeout

    def _failed(self, failure: RpcFailure) -> None:
        self.last = failure
        self.causes[failure.cause] = self.causes.get(failure.cause, 0) + 1
        if not refused_before_log(failure):
            self.may_have_applied = True

    def before_sleep(self, state: tenacity.RetryCallState) -> None:
        failure = _failure_of(state)
        if failure is not None:
            self._failed(failure.failure)
            if self.on_retry is not None:
                self.on_retry(failure.failure)

    def tenacity_kwargs(self) -> dict[str, Any]:
        return {
            "stop": _DeadlineStop(self.deadline, self.reserve, self.clock),
            "wait": _PerCauseWait(self.policies, self.deadline, self.reserve, self.clock),
            "retry": tenacity.retry_if_exception_type(RetriableFailure),
            "before_sleep": self.before_sleep,
            "reraise": False,
        }

    def timeout(self, gave_up: tenacity.RetryError | None) -> Timeout:
        if gave_up is not None:
            failure = gave_up.last_attempt.exception()
            if isinstance(failure, RetriableFailure):
                self._failed(failure.failure)
        return timeout_error(
            self.what,
            self.timeout_s,
            self.attempts,
            self.last,
            self.may_have_applied,
            self.causes,
        )

    def final(self, error: RaftletError) -> None:
        """Mark a non-retriable ``error`` that ends the run indeterminate if an earlier
        attempt's fate is unknown."""
        if self.may_have_applied:
            error.may_have_applied = True


def within(attempt_timeout: float, deadline: float, clock: Callable[[], float]) -> float:
    """``attempt_timeout``, cut to what is left before ``deadline`` once an attempt has
    done its own preparation (a leader look-up); a call given almost nothing fails at once
    with DEADLINE_EXCEEDED, and the retry loop then ends at its deadline."""
    return max(min(attempt_timeout, deadline - clock()), _LEAST_CALL_TIMEOUT_S)


def run_with_retries(
    attempt: Callable[[int, float], T],
    *,
    what: str,
    deadline: float,
    timeout_s: float,
    attempt_timeout_s: float | None = None,
    policies: Mapping[Cause, wait_base] = DEFAULT_POLICIES,
    on_retry: Callable[[RpcFailure], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``attempt(attempt_no, attempt_timeout_s)`` until it returns, raises something
    other than ``RetriableFailure``, or ``deadline`` (``clock()`` time) passes — then raise
    ``timeout_error``. ``attempt_no`` counts from 0. ``on_retry`` sees each failure that is
    about to be retried (for statistics). ``timeout_s`` is only for the message."""
    run = _RetryRun(
        what=what,
        deadline=deadline,
        timeout_s=timeout_s,
        attempt_timeout_s=attempt_timeout_s,
        policies=policies,
        on_retry=on_retry,
        clock=clock,
    )

    # The first attempt runs outside tenacity, which costs more than a write's own client
    # work; a retriable failure is then replayed as tenacity's first attempt, so the waits,
    # stops and counts are what they would have been.
    replay: list[RetriableFailure] = []

    def one() -> T:
        if replay:
            raise replay.pop()
        return attempt(*run.next_attempt())

    gave_up: tenacity.RetryError | None = None
    try:
        try:
            return one()
        except RetriableFailure as e:
            replay.append(e)
        return tenacity.Retrying(sleep=sleep, **run.tenacity_kwargs())(one)
    except tenacity.RetryError as e:
        gave_up = e
    except _DeadlinePassed:
        pass
    except RaftletError as e:
        run.final(e)
        raise
    raise run.timeout(gave_up)


async def run_with_retries_async(
    attempt: Callable[[int, float], Awaitable[T]],
    *,
    what: str,
    deadline: float,
    timeout_s: float,
    attempt_timeout_s: float | None = None,
    policies: Mapping[Cause, wait_base] = DEFAULT_POLICIES,
    on_retry: Callable[[RpcFailure], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """``run_with_retries`` for a coroutine ``attempt``: the same deadline, reserve, per-cause
    waits and errors, with the backoff awaited (``sleep``) instead of blocking a thread."""
    run = _RetryRun(
        what=what,
        deadline=deadline,
        timeout_s=timeout_s,
        attempt_timeout_s=attempt_timeout_s,
        policies=policies,
        on_retry=on_retry,
        clock=clock,
    )

    # As in run_with_retries: the first attempt outside tenacity, a failure replayed into it.
    replay: list[RetriableFailure] = []

    async def one() -> T:
        if replay:
            raise replay.pop()
        return await attempt(*run.next_attempt())

    gave_up: tenacity.RetryError | None = None
    try:
        try:
            return await one()
        except RetriableFailure as e:
            replay.append(e)
        result: T = await tenacity.AsyncRetrying(sleep=sleep, **run.tenacity_kwargs())(one)
        return result
    except tenacity.RetryError as e:
        gave_up = e
    except _DeadlinePassed:
        pass
    except RaftletError as e:
        run.final(e)
        raise
    raise run.timeout(gave_up)


class _DeadlinePassed(Exception):
    """The deadline passed before an attempt could start (ends the retries, not retried)."""
