"""TabletService.WriteStream against real servers: each write of a frame is answered on its
own, with the outcome (or the status and ServerErrorPB) the unary Write would have given;
exactly-once holds within and across frames; a client that half-closes still gets every
answer; the asyncio client's errors through the stream classify as the unary ones do."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import grpc
import pytest

from raftlet.client.aio import AsyncClient
from raftlet.client.aio_write_stream import StreamedRpcError
from raftlet.client.retry import Cause, classify
from raftlet.proto import tablet_pb2
from raftlet.proto.common_pb2 import ServerErrorPB
from tests.integration.tserver_cluster import (
    TserverCluster,
    kv_op,
    running_cluster,
    write_request,
)

pytestmark = pytest.mark.integration


def _frame(*items: tuple[int, tablet_pb2.WriteRequest]) -> tablet_pb2.WriteStreamRequestPB:
    return tablet_pb2.WriteStreamRequestPB(
        items=[tablet_pb2.WriteStreamItemPB(id=i, request=r) for i, r in items]
    )


def _results(
    stub: object, *frames: tablet_pb2.WriteStreamRequestPB
) -> dict[int, tablet_pb2.WriteStreamResultPB]:
    """Send ``frames`` and half-close; every write must be answered once before the end."""
    got: dict[int, tablet_pb2.WriteStreamResultPB] = {}
    for response in stub.WriteStream(iter(frames), timeout=30):  # type: ignore[attr-defined]
        for result in response.results:
            assert result.id not in got, f"write {result.id} answered twice"
            got[result.id] = result
    return got


def test_each_write_of_a_frame_gets_its_own_answer(tmp_path: Path) -> None:
    with running_cluster(tmp_path, partitions=2) as cluster:
        cluster.wait_caught_up()  # every follower has heard its leader: it can name it
        tablet = cluster.tablet_for_key(1)
        leader = cluster.leader_of(tablet)
        follower = next(s for s in cluster.alive_servers() if s.id != leader.id)
        keys = [k for k in range(1, 200) if cluster.tablet_for_key(k) == tablet][:3]
        good = [write_request(tablet, [kv_op(k, f"v{k}")], "ws", k) for k in keys]
        retry_of_first = write_request(tablet, [kv_op(keys[0], f"v{keys[0]}")], "ws", keys[0])
        unknown = write_request("no-such-tablet", [kv_op(1, "x")], "ws", 1000)
        results = _results(
            leader.tablet,
            _frame((1, good[0]), (2, good[1]), (3, unknown)),
            _frame((4, good[2]), (5, retry_of_first)),
        )
        assert set(results) == {1, 2, 3, 4, 5}
        for i in (1, 2, 4):
            assert results[i].status_code == 0
            assert results[i].response.op_index > 0
            assert list(results[i].response.row_errors) == []
        # The same request id again is the same write: answered with the first outcome.
        assert results[5].status_code == 0
        assert results[5].response.op_index == results[1].response.op_index
        assert results[3].status_code == grpc.StatusCode.NOT_FOUND.value[0]
        assert results[3].error.code == ServerErrorPB.TABLET_NOT_FOUND

        # A follower answers NOT_LEADER with the leader's address, as the unary call does.
        (refused,) = _results(
            follower.tablet, _frame((9, write_request(tablet, [kv_op(999, "z")], "ws2", 1)))
        ).values()
        assert refused.status_code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert refused.error.code == ServerErrorPB.NOT_LEADER
        assert refused.error.leader_uuid == leader.id
        assert refused.error.leader_addr == leader.config.rpc_addr
        _assert_rows_once(cluster, tablet, {k: f"v{k}" for k in keys})


def _assert_rows_once(cluster: TserverCluster, tablet: str, rows: dict[int, str]) -> None:
    cluster.wait_converged(tablet, rows, timeout=30)


def test_a_stream_error_classifies_as_the_unary_one() -> None:
    error = ServerErrorPB(
        code=ServerErrorPB.NOT_LEADER, message="not leader", leader_uuid="ts2", leader_addr="a:1"
    )
    failure = classify(StreamedRpcError(grpc.StatusCode.FAILED_PRECONDITION, "x", error), "ts1")
    assert failure.cause is Cause.NOT_LEADER
    assert (failure.leader_uuid, failure.leader_addr) == ("ts2", "a:1")
    full = classify(StreamedRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "service queue full"))
    assert full.cause is Cause.RESOURCE_EXHAUSTED
    gone = classify(StreamedRpcError(grpc.StatusCode.UNAVAILABLE, "stream ended"))
    assert gone.cause is Cause.UNAVAILABLE


def test_the_async_client_retries_what_a_broken_stream_left_unanswered(tmp_path: Path) -> None:
    """16 writers on the asyncio client (its writes ride one stream per server) while the
    leader is SIGKILLed: the writes waiting on the broken stream fail as UNAVAILABLE, are
    sent again with the same request id, and every acknowledged row is there exactly once."""
    with running_cluster(tmp_path, partitions=1) as cluster:
        cluster.wait_leaders()
        tablet = cluster.tablet_ids()[0]
        old = cluster.leader_of(tablet)
        addresses = [s.rpc_addr for s in cluster.config.servers]
        written: list[int] = []

        async def main() -> AsyncClient:
            async with AsyncClient.connect(addresses, timeout_s=60.0) as c:
                stop = asyncio.Event()
                reached = asyncio.Event()
                wanted = [30]
                keys = itertools.count(1)

                async def writer() -> None:
                    while not stop.is_set():
                        key = next(keys)
                        await c.insert("kv", {"key": key, "value": f"v{key}"})
                        written.append(key)
                        if len(written) >= wanted[0]:
                            reached.set()

                tasks = [asyncio.create_task(writer()) for _ in range(16)]
                try:
                    await reached.wait()
                    await asyncio.to_thread(old.kill)
                    reached.clear()
                    wanted[0] = len(written) + 30  # writes go on, on the new leader
                    await reached.wait()
                finally:
                    stop.set()
                    await asyncio.gather(*tasks)
                return c

        async def bounded() -> AsyncClient:
            async with asyncio.timeout(120):
                return await main()

        c = asyncio.run(bounded())
        assert c.stats.errors_by_cause == {}
        assert c.stats.writes_acked == len(written)
        old.start()
        expected = {k: f"v{k}" for k in written}
        cluster.wait_converged(tablet, expected, timeout=60)
