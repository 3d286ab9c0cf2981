"""How long a wiped follower takes to come back by tablet copy, and at what rate it copies.

    .venv/bin/python bench/tablet_copy.py [--rows 1000000] [--chunk-bytes 1048576] [--repeat 2]

Starts a fresh local cluster (3 `raftlet tserver` processes on loopback, one table of one
tablet, replication factor 3, 1 MiB WAL segments and log GC every second, so the leader's
log soon no longer starts at 1), loads ``--rows`` rows of ``--row-bytes`` with ``raftlet
write --batch-rows --in-flight``, then ``--repeat`` times: stops a follower, deletes its
replica directory, starts it again and measures until it has installed a copy from the
leader (its ``tablet_copies_installed_total`` grew) and until it has applied everything the
leader committed. Printed per run: the size of the store file it received, seconds from the
restart to the copy installed and to caught up, the copy's MiB/s, and the CPU seconds the
leader and the copying server spent meanwhile (their ``process_cpu_seconds_total``). The
cluster is stopped and its directory removed at the end, also on failure, Ctrl-C or
SIGTERM.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._drivers import run_in_scratch_dir  # noqa: E402
from bench.scan import load  # noqa: E402
from raftlet.cli.server_cpu import read_cpu_seconds  # noqa: E402
from raftlet.deploy.local import LocalCluster  # noqa: E402

_POLL_S = 0.02


def _metric(http_addr: str, name: str) -> float:
    """A server's unlabelled sample ``name`` (0 if it has none yet)."""
    with urllib.request.urlopen(f"http://{http_addr}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith((name + " ", name + "{")):
                return float(line.split()[-1])
    return 0.0


def _cpu(cluster: LocalCluster, server_id: str) -> float:
    reading = read_cpu_seconds([cluster.config.server(server_id)])[server_id]
    return reading.seconds if reading is not None else 0.0


def _tablet(http_addr: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{http_addr}/tablets.json", timeout=5) as r:
        (tablet,) = json.load(r)["tablets"]
    return dict(tablet)


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """The monotonic time ``predicate`` first held (a server not answering yet is "no")."""
    start = time.monotonic()
    while True:
        try:
            if predicate():
                return time.monotonic()
        except OSError:
            pass  # not answering yet
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(_POLL_S)


def copy_once(cluster: LocalCluster, tablet_id: str) -> list[str]:
    health = cluster.health()
    (tablet,) = health.tablets
    leader = tablet.leader
    assert leader is not None
    follower = next(sid for sid in cluster.servers if sid != leader)
    addr = {sid: cluster.config.server(sid).http_addr for sid in cluster.servers}
    directory = cluster.config.server(follower).data_dir / tablet_id
    leader_cpu0 = _cpu(cluster, leader)
    start = time.monotonic()
    cluster.restart_server(follower, lambda: shutil.rmtree(directory))
    ready = time.monotonic()
    installed = _wait(
        lambda: _metric(addr[follower], "tablet_copies_installed_total") >= 1, 600, "the copy"
    )
    commit = int(str(_tablet(addr[leader])["commit_index"]))
    caught_up = _wait(
        lambda: int(str(_tablet(addr[follower])["applied_index"])) >= commit, 600, "catch-up"
    )
    # What arrived: the snapshot, one self-contained file (no -wal beside it yet, or little).
    size_mib = (directory / "store.sqlite").stat().st_size / 2**20
    leader_cpu = _cpu(cluster, leader) - leader_cpu0
    follower_cpu = _cpu(cluster, follower)  # all since its start: the copy and the catch-up
    copy_s = installed - ready
    return [
        f"| {size_mib:,.1f} | {ready - start:.2f} | {copy_s:.2f} | {caught_up - ready:.2f} "
        f"| {size_mib / copy_s:,.1f} | {leader_cpu:.2f} | {follower_cpu:.2f} |"
    ]


def run(args: argparse.Namespace, root: Path) -> None:
    flags = [
        "--log_gc_interval_s",
        "1",
        # Small segments, so GC can discard the start of the log soon after the load.
        "--log_segment_size_bytes",
        str(1 << 20),
        "--tablet_copy_chunk_bytes",
        str(args.chunk_bytes),
    ]
    cluster = LocalCluster.create(root / "cluster", servers=3, tablets=1, extra_flags=flags)
    rows = [
        "| store MiB | stop + start s | start to copy installed s | start to caught up s "
        "| copy MiB/s | leader CPU s | copying server CPU s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    try:
        load(cluster, args)
        (tablet,) = cluster.health().tablets
        assert tablet.leader is not None
        leader_http = cluster.config.server(tablet.leader).http_addr
        # The copy is only needed once the leader's log no longer starts at 1.
        _wait(lambda: int(str(_tablet(leader_http)["first_index"])) > 1, 120, "log GC")
        for _ in range(args.repeat):
            rows += copy_once(cluster, tablet.tablet_id)
    finally:
        cluster.down()
    print("\n".join(rows), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--row-bytes", type=int, default=100)
    parser.add_argument("--batch-rows", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--chunk-bytes", type=int, default=1 << 20)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dir", help="where to make the temporary cluster directory")
    args = parser.parse_args(argv)
    print(
        f"# bench/tablet_copy.py  {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}  "
        f"python {platform.python_version()}  {os.cpu_count()} cpus  "
        f"{args.rows:,} rows of {args.row_bytes} B, 3 servers, 1 tablet, "
        f"chunks of {args.chunk_bytes:,} B",
        flush=True,
    )
    run_in_scratch_dir("raftlet-bench-copy-", args.dir, lambda root: run(args, root))


if __name__ == "__main__":
    main()
