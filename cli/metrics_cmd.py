"""``raftlet metrics``: the key metrics of each server, in human units.

Reads each server's ``/metrics.json`` (the Kudu-style JSON of its registry) and boils the
hundreds of series down to the figures that tell whether a server is healthy under load
and where it is contended: queue overflows and queue time (is the service pool keeping
up?), consensus lock contention and term checks (KUDU-2727: do writes wait for the
consensus lock?), write ops, WAL fsync latency, elections, and what the tablets' WAL and
row stores take on disk.

Aggregation, per server: counters are summed over tablets and labels; for latency, the
server-level histograms (queue time, handler latency) are shown as they are, while the
per-tablet ones (lock wait, fsync) show the worst tablet's figure, because histogram
percentiles of different tablets cannot be added. The JSON has no median (it keeps
Kudu's histogram fields: mean, p75, p95, p99, …, pinned by a test), so the typical queue
time shown is the mean, labelled as such. The cluster column sums counters and takes the
worst server's latency. Uptime and CPU time come from the server entity's process figures
(a server older than them shows "-").
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from raftlet.cli.common import (
    CliError,
    Credentials,
    UsageError,
    add_target_arguments,
    console,
    err_console,
    human_count,
    human_us,
    resolve_target,
    timeout_seconds,
)
from raftlet.cluster import ServerConfig
from raftlet.metrics.human import human_bytes, human_duration

__all__ = ["KEY_METRICS", "KeyMetric", "add_parser", "key_metrics", "run"]

_EPILOG = """\
examples:
  raftlet metrics --data-dir ./c1
  raftlet metrics --data-dir ./c1 --server ts2
  raftlet metrics --data-dir ./c1 --filter lock        # rows whose name or metric has "lock"
  raftlet metrics --servers 127.0.0.1:7051 --format json

All of every server's metrics: http://<status address>/metrics.json (or /metrics for
Prometheus); `raftlet cluster status` prints the status addresses.
Counters count since each server process started (the uptime row): a server restarted
since counts from zero again, and the cluster column, their sum, then counts less than the
cluster did (its uptime is the youngest server's).
Exit status: 0 when every server answered, 1 when one did not (the others are shown).
"""

Entity = dict[str, Any]


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    p = commands.add_parser(
        "metrics",
        help="key server metrics in human units (contention, queues, writes)",
        description=(
            "Show each server's key metrics: RPC queue overflows and queue time, consensus "
            "lock contention, term checks, write ops, WAL fsync latency, elections, WAL and "
            "store bytes on disk."
        ),
        epilog=_EPILOG,
        formatter_class=formatter,
        allow_abbrev=False,
    )
    add_target_arguments(p)
    p.add_argument(
        "--server",
        metavar="ID|ADDR",
        type=_server_arg,
        help="only this server (its id, RPC address or status address or URL)",
    )
    p.add_argument(
        "--filter",
        metavar="SUBSTR",
        help="only rows whose label or metric name contains SUBSTR (case-insensitive)",
    )
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=5.0,
        metavar="S",
        help="per-server HTTP timeout (default 5)",
    )


def _server_arg(text: str) -> str:
    """A server id or address; a status URL as `cluster status` prints it is its address."""
    value = text.strip()
    if "://" in value:
        value = value.split("://", 1)[1]
    value = value.split("/", 1)[0]
    if not value:
        raise argparse.ArgumentTypeError(f"{text!r} names no server")
    return value


# --- reading /metrics.json -------------------------------------------------------------------


def _metrics(doc: Iterable[Entity], name: str, etype: str, **labels: str) -> list[dict[str, Any]]:
    out = []
    for entity in doc:
        if entity.get("type") != etype:
            continue
        for m in entity.get("metrics", []):
            if m.get("name") != name:
                continue
            have = m.get("labels", {})
            if all(have.get(k) == v for k, v in labels.items()):
                out.append(m)
    return out


def _sum(name: str, etype: str, **labels: str) -> Callable[[list[Entity]], float]:
    def get(doc: list[Entity]) -> float:
        return float(sum(m.get("value") or 0 for m in _metrics(doc, name, etype, **labels)))

    return get


def _hist_count(name: str, etype: str, **labels: str) -> Callable[[list[Entity]], float]:
    def get(doc: list[Entity]) -> float:
        return float(sum(m.get("total_count") or 0 for m in _metrics(doc, name, etype, **labels)))

    return get


def _hist(
    name: str, etype: str, field: str, **labels: str
) -> Callable[[list[Entity]], float | None]:
    """A histogram field; of several series (tablets), the largest. None if never observed."""

    def get(doc: list[Entity]) -> float | None:
        values = []
        for m in _metrics(doc, name, etype, **labels):
            if not m.get("total_count"):
                continue
            v = m.get(field)
            if v is not None:
                values.append(float(v))
        return max(values) if values else None

    return get


def _server_value(name: str) -> Callable[[list[Entity]], float | None]:
    """The server entity's ``name``; None if it has none (a server older than it)."""

    def get(doc: list[Entity]) -> float | None:
        series = _metrics(doc, name, "server")
        value = series[0].get("value") if series else None
        return None if value is None else float(value)

    return get


def _uptime(doc: list[Entity]) -> float | None:
    # This machine's clock against the server's start: skew between them shows in it.
    started = _server_value("process_start_time_seconds")(doc)
    return None if started is None else max(0.0, time.time() - started)


def _leaders(doc: list[Entity]) -> float:
    # raft_role 3 = LEADER (metrics.catalogue.RAFT_ROLE_VALUES).
    return float(sum(1 for m in _metrics(doc, "raft_role", "tablet") if m.get("value") == 3))


@dataclass(frozen=True, slots=True)
class KeyMetric:
    key: str  # stable name for --format json and --filter
    label: str
    metric: str  # the underlying catalogue name, also matched by --filter
    unit: str  # "count", "us", "ratio", "bytes" or "seconds"
    get: Callable[[list[Entity]], float | None]
    # Across servers: counters add up; percentiles and means of different servers cannot,
    # so the cluster column shows the worst server's ("max"), and uptime the youngest's
    # ("min": the sums count from then at least).
    aggregate: str = "sum"


# The rows, in display order. Labels say "worst tablet" where a per-tablet histogram is
# reduced to its maximum, so nobody reads it as a server-wide percentile.
KEY_METRICS: tuple[KeyMetric, ...] = (
    KeyMetric(
        "uptime",
        "uptime (counters count from its start)",
        "process_start_time_seconds",
        "seconds",
        _uptime,
        aggregate="min",
    ),
    KeyMetric(
        "cpu_time",
        "CPU time used",
        "process_cpu_seconds",
        "seconds",
        _server_value("process_cpu_seconds"),
    ),
    KeyMetric("leaders", "tablet leaders hosted", "raft_role", "count", _leaders),
    KeyMetric(
        "failed_replicas",
        "replicas FAILED (why: cluster status)",
        "tablet_failed",
        "count",
        _sum("tablet_failed", "tablet"),
    ),
    KeyMetric(
        "write_ops",
        "write ops applied (all replicas)",
        "write_ops_total",
        "count",
        _sum("write_ops_total", "tablet"),
    ),
    KeyMetric(
        "failed_calls",
        "calls answered with an error (not counting those sent elsewhere)",
        "rpcs_failed",
        "count",
        lambda doc: _failed_calls(doc)[0],
    ),
    KeyMetric(
        "redirects",
        "calls sent elsewhere (leader moved: NOT_LEADER, LEADER_NOT_READY)",
        "rpcs_failed",
        "count",
        lambda doc: _failed_calls(doc)[1],
    ),
    KeyMetric(
        "row_errors",
        "rows refused in writes led",
        "write_row_errors_total",
        "count",
        _sum("write_row_errors_total", "tablet"),
    ),
    *(
        KeyMetric(
            f"rows_{verb}",
            f"rows {verb} (all replicas)",
            f"rows_{verb}_total",
            "count",
            _sum(f"rows_{verb}_total", "tablet"),
        )
        for verb in ("inserted", "upserted", "updated", "deleted")
    ),
    # Disk: summed over the server's replicas (each holds its own copy of the tablet's WAL
    # and rows, so the cluster column is what the cluster's disks hold, not the data's size).
    KeyMetric(
        "wal_bytes",
        "disk: WAL (all replicas)",
        "tablet_log_bytes",
        "bytes",
        _sum("tablet_log_bytes", "tablet"),
    ),
    KeyMetric(
        "wal_segments",
        "disk: WAL segments (all replicas)",
        "tablet_log_segments",
        "count",
        _sum("tablet_log_segments", "tablet"),
    ),
    KeyMetric(
        "store_bytes",
        "disk: row stores (all replicas)",
        "tablet_store_bytes",
        "bytes",
        _sum("tablet_store_bytes", "tablet"),
    ),
    KeyMetric(
        "copy_bytes",
        "disk: tablet copies in progress",
        "tablet_copy_disk_bytes",
        "bytes",
        _sum("tablet_copy_disk_bytes", "server"),
    ),
    KeyMetric(
        "tablet_queue_overflows",
        "tablet service queue overflows",
        "rpcs_queue_overflow",
        "count",
        _sum("rpcs_queue_overflow", "server", service="tablet"),
    ),
    KeyMetric(
        "write_memory_refusals",
        "writes refused at the write memory limit",
        "write_memory_refusals_total",
        "count",
        _sum("write_memory_refusals_total", "server"),
    ),
    KeyMetric(
        "write_memory_held",
        "write memory held (admitted writes not answered)",
        "write_memory_held_bytes",
        "bytes",
        _sum("write_memory_held_bytes", "server"),
    ),
    KeyMetric(
        "consensus_queue_overflows",
        "consensus service queue overflows (unary transport)",
        "rpcs_queue_overflow",
        "count",
        _sum("rpcs_queue_overflow", "server", service="consensus"),
    ),
    KeyMetric(
        "timed_out_in_queue",
        "RPCs timed out in queue",
        "rpcs_timed_out_in_queue",
        "count",
        _sum("rpcs_timed_out_in_queue", "server"),
    ),
    KeyMetric(
        "tablet_queue_time_mean",
        "tablet queue time mean*",
        "rpc_incoming_queue_time_us",
        "us",
        _hist("rpc_incoming_queue_time_us", "server", "mean", service="tablet"),
        aggregate="max",
    ),
    KeyMetric(
        "tablet_queue_time_p99",
        "tablet queue time p99",
        "rpc_incoming_queue_time_us",
        "us",
        _hist("rpc_incoming_queue_time_us", "server", "percentile_99", service="tablet"),
        aggregate="max",
    ),
    KeyMetric(
        "consensus_queue_time_mean",
        "consensus queue time mean (unary transport)*",
        "rpc_incoming_queue_time_us",
        "us",
        _hist("rpc_incoming_queue_time_us", "server", "mean", service="consensus"),
        aggregate="max",
    ),
    KeyMetric(
        "consensus_queue_time_p99",
        "consensus queue time p99 (unary transport)",
        "rpc_incoming_queue_time_us",
        "us",
        _hist("rpc_incoming_queue_time_us", "server", "percentile_99", service="consensus"),
        aggregate="max",
    ),
    KeyMetric(
        "write_handler_p99",
        "Write handler latency p99 (unary Write calls only)",
        "handler_latency_us",
        "us",
        _hist("handler_latency_us", "server", "percentile_99", service="tablet", method="Write"),
        aggregate="max",
    ),
    KeyMetric(
        "lock_contention_time",
        "consensus lock contention (total wait)",
        "consensus_lock_contention_time_us",
        "us",
        _sum("consensus_lock_contention_time_us", "tablet"),
    ),
    KeyMetric(
        "lock_contended_acquires",
        "consensus lock contended acquires",
        "consensus_lock_wait_time_us",
        "count",
        _hist_count("consensus_lock_wait_time_us", "tablet"),
    ),
    KeyMetric(
        "lock_wait_p99",
        "consensus lock wait p99 (worst tablet)",
        "consensus_lock_wait_time_us",
        "us",
        _hist("consensus_lock_wait_time_us", "tablet", "percentile_99"),
        aggregate="max",
    ),
    KeyMetric(
        "term_checks_lockfree",
        "term checks, lock-free",
        "term_checks_total",
        "count",
        _sum("term_checks_total", "tablet", mode="lockfree"),
    ),
    KeyMetric(
        "term_checks_locked",
        "term checks, locked",
        "term_checks_total",
        "count",
        _sum("term_checks_total", "tablet", mode="locked"),
    ),
    KeyMetric(
        "wal_fsync_p99",
        "WAL fsync p99 (worst tablet)",
        "log_sync_latency_us",
        "us",
        _hist("log_sync_latency_us", "tablet", "percentile_99"),
        aggregate="max",
    ),
    KeyMetric(
        "group_commit_mean",
        "entries per fsync, mean (best tablet)",
        "log_group_commit_entries",
        "ratio",
        lambda doc: _best_mean(doc, "log_group_commit_entries"),
        aggregate="max",
    ),
    KeyMetric(
        "leader_elections",
        "leader elections won",
        "leader_elections_total",
        "count",
        _sum("leader_elections_total", "tablet"),
    ),
    KeyMetric(
        "write_replays",
        "retried writes answered from the result tracker",
        "result_tracker_replays_total",
        "count",
        _sum("result_tracker_replays_total", "tablet"),
    ),
)


# The rpcs_failed `error` labels of the answers that are part of leadership moving, which a
# client retries elsewhere or a moment later: NOT_LEADER (FAILED_PRECONDITION, as a stale
# retry is, so the gRPC code alone cannot tell them apart), LEADER_NOT_READY (a leader not
# ready yet or handing leadership over, and a write it dropped meanwhile: UNAVAILABLE, as a
# failed tablet is), and LEADERSHIP_LOST (a write in flight when its leader stepped down,
# retried with its request id: UNAVAILABLE, as a server shutting down is). TABLET_NOT_FOUND
# is not one: a client's stale location after a replica moved gets it, but so does a
# tablet id that is wrong, and the server cannot tell.
LEADER_MOVED_ERRORS = frozenset({"NOT_LEADER", "LEADER_NOT_READY", "LEADERSHIP_LOST"})


def _failed_calls(doc: list[Entity]) -> tuple[float, float | None]:
    """Calls answered with an error, and calls sent elsewhere because leadership moved,
    apart. Those are no errors: the client retries at the (next) leader and its write
    succeeds; counting them as errors made the row jump on every leader change while
    clients saw none. A server too old to label the answers (no `error` label): all its
    failures are errors, those sent elsewhere unknown."""
    series = _metrics(doc, "rpcs_failed", "server")
    total = float(sum(m.get("value") or 0 for m in series))
    if any("error" not in m.get("labels", {}) for m in series):
        return total, None
    moved = float(
        sum(m.get("value") or 0 for m in series if m["labels"]["error"] in LEADER_MOVED_ERRORS)
    )
    return total - moved, moved


def _best_mean(doc: list[Entity], name: str) -> float | None:
    means = [
        float(m["mean"])
        for m in _metrics(doc, name, "tablet")
        if m.get("total_count") and m.get("mean") is not None
    ]
    return max(means) if means else None


def key_metrics(doc: list[Entity]) -> dict[str, float | None]:
    """Every ``KEY_METRICS`` row's value for one server's /metrics.json document."""
    return {k.key: k.get(doc) for k in KEY_METRICS}


def _fetch(server: ServerConfig, timeout: float, creds: Credentials) -> list[Entity]:
    opener = creds.http_opener()  # no proxy; TLS and token for a TLS cluster
    with opener.open(creds.status_url(server.http_addr, "/metrics.json"), timeout=timeout) as r:
        doc = json.loads(r.read())
    if not isinstance(doc, list):
        raise ValueError("not a list of entities")
    return doc


def _format(unit: str, value: float | None) -> str:
    if value is None:
        return "-"
    if unit == "us":
        return human_us(value)
    if unit == "ratio":
        return f"{value:.1f}"
    if unit == "bytes":
        return human_bytes(value)
    if unit == "seconds":  # tenths below a minute: a young server's CPU is not "0s"
        return f"{value:.1f}s" if value < 60 else human_duration(value)
    return human_count(value)


# --- the command -----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    target = resolve_target(args, timeout_s=args.timeout)
    servers = list(target.config.servers)
    if args.server:
        servers = [s for s in servers if args.server in (s.id, s.rpc_addr, s.http_addr)]
        if not servers:
            known = ", ".join(s.id for s in target.config.servers)
            raise UsageError(f"--server {args.server}: no such server (servers: {known})")
    rows = list(KEY_METRICS)
    if args.filter:
        f = args.filter.lower()
        rows = [k for k in rows if f in k.label.lower() or f in k.metric or f in k.key]
        if not rows:
            raise UsageError(f"--filter {args.filter!r} matches no metric")

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(servers))) as pool:
        futures = {s.id: pool.submit(_fetch, s, args.timeout, target.creds) for s in servers}
    values: dict[str, dict[str, float | None]] = {}
    failed: dict[str, str] = {}
    for sid, fut in futures.items():
        try:
            values[sid] = key_metrics(fut.result())
        except (OSError, ValueError, urllib.error.URLError) as e:
            failed[sid] = str(getattr(e, "reason", e))
    if not values:
        raise CliError(
            "no server answered: " + "; ".join(f"{sid}: {why}" for sid, why in failed.items())
        )
    total = _totals(rows, values)
    if args.format == "json":
        doc = {
            "servers": {sid: {k.key: v[k.key] for k in rows} for sid, v in values.items()},
            "cluster": total,
            "unreachable": failed,
        }
        print(json.dumps(doc, indent=2))
    else:
        _print_table(rows, values, total, failed, [s.id for s in servers])
    for sid, why in failed.items():
        err_console().print(f"raftlet metrics: error: {sid} did not answer: {why}", markup=False)
    return 1 if failed else 0


_AGGREGATES: dict[str, Callable[[list[float]], float]] = {"sum": sum, "max": max, "min": min}


def _totals(rows: list[KeyMetric], values: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    out: dict[str, float | None] = {}
    for k in rows:
        vs = [x for v in values.values() if (x := v[k.key]) is not None]
        if not vs:
            out[k.key] = None
        else:
            out[k.key] = _AGGREGATES[k.aggregate](vs)
    return out


def _print_table(
    rows: list[KeyMetric],
    values: dict[str, dict[str, float | None]],
    total: dict[str, Any],
    failed: dict[str, str],
    order: list[str],
) -> None:
    from rich.table import Table

    out = console(stop_when_unread=True)
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("metric")
    ids = [sid for sid in order if sid in values or sid in failed]
    for sid in ids:
        table.add_column(sid, justify="right")
    if len(values) > 1:
        table.add_column("cluster", justify="right", style="bold")
    for k in rows:
        cells = [
            _format(k.unit, values[sid][k.key]) if sid in values else "[red]down[/]" for sid in ids
        ]
        if len(values) > 1:
            cells.append(_format(k.unit, total[k.key]))
        table.add_row(k.label, *cells)
    out.print(table)
    if not any(k.label.endswith("*") for k in rows):
        return
    out.print(
        "* mean, not median: /metrics.json keeps Kudu's histogram fields, which have no p50. "
        "cluster column: counters summed, latencies the worst server's.",
        style="dim",
        markup=False,
    )
