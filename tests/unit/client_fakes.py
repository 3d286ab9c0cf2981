"""Fakes for client unit tests: gRPC errors, a scripted cluster of servers, a fake clock.

``FakeCluster`` plays the ``StubProvider`` the client's channels normally are: each fake
server answers each method from a script (a list of responses or exceptions, the last one
repeated), and records a *copy* of every request it received — the client mutates a write
request's ``attempt_no`` between attempts, exactly as what went over the wire would show.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import grpc

from raftlet.client.channels import CallFuture, ResultFuture, answer_of, wait_for_answer
from raftlet.client.meta_cache import MetaCache
from raftlet.client.request_tracker import RequestTracker
from raftlet.client.rpc import RpcContext
from raftlet.client.stats import StatsRecorder
from raftlet.proto import ERROR_METADATA_KEY, admin_pb2, consensus_pb2, tablet_pb2
from raftlet.proto.common_pb2 import ServerErrorPB
from raftlet.schema.row_block import row_width
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType

KV_SCHEMA = Schema(
    [
        ColumnSchema("key", DataType.INT64, is_key=True),
        ColumnSchema("value", DataType.STRING, nullable=True),
    ]
)
SERVERS = ("ts1", "ts2", "ts3")


def addr(uuid: str) -> str:
    return f"{uuid}.fake:7051"


class FakeRpcError(grpc.RpcError):
    def __init__(
        self, code: grpc.StatusCode, details: str = "", error: ServerErrorPB | None = None
    ) -> None:
        super().__init__(details)
        self._code = code
        self._details = details
        self._error = error
        self.raw_trailer: bytes | None = None

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        if self.raw_trailer is not None:
            return ((ERROR_METADATA_KEY, self.raw_trailer),)
        if self._error is None:
            return ()
        return ((ERROR_METADATA_KEY, self._error.SerializeToString()),)


def not_leader(hint: str = "") -> FakeRpcError:
    return FakeRpcError(
        grpc.StatusCode.FAILED_PRECONDITION,
        "not the leader",
        ServerErrorPB(code=ServerErrorPB.NOT_LEADER, message="not the leader", leader_uuid=hint),
    )


def leadership_lost(hint: str = "") -> FakeRpcError:
    """A write in flight when its leader stepped down: its fate unknown."""
    msg = "this replica stopped leading before the write was committed"
    return FakeRpcError(
        grpc.StatusCode.UNAVAILABLE,
        msg,
        ServerErrorPB(code=ServerErrorPB.LEADERSHIP_LOST, message=msg, leader_uuid=hint),
    )


def queue_full() -> FakeRpcError:
    return FakeRpcError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "service queue full",
        ServerErrorPB(code=ServerErrorPB.SERVICE_QUEUE_FULL, message="service queue full"),
    )


def stream_refused() -> FakeRpcError:
    """What grpcio raises for a call the server reset with HTTP/2's REFUSED_STREAM."""
    return FakeRpcError(
        grpc.StatusCode.UNAVAILABLE,
        "Stream removed (RST_STREAM (Received RST_STREAM with error code 7))",
    )


def unavailable() -> FakeRpcError:
    return FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")


def certificate_unverified() -> FakeRpcError:
    """What gRPC says when the client cannot verify a server's certificate (expired)."""
    return FakeRpcError(
        grpc.StatusCode.UNAVAILABLE,
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7050: Ssl "
        "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:"
        "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: certificate has expired",
    )


def config_pb(partitions: int = 2) -> tablet_pb2.GetClusterConfigResponse:
    pb = tablet_pb2.GetClusterConfigResponse()
    for s in SERVERS:
        pb.servers.add(uuid=s, rpc_addr=addr(s), http_addr=f"{s}.fake:8051")
    pb.tables.add(
        name="kv", schema=KV_SCHEMA.to_pb(), num_partitions=partitions, replication_factor=3
    )
    for p in range(partitions):
        pb.tablets.add(
            tablet_id=f"kv-p{p}", table_name="kv", partition=p, replica_uuids=list(SERVERS)
        )
    return pb


Script = list[Any]


class FakeServer:
    def __init__(self, uuid: str) -> None:
        self.uuid = uuid
        self.address = addr(uuid)
        self.scripts: dict[str, Script] = {}
        self.requests: dict[str, list[Any]] = {}
        self.leads: set[str] = set()  # tablets this server claims in ListTablets
        self._lock = threading.Lock()

    def script(self, method: str, *answers: Any) -> None:
        self.scripts[method] = list(answers)

    def _answer(self, method: str, request: Any) -> Any:
        with self._lock:
            if request is not None:
                copy = type(request)()
                copy.CopyFrom(request)
                self.requests.setdefault(method, []).append(copy)
            script = self.scripts.get(method)
            if not script:
                raise unavailable()
            answer = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return answer(request)
        return answer

    # ServerStub
    def write(self, request: tablet_pb2.WriteRequest, timeout: float) -> tablet_pb2.WriteResponse:
        result = self._answer("write", request)
        if isinstance(result, Future):  # a call in flight (``FakeCall``), waited for
            result = answer_of(result)
        return result  # type: ignore[no-any-return]

    def scan(self, request: tablet_pb2.ScanRequest, timeout: float) -> tablet_pb2.ScanResponse:
        result: tablet_pb2.ScanResponse = self._answer("scan", request)
        return result

    def list_tablets_future(self, timeout: float) -> ResultFuture:
        f: Future[Any] = Future()
        resp = tablet_pb2.ListTabletsResponse(server_uuid=self.uuid)
        for t in sorted(self.leads):
            resp.tablets.add(tablet_id=t, role=consensus_pb2.LEADER, leader_uuid=self.uuid)
        f.set_result(resp)
        return f

    def get_cluster_config(self, timeout: float) -> tablet_pb2.GetClusterConfigResponse:
        result: tablet_pb2.GetClusterConfigResponse = self._answer("config", None)
        return result

    def leader_step_down(
        self, request: admin_pb2.LeaderStepDownRequest, timeout: float
    ) -> admin_pb2.LeaderStepDownResponse:
        result: admin_pb2.LeaderStepDownResponse = self._answer("step_down", request)
        return result


class FakeCluster:
    """A ``StubProvider`` of ``FakeServer``s by address."""

    def __init__(self) -> None:
        self.servers = {s: FakeServer(s) for s in SERVERS}
        self._by_addr = {srv.address: srv for srv in self.servers.values()}

    def stub(self, address: str) -> FakeServer:
        return self._by_addr[address]

    def writes(self) -> list[tuple[str, tablet_pb2.WriteRequest]]:
        """Every write request received, by server, in no particular order across servers."""
        return [(s.uuid, r) for s in self.servers.values() for r in s.requests.get("write", [])]


class FakeClock:
    """``clock``/``sleep`` pair: sleeping advances the clock; nothing really waits. ``wait``
    is ``RpcContext.wait``: it advances the clock too, and ends a ``FakeCall`` whose deadline
    it passes."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    def wait(self, future: CallFuture, seconds: float) -> bool:
        if future.done():
            return True
        if isinstance(future, FakeCall):
            seconds = min(seconds, max(0.0, future.deadline - self.now))
            self.now += seconds
            future.expire()
        else:
            self.now += seconds
        return future.done()


class FakeCall(Future[Any]):
    """A call in flight to a server that does not answer (paused) unless the test sets its
    result: it ends DEADLINE_EXCEEDED by the fake clock at its deadline, as gRPC's do."""

    def __init__(self, clock: FakeClock, timeout: float) -> None:
        super().__init__()
        self.clock = clock
        self.deadline = clock.now + timeout

    def expire(self) -> None:
        if self.clock.now >= self.deadline and not self.done():
            self.set_exception(FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    def result(self, timeout: float | None = None) -> Any:
        if not self.done():  # waited for plainly: until its deadline
            self.clock.now = max(self.clock.now, self.deadline)
            self.expire()
        return super().result(0)


def make_rpc(
    cluster: FakeCluster, clock: FakeClock | None = None, attempt_timeout_s: float = 10.0
) -> RpcContext:
    stats = StatsRecorder()
    clk: Callable[[], float] = clock.clock if clock else (lambda: 0.0)
    meta = MetaCache([addr("ts1")], cluster, stats, clock=clk)
    meta.install(config_pb())
    return RpcContext(
        meta=meta,
        stubs=cluster,
        stats=stats,
        attempt_timeout_s=attempt_timeout_s,
        clock=clk,
        sleep=clock.sleep if clock else (lambda _s: None),
        # Only a fake clock's wait ends a ``FakeCall`` by its deadline.
        wait=clock.wait if isinstance(clock, FakeClock) else wait_for_answer,
    )


def ok(request: tablet_pb2.WriteRequest | None = None) -> tablet_pb2.WriteResponse:
    return tablet_pb2.WriteResponse(op_index=7, op_term=1)


__all__ = [
    "KV_SCHEMA",
    "FakeCall",
    "FakeClock",
    "FakeCluster",
    "FakeRpcError",
    "FakeServer",
    "RequestTracker",
    "config_pb",
    "leadership_lost",
    "make_rpc",
    "not_leader",
    "ok",
    "queue_full",
    "rows_in",
    "stream_refused",
    "unavailable",
]


def rows_in(request: tablet_pb2.WriteRequest, schema: Schema = KV_SCHEMA) -> int:
    """How many rows a write request carries, in either form."""
    if request.HasField("row_block"):
        return len(request.row_block.rows) // row_width(schema)
    return len(request.ops)
