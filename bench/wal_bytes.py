"""WAL bytes over time under a steady write load, with log GC and without, side by side.

    .venv/bin/python bench/wal_bytes.py [--minutes 10] [--sample 30] [--in-flight 32]

Starts two fresh local clusters at once (each 3 `raftlet tserver` processes on loopback, one
table `kv` of one tablet, replication factor 3, default flags -- 8 MiB WAL segments, log GC
every 10 s) in a temporary directory; the second with ``--log_gc_interval_s 0`` (GC off).
Each gets its own ``raftlet write --duration ... --in-flight N`` (single-row 100-byte
inserts through the asyncio client) for ``--minutes``. Every ``--sample`` seconds it reads
``/tablets.json`` of every server of both clusters and prints a row: the leader's applied
index (entries so far) and the largest replica WAL (``log_bytes``) in each cluster. The
last lines give each writer's summary and the servers' pids. Both clusters are taken down
and the directory removed at the end, also on failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._drivers import run_in_scratch_dir  # noqa: E402
from raftlet.deploy.local import LocalCluster  # noqa: E402

MiB = 1 << 20
CLUSTERS = ("gc on", "gc off")


def replica_status(cluster: LocalCluster) -> list[dict[str, object]]:
    """Every server's status of the one tablet (a server that does not answer is left out)."""
    out = []
    for server in cluster.servers.values():
        try:
            with urllib.request.urlopen(server.status_url + "tablets.json", timeout=10) as r:
                (tablet,) = json.load(r)["tablets"]
        except OSError:
            continue
        out.append(dict(tablet))
    return out


def sample(cluster: LocalCluster) -> tuple[int, int, int]:
    """(the highest applied index, the largest WAL in bytes, the lowest first index)."""
    st = replica_status(cluster)
    applied = max((int(str(t["applied_index"])) for t in st), default=0)
    wal = max((int(str(t["log_bytes"])) for t in st), default=0)
    first = min((int(str(t.get("first_index", 1))) for t in st), default=1)
    return applied, wal, first


def writer(data_dir: Path, seconds: float, in_flight: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "raftlet", "write", "--data-dir", str(data_dir),
         "--duration", f"{seconds:g}", "--in-flight", str(in_flight), "--no-progress"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def run(args: argparse.Namespace, root: Path) -> None:
    clusters: dict[str, LocalCluster] = {}
    writers: dict[str, subprocess.Popen[str]] = {}
    try:
        clusters["gc on"] = LocalCluster.create(root / "gc-on", servers=3, tablets=1)
        clusters["gc off"] = LocalCluster.create(
            root / "gc-off", servers=3, tablets=1, extra_flags=["--log_gc_interval_s", "0"]
        )
        seconds = args.minutes * 60
        began = time.monotonic()
        for name, cluster in clusters.items():
            writers[name] = writer(cluster.data_dir, seconds, args.in_flight)
        print(
            "| t (s) | entries, gc on | WAL MiB (largest replica), gc on | log starts at, gc on "
            "| entries, gc off | WAL MiB (largest replica), gc off |"
        )
        print("|---:|---:|---:|---:|---:|---:|")
        stop = threading.Event()
        while True:
            now = time.monotonic() - began
            on = sample(clusters["gc on"])
            off = sample(clusters["gc off"])
            print(
                f"| {now:,.0f} | {on[0]:,} | {on[1] / MiB:,.1f} | {on[2]:,} | {off[0]:,} | "
                f"{off[1] / MiB:,.1f} |",
                flush=True,
            )
            if all(w.poll() is not None for w in writers.values()):
                break
            stop.wait(min(args.sample, max(0.1, seconds + 1 - now)))
        for name, w in writers.items():
            out = (w.stdout.read() if w.stdout else "").strip().splitlines()
            print(f"# writer {name}: exit {w.returncode}; {out[-1] if out else ''}")
        pids = [s.pid for c in clusters.values() for s in c.servers.values()]
        print("# servers: " + ", ".join(f"pid {p}" for p in pids))
    finally:
        for w in writers.values():
            if w.poll() is None:
                w.terminate()
                w.wait(30)
        for cluster in clusters.values():
            cluster.down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--sample", type=float, default=30.0, help="seconds between rows")
    parser.add_argument("--in-flight", type=int, default=32, help="writes in flight per cluster")
    parser.add_argument("--dir", type=Path, default=None, help="where the clusters live")
    args = parser.parse_args(argv)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(
        f"# bench/wal_bytes.py  {now}  python {platform.python_version()}  "
        f"{os.cpu_count()} cpus  {args.minutes:g} min  in flight {args.in_flight} per cluster"
    )
    run_in_scratch_dir("raftlet-wal-bytes-", args.dir, lambda root: run(args, root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
