"""Throughput of the metrics primitives against lock-protected equivalents.

    .venv/bin/python bench/stats.py [--ops 100000] [--threads 1,4,16] [--repeat 5]

For each thread count, every thread performs a fixed number of operations (``--ops``);
the threads start together on a barrier and the wall time from the barrier to the last
join is measured. ops/s = threads * ops / wall time. Each cell is run ``--repeat`` times,
round-robin with the other implementations of its group, and the median is reported with
the min..max spread; "vs locked" divides medians.

Counters (each op: add 1):
- locked counter: ``with lock: self.value += n``, the obvious thread-safe counter;
- prometheus_client ``Counter.inc`` (which also takes a lock per increment);
- ``metrics.StripedCounter.increment`` (per-thread cell, no lock).

Histograms (each op: record one value from a precomputed log-uniform list in [1, 1e6]):
- locked histogram: the same log-linear bucketing, count/sum/min/max, under one lock;
- ``metrics.Histogram.observe`` (per-thread cells, no lock).

"loop only" rows time the same loop calling a no-op method: the floor every row pays.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter

from raftlet.metrics import Histogram, StripedCounter
from raftlet.metrics.histogram import (
    _HIGH,
    _INDEX_OFFSET,
    _LOW,
    _NUM_BUCKETS,
    _OVERFLOW,
    _UNDERFLOW,
)


class NoOp:
    def increment(self, n: int = 1) -> None:
        pass

    def observe(self, value: float) -> None:
        pass


class LockedCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0

    def increment(self, n: int = 1) -> None:
        with self._lock:
            self._value += n

    def value(self) -> int:
        return self._value


class LockedHistogram:
    """metrics.Histogram's bucketing and bookkeeping, in one shared cell under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = [0] * _NUM_BUCKETS
        self.sum: float = 0
        self.min = math.inf
        self.max = -math.inf

    def observe(self, value: float) -> None:
        with self._lock:
            if _LOW <= value < _HIGH:
                m, e = math.frexp(value)
                self.counts[(e << 6) + int(m * 128.0) + _INDEX_OFFSET] += 1
            elif value >= _HIGH:
                self.counts[_OVERFLOW] += 1
            elif value < _LOW:
                value = max(value, 0)
                self.counts[_UNDERFLOW] += 1
            else:
                return
            self.sum += value
            if value < self.min:
                self.min = value
            if value > self.max:
                self.max = value

    def count(self) -> int:
        return sum(self.counts)


@dataclass
class Subject:
    """One fresh instance under test: the operation, and how to read back its total."""

    op: Callable[..., None]
    total: Callable[[], float] | None  # None: nothing to check (the no-op)


def noop_subject() -> Subject:
    return Subject(NoOp().increment, None)


def locked_counter() -> Subject:
    c = LockedCounter()
    return Subject(c.increment, c.value)


def prom_counter() -> Subject:
    # A private registry: nothing global is touched, and each repeat starts from zero.
    registry = CollectorRegistry()
    c = PromCounter("bench_ops", "bench", registry=registry)
    return Subject(c.inc, lambda: registry.get_sample_value("bench_ops_total") or 0.0)


def striped_counter() -> Subject:
    c = StripedCounter()
    return Subject(c.increment, c.value)


def noop_histogram() -> Subject:
    return Subject(NoOp().observe, None)


def locked_histogram() -> Subject:
    h = LockedHistogram()
    return Subject(h.observe, h.count)


def striped_histogram() -> Subject:
    h = Histogram()
    return Subject(h.observe, lambda: h.snapshot().count)


@dataclass
class Cell:
    group: str
    impl: str
    threads: int
    ops_per_thread: int
    rates: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def run_threads(threads: int, body: Callable[[], None]) -> float:
    """Start ``threads`` threads running ``body`` together; return the wall time."""
    barrier = threading.Barrier(threads + 1)

    def run() -> None:
        barrier.wait()
        body()

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()  # every worker is at the barrier: the clock starts as they are released
    start = time.perf_counter()
    for w in workers:
        w.join()
    return time.perf_counter() - start


def count_loop(op: Callable[[], None], ops: int) -> Callable[[], None]:
    def body() -> None:
        for _ in range(ops):
            op()

    return body


def observe_loop(op: Callable[[float], None], values: Sequence[float]) -> Callable[[], None]:
    def body() -> None:
        for v in values:
            op(v)

    return body


def run_once(
    impl: str,
    factory: Callable[[], Subject],
    threads: int,
    ops: int,
    values: Sequence[float] | None,
) -> float:
    """ops/s of one run. Counters call ``op()`` ``ops`` times per thread; histograms
    ``op(v)`` for each of the ``ops`` values."""
    subject = factory()
    body = count_loop(subject.op, ops) if values is None else observe_loop(subject.op, values)
    wall = run_threads(threads, body)
    # A bench that counted wrong would measure nothing: verify every total.
    if subject.total is not None and subject.total() != threads * ops:
        raise AssertionError(f"{impl}: total {subject.total()}, expected {threads * ops}")
    return threads * ops / wall


def run_group(
    group: str,
    impls: list[tuple[str, Callable[[], Subject]]],
    threads: int,
    repeat: int,
    ops: int,
    values: Sequence[float] | None,
) -> list[Cell]:
    """Round-robin over the implementations ``repeat`` times, so that load from elsewhere on
    a shared machine falls on all of them alike rather than on whichever ran during it."""
    cells = [Cell(group, impl, threads, ops, []) for impl, _ in impls]
    for _ in range(repeat):
        for cell, (impl, factory) in zip(cells, impls, strict=True):
            cell.rates.append(run_once(impl, factory, threads, ops, values))
    return cells


def print_table(cells: list[Cell]) -> None:
    print(
        "| group     | implementation          | threads |    ops/s (median) |"
        " spread (min..max)         | vs locked |"
    )
    print(
        "|-----------|-------------------------|---------|-------------------|"
        "---------------------------|-----------|"
    )
    baseline = {(c.group, c.threads): c.median for c in cells if c.impl.startswith("locked")}
    for c in cells:
        base = baseline.get((c.group, c.threads))
        ratio = f"{c.median / base:.2f}x" if base else "-"
        spread = f"{min(c.rates):,.0f}..{max(c.rates):,.0f}"
        print(
            f"| {c.group:<9} | {c.impl:<23} | {c.threads:>7} | {c.median:>17,.0f} |"
            f" {spread:<25} | {ratio:>9} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=100_000, help="operations per thread")
    parser.add_argument("--threads", default="1,4,16", help="thread counts")
    parser.add_argument("--repeat", type=int, default=5, help="runs per cell (median shown)")
    args = parser.parse_args()
    thread_counts = [int(t) for t in args.threads.split(",")]
    rng = random.Random(42)
    values = [math.exp(rng.uniform(0.0, math.log(1e6))) for _ in range(args.ops)]
    print(
        f"# bench/stats.py  {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}  "
        f"python {platform.python_version()}  {os.cpu_count()} cpus  "
        f"switch interval {sys.getswitchinterval() * 1000:g} ms  "
        f"{args.ops:,} ops per thread  median of {args.repeat}"
    )
    cells: list[Cell] = []
    counters: list[tuple[str, Callable[[], Subject]]] = [
        ("loop only", noop_subject),
        ("locked counter", locked_counter),
        ("prometheus Counter.inc", prom_counter),
        ("StripedCounter", striped_counter),
    ]
    histograms: list[tuple[str, Callable[[], Subject]]] = [
        ("loop only", noop_histogram),
        ("locked histogram", locked_histogram),
        ("Histogram", striped_histogram),
    ]
    for threads in thread_counts:
        cells += run_group("counter", counters, threads, args.repeat, args.ops, None)
    for threads in thread_counts:
        cells += run_group("histogram", histograms, threads, args.repeat, args.ops, values)
    print_table(cells)


if __name__ == "__main__":
    main()
