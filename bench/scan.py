"""A full scan of a freshly loaded table, packed pages against per-cell pages.

    .venv/bin/python bench/scan.py [--rows 1000000] [--repeat 2] [--page-bytes 0]

Starts a fresh local cluster (3 `raftlet tserver` processes on loopback, one table of one
tablet, replication factor 3, ports from the kernel) in a temporary directory, loads
``--rows`` rows of ``--row-bytes`` values with ``raftlet write --batch-rows --in-flight``
(the client library's batch pipeline, run as its own process), then scans the whole table
through the client library ``--repeat`` times in each row form, the forms taking turns:
``packed`` (``RowFormat.PACKED``, one block per page) and ``cells`` (``RowFormat.CELLS``, a
``ValuePB`` per cell). Each scan must return every row loaded.

Printed: for the load and for each scan, rows/s, the client's CPU per row (user + system of
the whole writing process, its start-up included, or of this process while it scans) and
the servers' CPU per row (the three servers' ``process_cpu_seconds_total``, summed); then
each server's resident memory (VmRSS) after the load and after the scans. The cluster is
stopped and its directory removed at the end, also on failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._drivers import run_in_scratch_dir  # noqa: E402
from raftlet.cli.server_cpu import ServerCpu, read_cpu_seconds  # noqa: E402
from raftlet.client import Client, RowFormat  # noqa: E402
from raftlet.deploy.local import LocalCluster  # noqa: E402

FORMATS = {"packed": RowFormat.PACKED, "cells": RowFormat.CELLS}


@dataclass(frozen=True)
class Phase:
    """One measured run: what it was, how many rows, how long, and the CPU it cost."""

    name: str
    rows: int
    seconds: float
    client_cpu_s: float
    server_cpu_s: float | None

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")

    def per_row_us(self, cpu_s: float | None) -> float | None:
        return None if cpu_s is None or not self.rows else cpu_s / self.rows * 1e6


def parse_load_summary(text: str) -> dict[str, Any]:
    """The JSON summary ``raftlet write --format json`` prints: the JSON object that starts
    at the first line beginning with ``{``. ValueError if there is none."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("{"):
            doc = json.loads("\n".join(lines[i:]))
            if isinstance(doc, dict):
                return doc
            break
    raise ValueError("no JSON summary in the output of raftlet write")


def parse_vm_rss_kib(status_text: str) -> int | None:
    """VmRSS in KiB from the text of /proc/<pid>/status (None if absent)."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def rss_mib(pid: int) -> float | None:
    try:
        kib = parse_vm_rss_kib(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return None
    return None if kib is None else kib / 1024


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def phase_table(phases: Sequence[Phase]) -> list[str]:
    lines = [
        "| phase | rows | seconds | rows/s | client CPU µs/row | server CPU µs/row |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for p in phases:
        lines.append(
            f"| {p.name} | {p.rows:,} | {p.seconds:.2f} | {p.rows_per_s:,.0f} | "
            f"{_cell(p.per_row_us(p.client_cpu_s), '.2f')} | "
            f"{_cell(p.per_row_us(p.server_cpu_s), '.2f')} |"
        )
    return lines


def rss_table(
    roles: Mapping[str, str],
    pids: Mapping[str, int],
    after_load: Mapping[str, float | None],
    after_scans: Mapping[str, float | None],
) -> list[str]:
    lines = [
        "| server | role | RSS after load MiB | RSS after scans MiB |",
        "|---|---|---:|---:|",
    ]
    for sid in sorted(pids):
        lines.append(
            f"| {sid} (pid {pids[sid]}) | {roles.get(sid, '?')} | "
            f"{_cell(after_load.get(sid), '.0f')} | {_cell(after_scans.get(sid), '.0f')} |"
        )
    return lines


def _cpu_s(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def _child_env() -> dict[str, str]:
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def load(cluster: LocalCluster, args: argparse.Namespace) -> Phase:
    argv = [
        sys.executable, "-m", "raftlet", "write",
        "--data-dir", str(cluster.data_dir),
        "--rows", str(args.rows),
        "--row-bytes", str(args.row_bytes),
        "--batch-rows", str(args.batch_rows),
        "--in-flight", str(args.in_flight),
        "--format", "json",
    ]  # fmt: skip
    before = _cpu_s(resource.getrusage(resource.RUSAGE_CHILDREN))
    out = subprocess.run(
        argv,
        cwd=ROOT,  # `-m raftlet` resolves against the working directory first
        env=_child_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    client_cpu = _cpu_s(resource.getrusage(resource.RUSAGE_CHILDREN)) - before
    if out.returncode != 0:
        raise RuntimeError(f"raftlet write failed ({out.returncode}): {out.stderr[-2000:]}")
    summary = parse_load_summary(out.stdout)
    rows = int(summary["rows"])
    if rows != args.rows or summary.get("failed_rows"):
        raise RuntimeError(f"the load wrote {rows} of {args.rows} rows: {summary}")
    server_cpu = summary.get("server_cpu_s")
    return Phase(
        f"load: write --batch-rows {args.batch_rows} --in-flight {args.in_flight}",
        rows,
        float(summary["elapsed_s"]),
        client_cpu,
        None if server_cpu is None else float(server_cpu),
    )


def scan(client: Client, cluster: LocalCluster, form: str, page_bytes: int, expect: int) -> Phase:
    servers = cluster.config.servers
    cpu_before = read_cpu_seconds(servers)
    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    scanner = client.scan("kv", row_format=FORMATS[form], batch_size_bytes=page_bytes)
    rows = 0
    for _ in scanner:
        rows += 1
    elapsed = time.perf_counter() - start
    client_cpu = _cpu_s(resource.getrusage(resource.RUSAGE_SELF)) - _cpu_s(usage_before)
    server_cpu = ServerCpu.between(cpu_before, read_cpu_seconds(servers))
    if rows != expect:
        raise RuntimeError(f"a {form} scan returned {rows} rows, {expect} were loaded")
    known = [v for v in server_cpu.by_server.values() if v is not None]
    total = sum(known) if len(known) == len(servers) else None
    return Phase(f"scan: {form} ({scanner.pages} pages)", rows, elapsed, client_cpu, total)


def roles_of(cluster: LocalCluster) -> dict[str, str]:
    leaders = {t.leader for t in cluster.health().tablets}
    return {sid: "leader" if sid in leaders else "follower" for sid in cluster.servers}


def run(args: argparse.Namespace, root: Path) -> None:
    cluster = LocalCluster.create(root / "cluster", servers=3, tablets=1)
    try:
        pids = {sid: s.pid for sid, s in cluster.servers.items()}
        phases = [load(cluster, args)]
        after_load = {sid: rss_mib(pid) for sid, pid in pids.items()}
        client = Client.from_config(cluster.config_path, timeout_s=120.0)
        try:
            for _ in range(args.repeat):
                for form in args.forms:
                    phases.append(scan(client, cluster, form, args.page_bytes, args.rows))
        finally:
            client.close()
        after_scans = {sid: rss_mib(pid) for sid, pid in pids.items()}
        roles = roles_of(cluster)
    finally:
        cluster.down()
    print("\n".join(phase_table(phases)))
    print()
    print("\n".join(rss_table(roles, pids, after_load, after_scans)), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--row-bytes", type=int, default=100)
    parser.add_argument("--batch-rows", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2, help="scans per row form")
    parser.add_argument(
        "--forms", type=lambda s: s.split(","), default=list(FORMATS), help="packed,cells"
    )
    parser.add_argument(
        "--page-bytes", type=int, default=0, help="batch_size_bytes (0: the server's default)"
    )
    parser.add_argument("--dir", help="where to make the temporary cluster directory")
    args = parser.parse_args(argv)
    unknown = [f for f in args.forms if f not in FORMATS]
    if unknown:
        parser.error(f"--forms: unknown form {unknown[0]!r} (known: {', '.join(FORMATS)})")
    print(
        f"# bench/scan.py  {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}  "
        f"python {platform.python_version()}  {os.cpu_count()} cpus  "
        f"{args.rows:,} rows of {args.row_bytes} B, 3 servers, 1 tablet",
        flush=True,
    )
    run_in_scratch_dir("raftlet-bench-scan-", args.dir, lambda root: run(args, root))


if __name__ == "__main__":
    main()
