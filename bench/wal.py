"""WAL append throughput and latency: fsync per entry versus group commit.

    .venv/bin/python bench/wal.py [--seconds 3] [--dir /path/on/the/disk/to/test]

Cells (each for 100-byte and 4 KiB entries, a fixed duration each):

- fsync/entry: one producer calls the blocking ``Log.append([entry])`` in a loop, so each
  entry gets its own write and fdatasync.
- group commit, P producers: P threads each append one entry with ``append_async`` and wait
  for its callback before the next; indexes are assigned in order under a tiny lock at
  enqueue.  The appender syncs whatever was queued since its last sync.
- group, 1 CPU (extra row, ``--no-one-cpu`` skips it): the largest group-commit cell again
  with every thread of the process pinned to one CPU, to show what the cross-CPU wake-ups
  of CPython threads cost (see docs/benchmarks.md).
- bare floor (extra rows, ``--no-floor`` skips them): the same producers against a minimal
  appender with no log at all (write, fdatasync, release the waiters): the ceiling that
  CPython thread hand-offs put on any design with one waiting thread per entry.  "bare,
  asyncio" is the same for coroutine producers: what is left of a group-commit cycle with
  no entry objects, no checks, no index, cache, framing or per-batch callbacks; "bare,
  async cb" adds back only the per-batch callbacks (the log's contract), as the
  "group, asyncio" cells receive them.

Latency is what a producer waits, from ``append_async`` to its callback, as the log's
observer reports it (the future ``log_append_latency_us``); entries/sync comes from the
observer's group reports (``log_group_commit_entries``).  Temporary log directories are
created under ``--dir`` (default: the system temp dir) and removed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import os
import platform
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from _drivers import percentile, run_coroutines_for, run_threads_for

from raftlet.consensus.core.types import Entry
from raftlet.consensus.log import Log, LogOptions


class BenchObserver:
    """Collects what the log reports (the same hook the metrics layer will use)."""

    def __init__(self) -> None:
        self.latencies_us: list[float] = []
        self.syncs = 0
        self.synced_entries = 0
        self.sync_us = 0.0

    def batch_durable(self, entries: int, latency_us: float) -> None:
        self.latencies_us.append(latency_us)  # list.append is atomic; one appender thread

    def group_synced(
        self, batches: int, entries: int, nbytes: int, write_us: float, sync_us: float
    ) -> None:
        self.syncs += 1
        self.synced_entries += entries
        self.sync_us += sync_us

    def producer_blocked(self, queued_bytes: int) -> None:
        pass


@dataclass
class Cell:
    mode: str
    producers: int
    size: int
    entries: int
    seconds: float
    p50_us: float
    p99_us: float
    syncs: int
    mean_sync_us: float

    @property
    def rate(self) -> float:
        return self.entries / self.seconds


def observed_cell(
    mode: str, producers: int, size: int, entries: int, elapsed: float, obs: BenchObserver
) -> Cell:
    """A cell whose latencies and syncs come from what the log reported to ``obs``."""
    return Cell(
        mode,
        producers,
        size,
        entries,
        elapsed,
        percentile(obs.latencies_us, 0.5),
        percentile(obs.latencies_us, 0.99),
        obs.syncs,
        obs.sync_us / max(obs.syncs, 1),
    )


def run_fsync_per_entry(base: str, size: int, seconds: float, options: LogOptions) -> Cell:
    obs = BenchObserver()
    directory = tempfile.mkdtemp(prefix="walbench-", dir=base)
    payload = b"x" * size
    try:
        with Log.open(directory, options, obs) as log:
            index = 0
            start = time.perf_counter()
            deadline = start + seconds
            while time.perf_counter() < deadline:
                index += 1
                log.append([Entry(term=1, index=index, data=payload)])
            elapsed = time.perf_counter() - start
    finally:
        shutil.rmtree(directory)
    return observed_cell("fsync/entry", 1, size, index, elapsed, obs)


def run_group_commit(
    base: str, size: int, producers: int, seconds: float, options: LogOptions
) -> Cell:
    obs = BenchObserver()
    directory = tempfile.mkdtemp(prefix="walbench-", dir=base)
    payload = b"x" * size
    order = threading.Lock()
    next_index = [1]
    try:
        with Log.open(directory, options, obs) as log:

            def produce(slot: int, stop: threading.Event) -> int:
                # A plain lock as the wait: the cheapest thing a callback can wake.
                done = threading.Lock()
                done.acquire()
                release = done.release

                def callback(error: BaseException | None) -> None:
                    release()

                n = 0
                while not stop.is_set():
                    with order:
                        index = next_index[0]
                        next_index[0] = index + 1
                        log.append_async([Entry(term=1, index=index, data=payload)], callback)
                    done.acquire()
                    n += 1
                return n

            entries, elapsed = run_threads_for(seconds, producers, produce)
    finally:
        shutil.rmtree(directory)
    return observed_cell("group commit", producers, size, entries, elapsed, obs)


class LoopCompleter:
    """Append callbacks (on the appender thread) that resolve futures on an event loop:
    each callback only collects its future, and the first one collected since the loop
    last drained wakes the loop, which resolves them all."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._finished: list[asyncio.Future[None]] = []

    def _drain(self) -> None:
        with self._lock:
            batch = self._finished
            self._finished = []
        for fut in batch:
            fut.set_result(None)

    def callback_for(self, fut: asyncio.Future[None]) -> Callable[[BaseException | None], None]:
        def callback(error: BaseException | None) -> None:
            with self._lock:
                self._finished.append(fut)
                first = len(self._finished) == 1
            if first:
                self._loop.call_soon_threadsafe(self._drain)

        return callback


def run_group_commit_asyncio(
    base: str, size: int, producers: int, seconds: float, options: LogOptions
) -> Cell:
    """P producers as coroutines on one event loop, the way the tablet server's reactor
    completes RPCs: each appends one entry and awaits its future, completed through a
    ``LoopCompleter``.  No thread is woken per entry."""
    obs = BenchObserver()
    directory = tempfile.mkdtemp(prefix="walbench-", dir=base)
    payload = b"x" * size

    async def bench(log: Log) -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        completer = LoopCompleter(loop).callback_for
        next_index = 1

        async def produce(stop: asyncio.Event) -> int:
            nonlocal next_index
            n = 0
            while not stop.is_set():
                fut: asyncio.Future[None] = loop.create_future()
                index, next_index = next_index, next_index + 1
                log.append_async([Entry(term=1, index=index, data=payload)], completer(fut))
                await fut
                n += 1
            return n

        return await run_coroutines_for(seconds, producers, produce)

    try:
        with Log.open(directory, options, obs) as log:
            entries, elapsed = asyncio.run(bench(log))
    finally:
        shutil.rmtree(directory)
    return observed_cell("group, asyncio", producers, size, entries, elapsed, obs)


def run_on_one_cpu(
    base: str, size: int, producers: int, seconds: float, options: LogOptions
) -> Cell:
    """The group-commit cell again with the appender and every producer on one CPU.

    Threads inherit the affinity of the thread that starts them, so pinning the main thread
    for the duration of the cell pins the appender and the producers too.  With the GIL,
    Python runs on one CPU at a time anyway; what pinning removes is the cross-CPU wake-up
    of every producer a callback releases (which mostly finds the GIL taken and sleeps
    again).  Extra row, for comparison only: the required rows are not pinned.
    """
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        cell = run_group_commit(base, size, producers, seconds, options)
    finally:
        os.sched_setaffinity(0, allowed)
    cell.mode = "group, 1 CPU"
    return cell


def run_bare(base: str, size: int, producers: int, seconds: float) -> Cell:
    """The floor for thread producers on this machine: the same producers against a
    20-line appender that only writes, fdatasyncs and releases the waiting producers (no
    framing, index, cache or callbacks).  Whatever the log does, it cannot beat this row."""
    fd, path = tempfile.mkstemp(prefix="walbench-", dir=base)
    queue: list[tuple[bytes, threading.Lock]] = []
    qlock = threading.Lock()
    wake = threading.Lock()
    wake.acquire()
    state = {"idle": False, "stop": False, "syncs": 0}
    payload = b"x" * size

    def appender() -> None:
        nonlocal queue
        while True:
            with qlock:
                if not queue:
                    if state["stop"]:
                        return
                    state["idle"] = True
            if state["idle"]:
                wake.acquire()
                continue
            with qlock:
                group, queue = queue, []
            os.write(fd, b"".join(data for data, _ in group))
            os.fdatasync(fd)
            state["syncs"] += 1
            for _, done in group:
                done.release()

    def produce(slot: int, stop: threading.Event) -> int:
        done = threading.Lock()
        n = 0
        while not stop.is_set():
            done.acquire()
            with qlock:
                queue.append((payload, done))
                if state["idle"]:
                    state["idle"] = False
                    wake.release()
            done.acquire()
            done.release()
            n += 1
        return n

    try:
        t = threading.Thread(target=appender, name="bare-appender")
        t.start()
        entries, elapsed = run_threads_for(seconds, producers, produce)
        with qlock:
            state["stop"] = True
            if state["idle"]:
                state["idle"] = False
                wake.release()
        t.join()
    finally:
        os.close(fd)
        os.unlink(path)
    nan = float("nan")
    return Cell("bare floor", producers, size, entries, elapsed, nan, nan, state["syncs"], nan)


def run_bare_asyncio(
    base: str, size: int, producers: int, seconds: float, callbacks: bool = False
) -> Cell:
    """``run_bare`` with the producers as coroutines: each queues its payload and a future
    and awaits it; the appender writes, fdatasyncs and wakes the loop once per group.  With
    ``callbacks`` it instead calls one callback per entry, the ``LoopCompleter`` the log's
    asyncio cells use: the cost of the log's per-batch callback contract alone."""
    fd, path = tempfile.mkstemp(prefix="walbench-", dir=base)
    payload = b"x" * size
    queue: list[tuple[bytes, asyncio.Future[None], Callable[[BaseException | None], None]]] = []
    work = threading.Condition()
    state = {"idle": False, "stop": False, "syncs": 0}

    def appender(loop: asyncio.AbstractEventLoop) -> None:
        nonlocal queue
        while True:
            with work:
                while not queue:
                    if state["stop"]:
                        return
                    state["idle"] = True
                    work.wait()
                group, queue = queue, []
            os.write(fd, b"".join(data for data, _, _ in group))
            os.fdatasync(fd)
            state["syncs"] += 1
            if callbacks:
                for _, _, callback in group:
                    callback(None)
            else:
                loop.call_soon_threadsafe(_resolve_all, [fut for _, fut, _ in group])

    async def bench() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        t = threading.Thread(target=appender, args=(loop,), name="bare-appender")
        t.start()
        completer = LoopCompleter(loop).callback_for

        async def produce(stop: asyncio.Event) -> int:
            n = 0
            while not stop.is_set():
                fut: asyncio.Future[None] = loop.create_future()
                callback = completer(fut) if callbacks else _ignore
                with work:
                    queue.append((payload, fut, callback))
                    if state["idle"]:
                        state["idle"] = False
                        work.notify()
                await fut
                n += 1
            return n

        try:
            return await run_coroutines_for(seconds, producers, produce)
        finally:
            with work:
                state["stop"] = True
                work.notify()
            t.join()

    try:
        entries, elapsed = asyncio.run(bench())
    finally:
        os.close(fd)
        os.unlink(path)
    nan = float("nan")
    mode = "bare, async cb" if callbacks else "bare, asyncio"
    return Cell(mode, producers, size, entries, elapsed, nan, nan, state["syncs"], nan)


def _ignore(error: BaseException | None) -> None:
    pass


def _resolve_all(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:
        fut.set_result(None)


def print_table(cells: list[Cell]) -> None:
    base = {c.size: c.rate for c in cells if c.mode == "fsync/entry"}
    header = (
        f"| {'mode':<14} | {'producers':>9} | {'entry':>6} | {'entries/s':>9} | "
        f"{'vs fsync/entry':>14} | {'p50 us':>8} | {'p99 us':>8} | {'entries/sync':>12} | "
        f"{'sync us':>7} |"
    )
    print(header)
    print("|" + "|".join("-" * len(col) for col in header.split("|")[1:-1]) + "|")

    def us(value: float, width: int) -> str:
        return f"{'-':>{width}}" if math.isnan(value) else f"{value:>{width},.0f}"

    for c in cells:
        size = f"{c.size} B" if c.size < 1024 else f"{c.size // 1024} KiB"
        print(
            f"| {c.mode:<14} | {c.producers:>9} | {size:>6} | {c.rate:>9,.0f} | "
            f"{c.rate / base[c.size]:>13.1f}x | {us(c.p50_us, 8)} | {us(c.p99_us, 8)} | "
            f"{c.entries / max(c.syncs, 1):>12.1f} | {us(c.mean_sync_us, 7)} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each cell")
    parser.add_argument("--dir", default=None, help="where the temporary logs go")
    parser.add_argument("--producers", default="1,8,32", help="group-commit producer counts")
    parser.add_argument("--sizes", default="100,4096", help="entry payload sizes in bytes")
    parser.add_argument(
        "--no-one-cpu",
        dest="one_cpu",
        action="store_false",
        help="skip the extra row with every thread pinned to one CPU",
    )
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the extra rows with a bare write+fdatasync appender and no log",
    )
    parser.add_argument("--inject-latency-ms", type=float, default=0.0)
    args = parser.parse_args()
    options = LogOptions(inject_latency_ms=args.inject_latency_ms)
    base = args.dir or tempfile.gettempdir()
    print(
        f"# bench/wal.py  {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}  "
        f"python {platform.python_version()}  {os.cpu_count()} cpus  dir={base}  "
        f"{args.seconds:g} s per cell  inject_latency_ms={args.inject_latency_ms:g}"
    )
    cells: list[Cell] = []
    for size in (int(s) for s in args.sizes.split(",")):
        cells.append(run_fsync_per_entry(base, size, args.seconds, options))
        for producers in (int(p) for p in args.producers.split(",")):
            cells.append(run_group_commit(base, size, producers, args.seconds, options))
        for producers in (int(p) for p in args.producers.split(",")):
            cells.append(run_group_commit_asyncio(base, size, producers, args.seconds, options))
        if args.one_cpu and hasattr(os, "sched_setaffinity"):
            producers = max(int(p) for p in args.producers.split(","))
            cells.append(run_on_one_cpu(base, size, producers, args.seconds, options))
        if args.floor:
            for producers in sorted({1, max(int(p) for p in args.producers.split(","))}):
                cells.append(run_bare(base, size, producers, args.seconds))
            producers = max(int(p) for p in args.producers.split(","))
            cells.append(run_bare_asyncio(base, size, producers, args.seconds))
            cells.append(run_bare_asyncio(base, size, producers, args.seconds, callbacks=True))
    print_table(cells)


if __name__ == "__main__":
    main()
