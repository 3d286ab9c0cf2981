"""Point reads: leader ReadIndex, leader lease and plain follower reads, side by side.

    .venv/bin/python bench/reads.py [--seconds 4] [--repeat 2] [--keys 1000]

Starts two fresh local clusters at once (each 3 `raftlet tserver` processes on loopback, one
table `kv` of one tablet, replication factor 3, default Raft timings, ports from the
kernel) in a temporary directory: one with the default ``--leader_read_mode=read_index``,
one with ``--leader_read_mode=lease``. Loads ``--keys`` rows into each, then reads single
rows by key (``Client.scan`` with an EQUALS predicate on the key: one page of one tablet)
for ``--seconds`` per cell, from 1 and from 16 threads sharing one client:

- ``leader ReadIndex``: LEADER_LATEST on the read_index cluster (a quorum round per read,
  reads in flight together sharing rounds);
- ``leader lease``: LEADER_LATEST on the lease cluster (no round while the lease holds);
- ``follower``: FOLLOWER_APPLIED from one follower of the read_index cluster, no bound.

Cells are interleaved round-robin per repetition; printed per cell are the medians over
repetitions of reads/s, p50 and p99 latency (each read timed by the client, on
``time.perf_counter``), and reads/s and p50 over the ``leader ReadIndex`` cell with the
same reads in flight. A last line gives the lease cluster's leader's ``lease_reads`` and
``read_index_reads`` (from ``/tablets.json``), to show the lease did serve, and the servers'
pids. Both clusters
are taken down and the directory removed at the end, also on failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._drivers import run_in_scratch_dir  # noqa: E402
from raftlet.client import Client, FlushMode, Predicate, ReadMode  # noqa: E402
from raftlet.deploy.local import LocalCluster  # noqa: E402

CONFIGS = ("leader ReadIndex", "leader lease", "follower")
IN_FLIGHT = (1, 16)


@dataclass(frozen=True)
class Cell:
    """One run of one configuration at one number of reads in flight."""

    reads: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def reads_per_s(self) -> float:
        return self.reads / self.seconds if self.seconds > 0 else float("nan")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ascending ``sorted_values``, nearest rank."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, round(q * len(sorted_values)) - 1))
    return sorted_values[rank]


def measure(read: Callable[[int], None], keys: int, threads: int, seconds: float) -> Cell:
    """``threads`` threads calling ``read(key)`` for random keys until ``seconds`` pass."""
    stop = threading.Event()
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def worker(mine: list[float], seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                start = time.perf_counter()
                read(rng.randrange(keys))
                mine.append(time.perf_counter() - start)
        except BaseException as e:  # reported after the run
            errors.append(e)
            stop.set()

    workers = [
        threading.Thread(target=worker, args=(latencies[i], i), daemon=True) for i in range(threads)
    ]
    began = time.perf_counter()
    for w in workers:
        w.start()
    stop.wait(seconds)
    stop.set()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise RuntimeError(f"a read failed: {errors[0]!r}") from errors[0]
    every = sorted(x for mine in latencies for x in mine)
    return Cell(len(every), elapsed, percentile(every, 0.5) * 1e3, percentile(every, 0.99) * 1e3)


def leader_reader(client: Client) -> Callable[[int], None]:
    def read(key: int) -> None:
        rows = list(client.scan("kv", predicates=[Predicate.equals("key", key)]))
        if len(rows) != 1:
            raise RuntimeError(f"key {key}: {len(rows)} rows")

    return read


def follower_reader(client: Client, tablet: str, replica: str) -> Callable[[int], None]:
    def read(key: int) -> None:
        rows = list(
            client.scan_tablet(
                tablet,
                predicates=[Predicate.equals("key", key)],
                read_mode=ReadMode.FOLLOWER_APPLIED,
                replica=replica,
            )
        )
        if len(rows) != 1:
            raise RuntimeError(f"key {key}: {len(rows)} rows")

    return read


def load(client: Client, keys: int) -> None:
    session = client.new_session(FlushMode.MANUAL_FLUSH)
    for key in range(keys):
        session.insert("kv", {"key": key, "value": f"value-{key}"})
        if key % 500 == 499:
            session.flush()
    session.flush()
    session.close()


def leader_of(cluster: LocalCluster) -> tuple[str, str]:
    """The one tablet's id and its leader."""
    (tablet,) = cluster.health().tablets
    if tablet.leader is None:
        raise RuntimeError(f"tablet {tablet.tablet_id} has no leader: {tablet.issues}")
    return tablet.tablet_id, tablet.leader


def tablet_status(cluster: LocalCluster, server_id: str) -> dict[str, object]:
    url = cluster.servers[server_id].status_url + "tablets.json"
    with urllib.request.urlopen(url, timeout=10) as reply:
        (tablet,) = json.load(reply)["tablets"]
    return dict(tablet)


def table(medians: dict[tuple[str, int], Cell]) -> list[str]:
    lines = [
        "| reads in flight | mode | reads/s | p50 ms | p99 ms | reads/s vs ReadIndex | "
        "p50 vs ReadIndex |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for n in IN_FLIGHT:
        base = medians[(CONFIGS[0], n)]
        for name in CONFIGS:
            c = medians[(name, n)]
            lines.append(
                f"| {n} | {name} | {c.reads_per_s:,.0f} | {c.p50_ms:.2f} | {c.p99_ms:.2f} | "
                f"{c.reads_per_s / base.reads_per_s:.2f}x | {c.p50_ms / base.p50_ms:.2f}x |"
            )
    return lines


def median_cell(cells: Sequence[Cell]) -> Cell:
    """The run with the median reads/s (its latencies go with it)."""
    ordered = sorted(cells, key=lambda c: c.reads_per_s)
    return ordered[(len(ordered) - 1) // 2]


def run(args: argparse.Namespace, root: Path) -> None:
    clusters: dict[str, LocalCluster] = {}
    clients: list[Client] = []
    try:
        clusters["read_index"] = LocalCluster.create(root / "read_index", servers=3, tablets=1)
        clusters["lease"] = LocalCluster.create(
            root / "lease", servers=3, tablets=1, extra_flags=["--leader_read_mode=lease"]
        )
        plain = Client.from_config(clusters["read_index"].config_path, timeout_s=60.0)
        clients.append(plain)
        leased = Client.from_config(clusters["lease"].config_path, timeout_s=60.0)
        clients.append(leased)
        load(plain, args.keys)
        load(leased, args.keys)
        tablet, leader = leader_of(clusters["read_index"])
        follower = next(s for s in sorted(clusters["read_index"].servers) if s != leader)
        readers = {
            "leader ReadIndex": leader_reader(plain),
            "leader lease": leader_reader(leased),
            "follower": follower_reader(plain, tablet, follower),
        }
        for read in readers.values():  # warm up channels and caches
            for key in range(min(args.keys, 20)):
                read(key)
        runs: dict[tuple[str, int], list[Cell]] = {}
        for _ in range(args.repeat):
            for n in IN_FLIGHT:
                for name in CONFIGS:
                    runs.setdefault((name, n), []).append(
                        measure(readers[name], args.keys, n, args.seconds)
                    )
        status = tablet_status(clusters["lease"], leader_of(clusters["lease"])[1])
        pids = [s.pid for c in clusters.values() for s in c.servers.values()]
    finally:
        for client in clients:
            client.close()
        for cluster in clusters.values():
            cluster.down()
    print("\n".join(table({k: median_cell(v) for k, v in runs.items()})))
    print()
    print(
        f"lease cluster leader: lease_reads {status.get('lease_reads')}, "
        f"read_index_reads {status.get('read_index_reads')}, stalls {status.get('stalls')}",
    )
    print(f"servers stopped: {', '.join(f'pid {p}' for p in pids)}", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="per cell (default 4)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per cell (default 2)")
    parser.add_argument("--keys", type=int, default=1000, help="rows loaded (default 1000)")
    parser.add_argument("--dir", help="where to make the temporary cluster directory")
    args = parser.parse_args(argv)
    print(
        f"# bench/reads.py  {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}  "
        f"python {platform.python_version()}  {os.cpu_count()} cpus  "
        f"{args.keys:,} keys, {args.seconds:g} s x {args.repeat} per cell, "
        "3 servers, 1 tablet, point reads through Client.scan",
        flush=True,
    )
    run_in_scratch_dir("raftlet-bench-reads-", args.dir, lambda root: run(args, root))


if __name__ == "__main__":
    main()
