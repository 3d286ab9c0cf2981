"""The same-tablet concurrent-writes scenario (KUDU-2727) at a chosen scale, repeated.

    .venv/bin/python bench/contention.py [--reps 5] [--seconds 10] [--writers 32]
        [--latency-ms 20] [--queue-bytes 32768] [--leaders 0,0] [--cpu-affinity auto|none]
        [--rows-per-s 120] [--server-flag=--name=value ...]
        [--out out/contention]

Runs the scenario of tests/integration/contention.py R times per term-check mode,
interleaved (locked, lockfree, locked, ...), each on a fresh 3-server cluster; prints the
median and min-max of each figure per mode and the lockfree/locked ratios, and writes a PNG
with the incoming-queue-time distributions of both modes (all repetitions merged) plus the
raw results as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.contention import ModeResult, Scenario, run_mode

FIGURES = [
    ("write rate (rows/s)", lambda r: r.write_rate),
    ("rpcs_queue_overflow", lambda r: r.overflows),
    ("incoming queue time p50 (us)", lambda r: r.queue_time_us["p50"]),
    ("incoming queue time p99 (us)", lambda r: r.queue_time_us["p99"]),
    ("incoming queue time mean (us)", lambda r: r.queue_time_us["mean"]),
    ("consensus lock contention (us)", lambda r: r.lock_contention_us),
    ("term checks that took the lock", lambda r: r.term_checks_locked),
]


def _fmt(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med:,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def _ratio(locked: list[float], lockfree: list[float]) -> str:
    a, b = statistics.median(locked), statistics.median(lockfree)
    if b == 0:
        return "locked/lockfree: inf" if a else "-"
    return f"{a / b:,.1f}x"


def plot(results: dict[str, list[ModeResult]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    last_rise: list[float] = []
    for mode, runs in results.items():
        merged: dict[float, float] = {}
        for r in runs:
            for le, c in r.queue_time_buckets:
                merged[le] = merged.get(le, 0.0) + c
        points = sorted((le, c) for le, c in merged.items() if le != float("inf"))
        total = max((c for _, c in merged.items()), default=0.0)
        if not total:
            continue
        xs = [le / 1000.0 for le, _ in points]
        ys = [c / total for _, c in points]
        ax.step(xs, ys, where="post", label=f"{mode} ({int(total):,} calls)")
        last_rise.append(next((x for x, y in zip(xs, ys, strict=True) if y >= 1.0), xs[-1]))
    if last_rise:
        # Past the slowest call there is nothing to see: stop the axis a little after it.
        ax.set_xlim(left=0.01, right=max(last_rise) * 3)
    ax.set_xscale("log")
    ax.set_xlabel("incoming queue time of tablet-service RPCs (ms, log scale)")
    ax.set_ylabel("fraction of calls at or below")
    ax.set_title("Service queue time: consensus-lock term check vs lock-free snapshot")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--writers", type=int, default=32)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--queue-bytes", type=int, default=32 * 1024)
    parser.add_argument(
        "--leaders",
        default="0,0",
        help="server index leading each tablet, e.g. 0,1 (default 0,0: one server leads both)",
    )
    parser.add_argument(
        "--cpu-affinity",
        default="auto",
        help="every server's --cpu_affinity (default auto: one CPU each; none: the OS places them)",
    )
    parser.add_argument(
        "--rows-per-s",
        type=float,
        default=120.0,
        help="rows/s offered by all writers together (default 120, about 3/4 of what the "
        "locked mode carries here, so both modes write at one rate; 0: closed loop, each "
        "writer as fast as it is acknowledged)",
    )
    parser.add_argument(
        "--write-rounds-in-flight",
        type=int,
        default=0,
        help="every server's --write_rounds_in_flight (default 0: Kudu's pipeline, which "
        "KUDU-2727 is about; raftlet's own default, 1, keeps the WAL queue from filling)",
    )
    parser.add_argument(
        "--server-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="one more flag for every server, e.g. --server-flag=--rpc_handoff_yield=false "
        "(repeatable)",
    )
    parser.add_argument("--out", default="out/contention")
    args = parser.parse_args()
    sc = Scenario(
        writers=args.writers,
        seconds=args.seconds,
        log_inject_latency_ms=args.latency_ms,
        group_commit_queue_size_bytes=args.queue_bytes,
        leader_servers=tuple(int(i) for i in args.leaders.split(",")),
        cpu_affinity="" if args.cpu_affinity == "none" else args.cpu_affinity,
        rows_per_s=args.rows_per_s,
        write_rounds_in_flight=args.write_rounds_in_flight,
        extra_flags=tuple(args.server_flag),
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"# bench/contention.py  {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}  "
        f"python {platform.python_version()}  {os.cpu_count()} cpus  {sc}",
        flush=True,
    )
    results: dict[str, list[ModeResult]] = {"locked": [], "lockfree": []}
    with tempfile.TemporaryDirectory(prefix="raftlet-contention-") as tmp:
        for rep in range(args.reps):
            for mode in ("locked", "lockfree"):
                r = run_mode(Path(tmp) / f"{mode}-{rep}", mode, sc, seed=2727 + rep)
                if r.writer_errors:
                    print(f"  {mode} rep {rep}: errors {r.writer_errors[:3]}", flush=True)
                print(
                    f"  rep {rep} {mode:<8}: {r.write_rate:6.1f} rows/s, "
                    f"{r.overflows:5.0f} overflows, queue p99 {r.queue_time_us['p99']:9,.0f} us",
                    flush=True,
                )
                results[mode].append(r)
    print()
    print(f"| figure (median, min-max of {args.reps}) | locked | lockfree | locked/lockfree |")
    print("|---|---:|---:|---:|")
    for label, get in FIGURES:
        a = [get(r) for r in results["locked"]]
        b = [get(r) for r in results["lockfree"]]
        print(f"| {label} | {_fmt(a)} | {_fmt(b)} | {_ratio(a, b)} |")
    png = out / "queue_time.png"
    plot(results, png)
    raw = {
        mode: [{k: v for k, v in vars(r).items() if k not in ("acked_keys",)} for r in runs]
        for mode, runs in results.items()
    }
    (out / "contention.json").write_text(json.dumps(raw, indent=1, default=str))
    print(f"\nplot: {png}\nraw results: {out / 'contention.json'}")


if __name__ == "__main__":
    main()
