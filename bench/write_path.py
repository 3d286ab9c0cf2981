"""Write throughput and latency against a real 3-server cluster, both term-check modes.

    .venv/bin/python bench/write_path.py [--seconds 5] [--writers 1,32] [--modes lockfree,locked]

For each mode a fresh local cluster (3 `raftlet tserver` processes on loopback, one table
with 2 hash partitions, replication factor 3) is started; then for each writer count, that
many threads write single-row INSERTs with unique keys for a fixed time, each write routed
to its tablet's leader, each with its own request id.  Printed: writes/s, p50/p99/max
latency, and the errors seen.  The servers, ports and directories are the bench's own and
removed at the end.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _drivers import percentile, run_threads_for

from raftlet.proto import tablet_pb2
from raftlet.schema.partition import partition_for_key
from raftlet.schema.rows import OpType, encode_row_op
from tests.integration.tserver_cluster import KV_SCHEMA, TserverCluster

PARTITIONS = 2


def run_cell(cluster: TserverCluster, writers: int, seconds: float, key_base: int) -> dict:
    leaders = cluster.wait_leaders()
    stubs = {tid: cluster.servers[sid].tablet for tid, sid in leaders.items()}
    latencies: list[list[float]] = [[] for _ in range(writers)]
    errors: dict[str, int] = {}
    lock = threading.Lock()

    def writer(slot: int, stop: threading.Event) -> int:
        client = f"bench-{key_base}-{slot}"
        seq = 0
        while not stop.is_set():
            seq += 1
            key = key_base + slot * 10_000_000 + seq
            tid = f"kv-p{partition_for_key(KV_SCHEMA, [key], PARTITIONS)}"
            req = tablet_pb2.WriteRequest(tablet_id=tid)
            req.request_id.client_id = client
            req.request_id.seq_no = seq
            req.request_id.first_incomplete_seq_no = seq
            req.ops.append(encode_row_op(KV_SCHEMA, OpType.INSERT, {"key": key, "value": "v"}))
            t0 = time.perf_counter()
            try:
                stubs[tid].Write(req, timeout=10)
            except grpc.RpcError as e:
                with lock:
                    errors[e.code().name] = errors.get(e.code().name, 0) + 1
                continue
            latencies[slot].append((time.perf_counter() - t0) * 1000)
        return len(latencies[slot])

    _, elapsed = run_threads_for(seconds, writers, writer)
    flat = [x for per in latencies for x in per]
    return {
        "writes": len(flat),
        "rate": len(flat) / elapsed,
        "p50": percentile(flat, 0.5),
        "p99": percentile(flat, 0.99),
        "max": max(flat) if flat else float("nan"),
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--writers", default="1,32")
    parser.add_argument("--modes", default="lockfree,locked")
    parser.add_argument("--flags", default="", help="extra tserver flags, space separated")
    args = parser.parse_args()
    print(
        f"# bench/write_path.py  {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}  "
        f"python {platform.python_version()}  {os.cpu_count()} cpus  {args.seconds:g} s per cell"
    )
    print("| mode     | writers | writes/s |  p50 ms |  p99 ms |  max ms | errors |")
    print("|----------|---------|----------|---------|---------|---------|--------|")
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory(prefix="raftlet-bench-") as tmp:
            flags = ["--term_check_mode", mode, *args.flags.split()]
            cluster = TserverCluster(Path(tmp), partitions=PARTITIONS, flags=flags)
            try:
                cluster.start()
                for i, writers in enumerate(int(w) for w in args.writers.split(",")):
                    cell = run_cell(cluster, writers, args.seconds, key_base=(i + 1) << 40)
                    errs = ",".join(f"{k}:{v}" for k, v in sorted(cell["errors"].items())) or "-"
                    print(
                        f"| {mode:<8} | {writers:>7} | {cell['rate']:>8,.0f} | "
                        f"{cell['p50']:>7.2f} | {cell['p99']:>7.2f} | {cell['max']:>7.1f} | "
                        f"{errs} |",
                        flush=True,
                    )
            finally:
                cluster.stop()


if __name__ == "__main__":
    main()
