"""A server's budget for admitted writes (``--write_memory_limit_bytes``) against a real
3-server cluster whose log syncs are slowed (``--log_inject_latency_ms``), so the writes a
leader admits stay unanswered long enough to fill a 1 MiB budget.

Each test writes its own key range and reads back only that range; waits are on
conditions.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import grpc
import pytest

from raftlet.client import Client, Predicate
from raftlet.client.aio import AsyncClient
from raftlet.proto import admin_pb2
from raftlet.proto.common_pb2 import ServerErrorPB
from tests.integration.tserver_cluster import (
    TserverCluster,
    kv_op,
    running_cluster,
    server_error,
    wait_for,
    write_request,
)

pytestmark = pytest.mark.integration

LIMIT = 1 << 20
# Each write carries ~100 KB: a dozen fill the budget.
VALUE = "v" * 100_000
WRITES = 30
# Bounds on a hang, not performance claims.
RUN_BOUND_S = 120.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TserverCluster]:
    flags = [f"--write_memory_limit_bytes={LIMIT}", "--log_inject_latency_ms=300"]
    with running_cluster(tmp_path_factory.mktemp("write-memory"), partitions=1, flags=flags) as c:
        c.wait_leaders()
        yield c


def _scan_keys(cluster: TserverCluster, lo: int, hi: int) -> set[int]:
    addresses = [s.rpc_addr for s in cluster.config.servers]
    with Client(addresses, timeout_s=30.0) as c:
        rows = c.scan("kv", predicates=[Predicate.range("key", lower=lo, upper=hi)])
        return {int(row["key"]) for row in rows}  # type: ignore[call-overload]


def _held(cluster: TserverCluster) -> float:
    return sum(s.metric("write_memory_held_bytes") for s in cluster.servers.values())


def test_writes_past_the_limit_are_refused_at_once_and_nothing_of_them_is_kept(
    cluster: TserverCluster,
) -> None:
    (tablet,) = cluster.tablet_ids()
    leader = cluster.leader_of(tablet)
    refused_before = leader.metric("write_memory_refusals_total")
    base = 1_000
    # Sent together: the first round's syncs take 0.3 s, so all arrive while the first
    # dozen are held.
    calls = [
        leader.tablet.Write.future(
            write_request(tablet, [kv_op(base + i, VALUE)], "memory-raw", i), timeout=60
        )
        for i in range(WRITES)
    ]
    written: set[int] = set()
    refused: dict[int, grpc.RpcError] = {}
    for i, call in enumerate(calls):
        try:
            call.result()
        except grpc.RpcError as e:
            refused[base + i] = e
        else:
            written.add(base + i)
    for e in refused.values():
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
        error = server_error(e)
        assert error is not None, e
        assert error.code == ServerErrorPB.MEMORY_LIMIT, e
        assert "--write_memory_limit_bytes=1048576" in (e.details() or "")
    # The first is always admitted (nothing was held); 30 x 100 KB is three budgets.
    assert base in written
    assert len(refused) >= WRITES // 2, (written, refused)
    assert leader.metric("write_memory_refusals_total") - refused_before == len(refused)
    # What was answered gave its charge back, on every server.
    wait_for(lambda: _held(cluster) == 0, 30, "the budget given back")
    # A refused write left nothing: only the acknowledged rows are there.
    assert _scan_keys(cluster, base, base + WRITES) == written


def test_a_client_backs_off_and_every_write_goes_through(cluster: TserverCluster) -> None:
    (tablet,) = cluster.tablet_ids()
    leader = cluster.leader_of(tablet)
    refused_before = leader.metric("write_memory_refusals_total")
    base = 2_000
    addresses = [s.rpc_addr for s in cluster.config.servers]

    async def main() -> AsyncClient:
        async with asyncio.timeout(RUN_BOUND_S):
            async with AsyncClient.connect(addresses, timeout_s=60.0) as c:
                await asyncio.gather(
                    *(c.insert("kv", {"key": base + i, "value": VALUE}) for i in range(WRITES))
                )
                return c

    client = asyncio.run(main())
    assert client.stats.writes_acked == WRITES
    # It was refused on the way, and retried until each write was admitted.
    assert client.stats.retries_by_cause.get("RESOURCE_EXHAUSTED", 0) > 0
    assert client.stats.errors_by_cause == {}
    assert leader.metric("write_memory_refusals_total") > refused_before
    assert _scan_keys(cluster, base, base + WRITES) == set(range(base, base + WRITES))
    wait_for(lambda: _held(cluster) == 0, 30, "the budget given back")


def test_the_limit_is_set_at_runtime(cluster: TserverCluster) -> None:
    (tablet,) = cluster.tablet_ids()
    leader = cluster.leader_of(tablet)
    base = 3_000
    seq = itertools.count()
    resp = leader.admin.SetFlag(
        admin_pb2.SetFlagRequest(name="write_memory_limit_bytes", value=str(64 << 20)),
        timeout=10,
    )
    try:
        assert resp.old_value == str(LIMIT)
        refused_before = leader.metric("write_memory_refusals_total")
        calls = [
            leader.tablet.Write.future(
                write_request(tablet, [kv_op(base + i, VALUE)], "memory-runtime", next(seq)),
                timeout=60,
            )
            for i in range(WRITES)
        ]
        for call in calls:
            call.result()  # 3 MB is well inside 64 MiB: none refused
        assert leader.metric("write_memory_refusals_total") == refused_before
    finally:
        leader.admin.SetFlag(
            admin_pb2.SetFlagRequest(name="write_memory_limit_bytes", value=str(LIMIT)),
            timeout=10,
        )
    assert _scan_keys(cluster, base, base + WRITES) == set(range(base, base + WRITES))
