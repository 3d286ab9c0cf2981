"""Drivers shared by the benchmarks: run producers for a fixed time, all starting
together, and count what they did.  (Not a benchmark itself: ``make bench`` skips files
whose name starts with an underscore.)"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank of the sorted values; nan if empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_threads_for(
    seconds: float, producers: int, produce: Callable[[int, threading.Event], int]
) -> tuple[int, float]:
    """Run ``produce(slot, stop)`` on ``producers`` threads that start together, until
    ``seconds`` have passed; each returns how many operations it made.  Returns (operations,
    elapsed seconds)."""
    counts = [0] * producers
    gate = threading.Barrier(producers + 1)
    stop = threading.Event()

    def body(slot: int) -> None:
        gate.wait()
        counts[slot] = produce(slot, stop)

    threads = [
        threading.Thread(target=body, args=(i,), name=f"producer-{i}") for i in range(producers)
    ]
    for t in threads:
        t.start()
    gate.wait()
    start = time.perf_counter()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts), time.perf_counter() - start


async def run_coroutines_for(
    seconds: float, producers: int, produce: Callable[[asyncio.Event], Coroutine[Any, Any, int]]
) -> tuple[int, float]:
    """``run_threads_for`` with the producers as tasks on the running event loop."""
    stop = asyncio.Event()
    start = time.perf_counter()
    tasks = [asyncio.create_task(produce(stop)) for _ in range(producers)]
    await asyncio.sleep(seconds)
    stop.set()
    counts = await asyncio.gather(*tasks)
    return sum(counts), time.perf_counter() - start


def run_in_scratch_dir(prefix: str, parent: str | None, run: Callable[[Path], None]) -> None:
    """``run(root)`` in a new temporary directory under ``parent`` (None: the system's),
    removed afterwards -- also when SIGTERM ends the run: it unwinds like Ctrl-C, so the
    clusters the run started are stopped first."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        run(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def python_in(tree: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` importing raftlet from source tree ``tree``, output captured."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.run(
        [sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, timeout=timeout
    )


def cluster_servers(data: Path) -> list[dict[str, Any]]:
    """The servers of the local cluster in ``data`` (its cluster.json): id, pid, rpc_addr..."""
    servers: list[dict[str, Any]] = json.loads((data / "cluster.json").read_text())["servers"]
    return servers


def raftlet_cli(tree: Path, *args: str) -> str:
    """``python -m raftlet ARGS`` run from source tree ``tree``; what it printed."""
    done = python_in(tree, "-m", "raftlet", *args, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"raftlet {' '.join(args)} ({tree}) failed:\n{done.stderr[-2000:]}")
    return done.stdout


_STEP_DOWN = (
    "import sys; from pathlib import Path; from raftlet.client import Client; "
    "from raftlet.client.tls import TlsOptions; from raftlet.deploy.local import local_tls_files; "
    "f = local_tls_files(Path(sys.argv[2])); "
    "c = Client(sys.argv[1].split(','), tls=TlsOptions(*f) if f else None)\n"
    "for move in sys.argv[3:]:\n"
    "    tablet, _, to = move.partition('=')\n"
    "    try: c.leader_step_down(tablet, to)\n"
    "    except Exception as e: print(tablet, e, file=sys.stderr)\n"
    "c.close()"
)


def _leaders(tree: Path, data: Path) -> dict[str, str]:
    status = json.loads(
        raftlet_cli(tree, "cluster", "status", "--data-dir", str(data), "--format", "json")
    )
    return {t["tablet_id"]: t.get("leader") or "" for t in status["tablets"]}


def place_leaders(tree: Path, data: Path, timeout_s: float = 120.0) -> dict[str, str]:
    """Move the leader of tablet i to server i mod 3 (kv-p0 on the first server, ...):
    where elections put leaders moves a many-tablet run more than most changes do, so
    every run of a bench gets the same placement.  Returns tablet id -> leader."""
    servers = cluster_servers(data)
    ids = [srv["id"] for srv in servers]
    seeds = ",".join(srv["rpc_addr"] for srv in servers)
    deadline = time.monotonic() + timeout_s
    while True:
        leaders = _leaders(tree, data)
        want = {tid: ids[int(tid.rsplit("p", 1)[1]) % len(ids)] for tid in leaders}
        wrong = [tid for tid in leaders if leaders[tid] != want[tid]]
        if not wrong:
            return leaders
        if time.monotonic() > deadline:
            raise RuntimeError(f"leaders {leaders} not moved to {want} in {timeout_s} s")
        # A tablet without a leader now is in an election: looked at again next time.
        moves = [f"{tid}={want[tid]}" for tid in wrong if leaders[tid]]
        if moves:  # a refused move is looked at again next time, like a missing leader
            python_in(tree, "-c", _STEP_DOWN, seeds, str(data), *moves, timeout=120)
        time.sleep(0.5)  # a transfer takes an election round; not a test, so polling is fine
