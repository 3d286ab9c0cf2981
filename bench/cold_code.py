"""What the same work costs after a pause: code that has not run for a while runs slower.

    .venv/bin/python bench/cold_code.py [--gaps-ms 0.05,0.5,5,20] [--samples 400]
        [--wait spin,sleep] [--repeat 3] [--cpu 1] [--dir DIR]

Two pieces of the work a write's passes are made of, each timed alone (thread CPU,
``time.thread_time``) right after a pause of a given length: ``python`` -- a WriteRequest
built, serialized and parsed, and a 200-entry dict built and summed; ``store`` -- a one-write
``TabletStore.apply_batch`` (the leader's store transaction at one write in flight, as
``bench/store_apply.py`` makes its writes).  The pause is spent either spinning on the clock
(the thread never leaves its CPU and touches almost no memory) or sleeping (it blocks, as a
server's stage does between passes).  The process is pinned to one CPU (``--cpu``) so it does
not migrate.  Each cell (wait, pause) runs as a block of samples, the blocks in turn,
``--repeat`` times over; printed per pause: median
and p90 of each piece's thread CPU, and its median over that of the shortest pause.

A server's pass at one write in flight runs once every millisecond or two, with other
processes' work in between; at depth, the same code runs back to back.  What this prints is
how much of the difference between a pass's cost in a server and in a microbenchmark is the
pause alone (docs/benchmarks.md, "Code that has not run for a while").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _drivers import percentile
from store_apply import SCHEMA, _batches

from raftlet.proto import tablet_pb2
from raftlet.tserver.store import TabletStore

_WARM_UP = 200  # one-write applies before any is timed
_SETTLE = 5  # samples at the start of each cell's block, not kept


def python_work() -> int:
    """Protobuf and dict work of about the size of a small pass."""
    request = tablet_pb2.WriteRequest(tablet_id="kv-p0")
    tablet_pb2.WriteRequest.FromString(request.SerializeToString())
    table = {i: (i, str(i)) for i in range(200)}
    return sum(v[0] for v in table.values())


def pause(wait: str, seconds: float) -> None:
    if wait == "sleep":
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def timed(work: Callable[[], object]) -> float:
    start = time.thread_time()
    work()
    return time.thread_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gaps-ms", default="0.05,0.5,5,20")
    ap.add_argument("--samples", type=int, default=400, help="per cell and repetition")
    ap.add_argument("--wait", default="spin,sleep")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1)
    ap.add_argument("--dir", default=None, help="where the store goes (default: a temp dir)")
    args = ap.parse_args()
    gaps = [float(g) / 1000 for g in args.gaps_ms.split(",")]
    waits = args.wait.split(",")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    cells: dict[tuple[str, float], tuple[list[float], list[float]]] = {
        (w, g): ([], []) for w in waits for g in gaps
    }
    writes = (_SETTLE + args.samples) * len(cells) * args.repeat
    batches = iter(_batches(1, writes + _WARM_UP, 64))
    with tempfile.TemporaryDirectory(prefix="cold-code-", dir=args.dir) as d:
        store = TabletStore.open(Path(d) / "store.sqlite", SCHEMA)
        try:
            for _ in range(_WARM_UP):  # the tree's upper pages in the page cache
                store.apply_batch(next(batches))
            for _ in range(args.repeat):
                for (wait, gap), (py, st) in cells.items():
                    # A block per cell, so that what ran last before each piece is that
                    # piece, one pause (and the other piece) ago; the block's first few
                    # samples follow another cell's pauses, and are not kept.
                    for n in range(_SETTLE + args.samples):
                        pause(wait, gap)
                        cost = timed(python_work)
                        pause(wait, gap)
                        batch = next(batches)
                        cost_st = timed(lambda b=batch: store.apply_batch(b))
                        if n >= _SETTLE:
                            py.append(cost)
                            st.append(cost_st)
        finally:
            store.close()
    print(
        f"# bench/cold_code.py  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  "
        f"CPU {args.cpu}  {args.samples} samples x {args.repeat} per cell"
    )
    print("| wait | pause ms | python us (p50 / p90) | python / shortest "
          "| store us (p50 / p90) | store / shortest |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for wait in waits:
        base_py = statistics.median(cells[wait, gaps[0]][0])
        base_st = statistics.median(cells[wait, gaps[0]][1])
        for gap in gaps:
            py, st = cells[wait, gap]
            print(
                f"| {wait} | {gap * 1000:g} "
                f"| {statistics.median(py) * 1e6:.1f} / {percentile(py, 0.9) * 1e6:.1f} "
                f"| {statistics.median(py) / base_py:.2f} "
                f"| {statistics.median(st) * 1e6:.1f} / {percentile(st, 0.9) * 1e6:.1f} "
                f"| {statistics.median(st) / base_st:.2f} |"
            )


if __name__ == "__main__":
    main()
