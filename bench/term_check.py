"""Checking (term, role): an immutable snapshot versus a lock, idle and under a slow holder.

    .venv/bin/python bench/term_check.py [--seconds 1] [--threads 1,4,16]

The micro version of the contention scenario: RPC handlers that only need to know the
current term and role either

- snapshot: read one attribute holding a frozen ``(term, role)`` dataclass (replaced as a
  whole on every change, so a reader can never see a torn pair), or
- ProfiledLock: take the replica's lock (a ``metrics.ProfiledLock``) and read two fields,
- plain Lock: the same with a bare ``threading.Lock`` (what the profiling itself costs),

each while the lock is idle and while a background thread holds it for 5 ms of every
10 ms (a slow fsync under the lock; the background thread's ``time.sleep`` is that
workload). Every thread calls in a loop for ``--seconds`` (checking the clock every 1,000
calls), timing each call with ``perf_counter_ns``; p50/p99/p99.9/max are nearest-rank over
all calls of all threads, and ops/s is all calls over the wall time from the start barrier
to the last join (timer included). "timer only" rows time an empty call: the measurement
floor of the other rows. For ProfiledLock rows, contention_time_us is the lock's total wait
(readers and the background holder); "held" is the share of the wall time the background
thread really held the lock (it needs the GIL back to release it, so it can exceed 50%).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from raftlet.metrics import ProfiledLock


@dataclass(frozen=True, slots=True)
class TermRole:
    term: int
    role: str


class Replica:
    """The two ways of publishing (term, role)."""

    def __init__(self) -> None:
        # No trace logs: the bench measures waits, it does not want them printed.
        self.lock = ProfiledLock("consensus_lock", trace_threshold_ms=60_000)
        self.plain_lock = threading.Lock()
        self.term = 7
        self.role = "LEADER"
        self.state = TermRole(7, "LEADER")


def read_nothing(r: Replica) -> object:
    return None


def read_snapshot(r: Replica) -> object:
    s = r.state  # the one shared read; the fields belong to an immutable object
    return s.term, s.role


def read_locked(r: Replica) -> object:
    with r.lock:
        return r.term, r.role


def read_plain_locked(r: Replica) -> object:
    with r.plain_lock:
        return r.term, r.role


READERS: list[tuple[str, Callable[[Replica], object]]] = [
    ("timer only", read_nothing),
    ("snapshot", read_snapshot),
    ("ProfiledLock", read_locked),
    ("plain Lock", read_plain_locked),
]


@dataclass
class Cell:
    mode: str
    lock_state: str
    threads: int
    latencies_ns: Counter[int]  # latency -> number of calls that took it
    wall_s: float
    contention_us: int | None
    held_share: float | None

    @property
    def calls(self) -> int:
        return self.latencies_ns.total()

    def pct(self, q: float) -> int:
        """Nearest rank over all calls."""
        rank = min(self.calls, max(1, math.ceil(q / 100 * self.calls)))
        seen = 0
        for latency in sorted(self.latencies_ns):
            seen += self.latencies_ns[latency]
            if seen >= rank:
                return latency
        raise AssertionError("unreachable")


class SlowHolder:
    """Holds the lock for ``hold_s`` of every ``period_s`` until stopped."""

    def __init__(
        self, lock: ProfiledLock | threading.Lock, hold_s: float = 0.005, period_s: float = 0.010
    ):
        self._lock = lock
        self._hold_s = hold_s
        self._rest_s = period_s - hold_s
        self._stop = threading.Event()
        self.held_ns = 0
        self._thread = threading.Thread(target=self._run, name="slow-fsync", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                start = time.perf_counter_ns()
                time.sleep(self._hold_s)
                self.held_ns += time.perf_counter_ns() - start
            time.sleep(self._rest_s)

    def __enter__(self) -> SlowHolder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_cell(
    mode: str, reader: Callable[[Replica], object], threads: int, seconds: float, busy: bool
) -> Cell:
    replica = Replica()
    lock = replica.plain_lock if mode == "plain Lock" else replica.lock
    barrier = threading.Barrier(threads + 1)
    per_thread: list[array[int]] = []
    duration_ns = int(seconds * 1e9)

    def work() -> None:
        clock = time.perf_counter_ns
        # array, not list: millions of latencies as 8-byte slots, not int objects.
        lat: array[int] = array("q")
        record = lat.append
        r = replica
        barrier.wait()
        deadline = clock() + duration_ns
        while clock() < deadline:
            for _ in range(1000):
                t0 = clock()
                reader(r)
                record(clock() - t0)
        per_thread.append(lat)  # list.append is atomic

    workers = [threading.Thread(target=work) for _ in range(threads)]
    holder = SlowHolder(lock) if busy else None
    if holder is not None:
        holder.__enter__()
    for w in workers:
        w.start()
    barrier.wait()
    start = time.perf_counter()
    held_before = holder.held_ns if holder else 0
    for w in workers:
        w.join()
    wall = time.perf_counter() - start
    held_share = (holder.held_ns - held_before) / 1e9 / wall if holder else None
    if holder is not None:
        holder.__exit__()
    latencies: Counter[int] = Counter()
    for lat in per_thread:
        latencies.update(lat)  # counted in C; sorting millions of ints would not be
    contention = replica.lock.contention_time_us() if mode == "ProfiledLock" else None
    state = "held 5/10 ms" if busy else "idle"
    return Cell(mode, state, threads, latencies, wall, contention, held_share)


def print_table(cells: list[Cell]) -> None:
    print(
        "| lock state   | read         | threads |  p50 ns |   p99 ns |  p99.9 ns |      max ns |"
        "       ops/s | contention_time_us | held |"
    )
    print(
        "|--------------|--------------|---------|---------|----------|-----------|-------------|"
        "-------------|--------------------|------|"
    )
    for c in cells:
        contention = f"{c.contention_us:,}" if c.contention_us is not None else "-"
        held = f"{c.held_share:.0%}" if c.held_share is not None else "-"
        print(
            f"| {c.lock_state:<12} | {c.mode:<12} | {c.threads:>7} | {c.pct(50):>7,} |"
            f" {c.pct(99):>8,} | {c.pct(99.9):>9,} | {c.pct(100):>11,} |"
            f" {c.calls / c.wall_s:>11,.0f} | {contention:>18} | {held:>4} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="duration of each cell")
    parser.add_argument("--threads", default="1,4,16", help="thread counts")
    args = parser.parse_args()
    print(
        f"# bench/term_check.py  {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}  "
        f"python {platform.python_version()}  {os.cpu_count()} cpus  "
        f"switch interval {sys.getswitchinterval() * 1000:g} ms  {args.seconds:g} s per cell"
    )
    cells = []
    for busy in (False, True):
        for threads in (int(t) for t in args.threads.split(",")):
            for mode, reader in READERS:
                cells.append(run_cell(mode, reader, threads, args.seconds, busy))
    print_table(cells)


if __name__ == "__main__":
    main()
