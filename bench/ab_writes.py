"""Two builds of raftlet side by side: the same write load, interleaved, on a cluster of each.

    .venv/bin/python bench/ab_writes.py --a DIR_A --b DIR_B [--tablets 4]
        [--in-flight 1,16,64] [--reps 3] [--seconds 4] [--a-flag=--x=1 ...] [--b-flag=...]
        [--write-arg=--keys=scattered ...]

DIR_A and DIR_B are source trees (a checkout, or ``git archive REV | tar -x -C DIR``). In
every repetition each gets a new 3-server cluster (``raftlet cluster up``, started from that
tree) and is driven by that tree's asyncio client (``raftlet write --in-flight N``), A and B
one after the other in every cell, so both see the same machine noise. A and B may also be
one tree with different server flags (``--a-flag``/``--b-flag``, passed on as
``--tserver-flag``).

Two clusters of one build differ by more than many changes do, and keep their difference
for as long as they run: in an A/A run on one pair of clusters, one side was ahead by
5-15% in 4 of 5 repetitions (docs/benchmarks.md, "Two clusters of one build"). So every
repetition starts new clusters, and odd repetitions run B first: a difference has to
survive new clusters and both orders to show in the medians. Both clusters get the same
leader placement (tablet i's leader on server i mod 3, moved there by leader transfers):
where elections happen to put leaders moves a many-tablet run by more than most changes do.

Printed: per cell the median writes/s, server CPU per write and p50 latency of each side
over the repetitions, B/A, and the writer's own CPU per write (what ``raftlet write``
prints as client CPU; "-" for a tree whose writer does not print it). The clusters and
their directories are removed as each repetition ends.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import re
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _drivers import cluster_servers, place_leaders, raftlet_cli, run_in_scratch_dir

_RATE = re.compile(r"^write RPCs\s+[\d,]+\s+([\d,]+) writes/s", re.M)
_CPU = re.compile(r"^server CPU\s+[\d.]+ s\s+([\d.]+) ms/write", re.M)
_CLIENT_CPU = re.compile(r"^client CPU\s+[\d.,]+ s\s+([\d.]+) ms/write", re.M)
_P50 = re.compile(r"p50.*\n\s*([\d.]+) (ms|us|µs|s)\b")
_UNIT_MS = {"s": 1000.0, "ms": 1.0, "us": 0.001, "µs": 0.001}
# Each new cluster's first writes, not measured.
_WARM_UP_IN_FLIGHT = 16
_WARM_UP_S = 1.0
_HEADER = (
    "| in flight | A w/s | B w/s | B/A | A ms CPU/write | B ms CPU/write | A p50 ms | B p50 ms "
    "| A client ms/write | B client ms/write |"
)


Run = tuple[float, float, float, float]  # writes/s, server CPU ms/write, p50 ms, client CPU


def _one_run(tree: Path, data: Path, in_flight: int, seconds: float, write_args: list[str]) -> Run:
    out = raftlet_cli(
        tree,
        "write",
        "--data-dir", str(data),
        "--duration", str(seconds),
        "--in-flight", str(in_flight),
        "--no-progress",
        *write_args,
    )  # fmt: skip
    return parse_write_output(out)


def parse_write_output(out: str) -> Run:
    """Writes/s, server CPU ms per write, p50 ms and the writer's own CPU ms per write from
    what ``raftlet write`` printed (NaN for the last from a tree whose writer prints none)."""
    rate, cpu, p50 = _RATE.search(out), _CPU.search(out), _P50.search(out)
    if not (rate and cpu and p50):
        raise RuntimeError(f"unexpected output of raftlet write:\n{out}")
    client = _CLIENT_CPU.search(out)
    return (
        float(rate.group(1).replace(",", "")),
        float(cpu.group(1)),
        float(p50.group(1)) * _UNIT_MS[p50.group(2)],
        float(client.group(1)) if client else math.nan,
    )


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="source tree A")
    ap.add_argument("--b", type=Path, required=True, help="source tree B")
    ap.add_argument("--tablets", type=int, default=4)
    ap.add_argument("--in-flight", default="1,16,64", help="comma-separated (default 1,16,64)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--a-flag", action="append", default=[], help="server flag for A")
    ap.add_argument("--b-flag", action="append", default=[], help="server flag for B")
    ap.add_argument(
        "--write-arg", action="append", default=[], help="argument for raftlet write, both sides"
    )
    ap.add_argument("--dir", default=None, help="where the clusters live (default: a temp dir)")
    args = ap.parse_args()
    loads = [int(n) for n in args.in_flight.split(",")]
    sides = {"A": (args.a.resolve(), args.a_flag), "B": (args.b.resolve(), args.b_flag)}

    def start(side: str, tree: Path, flags: list[str], data: Path) -> None:
        raftlet_cli(
            tree,
            "cluster", "up",
            "--data-dir", str(data),
            "--tablets", str(args.tablets),
            *[f"--tserver-flag={f}" for f in flags],
        )  # fmt: skip
        leaders = place_leaders(tree, data)
        pids = [str(srv["pid"]) for srv in cluster_servers(data)]
        placed = " ".join(f"{t}:{s}" for t, s in sorted(leaders.items()))
        print(f"cluster {side}: server pids {' '.join(pids)}; leaders {placed}", flush=True)
        _one_run(tree, data, _WARM_UP_IN_FLIGHT, _WARM_UP_S, args.write_arg)  # caches warm

    def run(root: Path) -> None:
        results: dict[tuple[str, int], list[Run]] = {}
        for rep in range(args.reps):
            order = list(sides.items()) if rep % 2 == 0 else list(reversed(sides.items()))
            up: list[tuple[Path, Path]] = []
            try:
                for side, (tree, flags) in order:
                    data = root / f"{side}{rep + 1}"
                    up.append((tree, data))
                    start(side, tree, flags, data)
                for n in loads:
                    for side, (tree, _) in order:
                        data = root / f"{side}{rep + 1}"
                        got = _one_run(tree, data, n, args.seconds, args.write_arg)
                        results.setdefault((side, n), []).append(got)
                        line = (
                            f"{got[0]:,.0f} w/s, {got[1]:.3f} ms CPU/write, p50 {got[2]:.2f} ms, "
                            f"client {_ms(got[3])} ms CPU/write"
                        )
                        print(f"rep {rep + 1} in flight {n:>3} {side}: {line}", flush=True)
            finally:
                for tree, data in up:
                    try:
                        raftlet_cli(tree, "cluster", "down", "--data-dir", str(data))
                    except Exception as exc:  # the other cluster must still come down
                        print(f"cluster down {data}: {exc}", file=sys.stderr)
                    else:
                        shutil.rmtree(data, ignore_errors=True)
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        print(
            f"\n# bench/ab_writes.py  {stamp}  python {platform.python_version()}  "
            f"{os.cpu_count()} cpus  {args.tablets} tablets  medians of {args.reps}  "
            f"raftlet write {' '.join(args.write_arg)}\n"
            f"# A: {args.a} {' '.join(args.a_flag)}\n# B: {args.b} {' '.join(args.b_flag)}\n"
        )
        print(_HEADER)
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n in loads:
            a = [statistics.median(x) for x in zip(*results[("A", n)], strict=True)]
            b = [statistics.median(x) for x in zip(*results[("B", n)], strict=True)]
            print(
                f"| {n} | {a[0]:,.0f} | {b[0]:,.0f} | {b[0] / a[0]:.2f} | {a[1]:.3f} | "
                f"{b[1]:.3f} | {a[2]:.2f} | {b[2]:.2f} | {_ms(a[3])} | {_ms(b[3])} |"
            )

    run_in_scratch_dir("raftlet-ab-", args.dir, run)


if __name__ == "__main__":
    main()
