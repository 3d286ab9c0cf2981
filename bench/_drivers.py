"""Drivers shared by the benchmarks: run producers for a fixed time, all starting
together, and count what they did.  (Not a benchmark itself: ``make bench`` skips files
whose name starts with an underscore.)"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any


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
