"""What a store transaction costs, split at its commit: one-row writes applied in batches.

    .venv/bin/python bench/store_apply.py [--writes-per-apply 1,10,30] [--writes 6000]
        [--writers 64] [--repeat 3] [--dir DIR]

Applies one-row INSERTs (100-byte values; each from one of W clients with rising request
ids, keys as ``raftlet write`` makes them: each writer its own key range, so a batch's rows
land on as many leaf pages as it has writers) with the server's ``TabletStore.apply_batch``
to a store in a temporary directory (under DIR), N writes per apply. The
``before_commit`` hook splits each transaction: the statements (rows, request records,
the applied index) before it, COMMIT after it -- the part a leader's writers no longer
wait for.  Printed per N, medians over the repetitions: thread CPU per write of each part
and the commit's share, and user and kernel CPU per write of the whole (``getrusage``).

A single thread, warm caches: a server's apply stage, between other threads' work, pays
more per call (``bench/pass_cpu.py``), so read the split, not the totals.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import tempfile
import time
from pathlib import Path

from raftlet.cli.write_load import RowFactory
from raftlet.schema.row_runs import RowRun
from raftlet.schema.rows import OpType
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from raftlet.tserver.store import ApplyEntry, EntryResult, TabletStore

SCHEMA = Schema(
    [
        ColumnSchema("k", DataType.INT64, is_key=True),
        ColumnSchema("v", DataType.STRING, nullable=True),
    ]
)
_WARMUP = 200  # applies before the clock starts: the tree's upper pages in cache


def _batches(per_apply: int, applies: int, writers: int) -> list[list[ApplyEntry]]:
    rows = RowFactory(SCHEMA, row_bytes=100)  # raftlet write's keys and values
    seq = [0] * writers
    index = 0
    out = []
    for _ in range(applies):
        batch = []
        for _ in range(per_apply):
            w = random.randrange(writers)
            seq[w] += 1
            index += 1
            row = rows.row(w, seq[w])
            run = RowRun(OpType.INSERT, 1, ("v",), [(row["k"], row["v"])], [0])
            batch.append(ApplyEntry(index, 1, [run], (f"client-{w}", seq[w]), seq[w]))
        out.append(batch)
    return out


def measure(
    per_apply: int, applies: int, writers: int, parent: str | None = None
) -> dict[str, float]:
    """One run: µs per write of the statements and of the commit (thread CPU), and user
    and kernel µs per write of the whole (rusage)."""
    batches = _batches(per_apply, applies + _WARMUP, writers)
    clock = time.thread_time
    split = [0.0, 0.0]  # statements, commit
    mark = [0.0]

    def before_commit(_results: list[EntryResult]) -> None:
        mark[0] = clock()

    with tempfile.TemporaryDirectory(prefix="store-apply-", dir=parent) as d:
        store = TabletStore.open(Path(d) / "store.sqlite", SCHEMA)
        try:
            for batch in batches[:_WARMUP]:
                store.apply_batch(batch)
            r0 = resource.getrusage(resource.RUSAGE_THREAD)
            for batch in batches[_WARMUP:]:
                start = clock()
                store.apply_batch(batch, before_commit=before_commit)
                end = clock()
                split[0] += mark[0] - start
                split[1] += end - mark[0]
            r1 = resource.getrusage(resource.RUSAGE_THREAD)
        finally:
            store.close()
    writes = applies * per_apply
    return {
        "statements": split[0] / writes * 1e6,
        "commit": split[1] / writes * 1e6,
        "user": (r1.ru_utime - r0.ru_utime) / writes * 1e6,
        "kernel": (r1.ru_stime - r0.ru_stime) / writes * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writes-per-apply", default="1,10,30")
    ap.add_argument("--writes", type=int, default=6000, help="timed writes per run")
    ap.add_argument("--writers", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    args = ap.parse_args()
    sizes = [int(n) for n in args.writes_per_apply.split(",")]
    print(
        f"# bench/store_apply.py  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  "
        f"{args.writes} writes a run, {args.writers} writers, median of {args.repeat}"
    )
    print("| writes/apply | statements us/write | commit us/write | commit share "
          "| user us/write | kernel us/write |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        applies = max(args.writes // n, 1)
        runs = [measure(n, applies, args.writers, args.dir) for _ in range(args.repeat)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        share = med["commit"] / (med["statements"] + med["commit"])
        print(
            f"| {n} | {med['statements']:.1f} | {med['commit']:.1f} | {share:.0%} "
            f"| {med['user']:.1f} | {med['kernel']:.1f} |"
        )


if __name__ == "__main__":
    main()
