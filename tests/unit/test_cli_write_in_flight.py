"""``raftlet write --in-flight``: how the writer options resolve, the asyncio load on fake
servers, and the server-CPU figures (parsing ``/metrics``, differences, the summary's
JSON)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from raftlet.cli import write_async
from raftlet.cli.common import Target, UsageError
from raftlet.cli.main import build_parser
from raftlet.cli.server_cpu import CpuReading, ServerCpu, parse_cpu_reading, parse_cpu_seconds
from raftlet.cli.write_cmd import check_writers
from raftlet.cli.write_load import LoadSummary
from raftlet.client.aio import AsyncClient
from raftlet.cluster import ClusterConfig
from tests.unit.client_aio_fakes import AsyncFakeCluster, fake_client
from tests.unit.client_fakes import KV_SCHEMA, ok, rows_in


def test_parse_cpu_seconds_finds_the_sample_with_or_without_labels() -> None:
    text = (
        "# HELP process_cpu_seconds CPU\n"
        "# TYPE process_cpu_seconds counter\n"
        "process_cpu_seconds_totalx 9\n"
        'process_cpu_seconds_total{server="ts1"} 12.5\n'
    )
    assert parse_cpu_seconds(text) == 12.5
    assert parse_cpu_seconds("process_cpu_seconds_total 3.25\n") == 3.25
    assert parse_cpu_seconds("rpcs_queue_overflow_total 1\n") is None


def test_server_cpu_between_two_readings() -> None:
    old = CpuReading  # a server too old to say when it started: a counter gone down
    cpu = ServerCpu.between(
        {"ts1": old(1.0), "ts2": old(2.0), "ts3": None, "ts4": old(9.0)},
        {"ts1": old(1.5), "ts2": old(3.0), "ts3": old(4.0), "ts4": old(0.5)},
    )
    assert cpu.by_server == {"ts1": 0.5, "ts2": 1.0, "ts3": None, "ts4": None}
    assert cpu.total_s == 1.5
    assert cpu.missing == ["ts3", "ts4"]
    assert (cpu.restarted, cpu.unread) == (("ts4",), ["ts3"])
    assert cpu.ms_per_write(1000) == pytest.approx(1.5)
    assert cpu.ms_per_write(0) is None
    assert ServerCpu.between({"ts1": None}, {"ts1": old(2.0)}).total_s is None


def test_a_server_restarted_during_the_run_has_no_cpu_figure() -> None:
    """Review r31a: the new process's counter less the old one's first reading passed for
    the server's CPU (44 s where it used ~134 s), and the summary said nothing."""
    cpu = ServerCpu.between(
        {"ts1": CpuReading(1.5, 100.0), "ts3": CpuReading(1.48, 100.0)},
        {"ts1": CpuReading(90.0, 100.0), "ts3": CpuReading(42.85, 400.0)},
    )
    assert cpu.by_server == {"ts1": 88.5, "ts3": None}
    assert cpu.restarted == ("ts3",)
    text = (
        "# TYPE process_cpu_seconds counter\n"
        'process_cpu_seconds_total{server="ts1"} 12.5\n'
        "# TYPE process_start_time_seconds gauge\n"
        'process_start_time_seconds{server="ts1"} 1.7e9\n'
    )
    assert parse_cpu_reading(text) == CpuReading(12.5, 1.7e9)
    assert parse_cpu_reading("process_cpu_seconds_total 3.25\n") == CpuReading(3.25)
    assert parse_cpu_reading("process_start_time_seconds 3\n") is None


def _summary(**kwargs: object) -> LoadSummary:
    base: dict[str, object] = {
        "table": "kv",
        "threads": None,
        "flush_mode": "sync",
        "row_bytes": 100,
        "elapsed_s": 2.0,
        "rows": 400,
        "writes": 400,
        "latency_us": dict.fromkeys(("p50", "p95", "p99", "p99.9", "max"), 1.0),
        "retries_by_cause": {},
        "errors_by_cause": {},
        "first_error": "",
        "interrupted": False,
    }
    base.update(kwargs)
    return LoadSummary(**base)  # type: ignore[arg-type]


def test_summary_json_has_the_in_flight_and_server_cpu_figures() -> None:
    one = CpuReading(1.0, 5.0)
    cpu = ServerCpu.between(
        {"ts1": one, "ts2": one, "ts3": one},
        {"ts1": CpuReading(1.6, 5.0), "ts2": CpuReading(1.2, 5.0), "ts3": CpuReading(0.1, 9.0)},
    )
    doc = _summary(in_flight=16, server_cpu=cpu).to_json()
    assert (doc["threads"], doc["in_flight"], doc["client"]) == (None, 16, "asyncio")
    assert doc["server_cpu_s"] == pytest.approx(0.8)
    assert doc["server_cpu_ms_per_write"] == pytest.approx(2.0)
    assert doc["server_cpu_s_by_server"] == {
        "ts1": pytest.approx(0.6),
        "ts2": pytest.approx(0.2),
        "ts3": None,
    }
    assert doc["server_cpu_restarted"] == ["ts3"]
    assert doc["server_cpu_unread"] == []
    # One killed and still starting at the end: no reading after, named apart (review r33a).
    unread = ServerCpu.between({"ts1": one, "ts2": one}, {"ts1": CpuReading(1.5, 5.0), "ts2": None})
    unread_doc = _summary(in_flight=16, server_cpu=unread).to_json()
    assert (unread_doc["server_cpu_restarted"], unread_doc["server_cpu_unread"]) == ([], ["ts2"])
    threaded = _summary(threads=4).to_json()
    assert (threaded["threads"], threaded["in_flight"], threaded["client"]) == (4, None, "threads")
    assert threaded["server_cpu_s"] is None
    assert threaded["server_cpu_ms_per_write"] is None
    assert (threaded["client_cpu_s"], threaded["client_cpu_ms_per_write"]) == (None, None)


def test_client_cpu_per_write_is_the_writers_cpu_over_its_acknowledged_writes() -> None:
    doc = _summary(client_cpu_s=0.3).to_json()  # 400 writes
    assert doc["client_cpu_s"] == pytest.approx(0.3)
    assert doc["client_cpu_ms_per_write"] == pytest.approx(0.75)
    assert _summary(client_cpu_s=0.3, writes=0, rows=0).client_cpu_ms_per_write is None


def test_in_flight_load_writes_each_row_once_with_n_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """50 rows with 8 writes in flight against fake servers: 50 acknowledged writes of one
    row each, 50 distinct keys, never more than 8 outstanding."""
    cluster = AsyncFakeCluster()
    in_flight = [0]
    peak = [0]

    async def write(request: object) -> object:
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await asyncio.sleep(0)
        in_flight[0] -= 1
        return ok()

    for s in cluster.servers.values():
        s.script("write", write)
    cluster.servers["ts1"].leads = {"kv-p0", "kv-p1"}

    async def connect(_target: Target, timeout_s: float) -> AsyncClient:
        return await fake_client(cluster, timeout_s=timeout_s)

    monkeypatch.setattr(write_async, "_connect", connect)
    target = Target(ClusterConfig.__new__(ClusterConfig), Path("cluster.toml"), ())
    ticks: list[float] = []
    summary = write_async.run_load_async(
        target,
        "kv",
        KV_SCHEMA,
        rows=50,
        duration_s=None,
        in_flight=8,
        row_bytes=10,
        timeout_s=5.0,
        on_tick=lambda elapsed, _stats, _shared: ticks.append(elapsed),
    )
    assert (summary.rows, summary.writes, summary.in_flight) == (50, 50, 8)
    assert summary.client_cpu_s is not None
    assert summary.client_cpu_s > 0
    assert summary.failed_rows == 0
    assert summary.interrupted is False
    assert ticks
    sent = [r for _, r in cluster.writes()]
    assert all(rows_in(r) == 1 for r in sent)
    assert len({r.row_block.SerializeToString() for r in sent}) == 50
    assert 1 < peak[0] <= 8


@pytest.mark.parametrize(
    ("argv", "resolved"),
    [
        # (flush mode, threads, asyncio in flight, batches in flight per session, batch rows)
        ([], ("sync", 4, None, None, 100)),
        (["--in-flight", "8"], ("sync", None, 8, None, 100)),
        (["--batch-rows", "1000", "--in-flight", "4"], ("background", 1, None, 4, 1000)),
        (
            ["--flush-mode", "background", "--in-flight", "3", "--threads", "2"],
            ("background", 2, None, 3, 100),
        ),
        (["--flush-mode", "manual", "--batch-rows", "50"], ("manual", 4, None, None, 50)),
        # Batches of N, never a sync load that ignores N.
        (["--batch-rows", "1000"], ("background", 4, None, None, 1000)),
    ],
)
def test_writer_options_resolve_to_one_load(argv: list[str], resolved: tuple[object, ...]) -> None:
    args = build_parser().parse_args(["write", "--data-dir", "x", "--rows", "5", *argv])
    check_writers(args)
    got = (args.flush_mode, args.threads, args.in_flight, args.batches_in_flight, args.batch_rows)
    assert got == resolved


def test_batch_rows_with_a_sync_session_is_a_usage_error() -> None:
    args = build_parser().parse_args(
        ["write", "--data-dir", "x", "--rows", "5", "--batch-rows", "50", "--flush-mode", "sync"]
    )
    with pytest.raises(UsageError, match="--batch-rows with --flush-mode sync"):
        check_writers(args)
