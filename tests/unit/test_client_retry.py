"""Retry classification and the deadline-bounded retry loop of the client, without servers.

The classification is checked against the server's own status table (``status_for`` in
tserver/rpc_dispatch.py); the loop is driven by a fake clock whose sleeps only
advance time, so the backoff and the deadline are checked exactly and instantly.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from raftlet.client.errors import (
    ClientClosed,
    InvalidArgument,
    MessageTooLarge,
    NotLeader,
    RaftletError,
    RemoteError,
    ServerTooBusy,
    Timeout,
)
from raftlet.client.retry import (
    _RETRIABLE,
    DEFAULT_POLICIES,
    MIN_ATTEMPT_S,
    Action,
    Cause,
    RetriableFailure,
    RpcFailure,
    classify,
    classify_error_pb,
    credentials_refused,
    fatal_error,
    refused_before_log,
    run_with_retries,
    run_with_retries_async,
    timeout_error,
    within,
)
from raftlet.client.rpc import call_tablet
from raftlet.client.write_batch import write_failure
from raftlet.proto import tablet_pb2
from raftlet.proto.common_pb2 import ServerErrorPB
from tests.unit.client_fakes import (
    FakeClock,
    FakeCluster,
    FakeRpcError,
    make_rpc,
    not_leader,
    queue_full,
    stream_refused,
)

REPO = Path(__file__).resolve().parents[2]
S = grpc.StatusCode
E = ServerErrorPB


@pytest.mark.parametrize(
    ("status", "code", "cause", "action"),
    [
        (S.RESOURCE_EXHAUSTED, E.SERVICE_QUEUE_FULL, Cause.RESOURCE_EXHAUSTED, Action.BACKOFF_SAME),
        (S.UNAVAILABLE, E.LEADER_NOT_READY, Cause.LEADER_NOT_READY, Action.BACKOFF_SAME),
        (S.FAILED_PRECONDITION, E.NOT_LEADER, Cause.NOT_LEADER, Action.FIND_LEADER),
        (S.FAILED_PRECONDITION, E.TERM_MOVED, Cause.NOT_LEADER, Action.FIND_LEADER),
        (S.UNAVAILABLE, None, Cause.UNAVAILABLE, Action.NEXT_REPLICA),
        # The leader stepped down with the write in flight: look for the next one.
        (S.UNAVAILABLE, E.LEADERSHIP_LOST, Cause.LEADERSHIP_LOST, Action.FIND_LEADER),
        (S.UNAVAILABLE, E.TABLET_NOT_RUNNING, Cause.TABLET_NOT_RUNNING, Action.NEXT_REPLICA),
        (S.DEADLINE_EXCEEDED, None, Cause.DEADLINE_EXCEEDED, Action.NEXT_REPLICA),
        # A server shutting down cancels the calls it took in but had not started.
        (S.CANCELLED, None, Cause.UNAVAILABLE, Action.NEXT_REPLICA),
        (S.NOT_FOUND, E.TABLET_NOT_FOUND, Cause.TABLET_NOT_FOUND, Action.NEXT_REPLICA),
        (S.INVALID_ARGUMENT, E.INVALID_ARGUMENT, Cause.INVALID_ARGUMENT, Action.FAIL),
        (S.FAILED_PRECONDITION, E.STALE_REQUEST, Cause.STALE_REQUEST, Action.FAIL),
        (S.INTERNAL, None, Cause.REMOTE_ERROR, Action.FAIL),
        (S.PERMISSION_DENIED, None, Cause.PERMISSION_DENIED, Action.FAIL),
        (S.UNAUTHENTICATED, None, Cause.UNAUTHENTICATED, Action.FAIL),
        # FAILED_PRECONDITION without a NOT_LEADER code is not a leadership problem.
        (S.FAILED_PRECONDITION, None, Cause.REMOTE_ERROR, Action.FAIL),
    ],
)
def test_classify_every_status_the_server_sends(
    status: grpc.StatusCode, code: int | None, cause: Cause, action: Action
) -> None:
    error = None if code is None else ServerErrorPB(code=code, message="why")  # type: ignore[arg-type]
    failure = classify(FakeRpcError(status, "details", error), "ts1", "h:1")
    assert (failure.cause, failure.action) == (cause, action)
    assert failure.status == status.name
    assert failure.server == "ts1"
    assert str(failure) == f"{cause} from ts1 (h:1): details"


def test_classify_reads_the_leader_hint_from_the_trailer() -> None:
    failure = classify(not_leader("ts3"), "ts1")
    assert failure.leader_uuid == "ts3"
    assert failure.cause is Cause.NOT_LEADER


def test_classify_survives_a_garbled_trailer() -> None:
    err = FakeRpcError(S.RESOURCE_EXHAUSTED, "service queue full")
    err.raw_trailer = b"\xff\xff\xff not a proto"
    failure = classify(err)
    assert failure.cause is Cause.RESOURCE_EXHAUSTED


def test_errors_inside_ok_responses_classify_like_statuses() -> None:
    f = classify_error_pb(ServerErrorPB(code=E.NOT_LEADER, leader_uuid="ts2"), "ts1")
    assert (f.cause, f.action, f.leader_uuid) == (Cause.NOT_LEADER, Action.FIND_LEADER, "ts2")
    f = classify_error_pb(ServerErrorPB(code=E.SERVICE_QUEUE_FULL))
    assert f.cause is Cause.RESOURCE_EXHAUSTED


def test_fatal_errors_are_typed() -> None:
    invalid = classify(FakeRpcError(S.INVALID_ARGUMENT, "bad", None))
    assert isinstance(fatal_error(invalid, "write"), InvalidArgument)
    internal = classify(FakeRpcError(S.INTERNAL, "boom", None))
    err = fatal_error(internal, "write")
    assert isinstance(err, RemoteError)
    assert err.cause == "REMOTE_ERROR"
    assert str(err) == "write failed: REMOTE_ERROR: boom"


_NO_CONNECTION = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:39593: "
    "Failed to connect to remote host: Connection refused"
)
_CLOSED_AT_HANDSHAKE = (
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:35447: "
    "Socket closed"
)


@pytest.mark.parametrize(
    ("details", "never_sent"),
    [
        (_NO_CONNECTION, True),
        (_CLOSED_AT_HANDSHAKE, True),
        ("DNS resolution failed for nosuchhost:7051: C-ares status is not ARES_SUCCESS", True),
        # Broken after the call may have gone out: its fate is unknown.
        ("Socket closed", False),
        ("Connection reset by peer", False),
        ("write stream ended: UNAVAILABLE: Socket closed", False),
        (f"write stream ended: UNAVAILABLE: {_NO_CONNECTION}", True),
    ],
)
def test_a_call_grpc_could_not_connect_for_was_never_sent(details: str, never_sent: bool) -> None:
    failure = classify(FakeRpcError(S.UNAVAILABLE, details))
    assert failure.cause is Cause.UNAVAILABLE
    assert failure.action is Action.NEXT_REPLICA
    assert refused_before_log(failure) is never_sent


def test_refused_credentials_fail_at_once_and_were_not_applied() -> None:
    for status in (S.PERMISSION_DENIED, S.UNAUTHENTICATED):
        err = fatal_error(classify(FakeRpcError(status, "needs role writer")), "write")
        assert isinstance(err, RemoteError)
        assert (err.cause, err.may_have_applied) == (status.name, False)
    internal = fatal_error(classify(FakeRpcError(S.INTERNAL, "boom")), "write")
    assert internal.may_have_applied is True


def test_a_timeout_of_connections_closed_at_once_says_to_check_tls() -> None:
    closed = classify(FakeRpcError(S.UNAVAILABLE, _CLOSED_AT_HANDSHAKE), "ts1")
    err = timeout_error("fetching the cluster config", 3.0, 9, closed, may_have_applied=False)
    assert "as a TLS server does to a client without TLS" in str(err)
    assert err.attempts == 9
    refused = classify(FakeRpcError(S.UNAVAILABLE, _NO_CONNECTION), "ts1")
    assert "TLS" not in str(timeout_error("write", 3.0, 9, refused, may_have_applied=False))
    lost = classify(FakeRpcError(S.UNAVAILABLE, "Socket closed"), "ts1")
    assert "TLS" not in str(timeout_error("write", 3.0, 9, lost))


# What gRPC says when the client's --tls-ca is another CA than the one that signed the
# server's certificate (review r26v).
_CERTIFICATE_UNVERIFIED = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7050: Ssl "
    "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL "
    "routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED"
)


def test_a_server_certificate_the_client_cannot_verify_sends_the_call_elsewhere() -> None:
    """That server's certificate may have expired while the others' verify: review r27a's
    clients failed at once on the first seed, ts1, though ts2 and ts3 served every tablet.
    (No server's certificate verifying fails a config fetch at once: ``MetaCache.load``.)"""
    failure = classify(FakeRpcError(S.UNAVAILABLE, _CERTIFICATE_UNVERIFIED), "ts1")
    assert (failure.cause, failure.action) == (Cause.CERTIFICATE_UNVERIFIED, Action.NEXT_REPLICA)
    assert not credentials_refused(failure)
    assert refused_before_log(failure)  # the handshake failed: nothing was sent
    err = fatal_error(failure, "fetching the cluster config")
    assert isinstance(err, RemoteError)
    assert (err.cause, err.may_have_applied) == ("CERTIFICATE_UNVERIFIED", False)
    assert "--tls-ca" in str(err)
    assert "\n" not in str(err)
    late = timeout_error("write of 1 row", 3.0, 9, failure, may_have_applied=False)
    assert "could not verify the certificate of ts1 -- expired, or of another CA" in str(late)
    # The leader's certificate, and the followers naming it: the last attempt's NOT_LEADER
    # was all the timeout said (review r27v).
    causes = {Cause.CERTIFICATE_UNVERIFIED: 23, Cause.NOT_LEADER: 23}
    redirected = classify(not_leader("ts1"), "ts2")
    late = timeout_error("write of 1 row", 30.0, 46, redirected, False, causes)
    assert "could not verify a server's certificate -- expired, or of another CA" in str(late)
    # A connection closed by the server (a plaintext client of a TLS server) is still
    # retried: a server restarting does that too.
    closed = classify(FakeRpcError(S.UNAVAILABLE, _CLOSED_AT_HANDSHAKE), "ts1")
    assert (closed.cause, closed.action) == (Cause.UNAVAILABLE, Action.NEXT_REPLICA)


def test_a_write_timed_out_before_any_attempt_says_it_was_not_sent() -> None:
    err = write_failure(timeout_error("write of 1 row", 0.01, 0, None, may_have_applied=False))
    assert str(err).endswith("(0 attempts); it was not sent")
    closed = write_failure(ClientClosed("the client is closed", may_have_applied=True))
    assert str(closed) == "the client is closed; its outcome is unknown: it may have been applied"
    assert str(write_failure(ClientClosed("the client is closed"))) == "the client is closed"


def test_every_retriable_cause_has_a_policy() -> None:
    assert set(_RETRIABLE) <= set(DEFAULT_POLICIES)


def _failure(cause: Cause) -> RpcFailure:
    return RpcFailure(cause, Action.BACKOFF_SAME, cause.value, "x", server="ts1")


def _failing(
    clock: FakeClock, fails: list[RpcFailure], result: str = "done", retry_now: bool = False
) -> tuple[list[tuple[int, float, float]], Callable[[int, float], str]]:
    calls: list[tuple[int, float, float]] = []

    def attempt(n: int, timeout: float) -> str:
        calls.append((n, timeout, clock.now))
        if n < len(fails):
            raise RetriableFailure(fails[n], retry_now=retry_now)
        return result

    return calls, attempt


def test_retries_until_success_and_reports_each_retry() -> None:
    clock = FakeClock()
    fails = [_failure(Cause.RESOURCE_EXHAUSTED), _failure(Cause.NOT_LEADER)]
    calls, attempt = _failing(clock, fails)
    seen: list[Cause] = []
    result = run_with_retries(
        attempt,
        what="op",
        deadline=clock.now + 5,
        timeout_s=5,
        attempt_timeout_s=2.0,
        on_retry=lambda f: seen.append(f.cause),
        clock=clock.clock,
        sleep=clock.sleep,
    )
    assert result == "done"
    assert [n for n, _, _ in calls] == [0, 1, 2]
    assert seen == [Cause.RESOURCE_EXHAUSTED, Cause.NOT_LEADER]
    assert all(t == 2.0 for _, t, _ in calls)  # capped by attempt_timeout_s
    assert len(clock.sleeps) == 2


def test_queue_full_backoff_is_jittered_exponential_and_capped() -> None:
    """Full jitter: the n-th wait is uniform in [0, min(0.5, 0.01 * 2**(n-1))]."""
    clock = FakeClock()
    fails = [_failure(Cause.RESOURCE_EXHAUSTED)] * 12
    _, attempt = _failing(clock, fails)
    run_with_retries(
        attempt,
        what="op",
        deadline=clock.now + 100,
        timeout_s=100,
        clock=clock.clock,
        sleep=clock.sleep,
    )
    assert len(clock.sleeps) == 12
    for n, slept in enumerate(clock.sleeps, start=1):
        assert 0 <= slept <= min(0.5, 0.01 * 2 ** (n - 1)) + 1e-9
    # Jittered: not all equal to the bound (the chance that 12 uniform draws all hit the
    # maximum is nil), and the later ones are allowed to be much longer than the first.
    assert len(set(clock.sleeps)) > 1


def test_retry_now_skips_the_backoff() -> None:
    clock = FakeClock()
    calls, attempt = _failing(clock, [_failure(Cause.NOT_LEADER)], retry_now=True)
    run_with_retries(
        attempt,
        what="op",
        deadline=clock.now + 5,
        timeout_s=5,
        clock=clock.clock,
        sleep=clock.sleep,
    )
    assert clock.sleeps == [0.0]
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("cause", "error"),
    [
        (Cause.RESOURCE_EXHAUSTED, ServerTooBusy),
        # The client's own call slots: no server was busy (it never saw the call).
        (Cause.NO_CALL_SLOT, Timeout),
        (Cause.NOT_LEADER, NotLeader),
        (Cause.UNAVAILABLE, Timeout),
        (Cause.DEADLINE_EXCEEDED, Timeout),
    ],
)
def test_deadline_bounds_the_retries_and_names_the_last_cause(
    cause: Cause, error: type[Timeout]
) -> None:
    clock = FakeClock()
    start = clock.now
    calls, attempt = _failing(clock, [_failure(cause)] * 10_000)
    with pytest.raises(error) as info:
        run_with_retries(
            attempt,
            what="write of 1 row to tablet kv-p0",
            deadline=start + 3.0,
            timeout_s=3.0,
            attempt_timeout_s=1.0,
            clock=clock.clock,
            sleep=clock.sleep,
        )
    assert type(info.value) is error
    assert isinstance(info.value, Timeout)  # ServerTooBusy and NotLeader are timeouts too
    # No sleep crosses the deadline, and no attempt starts without time left.
    assert clock.now <= start + 3.0
    assert all(t >= MIN_ATTEMPT_S and at + t <= start + 3.0 + 1e-9 for _, t, at in calls)
    message = str(info.value)
    assert message.startswith("write of 1 row to tablet kv-p0 timed out after 3 s (")
    assert f"last error: {cause} from ts1: x" in message
    assert "\n" not in message
    # Not the leader, and no leader named by anyone: the group elected none.
    assert ("the tablet has no leader" in message) == (cause is Cause.NOT_LEADER)


def test_not_the_leader_with_a_leader_named_is_no_lost_majority() -> None:
    failure = RpcFailure(
        Cause.NOT_LEADER, Action.FIND_LEADER, "x", "x", server="ts1", leader_uuid="ts2"
    )
    assert "no leader" not in str(timeout_error("write", 3.0, 5, failure))


def test_no_time_left_is_a_timeout_without_an_attempt() -> None:
    clock = FakeClock()
    calls, attempt = _failing(clock, [])
    with pytest.raises(Timeout, match=r"\(0 attempts\)"):
        run_with_retries(
            attempt,
            what="op",
            deadline=clock.now - 1,
            timeout_s=1,
            clock=clock.clock,
            sleep=clock.sleep,
        )
    assert calls == []


def test_non_retriable_errors_pass_through_at_once() -> None:
    clock = FakeClock()
    attempts = []

    def attempt(n: int, timeout: float) -> None:
        attempts.append(n)
        raise InvalidArgument("bad request")

    with pytest.raises(InvalidArgument, match="bad request"):
        run_with_retries(attempt, what="op", deadline=clock.now + 5, timeout_s=5, clock=clock.clock)
    assert attempts == [0]


def test_error_hierarchy_and_one_line_messages() -> None:
    for cls in (Timeout, ServerTooBusy, NotLeader, InvalidArgument, RemoteError):
        err = cls("a clear message")
        assert isinstance(err, RaftletError)
        assert str(err) == "a clear message"
    err = ServerTooBusy("busy").for_operation(4, "kv", {"key": 1})
    assert isinstance(err, ServerTooBusy)
    assert (err.row_index, err.table, err.row, str(err)) == (4, "kv", {"key": 1}, "busy")


def test_queue_full_fake_is_classified_as_such() -> None:
    assert classify(queue_full()).cause is Cause.RESOURCE_EXHAUSTED


def test_a_stream_refused_by_http2_is_no_server_failure() -> None:
    failure = classify(stream_refused(), "ts1")
    assert (failure.cause, failure.action) == (Cause.STREAM_REFUSED, Action.BACKOFF_SAME)
    assert refused_before_log(failure)
    # Other stream resets (the server went away mid-call) are still UNAVAILABLE.
    reset = FakeRpcError(S.UNAVAILABLE, "Stream removed (RST_STREAM with error code 2)")
    assert classify(reset).cause is Cause.UNAVAILABLE
    assert classify(FakeRpcError(S.UNAVAILABLE, "Socket closed")).cause is Cause.UNAVAILABLE


def test_the_client_imports_neither_tserver_nor_consensus() -> None:
    """The client speaks only the wire protocol (docs/ARCHITECTURE.md, "Layout")."""
    code = (
        "import sys, raftlet.client, raftlet.client.health, raftlet.client.aio\n"
        "server = ('raftlet.tserver', 'raftlet.consensus')\n"
        "bad = sorted(m for m in sys.modules if m.startswith(server))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == ""


# gRPC's words for a message over a limit, as each side reports them (grpc 1.6x).
_SIZE_ERRORS = [
    ("SERVER: Received message larger than max (5242934 vs. 4194304)", 5242934, 4194304, True),
    ("CLIENT: Sent message larger than max (2097232 vs. 1048576)", 2097232, 1048576, True),
    (
        "Stream removed (CLIENT: Received message larger than max (4194149 vs. 1048576))",
        4194149,
        1048576,
        False,
    ),
    ("SERVER: Sent message larger than max (17825850 vs. 16777216)", 17825850, 16777216, False),
]


@pytest.mark.parametrize(("details", "size", "limit", "request_side"), _SIZE_ERRORS)
def test_a_message_over_the_size_limit_is_not_overload_and_is_not_retried(
    details: str, size: int, limit: int, request_side: bool
) -> None:
    failure = classify(FakeRpcError(S.RESOURCE_EXHAUSTED, details), "ts1")
    assert failure.cause is Cause.MESSAGE_TOO_LARGE
    assert failure.action is Action.FAIL
    err = fatal_error(failure, "scan of tablet kv-p0")
    assert isinstance(err, MessageTooLarge)
    assert isinstance(err, RemoteError)
    assert (err.size, err.limit) == (size, limit)
    assert f"{size} bytes is over the gRPC message limit of {limit} bytes" in str(err)
    assert "--max_message_bytes" in str(err)
    # A request too large never reached a log; a response too large says nothing of it.
    assert err.may_have_applied is not request_side


def test_a_write_larger_than_the_server_replicates_is_a_message_too_large() -> None:
    """Review r30b: a write just over 16 MiB was InvalidArgument from the threaded client
    (the server's own cap) and MessageTooLarge from the asyncio one (gRPC's)."""
    said = (
        "a write of 16780087 bytes exceeds 16777216 bytes, the largest this server replicates "
        "(--max_message_bytes); split it"
    )
    error = ServerErrorPB(code=ServerErrorPB.WRITE_TOO_LARGE, message=said)
    failure = classify(FakeRpcError(S.INVALID_ARGUMENT, said, error), "ts1")
    assert (failure.cause, failure.action) == (Cause.MESSAGE_TOO_LARGE, Action.FAIL)
    err = fatal_error(failure, "write to tablet kv-p0")
    assert isinstance(err, MessageTooLarge)
    assert (err.size, err.limit) == (16780087, 16777216)
    assert "its request of 16780087 bytes is over the largest write the server replicates" in str(
        err
    )
    assert err.may_have_applied is False  # refused before its log


def test_a_full_queue_is_still_overload_whatever_its_words() -> None:
    # The server's own refusal carries its ServerErrorPB: that decides, not the text.
    words = "service queue full (Received message larger than max (1 vs. 0))"
    failure = classify(
        FakeRpcError(S.RESOURCE_EXHAUSTED, words, E(code=E.SERVICE_QUEUE_FULL, message=words))
    )
    assert failure.cause is Cause.RESOURCE_EXHAUSTED
    assert classify(queue_full()).cause is Cause.RESOURCE_EXHAUSTED


def test_a_size_error_ends_the_retries_at_once() -> None:
    clock = FakeClock()
    calls: list[int] = []

    def attempt(n: int, _timeout: float) -> str:
        calls.append(n)
        failure = classify(FakeRpcError(S.RESOURCE_EXHAUSTED, _SIZE_ERRORS[0][0]), "ts1")
        if failure.action is Action.FAIL:
            raise fatal_error(failure, "write")
        raise RetriableFailure(failure)

    with pytest.raises(MessageTooLarge, match="not retried"):
        run_with_retries(
            attempt,
            what="write",
            deadline=clock.now + 5,
            timeout_s=5,
            clock=clock.clock,
            sleep=clock.sleep,
        )
    assert calls == [0]
    assert clock.sleeps == []


def _as_coroutines(
    clock: FakeClock, attempt: Callable[[int, float], str]
) -> tuple[Callable[[int, float], Awaitable[str]], Callable[[float], Awaitable[None]]]:
    """``attempt`` and ``clock.sleep`` for the asyncio driver."""

    async def attempt_async(n: int, timeout: float) -> str:
        return attempt(n, timeout)

    async def sleep_async(seconds: float) -> None:
        clock.sleep(seconds)

    return attempt_async, sleep_async


def test_the_asyncio_driver_retries_and_backs_off_like_the_threaded_one() -> None:
    # The first attempt runs outside tenacity in both drivers; its failure must still count
    # as attempt 1 (the n-th wait's bound depends on n).
    clock = FakeClock()
    fails = [_failure(Cause.RESOURCE_EXHAUSTED)] * 6 + [_failure(Cause.NOT_LEADER)]
    calls, attempt = _failing(clock, fails)
    attempt_async, sleep_async = _as_coroutines(clock, attempt)
    seen: list[Cause] = []
    result = asyncio.run(
        run_with_retries_async(
            attempt_async,
            what="op",
            deadline=clock.now + 100,
            timeout_s=100,
            on_retry=lambda f: seen.append(f.cause),
            clock=clock.clock,
            sleep=sleep_async,
        )
    )
    assert result == "done"
    assert [n for n, _, _ in calls] == list(range(8))
    assert seen == [Cause.RESOURCE_EXHAUSTED] * 6 + [Cause.NOT_LEADER]
    assert len(clock.sleeps) == 7
    assert all(
        0 <= slept <= min(0.5, 0.01 * 2 ** (n - 1)) + 1e-9
        for n, slept in enumerate(clock.sleeps[:6], start=1)
    )


def test_the_asyncio_driver_passes_non_retriable_errors_and_times_out() -> None:
    clock = FakeClock()

    async def fatal(n: int, timeout: float) -> str:
        raise InvalidArgument("no such column")

    with pytest.raises(InvalidArgument):
        asyncio.run(
            run_with_retries_async(
                fatal, what="op", deadline=clock.now + 5, timeout_s=5, clock=clock.clock
            )
        )
    calls, attempt = _failing(clock, [_failure(Cause.UNAVAILABLE)] * 1000)
    attempt_async, sleep_async = _as_coroutines(clock, attempt)
    with pytest.raises(Timeout):
        asyncio.run(
            run_with_retries_async(
                attempt_async,
                what="op",
                deadline=clock.now + 5,
                timeout_s=5,
                clock=clock.clock,
                sleep=sleep_async,
            )
        )
    assert len(calls) > 1


def test_an_attempt_keeps_only_the_time_a_leader_look_up_left_it() -> None:
    # A look-up that takes most of the time left (servers that do not answer ListTablets at
    # once) must not leave the call its whole attempt timeout: a 1 s write had taken 2 s.
    cluster = FakeCluster()
    clock = FakeClock()
    timeouts: list[float] = []

    def slow_list_tablets(_timeout: float) -> Future[Any]:
        clock.now += 0.7 / len(cluster.servers)  # all asked at once: 0.7 s in all
        done: Future[Any] = Future()
        done.set_result(tablet_pb2.ListTabletsResponse())
        return done

    def answer(request: tablet_pb2.WriteRequest) -> tablet_pb2.WriteResponse:
        return tablet_pb2.WriteResponse(op_index=1, op_term=1)

    for server in cluster.servers.values():
        server.list_tablets_future = slow_list_tablets  # type: ignore[method-assign]
        server.script("write", answer)
    rpc = make_rpc(cluster, clock)
    start = clock.now

    def write(stub: Any, timeout: float, _attempt: int) -> tablet_pb2.WriteResponse:
        timeouts.append(timeout)
        return cast(tablet_pb2.WriteResponse, stub.write(tablet_pb2.WriteRequest(), timeout))

    call_tablet(rpc, "kv-p0", write, what="a write", deadline=start + 1.0, timeout_s=1.0)
    assert timeouts == [pytest.approx(0.3)]
    assert within(5.0, start + 1.0, lambda: start + 2.0) == pytest.approx(0.001)


def test_a_timeout_is_named_by_the_cause_most_attempts_failed_with() -> None:
    """The last attempt gets the time that is left, often a sliver: a scan refused as busy
    31 times ended on one DEADLINE_EXCEEDED, and was told to try smaller pages."""
    busy = RpcFailure(Cause.RESOURCE_EXHAUSTED, Action.BACKOFF_SAME, "RESOURCE_EXHAUSTED", "busy")
    late = RpcFailure(Cause.DEADLINE_EXCEEDED, Action.NEXT_REPLICA, "DEADLINE_EXCEEDED", "late")
    causes = {Cause.RESOURCE_EXHAUSTED: 31, Cause.DEADLINE_EXCEEDED: 1}
    err = timeout_error("scan of tablet kv-p0", 8.0, 32, late, causes=causes)
    assert type(err) is ServerTooBusy
    assert "(32 attempts: 31 RESOURCE_EXHAUSTED, 1 DEADLINE_EXCEEDED; last error: " in str(err)
    # One cause: said once, as before.
    one = timeout_error("write", 3.0, 2, busy, causes={Cause.RESOURCE_EXHAUSTED: 2})
    assert "(2 attempts; last error: " in str(one)
    assert type(one) is ServerTooBusy
    # Counted by the retry loop itself.
    clock = FakeClock()
    fails = [_failure(Cause.RESOURCE_EXHAUSTED)] * 3 + [_failure(Cause.DEADLINE_EXCEEDED)] * 10_000
    _, attempt = _failing(clock, fails)
    with pytest.raises(Timeout) as info:
        run_with_retries(
            attempt,
            what="scan",
            deadline=clock.now + 3.0,
            timeout_s=3.0,
            attempt_timeout_s=1.0,
            clock=clock.clock,
            sleep=clock.sleep,
        )
    counted = str(info.value).split("; last error")[0]
    assert "DEADLINE_EXCEEDED, 3 RESOURCE_EXHAUSTED" in counted, counted


def test_only_a_deadline_the_client_says_it_never_sent_counts_as_not_applied() -> None:
    sent = RpcFailure(Cause.DEADLINE_EXCEEDED, Action.NEXT_REPLICA, "DEADLINE_EXCEEDED", "late")
    never = RpcFailure(
        Cause.DEADLINE_EXCEEDED,
        Action.NEXT_REPLICA,
        "DEADLINE_EXCEEDED",
        "the call was never sent: the write port of h:1 was still opening",
    )
    assert not refused_before_log(sent)
    assert refused_before_log(never)
