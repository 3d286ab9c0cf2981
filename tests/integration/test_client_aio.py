"""The asyncio client (``raftlet.client.aio``) and ``raftlet write --in-flight`` against a
real 3-server cluster (one for the module).

Each test writes its own key range (``BASE_*``) and reads back only that range. Waiting is on
conditions (``wait_for``, asyncio events), never on time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from raftlet.client import Client, Predicate
from raftlet.client.aio import AsyncClient
from raftlet.client.errors import MessageTooLarge
from raftlet.proto import admin_pb2
from raftlet.tserver.grpc_limits import MAX_CONCURRENT_STREAMS
from tests.integration.tserver_cluster import REPO, TserverCluster, running_cluster, wait_for

pytestmark = pytest.mark.integration

T = TypeVar("T")
PARTITIONS = 3
# Bounds on a hang, not performance claims.
RUN_BOUND_S = 120.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TserverCluster]:
    with running_cluster(tmp_path_factory.mktemp("client-aio"), partitions=PARTITIONS) as c:
        c.wait_leaders()
        yield c


def addresses(cluster: TserverCluster) -> list[str]:
    return [s.rpc_addr for s in cluster.config.servers]


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(RUN_BOUND_S):
            return await coro

    return asyncio.run(bounded())


def scan_range(cluster: TserverCluster, lo: int, hi: int) -> dict[int, Any]:
    """{key: value} of keys in [lo, hi) read with the threaded client (leader reads),
    failing on a key returned twice."""
    out: dict[int, Any] = {}
    with Client(addresses(cluster), timeout_s=30.0) as c:
        for row in c.scan("kv", predicates=[Predicate.range("key", lower=lo, upper=hi)]):
            key = row["key"]
            assert isinstance(key, int)
            assert key not in out, f"key {key} scanned twice"
            out[key] = row["value"]
    return out


def test_64_concurrent_inserts_all_succeed_and_are_readable(cluster: TserverCluster) -> None:
    base = 1_000_000

    async def main() -> AsyncClient:
        async with AsyncClient.connect(addresses(cluster), timeout_s=30.0) as c:
            await asyncio.gather(
                *(c.insert("kv", {"key": base + i, "value": f"a{i}"}) for i in range(64))
            )
            return c

    c = run(main())
    stats = c.stats
    assert (stats.writes_acked, stats.rows_acked) == (64, 64)
    assert stats.errors_by_cause == {}
    assert stats.channels_created <= len(cluster.servers)  # one channel per server at most
    assert scan_range(cluster, base, base + 64) == {base + i: f"a{i}" for i in range(64)}


def _write_connections(cluster: TserverCluster) -> float:
    return sum(s.metric("write_tcp_connections") for s in cluster.servers.values())


@pytest.mark.parametrize("tcp_writes", [False, True])
def test_writes_take_the_tcp_port_unless_told_not_to(
    cluster: TserverCluster, tcp_writes: bool
) -> None:
    """A plaintext client's writes go on each leader's plain-TCP write port (one connection
    per server written to); ``tcp_writes=False`` keeps them on the gRPC WriteStream."""
    base = 1_050_000 if tcp_writes else 1_060_000
    wait_for(lambda: _write_connections(cluster) == 0, 30, "earlier clients' connections gone")

    async def main() -> tuple[float, int]:
        async with AsyncClient.connect(addresses(cluster), tcp_writes=tcp_writes) as c:
            await asyncio.gather(
                *(c.insert("kv", {"key": base + i, "value": f"t{i}"}) for i in range(32))
            )
            # One per server written to: the leaders now, and any that led a tablet when
            # the client first wrote to it (a module's cluster may elect again under load:
            # a CI run saw 3 connections where the leaders were on 2 servers).
            leaders = {c._meta.leader(t) for t in cluster.tablet_ids()}
            fewest = len(leaders) if tcp_writes else 0
            most = len(cluster.servers) if tcp_writes else 0
            await asyncio.to_thread(
                wait_for,
                lambda: fewest <= _write_connections(cluster) <= most,
                30,
                f"{fewest} to {most} connections (one per server written to, if tcp)",
            )
            return _write_connections(cluster), (fewest, most)

    connections, (fewest, most) = run(main())
    assert fewest <= connections <= most
    assert scan_range(cluster, base, base + 32) == {base + i: f"t{i}" for i in range(32)}
    wait_for(lambda: _write_connections(cluster) == 0, 30, "the closed client's connections gone")


def test_more_clients_in_one_process_than_a_connection_has_streams_all_write(
    cluster: TserverCluster,
) -> None:
    """Each client keeps a write stream open to each server it writes to. On one connection
    shared by the process, the clients past the server's streams per connection waited out
    their deadline (a reviewer's 100 clients: 64 wrote); each client's connections are its
    own."""
    base = 1_080_000
    clients = MAX_CONCURRENT_STREAMS + 6

    async def main() -> tuple[list[AsyncClient], dict[int, str]]:
        connecting = (
            AsyncClient.connect(addresses(cluster), timeout_s=60.0, tcp_writes=False)
            for _ in range(clients)
        )
        opened = list(await asyncio.gather(*connecting))
        # Each client writes a key of every tablet: a stream to every leader.
        by_tablet: dict[str, list[int]] = {}
        key = base
        while len(by_tablet) < PARTITIONS or any(len(k) < clients for k in by_tablet.values()):
            by_tablet.setdefault(opened[0].tablet_for("kv", {"key": key}), []).append(key)
            key += 1
        rows = {keys[i]: f"m{i}" for keys in by_tablet.values() for i in range(clients)}
        try:
            await asyncio.gather(
                *(
                    c.insert("kv", {"key": keys[i], "value": f"m{i}"})
                    for i, c in enumerate(opened)
                    for keys in by_tablet.values()
                )
            )
        finally:
            await asyncio.gather(*(c.close() for c in opened))
        return opened, rows

    done, rows = run(main())
    assert [c.stats.writes_acked for c in done] == [PARTITIONS] * clients
    assert scan_range(cluster, base, max(rows) + 1) == rows


def test_a_write_too_large_for_a_frame_fails_alone(cluster: TserverCluster) -> None:
    """Over the tcp port too, a write over the server's message limit fails on its own with
    MESSAGE_TOO_LARGE (not retried), saying its request was too large and so never applied,
    and the writes around it succeed."""
    base = 1_070_000

    async def main() -> list[object]:
        async with AsyncClient.connect(addresses(cluster), timeout_s=30.0) as c:
            return await asyncio.gather(
                c.insert("kv", {"key": base, "value": "x" * (17 * 1024 * 1024)}),
                *(c.insert("kv", {"key": base + 1 + i, "value": "ok"}) for i in range(8)),
                return_exceptions=True,
            )

    results = run(main())
    too_large = results[0]
    assert isinstance(too_large, MessageTooLarge), too_large
    assert "its request of" in str(too_large), too_large
    assert too_large.may_have_applied is False
    assert not any(isinstance(r, BaseException) for r in results[1:]), results[1:]
    assert scan_range(cluster, base, base + 9) == {base + 1 + i: "ok" for i in range(8)}


def test_write_batches_round_trip(cluster: TserverCluster) -> None:
    from raftlet.schema.rows import OpType

    base = 1_100_000

    async def main() -> list[Any]:
        async with AsyncClient.connect(addresses(cluster), max_batch_rows=16) as c:
            errors: list[Any] = await c.write(
                "kv", [(OpType.INSERT, {"key": base + i, "value": "w"}) for i in range(100)]
            )
            errors += await c.write(
                "kv",
                [
                    (OpType.UPDATE, {"key": base, "value": "updated"}),
                    (OpType.DELETE, {"key": base + 1}),
                    (OpType.INSERT, {"key": base + 2, "value": "dup"}),  # KEY_EXISTS
                ],
            )
            return errors

    errors = run(main())
    assert [(e.row_index, e.cause) for e in errors] == [(2, "KEY_EXISTS")]
    expected: dict[int, Any] = {base + i: "w" for i in range(100)}
    expected[base] = "updated"
    del expected[base + 1]
    assert scan_range(cluster, base, base + 100) == expected


def test_not_leader_mid_run_is_retried_and_each_write_applied_once(
    cluster: TserverCluster,
) -> None:
    """16 writes in flight to one tablet while its leader steps down behind the client's back.
    Every write succeeds; the leader change was retried (same request id, elsewhere) --
    NOT_LEADER for a write that reached the old leader after it stepped down, UNAVAILABLE
    for one in flight there as it did (its proposal dropped), whichever the timing gave; and
    each replica applied exactly one write op per acknowledged write — a retry applied twice
    would show as an extra op (and as KEY_EXISTS, since every key is new)."""
    base = 1_200_000
    tablet = cluster.tablet_for_key(base)
    keys = (k for k in itertools.count(base) if cluster.tablet_for_key(k) == tablet)
    replicas = [cluster.servers[r] for r in cluster.config.placement(tablet).replicas]

    def ops_applied() -> list[float]:
        return [s.metric("write_ops_total", tablet=tablet) for s in replicas]

    wait_for(lambda: len(set(ops_applied())) == 1, 30, "replicas to agree before the test")
    before = ops_applied()[0]
    old = cluster.leader_of(tablet).id
    written: list[int] = []

    async def main() -> AsyncClient:
        async with AsyncClient.connect(addresses(cluster), timeout_s=60.0) as c:
            stop = asyncio.Event()
            milestone = asyncio.Event()
            wanted = [40]  # acks to reach before `milestone` is set

            async def writer() -> None:
                while not stop.is_set():
                    key = next(keys)
                    await c.insert("kv", {"key": key, "value": f"v{key - base}"})
                    written.append(key)
                    if len(written) >= wanted[0]:
                        milestone.set()

            tasks = [asyncio.create_task(writer()) for _ in range(16)]
            try:
                await milestone.wait()
                assert c._meta.leader(tablet) == old  # the client routes to the old leader
                target = next(r.id for r in replicas if r.id != old)
                await asyncio.to_thread(
                    cluster.servers[old].admin.LeaderStepDown,
                    admin_pb2.LeaderStepDownRequest(tablet_id=tablet, new_leader_uuid=target),
                    timeout=10,
                )
                new = await asyncio.to_thread(cluster.new_leader_of, tablet, old)
                # Keep writing until 40 more writes were acknowledged by the new leader.
                milestone.clear()
                wanted[0] = len(written) + 40
                await milestone.wait()
                while c._meta.leader(tablet) != new.id:
                    milestone.clear()
                    wanted[0] = len(written) + 1
                    await milestone.wait()
            finally:
                stop.set()
                await asyncio.gather(*tasks)
            return c

    c = run(main())
    stats = c.stats
    assert stats.errors_by_cause == {}
    retried = stats.retries_by_cause
    assert retried.get("NOT_LEADER", 0) + retried.get("UNAVAILABLE", 0) > 0, retried
    assert stats.writes_acked == len(written)
    assert scan_range(cluster, base, max(written) + 1) == {k: f"v{k - base}" for k in written}
    wait_for(
        lambda: ops_applied() == [before + len(written)] * len(replicas),
        30,
        f"every replica to apply exactly {len(written)} write ops "
        f"(applied: {[x - before for x in ops_applied()]})",
    )


def test_write_in_flight_reports_rows_and_server_cpu_per_write(cluster: TserverCluster) -> None:
    rows = 300
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "raftlet",
            "write",
            "--cluster",
            str(cluster.path),
            "--in-flight",
            "16",
            "--rows",
            str(rows),
            "--format",
            "json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_BOUND_S,
        env=dict(os.environ, NO_COLOR="1"),
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = json.loads(proc.stdout)
    assert (doc["rows"], doc["writes"], doc["failed_rows"]) == (rows, rows, 0)
    assert (doc["in_flight"], doc["client"], doc["flush_mode"]) == (16, "asyncio", "sync")
    by_server = doc["server_cpu_s_by_server"]
    assert sorted(by_server) == sorted(cluster.servers)
    assert all(isinstance(v, float) and v > 0 for v in by_server.values()), by_server
    assert doc["server_cpu_s"] == pytest.approx(sum(by_server.values()), abs=1e-3)
    assert doc["server_cpu_ms_per_write"] == pytest.approx(
        doc["server_cpu_s"] * 1000 / rows, rel=1e-3
    )
    assert doc["client_cpu_s"] > 0  # the writer's own, while it wrote
    assert doc["client_cpu_ms_per_write"] == pytest.approx(
        doc["client_cpu_s"] * 1000 / rows, rel=1e-2
    )
