"""Batched writes: the packed row block next to the per-cell encoding, in one run.

    .venv/bin/python bench/batched_writes.py [--seconds 8] [--repeat 2] [--tablets 1]

Each cell starts a fresh local cluster (`raftlet cluster up`: 3 servers on loopback, one
table `kv` with ``--tablets`` hash partitions, 3 replicas each), runs `raftlet write` for
``--seconds`` with 100-byte rows under new keys, and takes the cluster down again. The
configurations, interleaved round-robin per repetition (medians printed):

- ``cells``: 8 threads, manual flush every 2000 rows, rows in the per-cell form
  (`--row-format cells`: one RowOperationPB per row, as before the packed block);
- ``block``: the same, rows packed into one row block per write;
- ``pipelined``: packed rows, 2 threads, 2000-row batches, 4 batches in flight per session
  (`--batch-rows 2000 --in-flight 4`).

Printed per configuration: rows/s, p50 write latency, and CPU per acknowledged row of each
process -- the client (`raftlet write`'s own utime+stime, from ``wait4``), the tablet's
leader and the two followers (each server's ``process_cpu_seconds_total`` difference, as
`raftlet write` reports it) -- then each configuration's rate over the ``cells`` rate.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

_MANUAL = ["--threads", "8", "--flush-mode", "manual", "--batch-rows", "2000"]
CONFIGS: dict[str, list[str]] = {
    "cells": [*_MANUAL, "--row-format", "cells"],
    "block": _MANUAL,
    "pipelined": ["--threads", "2", "--batch-rows", "2000", "--in-flight", "4"],
}


@dataclass(frozen=True)
class Cell:
    """One run of one configuration."""

    rows_per_s: float
    p50_ms: float
    client_us: float  # CPU per row
    leader_us: float
    follower_us: float  # mean of the followers
    failed_rows: int

    @property
    def total_us(self) -> float:
        return self.client_us + self.leader_us + 2 * self.follower_us


def cell_from(summary: dict, client_cpu_s: float, leaders: set[str]) -> Cell:
    """A cell from `raftlet write --format json`'s summary, the client's CPU seconds and the
    ids of the servers that led a tablet (their CPU counts as leader CPU)."""
    rows = max(1, int(summary["rows"]))
    by_server: dict[str, float] = summary["server_cpu_s_by_server"]
    lead = [v for k, v in by_server.items() if k in leaders]
    follow = [v for k, v in by_server.items() if k not in leaders]
    return Cell(
        rows_per_s=float(summary["rows_per_s"]),
        p50_ms=float(summary["latency_us"]["p50"] or 0.0) / 1000,
        client_us=client_cpu_s / rows * 1e6,
        leader_us=(sum(lead) / len(lead) if lead else 0.0) / rows * 1e6,
        follower_us=(sum(follow) / len(follow) if follow else 0.0) / rows * 1e6,
        failed_rows=int(summary["failed_rows"]),
    )


def median_cell(cells: list[Cell]) -> Cell:
    def med(name: str) -> float:
        return statistics.median(getattr(c, name) for c in cells)

    return Cell(
        med("rows_per_s"),
        med("p50_ms"),
        med("client_us"),
        med("leader_us"),
        med("follower_us"),
        sum(c.failed_rows for c in cells),
    )


def format_table(results: dict[str, list[Cell]]) -> str:
    head = (
        "| configuration | rows/s | p50 ms | CPU µs/row: client | leader | follower (each) "
        "| all | rate vs cells | failed rows |"
    )
    lines = [head, "|" + "---|" * 9]
    base = median_cell(results["cells"]).rows_per_s if results.get("cells") else 0.0
    for name, cells in results.items():
        if not cells:
            continue
        m = median_cell(cells)
        ratio = f"{m.rows_per_s / base:.2f}x" if base else "-"
        lines.append(
            f"| {name} | {m.rows_per_s:,.0f} | {m.p50_ms:.1f} | {m.client_us:.1f} | "
            f"{m.leader_us:.1f} | {m.follower_us:.1f} | {m.total_us:.1f} | {ratio} | "
            f"{m.failed_rows} |"
        )
    return "\n".join(lines)


def _raftlet(*args: str) -> list[str]:
    return [sys.executable, "-m", "raftlet", *args]


def run_cell(args: list[str], seconds: float, tablets: int, work: Path) -> Cell:
    data = work / "cluster"
    up = subprocess.run(
        _raftlet("cluster", "up", "--data-dir", str(data), "--tablets", str(tablets)),
        capture_output=True,
        text=True,
    )
    try:
        if up.returncode != 0:
            raise RuntimeError(f"cluster up failed: {up.stderr.strip()[-500:]}")
        cmd = _raftlet(
            "write", "--data-dir", str(data), "--duration", str(seconds), "--no-progress",
            "--format", "json", *args,
        )  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out, err = proc.communicate()
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"raftlet write failed: {err.strip()[-500:]}")
        status_json = subprocess.run(
            _raftlet("cluster", "status", "--data-dir", str(data), "--format", "json"),
            capture_output=True,
            text=True,
        ).stdout
        leaders = {t["leader"] for t in json.loads(status_json)["tablets"] if t["leader"]}
        return cell_from(json.loads(out), usage.ru_utime + usage.ru_stime, leaders)
    finally:
        subprocess.run(
            _raftlet("cluster", "down", "--data-dir", str(data)), capture_output=True, check=False
        )
        shutil.rmtree(data, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=8.0, help="per cell (default 8)")
    p.add_argument("--repeat", type=int, default=2, help="repetitions, interleaved (default 2)")
    p.add_argument("--tablets", type=int, default=1, help="tablets of table kv (default 1)")
    p.add_argument(
        "--configs", default=",".join(CONFIGS), help=f"subset of: {', '.join(CONFIGS)}"
    )
    a = p.parse_args(argv)
    names = [n.strip() for n in a.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"unknown configuration(s): {', '.join(unknown)}")
    print(
        f"# batched writes, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"{a.seconds:g} s per cell, {a.repeat} repetitions, {a.tablets} tablet(s)"
    )
    results: dict[str, list[Cell]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="raftlet-bench-batched-") as tmp:
        for rep in range(a.repeat):
            for name in names:
                cell = run_cell(CONFIGS[name], a.seconds, a.tablets, Path(tmp))
                results[name].append(cell)
                print(
                    f"  rep {rep + 1} {name}: {cell.rows_per_s:,.0f} rows/s, "
                    f"{cell.total_us:.1f} µs CPU/row",
                    flush=True,
                )
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
