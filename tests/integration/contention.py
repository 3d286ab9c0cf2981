"""The same-tablet concurrent-writes scenario (KUDU-2727), shared by the integration test
and bench/contention.py.

A 3-server cluster, one table with an INT64 key and four STRING columns (rows of 10-50 KiB),
2 hash partitions, replication factor 3.  The servers run with a slow WAL (an injected sync
latency), a tiny group-commit queue, 2 tablet-service threads and a service queue of 3 --
Kudu's settings, scaled down -- each server's threads on one CPU, as ``raftlet cluster up``
starts them, and both tablets' leaders on the first server.  W writer threads, each with
its own client, write single rows in AUTO_FLUSH_SYNC for a fixed time, as fast as they are
acknowledged or together at a fixed rate (``Scenario.rows_per_s``).  Every figure but the
term-check counts is taken over that window -- every server's metrics read just before
the writers start and again once they stopped -- and each client has found its tablets'
leaders before it: 32 clients' start-up lookups at once are a burst of their own, not the
contention measured here (they were the lock-free mode's largest queue times when the
figures counted from server start).

With ``--term_check_mode=locked`` the holder of the consensus lock waits for room in the
WAL queue while the service threads queue behind it in the leadership check, so the
service queue overflows; lockfree service threads never wait for that lock.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raftlet.client import Client, FlushMode
from raftlet.cluster import RaftTimings
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from tests.integration.tserver_cluster import TserverCluster

SCHEMA = Schema(
    [ColumnSchema("key", DataType.INT64, is_key=True)]
    + [ColumnSchema(f"c{i}", DataType.STRING, nullable=True) for i in range(4)]
)


@dataclass(frozen=True)
class Scenario:
    writers: int = 32
    seconds: float = 10.0
    row_kib: tuple[int, int] = (10, 50)
    log_inject_latency_ms: float = 20.0
    group_commit_queue_size_bytes: int = 32 * 1024
    service_threads: int = 2
    service_queue: int = 3
    partitions: int = 2
    # Server (index into the cluster's servers) that leads tablet i while the writers run.
    # Both on one server: one service pool takes every write, as in KUDU-2727.  Left to
    # elections, the placement changed the locked mode's overflows by 2-3x between runs.
    leader_servers: tuple[int, ...] = (0, 0)
    # Every server's --cpu_affinity: one CPU each, as `raftlet cluster up` starts them
    # ("": placement left to the OS).
    cpu_affinity: str = "auto"
    # Rows per second offered by all writers together, spread evenly over them (each still
    # has at most one write in flight); 0: closed loop, every writer as fast as it is
    # acknowledged.  Closed loop (the test's setting: it overflows the locked mode's queue
    # most surely), the locked mode also writes slower -- its service threads block on one
    # tablet's lock while the other tablet's WAL idles.  Offered below what both modes
    # carry (bench/contention.py's default), both write at the same rate and only how
    # long writes wait differs.
    rows_per_s: float = 0.0
    # Every server's --write_rounds_in_flight.  0, Kudu's pipeline: every batch the
    # prepare stage takes goes to consensus at once, and so waits under the consensus
    # lock whenever the WAL's queue is full -- the wait KUDU-2727 is about.  raftlet's
    # default (1) sends a tablet's next round only once the last is applied, which keeps
    # the queue from filling in the first place (docs/contention.md, "Measured").
    write_rounds_in_flight: int = 0
    # More server flags, as given on the command line (bench/contention.py --server-flag).
    extra_flags: tuple[str, ...] = ()

    def flags(self, mode: str) -> list[str]:
        pin = ["--cpu_affinity", self.cpu_affinity] if self.cpu_affinity else []
        return [
            *pin,
            "--term_check_mode",
            mode,
            "--log_inject_latency_ms",
            str(self.log_inject_latency_ms),
            "--group_commit_queue_size_bytes",
            str(self.group_commit_queue_size_bytes),
            "--rpc_num_service_threads",
            str(self.service_threads),
            "--rpc_service_queue_length",
            str(self.service_queue),
            "--write_rounds_in_flight",
            str(self.write_rounds_in_flight),
            *self.extra_flags,
        ]


@dataclass
class ModeResult:
    mode: str
    seconds: float
    rows_acked: int
    write_rate: float
    overflows: float
    timed_out_in_queue: float
    lock_contention_us: float
    lock_wait_us: dict[str, float]
    queue_time_us: dict[str, float]
    write_handler_us: dict[str, float]
    update_consensus_handler_us: dict[str, float]
    apply_us: dict[str, float]
    term_checks_locked: float
    term_checks_lockfree: float
    # Cumulative (upper bound, count) buckets of the tablet service's queue time, all servers.
    queue_time_buckets: list[tuple[float, float]] = field(default_factory=list)
    client_retries: dict[str, int] = field(default_factory=dict)
    # tablet id -> the server that led it while the writers ran.
    leaders: dict[str, str] = field(default_factory=dict)
    writer_errors: list[str] = field(default_factory=list)
    acked_keys: set[int] = field(default_factory=set, repr=False)


# --- histograms from Prometheus buckets, merged across servers -----------------------------


@dataclass(frozen=True)
class _Metrics:
    """Every server's ``/metrics`` samples, read at one moment."""

    samples: list[Any]

    @classmethod
    def read(cls, cluster: TserverCluster) -> _Metrics:
        return cls(
            [
                sample
                for server in cluster.servers.values()
                for family in server.metric_families()
                for sample in family.samples
            ]
        )

    def _matching(self, names: tuple[str, ...], labels: dict[str, str]) -> Iterable[Any]:
        for s in self.samples:
            if s.name in names and all(s.labels.get(k) == v for k, v in labels.items()):
                yield s

    def total(self, sample_name: str, **labels: str) -> float:
        """The sum of every server's samples named ``sample_name`` with ``labels``."""
        return sum(s.value for s in self._matching((sample_name,), labels))

    def histogram(self, name: str, **labels: str) -> dict[str, Any]:
        """Histogram ``name`` merged across servers: cumulative buckets, sum and count."""
        buckets: dict[float, float] = {}
        total = count = 0.0
        names = (f"{name}_bucket", f"{name}_sum", f"{name}_count")
        for s in self._matching(names, labels):
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
            elif s.name.endswith("_sum"):
                total += s.value
            else:
                count += s.value
        return {"buckets": sorted(buckets.items()), "sum": total, "count": count}


def _window(before: _Metrics, after: _Metrics, name: str, **labels: str) -> dict[str, Any]:
    """Histogram ``name`` of what was observed between the two readings."""
    a, b = after.histogram(name, **labels), before.histogram(name, **labels)
    earlier = dict(b["buckets"])
    return {
        "buckets": [(le, c - earlier.get(le, 0.0)) for le, c in a["buckets"]],
        "sum": a["sum"] - b["sum"],
        "count": a["count"] - b["count"],
    }


def _quantile(h: dict[str, Any], q: float) -> float:
    """Linear interpolation inside the cumulative bucket that holds the q-th observation
    (what Prometheus' histogram_quantile does)."""
    count = h["count"]
    if not count:
        return 0.0
    rank = q * count
    prev_le, prev_c = 0.0, 0.0
    for le, c in h["buckets"]:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            width = c - prev_c
            frac = (rank - prev_c) / width if width else 1.0
            return prev_le + (le - prev_le) * frac
        prev_le, prev_c = le, c
    return prev_le


def summarize(h: dict[str, Any]) -> dict[str, float]:
    count = h["count"]
    return {
        "count": count,
        "mean": h["sum"] / count if count else 0.0,
        "p50": _quantile(h, 0.50),
        "p99": _quantile(h, 0.99),
        "p99.9": _quantile(h, 0.999),
    }


def _cap(summary: dict[str, float], exact_max: float) -> None:
    """Record the exact maximum; an interpolated quantile never exceeds it."""
    summary["max"] = exact_max
    for q in ("p50", "p99", "p99.9"):
        summary[q] = min(summary[q], exact_max)


def _max_from_json(cluster: TserverCluster, name: str, **labels: str) -> float:
    best = 0.0
    for server in cluster.servers.values():
        doc = json.loads(server.http(f"/metrics.json?metrics={name}"))
        for entity in doc:
            for m in entity["metrics"]:
                if m["name"] != name:
                    continue
                if any(m.get("labels", {}).get(k) != v for k, v in labels.items()):
                    continue
                best = max(best, float(m.get("max") or 0.0))
    return best


# --- running one mode ---------------------------------------------------------------------


def run_mode(root: Path, mode: str, sc: Scenario, seed: int = 2727) -> ModeResult:
    root.mkdir(parents=True, exist_ok=True)
    cluster = TserverCluster(
        root,
        partitions=sc.partitions,
        schema=SCHEMA,
        flags=sc.flags(mode),
        # Heartbeats every 100 ms and elections after 1.5-3 s: a consensus lock held for a
        # slow WAL must not look like a dead leader.
        raft=RaftTimings(tick_interval_ms=100, election_ticks=15, heartbeat_ticks=1),
    )
    try:
        cluster.start()
        cluster.wait_leaders()
        servers = [s.id for s in cluster.config.servers]
        for i, tablet_id in enumerate(sorted(cluster.tablet_ids())):
            cluster.move_leader(tablet_id, servers[sc.leader_servers[i % len(sc.leader_servers)]])
        return _drive(cluster, mode, sc, seed)
    finally:
        cluster.stop()


def _drive(cluster: TserverCluster, mode: str, sc: Scenario, seed: int) -> ModeResult:
    seeds = [s.rpc_addr for s in cluster.config.servers]
    leaders = cluster.leaders()
    acked: list[list[int]] = [[] for _ in range(sc.writers)]
    errors: list[str] = []
    retries: dict[str, int] = {}
    lock = threading.Lock()
    # Every writer warm, then the metrics read, then the writers go.
    warm = threading.Barrier(sc.writers + 1, timeout=120)
    start = threading.Barrier(sc.writers + 1, timeout=120)
    stop = threading.Event()

    def writer(slot: int) -> None:
        rng = random.Random(seed * 1000 + slot)
        client = Client(seeds, timeout_s=60.0)
        session = client.new_session(flush_mode=FlushMode.AUTO_FLUSH_SYNC, timeout_s=60.0)
        # Evenly spaced sends from a random phase: the writers must not fire together.
        interval = sc.writers / sc.rows_per_s if sc.rows_per_s > 0 else 0.0
        try:
            # Find the tablets' leaders and connect to them (an empty table's scan) before
            # the window opens.
            list(client.scan("kv", projection=["key"]))
            warm.wait()
            start.wait()
            due = time.monotonic() + rng.uniform(0.0, interval)
            n = 0
            while not stop.is_set():
                if interval:
                    if stop.wait(max(0.0, due - time.monotonic())):
                        break
                    # A writer that fell behind (a slow write) does not catch up in a burst.
                    due = max(due + interval, time.monotonic())
                n += 1
                key = slot * 1_000_000_000 + n
                size = rng.randint(sc.row_kib[0] * 1024, sc.row_kib[1] * 1024)
                part = "x" * (size // 4)
                row: dict[str, object] = {"key": key}
                row.update({f"c{i}": part for i in range(4)})
                try:
                    session.insert("kv", row)
                except Exception as e:  # an error the client did not (or could not) retry
                    with lock:
                        errors.append(f"writer {slot} key {key}: {type(e).__name__}: {e}")
                    return
                acked[slot].append(key)
        except threading.BrokenBarrierError:
            with lock:
                errors.append(f"writer {slot}: another writer did not start")
        except Exception as e:  # the warm-up scan failed: the others must not wait for it
            with lock:
                errors.append(f"writer {slot} warming up: {type(e).__name__}: {e}")
            warm.abort()
            start.abort()
        finally:
            with lock:
                for cause, n_retries in client.stats.retries_by_cause.items():
                    retries[cause] = retries.get(cause, 0) + n_retries
            session.close()
            client.close()

    threads = [threading.Thread(target=writer, args=(i,), name=f"w{i}") for i in range(sc.writers)]
    for t in threads:
        t.start()
    before = None
    try:
        warm.wait()
        before = _Metrics.read(cluster)
        start.wait()
    except threading.BrokenBarrierError:
        stop.set()  # a writer failed to warm up: its error is reported below
    t0 = time.monotonic()
    if before is not None:
        stop.wait(sc.seconds)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    elapsed = time.monotonic() - t0
    keys = {k for per in acked for k in per}
    after = _Metrics.read(cluster)
    if before is None:
        before = after  # nothing was measured; the writers' errors say why

    def counted(sample: str, **labels: str) -> float:
        return after.total(sample, **labels) - before.total(sample, **labels)

    def observed(name: str, **labels: str) -> dict[str, float]:
        return summarize(_window(before, after, name, **labels))

    queue = _window(before, after, "rpc_incoming_queue_time_us", service="tablet")
    queue_summary = summarize(queue)
    # The exact maximum is kept from server start: a bound, never below the window's.
    _cap(queue_summary, _max_from_json(cluster, "rpc_incoming_queue_time_us", service="tablet"))
    lock_wait = observed("consensus_lock_wait_time_us")
    _cap(lock_wait, _max_from_json(cluster, "consensus_lock_wait_time_us"))
    result = ModeResult(
        mode=mode,
        seconds=elapsed,
        rows_acked=len(keys),
        write_rate=len(keys) / elapsed,
        overflows=counted("rpcs_queue_overflow_total", service="tablet"),
        timed_out_in_queue=counted("rpcs_timed_out_in_queue_total", service="tablet"),
        lock_contention_us=counted("consensus_lock_contention_time_us_total"),
        lock_wait_us=lock_wait,
        queue_time_us=queue_summary,
        write_handler_us=observed("handler_latency_us", service="tablet", method="Write"),
        update_consensus_handler_us=observed(
            "handler_latency_us", service="consensus", method="UpdateConsensus"
        ),
        apply_us=observed("op_apply_run_time_us"),
        # From server start: lock-free mode must never have taken the lock to check.
        term_checks_locked=after.total("term_checks_total", mode="locked"),
        term_checks_lockfree=after.total("term_checks_total", mode="lockfree"),
        queue_time_buckets=list(queue["buckets"]),
        client_retries=retries,
        writer_errors=errors,
        acked_keys=keys,
        leaders=leaders,
    )
    result_keys_missing = _missing_keys(cluster, keys)
    if result_keys_missing:
        result.writer_errors.append(
            f"{len(result_keys_missing)} acknowledged rows missing, e.g. "
            f"{sorted(result_keys_missing)[:5]}"
        )
    return result


def _missing_keys(cluster: TserverCluster, keys: Iterable[int]) -> set[int]:
    """Acknowledged keys not found on the tablets' leaders (leader-latest scans)."""
    seeds = [s.rpc_addr for s in cluster.config.servers]
    client = Client(seeds, timeout_s=60.0)
    try:
        stored = [row["key"] for row in client.scan("kv", projection=["key"])]
    finally:
        client.close()
    if len(stored) != len(set(stored)):
        raise AssertionError("a scan returned a key twice")
    return set(keys) - set(stored)


# --- reporting ---------------------------------------------------------------------------


ROWS = [
    ("write rate (rows/s)", lambda r: f"{r.write_rate:,.1f}"),
    ("rows acknowledged", lambda r: f"{r.rows_acked:,}"),
    ("rpcs_queue_overflow", lambda r: f"{r.overflows:,.0f}"),
    ("rpcs_timed_out_in_queue", lambda r: f"{r.timed_out_in_queue:,.0f}"),
    ("consensus_lock_contention_time_us", lambda r: f"{r.lock_contention_us:,.0f}"),
    (
        "consensus lock wait p50 / p99 (us)",
        lambda r: f"{r.lock_wait_us['p50']:,.0f} / {r.lock_wait_us['p99']:,.0f}",
    ),
    ("incoming queue time mean (us)", lambda r: f"{r.queue_time_us['mean']:,.0f}"),
    ("incoming queue time p50 (us)", lambda r: f"{r.queue_time_us['p50']:,.0f}"),
    ("incoming queue time p99 (us)", lambda r: f"{r.queue_time_us['p99']:,.0f}"),
    ("incoming queue time p99.9 (us)", lambda r: f"{r.queue_time_us['p99.9']:,.0f}"),
    ("incoming queue time max (us, from server start)", lambda r: f"{r.queue_time_us['max']:,.0f}"),
    (
        "Write handler mean / p99 (us)",
        lambda r: f"{r.write_handler_us['mean']:,.0f} / {r.write_handler_us['p99']:,.0f}",
    ),
    (
        "UpdateConsensus handler mean / p99 (us)",
        lambda r: (
            f"{r.update_consensus_handler_us['mean']:,.0f} / "
            f"{r.update_consensus_handler_us['p99']:,.0f}"
        ),
    ),
    (
        "op_apply_run_time_us mean / p99",
        lambda r: f"{r.apply_us['mean']:,.0f} / {r.apply_us['p99']:,.0f}",
    ),
    (
        "term checks locked / lockfree (from server start)",
        lambda r: f"{r.term_checks_locked:,.0f} / {r.term_checks_lockfree:,.0f}",
    ),
    (
        "client retries (warm-up included)",
        lambda r: ", ".join(f"{k}:{v}" for k, v in sorted(r.client_retries.items())) or "-",
    ),
]


def markdown_table(results: list[ModeResult]) -> str:
    head = "| metric | " + " | ".join(r.mode for r in results) + " |"
    sep = "|---|" + "---:|" * len(results)
    lines = [head, sep]
    for label, fmt in ROWS:
        lines.append(f"| {label} | " + " | ".join(fmt(r) for r in results) + " |")
    return "\n".join(lines)


def write_report(results: list[ModeResult], out_dir: Path, sc: Scenario) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "scenario": asdict(sc),
        "results": [{k: v for k, v in asdict(r).items() if k != "acked_keys"} for r in results],
    }
    json_path = out_dir / "same_tablet_concurrent_writes.json"
    md_path = out_dir / "same_tablet_concurrent_writes.md"
    json_path.write_text(json.dumps(doc, indent=2, sort_keys=True))
    md_path.write_text(markdown_table(results) + "\n")
    return json_path, md_path
