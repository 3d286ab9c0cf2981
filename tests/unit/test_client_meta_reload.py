"""The client's config is fetched again when it proves out of date: a table it does not
list (added by a rolling restart since the client connected: it said "unknown table" until
the process was started again), or a call refused as made for another schema."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from raftlet.client.errors import InvalidArgument, RowError
from raftlet.client.meta_cache import MetaCache
from raftlet.client.request_tracker import RequestTracker
from raftlet.client.retry import Cause, classify
from raftlet.client.rpc import Router
from raftlet.client.session import Session
from raftlet.client.stats import StatsRecorder
from raftlet.proto import tablet_pb2
from raftlet.proto.common_pb2 import ServerErrorPB
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from tests.unit.client_aio_fakes import AsyncFakeClock, AsyncFakeCluster, fake_client
from tests.unit.client_fakes import (
    SERVERS,
    FakeClock,
    FakeCluster,
    FakeRpcError,
    FakeServer,
    addr,
    config_pb,
    make_rpc,
    ok,
)

EVENTS = Schema([ColumnSchema("id", DataType.INT64, is_key=True)])


def with_events() -> tablet_pb2.GetClusterConfigResponse:
    pb = config_pb()
    pb.tables.add(name="events", schema=EVENTS.to_pb(), num_partitions=1, replication_factor=3)
    pb.tablets.add(tablet_id="events-p0", table_name="events", partition=0,
                   replica_uuids=list(SERVERS))  # fmt: skip
    return pb


def meta_of(cluster: FakeCluster, clock: FakeClock) -> MetaCache:
    meta = MetaCache([addr("ts1")], cluster, StatsRecorder(), clock=clock.clock)
    meta.install(config_pb())
    return meta


class Answers:
    """A server's GetClusterConfig answer, counting the calls."""

    def __init__(self, config: tablet_pb2.GetClusterConfigResponse) -> None:
        self.config = config
        self.calls = 0

    def __call__(self, _request: object) -> tablet_pb2.GetClusterConfigResponse:
        self.calls += 1
        return self.config


def test_a_table_added_since_the_client_connected_is_found() -> None:
    cluster, clock = FakeCluster(), FakeClock()
    cluster.servers["ts1"].script("config", with_events())
    meta = meta_of(cluster, clock)
    clock.now += 5
    assert meta.table("events").schema == EVENTS
    assert meta.table("kv").name == "kv"


def test_a_name_that_is_no_table_costs_a_fetch_a_second_at_most() -> None:
    cluster, clock = FakeCluster(), FakeClock()
    answers = Answers(config_pb())
    cluster.servers["ts1"].script("config", answers)
    meta = meta_of(cluster, clock)
    clock.now += 5
    for _ in range(3):
        with pytest.raises(InvalidArgument, match="unknown table 'nope'"):
            meta.table("nope")
    assert answers.calls == 1
    clock.now += 1
    with pytest.raises(InvalidArgument):
        meta.table("nope")
    assert answers.calls == 2


def test_a_fetch_that_fails_keeps_the_view() -> None:
    cluster, clock = FakeCluster(), FakeClock()
    cluster.servers["ts1"].script("config", FakeRpcError(grpc.StatusCode.UNAUTHENTICATED, "no"))
    meta = meta_of(cluster, clock)
    clock.now += 5
    with pytest.raises(InvalidArgument, match="unknown table 'events'"):
        meta.table("events")
    assert meta.table("kv").name == "kv"


def test_a_call_refused_for_its_schema_makes_the_next_look_up_fetch_the_config() -> None:
    cluster, clock = FakeCluster(), FakeClock()
    changed = config_pb()
    changed.tables[0].schema.columns[1].type = tablet_pb2.DOUBLE
    answers = Answers(changed)
    cluster.servers["ts1"].script("config", answers)
    meta = meta_of(cluster, clock)
    clock.now += 5
    refused = classify(
        FakeRpcError(
            grpc.StatusCode.INVALID_ARGUMENT,
            "made for another schema",
            ServerErrorPB(code=ServerErrorPB.SCHEMA_MISMATCH, message="made for another schema"),
        ),
        "ts1",
    )
    assert refused.cause is Cause.SCHEMA_MISMATCH
    router = Router(meta, meta.tablet("kv-p0"), True, None)
    with pytest.raises(InvalidArgument) as e:
        router.failed_with(refused, "write of 1 row to tablet kv-p0")
    assert (e.value.cause, e.value.may_have_applied) == ("SCHEMA_MISMATCH", False)
    assert answers.calls == 0
    assert meta.table("kv").schema.columns[1].type is DataType.DOUBLE
    assert answers.calls == 1
    meta.table("kv")
    assert answers.calls == 1


def test_a_row_refused_by_an_old_schema_is_tried_again_by_the_tables_new_one() -> None:
    """A cluster made again with a column changed: a row that fits only the new schema was
    refused by the client itself on every write, which never asked a server and so never
    learned of the change."""
    cluster, clock = FakeCluster(), FakeClock()
    changed = config_pb()
    changed.tables[0].schema.columns[1].type = tablet_pb2.DOUBLE
    answers = Answers(changed)
    cluster.servers["ts1"].script("config", answers)
    cluster.servers["ts1"].leads = {"kv-p0", "kv-p1"}
    cluster.servers["ts1"].script("write", ok)
    rpc = make_rpc(cluster, clock)
    session = Session(rpc, RequestTracker(), ThreadPoolExecutor(1))
    clock.now += 5
    assert session.upsert("kv", {"key": 1, "value": 2.5}) is not None
    (sent,) = [r for _, r in cluster.writes()]
    assert sent.schema_fingerprint == rpc.meta.table("kv").schema.fingerprint
    assert answers.calls == 1
    # A row that fits neither is refused, and costs no more than a fetch a second.
    for _ in range(3):
        with pytest.raises(RowError, match="TYPE_MISMATCH"):
            session.upsert("kv", {"key": 2, "value": "text"})
    assert answers.calls == 1


def grown_cluster() -> FakeCluster:
    """Three servers on the config of three, each naming ts4 -- listed only in ts4's own
    config -- the leader of every tablet."""
    cluster = FakeCluster()
    ts4 = FakeServer("ts4")
    cluster.servers["ts4"] = ts4
    cluster._by_addr[ts4.address] = ts4
    grown = config_pb()
    grown.servers.add(uuid="ts4", rpc_addr=ts4.address, http_addr="ts4.fake:8051")
    for tablet in grown.tablets:
        tablet.replica_uuids[:] = ["ts2", "ts3", "ts4"]
    ts4.script("config", Answers(grown))
    ts4.leads = {"kv-p0", "kv-p1"}
    ts4.script("write", ok)
    hint = ServerErrorPB(
        code=ServerErrorPB.NOT_LEADER, message="not the leader", leader_uuid="ts4",
        leader_addr=ts4.address,
    )  # fmt: skip
    for sid in SERVERS:
        cluster.servers[sid].script("config", config_pb())
        cluster.servers[sid].script(
            "write", FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "not the leader", hint)
        )
    return cluster


def test_a_leader_the_view_does_not_list_makes_the_next_look_up_fetch_the_config_there() -> None:
    """Review r27c: a seed left on an older cluster.toml gave the client a server list
    without ts4, which had since taken a tablet over; every other server named ts4 as the
    leader, and the client, ignoring a hint outside its view, wrote nothing for minutes."""
    cluster, clock = grown_cluster(), FakeClock()
    rpc = make_rpc(cluster, clock)
    session = Session(rpc, RequestTracker(), ThreadPoolExecutor(1))
    clock.now += 5
    session.insert("kv", {"key": 0, "value": "v"})
    assert [sid for sid, _ in cluster.writes()][-1] == "ts4"
    assert rpc.meta.config_addresses()[0] == addr("ts4")


def test_the_asyncio_client_too_fetches_the_config_where_an_unlisted_leader_is() -> None:
    cluster, clock = AsyncFakeCluster(grown_cluster()), AsyncFakeClock()

    async def main() -> None:
        c = await fake_client(cluster, clock)
        clock.now += 5
        await c.insert("kv", {"key": 0, "value": "v"})
        await c.close()

    asyncio.run(main())
    assert [sid for sid, _ in cluster.writes()][-1] == "ts4"
