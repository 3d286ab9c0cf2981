"""Hypothesis fuzzing of the admin service against a real in-process tablet server.

One single-server cluster (one tablet, one replica, so it elects itself and no step-down
can succeed) runs ``TabletServer`` on its own event loop thread, on ports the test picks.
Random SetFlag names and values (unicode, huge strings, NaN, out-of-range numbers), random
LeaderStepDown tablets and targets, random GetFlags lists, random GetConsensusStatus tablets
and random undecodable bytes go through a real gRPC channel. Each answer must be OK or a
client error -- never INTERNAL or UNKNOWN, never a timeout -- and nothing may change except
what a valid request changes (a runtime flag, set to exactly the value sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlet.cli.main import main
from raftlet.client import Client, InvalidArgument
from raftlet.client.channels import channel_options
from raftlet.cluster import ClusterConfig, RaftTimings, ServerConfig, TableConfig
from raftlet.proto import admin_pb2, admin_pb2_grpc, consensus_pb2
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from raftlet.tserver.malformed import MalformedRequestInterceptor
from raftlet.tserver.server import TabletServer
from raftlet.tserver.settings import FLAGS, ServerSettings
from tests.integration.tserver_cluster import free_ports
from tests.waiting import wait_for

RPC_TIMEOUT_S = 10.0  # a call that takes longer than this has hung
CLIENT_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,  # a checksum point not reached in time
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # the step-down rate limit
}
RUNTIME = {s.name: s for s in FLAGS if s.runtime}
NAMES = sorted(s.name for s in FLAGS)
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class InProcessServer:
    """A ``TabletServer`` on an event loop of its own thread."""

    def __init__(self, root: Path) -> None:
        rpc, http = free_ports(2)
        schema = Schema(
            [
                ColumnSchema("key", DataType.INT64, is_key=True),
                ColumnSchema("value", DataType.STRING, nullable=True),
            ]
        )
        config = ClusterConfig(
            name="fuzz",
            servers=(
                ServerConfig(
                    id="ts1",
                    rpc_addr=f"127.0.0.1:{rpc}",
                    http_addr=f"127.0.0.1:{http}",
                    data_dir=root / "ts1",
                ),
            ),
            tables=(TableConfig("kv", schema, 1, 1),),
            raft=RaftTimings(tick_interval_ms=20, election_ticks=10, heartbeat_ticks=1),
        )
        settings = ServerSettings(
            server_id="ts1",
            config=config,
            data_dir=root / "ts1",
            rpc_addr=f"127.0.0.1:{rpc}",
            http_addr=f"127.0.0.1:{http}",
            raft=config.raft,
        )
        self.tablet_id = config.placements()[0].tablet_id
        self.rpc_addr = f"127.0.0.1:{rpc}"
        self.server = TabletServer(settings)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz-server")
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{rpc}", options=channel_options())
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)

    def consensus_state(self) -> consensus_pb2.ConsensusStatePB:
        request = consensus_pb2.GetConsensusStateRequest(tablet_id=self.tablet_id)
        return self.admin.GetConsensusStatus(request, timeout=RPC_TIMEOUT_S).state

    def close(self) -> None:
        self.channel.close()
        asyncio.run_coroutine_threadsafe(self.server.stop(1.0), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


@contextlib.contextmanager
def leading_server(root: Path) -> Iterator[InProcessServer]:
    """An ``InProcessServer`` in ``root`` once it leads its tablet; closed at the end."""
    server = InProcessServer(root)
    try:
        wait_for(lambda: server.consensus_state().leader_uuid == "ts1", what="ts1 leads")
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def ts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    with leading_server(tmp_path_factory.mktemp("admin-fuzz")) as server:
        yield server


def _call(fn: object, request: object) -> grpc.StatusCode:
    """The call's status; anything but OK or a client error fails the test."""
    code, details = grpc.StatusCode.OK, ""
    try:
        fn(request, timeout=RPC_TIMEOUT_S)  # type: ignore[operator]
    except grpc.RpcError as e:
        code, details = e.code(), e.details()  # type: ignore[attr-defined]
    assert code is grpc.StatusCode.OK or code in CLIENT_ERRORS, (code, details)
    return code


def _flags(ts: InProcessServer) -> dict[str, str]:
    return dict(ts.admin.GetFlags(admin_pb2.GetFlagsRequest(), timeout=RPC_TIMEOUT_S).flags)


# Built from a small description, so hypothesis never has to print 100 kB of example.
huge = st.tuples(
    st.sampled_from(["x", "9", "\u00e9", "\U0001f600"]), st.sampled_from([400, 5000, 100_000])
).map(lambda t: t[0] * t[1])
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(min_value=-1, max_value=4e6).map(str),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["nan", "-inf", "1e999", "10000", "10000.0001", "3600000", "-0", " 5 "]),
)
flag_names = st.one_of(
    st.sampled_from(NAMES),
    st.sampled_from(NAMES).map(lambda n: "--" + n.replace("_", "-")),
    st.text(max_size=40),
    huge,
)
flag_values = st.one_of(numbers, st.text(max_size=40), huge)


@FUZZ
@given(name=flag_names, value=flag_values)
def test_set_flag_changes_only_what_a_valid_request_sets(
    ts: InProcessServer, name: str, value: str
) -> None:
    before = _flags(ts)
    code = _call(ts.admin.SetFlag, admin_pb2.SetFlagRequest(name=name, value=value))
    after = _flags(ts)
    key = name.strip().lstrip("-").replace("-", "_")
    if code is grpc.StatusCode.OK:
        spec = RUNTIME[key]  # only a runtime flag can be set
        expected = spec.parse(value)
        assert math.isfinite(expected)
        assert {k: v for k, v in after.items() if k != key} == {
            k: v for k, v in before.items() if k != key
        }
        # Put it back, so a latency drawn here does not slow the next examples.
        ts.admin.SetFlag(
            admin_pb2.SetFlagRequest(name=key, value=before[key]), timeout=RPC_TIMEOUT_S
        )
    else:
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert after == before


@FUZZ
@given(
    tablet=st.one_of(st.just("<the tablet>"), st.text(max_size=40), huge),
    target=st.one_of(st.just(""), st.just("ts1"), st.text(max_size=40), huge),
)
def test_leader_step_down_with_random_tablets_and_targets(
    ts: InProcessServer, tablet: str, target: str
) -> None:
    tablet_id = ts.tablet_id if tablet == "<the tablet>" else tablet
    before = ts.consensus_state()
    code = _call(
        ts.admin.LeaderStepDown,
        admin_pb2.LeaderStepDownRequest(tablet_id=tablet_id, new_leader_uuid=target),
    )
    # One replica: no step-down can succeed, so nothing may move.
    assert code is not grpc.StatusCode.OK
    after = ts.consensus_state()
    assert (after.current_term, after.leader_uuid, after.role) == (
        before.current_term,
        before.leader_uuid,
        before.role,
    )


def test_a_step_down_of_a_group_of_one_fails_at_once_saying_why(
    ts: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """It answered UNAVAILABLE, which clients retry: `raftlet leader-step-down` of a
    one-replica tablet retried for its whole --timeout, then failed as a timeout."""
    request = admin_pb2.LeaderStepDownRequest(tablet_id=ts.tablet_id)
    with pytest.raises(grpc.RpcError) as refused:
        ts.admin.LeaderStepDown(request, timeout=RPC_TIMEOUT_S)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "no follower to hand leadership to" in refused.value.details()  # type: ignore[attr-defined]
    with (
        Client([ts.rpc_addr], timeout_s=RPC_TIMEOUT_S) as client,
        pytest.raises(InvalidArgument, match=r"no other voter, so no follower to hand leadership"),
    ):
        client.leader_step_down(ts.tablet_id)
    argv = ["leader-step-down", ts.tablet_id, "--servers", ts.rpc_addr, "--timeout", "30"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "no follower to hand leadership to" in err
    assert "timed out" not in err, err
    assert "attempts" not in err, err


def test_the_threaded_clients_calls_check_their_timeouts(ts: InProcessServer) -> None:
    """A NaN deadline made a step-down raise a bare ValueError from deep in the meta cache,
    and a timeout of 0 made list_tablets answer {} -- as if every server were down."""
    with Client([ts.rpc_addr], timeout_s=RPC_TIMEOUT_S) as client:
        for bad in (float("nan"), -1, 0):
            with pytest.raises(InvalidArgument, match="timeout_s must be positive seconds"):
                client.leader_step_down(ts.tablet_id, timeout_s=bad)
            with pytest.raises(InvalidArgument, match="timeout_s must be positive seconds"):
                client.list_tablets(timeout_s=bad)
            with pytest.raises(InvalidArgument, match="timeout_s must be positive seconds"):
                client.checksum(ts.tablet_id, timeout_s=bad)
        assert set(client.list_tablets()) == {"ts1"}


@FUZZ
@given(names=st.lists(flag_names, max_size=20))
def test_get_flags_with_random_names(ts: InProcessServer, names: list[str]) -> None:
    before = _flags(ts)
    code = _call(ts.admin.GetFlags, admin_pb2.GetFlagsRequest(names=names))
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT)
    assert _flags(ts) == before


@FUZZ
@given(tablet=st.one_of(st.just("<the tablet>"), st.text(max_size=40), huge))
def test_get_consensus_status_with_random_tablets(ts: InProcessServer, tablet: str) -> None:
    tablet_id = ts.tablet_id if tablet == "<the tablet>" else tablet
    code = _call(
        ts.admin.GetConsensusStatus, consensus_pb2.GetConsensusStateRequest(tablet_id=tablet_id)
    )
    assert code in (
        grpc.StatusCode.OK,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
    )


@FUZZ
@given(
    tablet=st.one_of(st.just("<the tablet>"), st.text(max_size=40), huge),
    index=st.one_of(
        st.just(0), st.integers(1, 10**6), st.sampled_from([2**63 - 1, 2**63, 2**64 - 1])
    ),
    # Short waits only: an index ahead of the log waits that long before UNAVAILABLE.
    timeout_ms=st.sampled_from([1, 50, 60_001, 2**32 - 1]),
)
def test_checksum_tablet_with_random_tablets_indexes_and_waits(
    ts: InProcessServer, tablet: str, index: int, timeout_ms: int
) -> None:
    tablet_id = ts.tablet_id if tablet == "<the tablet>" else tablet
    before = ts.consensus_state()
    request = admin_pb2.ChecksumTabletRequest(
        tablet_id=tablet_id, index=index, timeout_ms=timeout_ms
    )
    code = _call(ts.admin.ChecksumTablet, request)
    if timeout_ms > 60_000 or index >= 2**63 or tablet_id != ts.tablet_id:
        assert code is not grpc.StatusCode.OK
    after = ts.consensus_state()
    assert (after.current_term, after.leader_uuid) == (before.current_term, before.leader_uuid)


@FUZZ
@given(
    method=st.sampled_from(["LeaderStepDown", "GetConsensusStatus", "GetFlags", "SetFlag"]),
    payload=st.binary(max_size=200),
)
def test_undecodable_admin_requests_are_invalid_argument(
    ts: InProcessServer, method: str, payload: bytes
) -> None:
    before = _flags(ts)
    call = ts.channel.unary_unary(
        f"/raftlet.AdminService/{method}",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    _call(call, payload)  # many random bytes decode as some valid request: any client error
    if method == "SetFlag":
        return  # a payload may decode as a valid SetFlag; the test above covers its effect
    assert _flags(ts) == before


def test_undecodable_requests_are_counted_as_the_methods_failures(ts: InProcessServer) -> None:
    """Review r34b: 100 undecodable Write and Scan calls left no log line and no count."""
    failed = ts.server.pools["tablet"].metrics.failed_for
    counted = failed("Write", "INVALID_ARGUMENT", "INVALID_ARGUMENT")
    before = counted.value()
    write = ts.channel.unary_unary(
        "/raftlet.TabletService/Write",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    for _ in range(3):
        assert _call(write, b"\xff\xff\xff") is grpc.StatusCode.INVALID_ARGUMENT
    assert counted.value() == before + 3


def test_an_undecodable_request_is_logged_with_its_caller_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="raftlet.tserver.malformed")
    methods: list[str] = []
    interceptor = MalformedRequestInterceptor(methods.append)
    reason = "/raftlet.TabletService/Write: request does not decode (DecodeError)"
    for _ in range(3):
        interceptor._refused("/raftlet.TabletService/Write", reason, "ipv4:127.0.0.1:5")
    assert methods == ["/raftlet.TabletService/Write"] * 3
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(
        f"refused a request from ipv4:127.0.0.1:5 that does not decode: {reason}"
    )
