"""The asyncio client against scripted fake servers: the threaded client's routing, retries,
errors and exactly-once request ids, with many writes in flight from one event loop."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from raftlet.client import (
    ClientClosed,
    InvalidArgument,
    NotLeader,
    RemoteError,
    RowError,
    ServerTooBusy,
    TabletNotFound,
    Timeout,
)
from raftlet.client.aio import AsyncClient
from raftlet.client.aio_write_stream import StreamedRpcError
from raftlet.client.aio_write_stream import unary_call as _unary
from raftlet.client.meta_cache import MetaCache
from raftlet.client.stats import StatsRecorder
from raftlet.proto import tablet_pb2
from raftlet.schema.rows import OpType
from tests.unit.client_aio_fakes import AsyncFakeClock, AsyncFakeCluster, fake_client
from tests.unit.client_fakes import (
    FakeRpcError,
    addr,
    certificate_unverified,
    config_pb,
    not_leader,
    ok,
    queue_full,
    rows_in,
    unavailable,
)

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        # A bound on a hang (a bug that serializes or loses a wake-up), not a timing claim.
        async with asyncio.timeout(60):
            return await coro

    return asyncio.run(bounded())


def test_64_concurrent_inserts_are_all_in_flight_at_once_with_distinct_request_ids() -> None:
    """The fake leader holds every write until 64 have arrived: the test only finishes if
    the client really has 64 in flight. Each has its own seq_no under one client_id, and no
    request's first_incomplete_seq_no passes a request still outstanding."""
    cluster = AsyncFakeCluster()
    arrived: list[tablet_pb2.WriteRequest] = []
    all_in = asyncio.Event()

    async def held(request: tablet_pb2.WriteRequest) -> tablet_pb2.WriteResponse:
        arrived.append(request)
        if len(arrived) == 64:
            all_in.set()
        await all_in.wait()
        return ok()

    async def main() -> None:
        for s in cluster.servers.values():
            s.script("write", held)
        cluster.servers["ts2"].leads = {"kv-p0", "kv-p1"}
        async with AsyncClient.connect([addr("ts1")], stubs=cluster, timeout_s=5.0) as c:
            await asyncio.gather(*(c.insert("kv", {"key": k, "value": str(k)}) for k in range(64)))
            stats = c.stats
            assert (stats.writes_acked, stats.rows_acked) == (64, 64)
            assert stats.errors_by_cause == {}
            assert stats.retries_by_cause == {}
            sent = [r for _, r in cluster.writes()]
            assert {s for s, _ in cluster.writes()} == {"ts2"}  # the leader ListTablets named
            assert sorted(r.request_id.seq_no for r in sent) == list(range(1, 65))
            assert {r.request_id.client_id for r in sent} == {c.client_id}
            assert all(r.request_id.first_incomplete_seq_no <= r.request_id.seq_no for r in sent)
            assert c._tracker.outstanding() == 0

    cluster.servers["ts1"].script("config", config_pb())
    run(main())


def test_a_retried_write_keeps_its_request_id_across_servers() -> None:
    """ts1 (cached leader) says NOT_LEADER → ts2; ts2 is full, then unreachable → ts3
    succeeds. One seq_no throughout; attempt_no 0, 1, 2, 3 (as the threaded client)."""
    cluster = AsyncFakeCluster()
    cluster.servers["ts1"].script("write", not_leader("ts2"))
    cluster.servers["ts2"].script("write", queue_full(), unavailable())
    cluster.servers["ts3"].script("write", ok)
    clock = AsyncFakeClock()

    async def main() -> None:
        c = await fake_client(cluster, clock)
        c._meta.set_leader("kv-p0", "ts1")
        c._meta.set_leader("kv-p1", "ts1")
        await c.insert("kv", {"key": 1, "value": "a"})
        sent = cluster.writes()
        order = {"ts1": 0, "ts2": 1, "ts3": 2}
        sent.sort(key=lambda x: (order[x[0]], x[1].request_id.attempt_no))
        assert [s for s, _ in sent] == ["ts1", "ts2", "ts2", "ts3"]
        assert {(r.request_id.client_id, r.request_id.seq_no) for _, r in sent} == {
            (c.client_id, 1)
        }
        assert [r.request_id.attempt_no for _, r in sent] == [0, 1, 2, 3]
        assert c.stats.retries_by_cause == {
            "NOT_LEADER": 1,
            "RESOURCE_EXHAUSTED": 1,
            "UNAVAILABLE": 1,
        }
        assert clock.sleeps  # the queue-full retry backed off
        landed = await c.insert("kv", {"key": 2, "value": "b"})  # straight to the leader
        assert (landed.op_index, landed.op_term) == (7, 1)  # where the server said it is
        last = cluster.servers["ts3"].requests["write"][-1]
        assert (last.request_id.seq_no, last.request_id.attempt_no) == (2, 0)
        assert last.request_id.first_incomplete_seq_no == 2
        await c.close()

    run(main())


def test_not_leader_without_a_hint_looks_the_leader_up_once_for_many_writes() -> None:
    """Every replica but ts3 refuses with NOT_LEADER and no hint; 32 concurrent writes find
    ts3 through ListTablets, and the refreshes are rate-limited (the fake clock stands still,
    so one round serves all of them)."""
    cluster = AsyncFakeCluster()
    cluster.servers["ts1"].script("write", not_leader())
    cluster.servers["ts2"].script("write", not_leader())
    cluster.servers["ts3"].script("write", ok)
    cluster.servers["ts3"].leads = {"kv-p0", "kv-p1"}

    async def main() -> None:
        c = await fake_client(cluster)
        c._meta.set_leader("kv-p0", "ts1")
        c._meta.set_leader("kv-p1", "ts1")
        await asyncio.gather(*(c.insert("kv", {"key": k}) for k in range(32)))
        assert c.stats.leader_refreshes == 1
        assert c.stats.rows_acked == 32
        assert await c.leader_of("kv-p0") == "ts3"
        applied = cluster.servers["ts3"].requests["write"]
        assert sorted(r.request_id.seq_no for r in applied) == list(range(1, 33))

    run(main())


def test_busy_until_the_deadline_raises_server_too_busy() -> None:
    cluster = AsyncFakeCluster()
    for s in cluster.servers.values():
        s.script("write", queue_full())
    cluster.servers["ts1"].leads = {"kv-p0", "kv-p1"}
    clock = AsyncFakeClock()

    async def main() -> None:
        c = await fake_client(cluster, clock, timeout_s=2.0)
        start = clock.now
        with pytest.raises(ServerTooBusy) as info:
            await c.insert("kv", {"key": 5, "value": "x"})
        assert clock.now <= start + 2.0
        assert info.value.row_index == 0
        # Every attempt was refused before any log, and the text says so.
        assert info.value.may_have_applied is False
        assert str(info.value).endswith(
            "; it was not applied: every attempt was refused before reaching a log"
        )
        sent = [r for _, r in cluster.writes()]
        assert len(sent) > 3
        assert {r.request_id.seq_no for r in sent} == {1}
        assert [r.request_id.attempt_no for r in sent] == list(range(len(sent)))
        assert {s for s, _ in cluster.writes()} == {"ts1"}  # backoff on the same server
        assert c._tracker.outstanding() == 0
        assert c.stats.errors_by_cause == {"RESOURCE_EXHAUSTED": 1}

    run(main())


def test_no_leader_until_the_deadline_raises_not_leader() -> None:
    cluster = AsyncFakeCluster()
    for s in cluster.servers.values():
        s.script("write", not_leader())
    clock = AsyncFakeClock()

    async def main() -> None:
        c = await fake_client(cluster, clock, timeout_s=1.0)
        with pytest.raises(NotLeader):
            await c.insert("kv", {"key": 5})
        assert isinstance(NotLeader("x"), Timeout)
        # Each single-row call takes its own deadline, as apply does.
        for call in (c.insert, c.upsert, c.update, c.delete):
            start = clock.now
            with pytest.raises(NotLeader, match=r"timed out after 0\.25 s"):
                await call("kv", {"key": 5, "value": "x"} if call == c.update else {"key": 5},
                           timeout_s=0.25)  # fmt: skip
            assert clock.now <= start + 0.25

    run(main())


def test_row_errors_and_rows_refused_before_sending() -> None:
    cluster = AsyncFakeCluster()

    def key_exists(request: tablet_pb2.WriteRequest) -> tablet_pb2.WriteResponse:
        resp = tablet_pb2.WriteResponse(op_index=3, op_term=1)
        resp.row_errors.add(row_index=0, code=tablet_pb2.RowErrorPB.KEY_EXISTS, message="dup")
        return resp

    for s in cluster.servers.values():
        s.script("write", key_exists)
    cluster.servers["ts1"].leads = {"kv-p0", "kv-p1"}

    async def main() -> None:
        c = await fake_client(cluster)
        with pytest.raises(RowError) as info:
            await c.insert("kv", {"key": 1, "value": "x"})
        assert (info.value.row_index, info.value.code, info.value.message) == (
            0,
            "KEY_EXISTS",
            "dup",
        )
        with pytest.raises(RowError) as refused:
            await c.insert("kv", {"key": "not an int"})
        assert refused.value.code == "TYPE_MISMATCH"
        assert "refused by the client" in str(refused.value)
        with pytest.raises(InvalidArgument, match="unknown table"):
            await c.insert("nope", {"key": 1})
        # Arguments no write could have: refused by name, before any call.
        with pytest.raises(InvalidArgument, match="'BOGUS' is not an operation type"):
            await c.apply("BOGUS", "kv", {"key": 1})  # type: ignore[arg-type]
        for timeout in (0, -1, float("nan"), float("inf"), 1e300):
            with pytest.raises(InvalidArgument, match="timeout_s must be positive seconds"):
                await c.apply(OpType.INSERT, "kv", {"key": 1, "value": "x"}, timeout_s=timeout)
        (bogus,) = await c.write("kv", [("BOGUS", {"key": 1})])  # type: ignore[list-item]
        assert isinstance(bogus, InvalidArgument)
        assert bogus.row_index == 0
        # A row that is no mapping: InvalidArgument, not a TypeError from dict(row).
        with pytest.raises(InvalidArgument, match="a row is a mapping of column name"):
            await c.insert("kv", None)  # type: ignore[arg-type]
        (not_a_row,) = await c.write("kv", [(OpType.INSERT, [1, 2])])  # type: ignore[list-item]
        assert isinstance(not_a_row, InvalidArgument)
        assert not_a_row.row_index == 0
        assert len(cluster.writes()) == 1
        assert c.stats.errors_by_cause == {
            "KEY_EXISTS": 1,
            "TYPE_MISMATCH": 1,
            "INVALID_ARGUMENT": 2,  # the operations of write()'s, each one of its results
        }

    run(main())


def test_write_batches_per_tablet_and_reports_errors_by_position() -> None:
    cluster = AsyncFakeCluster()

    def second_row_exists(request: tablet_pb2.WriteRequest) -> tablet_pb2.WriteResponse:
        resp = tablet_pb2.WriteResponse(op_index=3, op_term=1)
        if rows_in(request) > 1:
            resp.row_errors.add(row_index=1, code=tablet_pb2.RowErrorPB.KEY_EXISTS, message="d")
        return resp

    for s in cluster.servers.values():
        s.script("write", second_row_exists)
    cluster.servers["ts1"].leads = {"kv-p0", "kv-p1"}

    async def main() -> None:
        c = await fake_client(cluster, max_batch_rows=4)
        p0 = [k for k in range(100) if c.tablet_for("kv", {"key": k}) == "kv-p0"][:6]
        p1 = [k for k in range(100) if c.tablet_for("kv", {"key": k}) == "kv-p1"][:3]
        ops: list[tuple[OpType, dict[str, object]]] = [
            (OpType.INSERT, {"key": k, "value": "v"}) for k in [*p0, *p1]
        ]
        ops.append((OpType.UPSERT, {"key": "bad"}))
        errors = await c.write("kv", ops)
        sent = [r for _, r in cluster.writes()]
        # kv-p0: 6 rows in batches of 4 and 2 (in order); kv-p1: one batch of 3.
        assert sorted((r.tablet_id, rows_in(r)) for r in sent) == [
            ("kv-p0", 2),
            ("kv-p0", 4),
            ("kv-p1", 3),
        ]
        assert sorted(r.request_id.seq_no for r in sent) == [1, 2, 3]
        # Row 1 of each multi-row batch: ops positions 1, 5 (p0) and 7 (p1); then the bad row.
        assert [e.row_index for e in errors] == [1, 5, 7, 9]
        assert [getattr(e, "code", "") for e in errors] == [
            "KEY_EXISTS",
            "KEY_EXISTS",
            "KEY_EXISTS",
            "TYPE_MISMATCH",
        ]
        assert errors[0].row == {"key": p0[1], "value": "v"}

    run(main())


def test_tablet_not_found_on_every_replica() -> None:
    cluster = AsyncFakeCluster()
    missing = FakeRpcError(grpc.StatusCode.NOT_FOUND, "tablet 'kv-p0' not found")
    for s in cluster.servers.values():
        s.script("write", missing)

    async def main() -> None:
        c = await fake_client(cluster)
        with pytest.raises(TabletNotFound):
            await c.insert("kv", {"key": 0, "value": "x"})
        assert len(cluster.writes()) == 3

    run(main())


def test_connect_from_config_retries_seeds_and_close_refuses_writes(tmp_path: Path) -> None:
    """The first seed is unreachable, the second answers; after close() writes raise
    ClientClosed."""
    cluster = AsyncFakeCluster()
    cluster.servers["ts1"].script("config", unavailable())
    cluster.servers["ts2"].script("config", config_pb())
    config = tmp_path / "cluster.toml"
    config.write_text(
        '[cluster]\nname = "fake"\n'
        + "".join(
            f'[[servers]]\nid = "{s}"\nrpc_addr = "{addr(s)}"\nhttp_addr = "{s}.fake:8051"\n'
            for s in ("ts1", "ts2")
        )
    )

    async def main() -> None:
        async with AsyncClient.from_config(config, stubs=cluster) as c:
            assert c.tables() == ["kv"]
            assert c.tablets("kv") == ["kv-p0", "kv-p1"]
            assert c.stats.config_fetches == 1
        assert c.closed
        with pytest.raises(ClientClosed):
            await c.insert("kv", {"key": 1})

    run(main())


def test_from_config_reads_the_file_as_the_servers_do(tmp_path: Path) -> None:
    """The file is loaded by raftlet.cluster, so a config the servers would refuse is refused
    here too, with their file:line message, before any server is asked."""
    config = tmp_path / "cluster.toml"
    config.write_text(
        '[cluster]\nname = "fake"\n\n[[servers]]\nid = "ts1"\n'
        'rpc_addr = "ts1.fake:7051"\nhttp_addr = "ts1.fake:7051"\n'
    )
    expected = f"{config}:7: servers[0].http_addr: 'ts1.fake:7051' is also this server's rpc_addr"
    with pytest.raises(InvalidArgument) as info:
        AsyncClient.from_config(config, stubs=AsyncFakeCluster())  # raises before awaiting
    assert str(info.value) == expected


def test_no_seed_answers_times_out() -> None:
    cluster = AsyncFakeCluster()
    clock = AsyncFakeClock()

    async def main() -> None:
        with pytest.raises(Timeout, match="fetching the cluster config"):
            await AsyncClient.connect(
                [addr("ts1")],
                stubs=cluster,
                clock=clock.clock,
                sleep=clock.async_sleep,
                timeout_s=1.0,
            )

    run(main())


async def connect_to_two(cluster: AsyncFakeCluster, clock: AsyncFakeClock) -> AsyncClient:
    return await AsyncClient.connect(
        [addr("ts1"), addr("ts2")],
        stubs=cluster,
        clock=clock.clock,
        sleep=clock.async_sleep,
        timeout_s=30.0,
    )


_SOCKET_CLOSED = "failed to connect to all addresses; last error: UNAVAILABLE: x: Socket closed"


@pytest.mark.parametrize(
    ("refusal", "said", "rounds"),
    [
        # Every server of a cluster takes the same tokens and certificates: the first
        # refusal is the answer, not something to retry until the deadline (30 s of
        # "invalid bearer token" in a review).
        (FakeRpcError(grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token"), "invalid", 1),
        # No server's certificate verifying: the client's CA (--tls-ca), which no retry
        # changes (one server's alone may have expired: the next test).
        (certificate_unverified(), "could not verify the server's certificate", 1),
        # Review r27a: a client certificate of another CA (every server closes the
        # connection at the handshake) retried for the whole 30 s. Two rounds, not one: a
        # server closes connections as it stops.
        (FakeRpcError(grpc.StatusCode.UNAVAILABLE, _SOCKET_CLOSED), "check the client's CA", 2),
    ],
)
def test_a_refusal_from_every_server_fails_the_config_fetch_at_once(
    refusal: FakeRpcError, said: str, rounds: int
) -> None:
    cluster = AsyncFakeCluster()
    clock = AsyncFakeClock()
    for s in cluster.servers.values():
        s.script("config", refusal)
    with pytest.raises(RemoteError, match=said):
        run(connect_to_two(cluster, clock))
    assert len(clock.sleeps) == rounds - 1  # a backoff between rounds, if any
    # The threaded client's meta cache, the same (retried, it would end in a Timeout).
    meta = MetaCache([addr("ts1"), addr("ts2")], cluster.cluster, StatsRecorder())
    with pytest.raises(RemoteError, match=said):
        meta.load(time.monotonic() + 30.0, 30.0)


def test_one_server_closing_the_handshake_while_another_is_down_is_retried() -> None:
    """A server stopping closes connections too: not taken for a refused certificate."""
    cluster = AsyncFakeCluster()
    cluster.servers["ts1"].script(
        "config", FakeRpcError(grpc.StatusCode.UNAVAILABLE, _SOCKET_CLOSED)
    )
    cluster.servers["ts2"].script("config", unavailable())
    meta = MetaCache([addr("ts1"), addr("ts2")], cluster.cluster, StatsRecorder())
    with pytest.raises(Timeout):
        meta.load(time.monotonic() + 0.3, 0.3)


def test_a_server_whose_certificate_does_not_verify_is_passed_over_for_the_config() -> None:
    """Review r27a: ts1's certificate expired, and every new client failed at once on it
    (the first seed) while ts2 and ts3 served every tablet."""
    cluster = AsyncFakeCluster()
    clock = AsyncFakeClock()
    cluster.servers["ts1"].script("config", certificate_unverified())
    cluster.servers["ts2"].script("config", config_pb())

    async def main() -> None:
        await (await connect_to_two(cluster, clock)).close()

    run(main())
    assert clock.sleeps == []
    meta = MetaCache([addr("ts1"), addr("ts2")], cluster.cluster, StatsRecorder())
    meta.load(time.monotonic() + 2.0, 2.0)


def test_leader_step_down_goes_to_the_leader() -> None:
    from raftlet.proto import admin_pb2

    cluster = AsyncFakeCluster()
    cluster.servers["ts2"].leads = {"kv-p0", "kv-p1"}
    cluster.servers["ts2"].script("step_down", admin_pb2.LeaderStepDownResponse())

    async def main() -> None:
        c = await fake_client(cluster)
        assert await c.leader_step_down("kv-p0", "ts3") == "ts2"
        (request,) = cluster.servers["ts2"].requests["step_down"]
        assert request.new_leader_uuid == "ts3"
        with pytest.raises(InvalidArgument):
            await c.leader_step_down("kv-p0", "ts9")

    run(main())


def test_write_cuts_a_tablets_rows_by_bytes_too() -> None:
    # Forty 1 MiB rows had gone in one 40 MiB request and failed whole as MessageTooLarge.
    cluster = AsyncFakeCluster()
    for s in cluster.servers.values():
        s.script("write", tablet_pb2.WriteResponse(op_index=3, op_term=1))
    cluster.servers["ts1"].leads = {"kv-p0", "kv-p1"}

    async def main() -> None:
        c = await fake_client(cluster, max_batch_rows=1000, max_batch_bytes=2500)
        keys = [k for k in range(100) if c.tablet_for("kv", {"key": k}) == "kv-p0"][:5]
        ops = [(OpType.INSERT, {"key": k, "value": "x" * 1000}) for k in keys]
        assert await c.write("kv", ops) == []
        sent = [rows_in(r) for _, r in cluster.writes()]
        assert sorted(sent) == [1, 2, 2]  # two ~1 KB rows fit under 2,500 bytes, not three
        with pytest.raises(InvalidArgument, match="max_batch_bytes must be at least 1"):
            await fake_client(cluster, max_batch_bytes=0)

    run(main())


def test_a_call_its_closing_channel_cancelled_fails_as_cancelled_not_as_a_cancelled_task() -> None:
    # grpc.aio raises CancelledError in the awaiting task when the call's channel closes: a
    # client closed during a leader look-up raised it into the caller (past `except
    # Exception`), instead of the ClientClosed the retry loop makes of CANCELLED.
    async def cancelled_call() -> None:
        raise asyncio.CancelledError()

    async def main() -> None:
        with pytest.raises(StreamedRpcError) as failed:
            await _unary(cancelled_call)
        assert failed.value.code() is grpc.StatusCode.CANCELLED
        # A task that is itself cancelled stays cancelled.
        waiting = asyncio.ensure_future(_unary(lambda: asyncio.sleep(30)))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    run(main())


def test_closing_the_client_while_a_write_port_opens_fails_no_writer_as_cancelled() -> None:
    """Closing the channels cancelled the opening's WriteEndpoint call: the opening task
    ended cancelled, and every write waiting on it raised CancelledError -- read by
    gather() and TaskGroups as their own cancellation -- instead of ClientClosed."""
    from raftlet.client.aio_tcp_writes import open_tcp_write_stream

    class ClosingStub:
        async def WriteEndpoint(self, *_a: object, **_k: object) -> object:
            raise asyncio.CancelledError()

    async def main() -> None:
        opening = asyncio.ensure_future(
            open_tcp_write_stream("127.0.0.1:1", ClosingStub())  # type: ignore[arg-type]
        )
        assert await opening is None  # no port: the writes go the gRPC way, which says closed
        assert not opening.cancelled()

    run(main())


def test_a_client_used_from_another_event_loop_says_so_at_once() -> None:
    """Its connections belong to the loop it connected in: from another, a write was sent
    and applied, and its answer waited for a reader that never ran -- a Timeout after the
    whole deadline, for a write that had succeeded."""
    cluster = AsyncFakeCluster()
    for s in cluster.servers.values():
        s.script("write", *[ok] * 4)

    async def connect() -> AsyncClient:
        c = await fake_client(cluster)
        await c.upsert("kv", {"key": 1, "value": "v"})
        return c

    client = asyncio.run(connect())

    async def elsewhere() -> None:
        with pytest.raises(InvalidArgument, match="connected in an event loop that has ended"):
            await client.upsert("kv", {"key": 2, "value": "v"})
        with pytest.raises(InvalidArgument, match=r"close it \(from any loop\) and connect a new"):
            await client.leader_of("kv-p0", refresh=True)

    asyncio.run(elsewhere())
    assert len(cluster.writes()) == 1  # nothing sent from the other loop


def test_a_client_whose_loop_runs_is_closed_only_in_that_loop() -> None:
    """Closed from another loop while its own ran, it said it was closed and left its
    sockets open for good (no later close could reach them)."""
    cluster = AsyncFakeCluster()
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    try:
        client = asyncio.run_coroutine_threadsafe(fake_client(cluster), loop).result(30)

        async def elsewhere() -> None:
            with pytest.raises(InvalidArgument, match="another event loop: use it only from"):
                await client.upsert("kv", {"key": 2, "value": "v"})
            with pytest.raises(InvalidArgument, match="close it in that one"):
                await client.close()

        asyncio.run(elsewhere())
        assert not client.closed
        asyncio.run_coroutine_threadsafe(client.close(), loop).result(30)
        assert client.closed
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(30)
        loop.close()


def test_a_client_whose_loop_ended_is_closed_from_another() -> None:
    """``asyncio.run(main())`` returned with the client open: its loop is gone, so a close
    elsewhere cannot race it (it was refused -- "close it in that one, before that loop
    ends" -- which could no longer be done; tests/integration/test_client_close.py shows
    the connections end)."""
    cluster = AsyncFakeCluster()
    client = asyncio.run(fake_client(cluster))
    asyncio.run(client.close())
    assert client.closed


def test_call_timeouts_are_checked_like_the_writes_ones() -> None:
    """A NaN deadline kept a step-down's retries going for ever; a timeout of 0 made
    list_tablets answer {} -- as if every server were down."""
    cluster = AsyncFakeCluster()

    async def main() -> None:
        c = await fake_client(cluster)
        for bad in (float("nan"), -1, 0, float("inf")):
            with pytest.raises(InvalidArgument, match="timeout_s must be positive seconds"):
                await c.leader_step_down("kv-p0", timeout_s=bad)
            with pytest.raises(InvalidArgument, match="timeout_s must be positive seconds"):
                await c.list_tablets(timeout_s=bad)
        await c.close()

    run(main())


def test_malformed_operations_are_invalid_arguments_not_tracebacks() -> None:
    cluster = AsyncFakeCluster()
    for s in cluster.servers.values():
        s.script("write", *[ok] * 4)

    async def main() -> None:
        c = await fake_client(cluster)
        with pytest.raises(InvalidArgument, match="iterable of \\(OpType, row\\) pairs, not int"):
            await c.write("kv", 5)  # type: ignore[arg-type]
        for whole in ("ab", b"ab", {"key": 1}):  # iterable, but not of pairs
            with pytest.raises(InvalidArgument, match="iterable of \\(OpType, row\\) pairs"):
                await c.write("kv", whole)  # type: ignore[arg-type]
        errors = await c.write(
            "kv",
            [5, (OpType.INSERT, {"key": 1}, 3), (OpType.UPSERT, {"key": 2, "value": "v"})],  # type: ignore[list-item]
        )
        assert [(type(e), e.row_index) for e in errors] == [
            (InvalidArgument, 0),
            (InvalidArgument, 1),
        ]
        assert "an operation is an (OpType, row) pair, not 5" in str(errors[0])
        assert len(cluster.writes()) == 1  # the good one went
        await c.close()

    run(main())


def test_a_connect_not_awaited_says_to_await_it() -> None:
    """It raised a bare AttributeError naming a private class (review r33b)."""
    connecting = AsyncClient.connect([addr("ts1")], stubs=AsyncFakeCluster())
    with pytest.raises(AttributeError, match=r"'insert': AsyncClient.connect\(\) and "):
        connecting.insert  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'no_such'"):
        connecting.no_such  # noqa: B018


def test_async_with_a_client_not_yet_connected_connects_it() -> None:
    cluster = AsyncFakeCluster()
    cluster.servers["ts1"].script("config", config_pb())
    for s in cluster.servers.values():
        s.script("write", ok)
    clock = AsyncFakeClock()

    async def main() -> None:
        client = AsyncClient(
            [addr("ts1")], stubs=cluster, clock=clock.clock, sleep=clock.async_sleep
        )
        with pytest.raises(InvalidArgument, match="has not fetched the cluster config yet"):
            await client.insert("kv", {"key": 1})
        async with client as c:
            await c.upsert("kv", {"key": 1, "value": "v"})
        assert client.closed

    run(main())


def test_a_look_up_the_close_cut_short_leaves_no_exception_unread() -> None:
    """Closing an AsyncClient under thousands of writes logged thousands of "Task exception
    was never retrieved" (review r30b): a look-up read the first ClientClosed and left the
    other servers' calls, ended or still out, unread."""
    cluster = AsyncFakeCluster()
    unread: list[dict[str, Any]] = []

    async def go() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: unread.append(ctx))
        client = await fake_client(cluster)
        late = asyncio.Event()

        async def closed(_timeout: float) -> tablet_pb2.ListTabletsResponse:
            raise ClientClosed("the client is closed")

        async def closed_later(_timeout: float) -> tablet_pb2.ListTabletsResponse:
            await late.wait()
            raise ClientClosed("the client is closed")

        stubs = cluster._stubs
        stubs[addr("ts1")].list_tablets = closed  # type: ignore[method-assign]
        stubs[addr("ts2")].list_tablets = closed  # type: ignore[method-assign]
        stubs[addr("ts3")].list_tablets = closed_later  # type: ignore[method-assign]
        with pytest.raises(ClientClosed):
            await client._meta.list_tablets(1.0)
        late.set()
        for _ in range(5):
            await asyncio.sleep(0)
        gc.collect()

    run(go())
    assert [c.get("message") for c in unread] == []
