"""A concurrent log-linear histogram: per-thread buckets, merged only when read.

Bucketing (HdrHistogram-like): a positive value ``v`` is split by ``math.frexp`` into
``m * 2**e`` with ``m`` in [0.5, 1); the octave [2**(e-1), 2**e) is cut into 64 equal
linear sub-buckets, so a bucket [L, U) has U - L = L/64 at most (at the bottom of an
octave). A percentile is reported as the midpoint of its bucket (clamped to the observed
min and max), which is within (U - L) / 2 / L = 1/128 < 0.79% of any value in the bucket:
the relative error is below 1% everywhere in the tracked range.

Tracked range: [2**-4, 2**36) in the metric's unit, i.e. 0.0625 µs to about 19 hours for a
microsecond histogram (the requirement is 1 µs to 1 hour). Values below it (including 0
and negatives, which are clamped to 0) share one underflow bucket; values above share one
overflow bucket. min, max and sum are kept exactly in any case. NaN is ignored.

Concurrency: each thread owns a cell (bucket list, sum, min, max) reached through a
``threading.local``; ``observe`` takes no lock. Only the owner writes a cell, so under
the GIL no update is lost; a reader sees each field atomically, though a snapshot taken
while observations are in flight may reflect an observation in its bucket but not yet in
the sum (the same looseness as Kudu's histograms; exact once writers are quiet). Cells of
threads that have ended are folded into a base cell (see ``metrics.counter`` for the
mechanism), so nothing is lost and nothing leaks.

Memory: 2,562 buckets (about 20 KiB) per thread that has observed into a histogram.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import add

from raftlet.metrics._thread_cells import PerThreadCells

__all__ = ["DEFAULT_BUCKET_BOUNDS", "MAX_RELATIVE_ERROR", "Histogram", "HistogramSnapshot"]

_SUB_BITS = 6
_SUB_BUCKETS = 1 << _SUB_BITS  # linear sub-buckets per power of two
# frexp exponents e tracked: values in [2**(e-1), 2**e) for e in [_E_MIN, _E_MAX].
_E_MIN = -3
_E_MAX = 36
_LOW = math.ldexp(1.0, _E_MIN - 1)  # 0.0625: smallest value with its own bucket
_HIGH = math.ldexp(1.0, _E_MAX)  # 2**36: first value in the overflow bucket
_OCTAVES = _E_MAX - _E_MIN + 1
_UNDERFLOW = 0
_OVERFLOW = 1 + _OCTAVES * _SUB_BUCKETS
_NUM_BUCKETS = _OVERFLOW + 1
# index = (e - _E_MIN) * 64 + (int(m * 128) - 64) + 1, folded into one shift and one add:
_INDEX_OFFSET = -(_E_MIN * _SUB_BUCKETS) - _SUB_BUCKETS + 1

#: Worst-case relative error of a reported percentile inside the tracked range.
MAX_RELATIVE_ERROR = 1.0 / (2 * _SUB_BUCKETS)

#: Default upper bounds for ``HistogramSnapshot.buckets()``: powers of two from 1 to 2**35.
#: They coincide with bucket edges, so the cumulative counts are exact (except that a value
#: exactly equal to a bound is counted in the next bound up).
DEFAULT_BUCKET_BOUNDS: tuple[float, ...] = tuple(math.ldexp(1.0, k) for k in range(36))


def _bucket_index(value: float) -> int:
    """Index of the bucket holding ``value`` (the hot path inlines the common case)."""
    if _LOW <= value < _HIGH:
        m, e = math.frexp(value)
        return (e << _SUB_BITS) + int(m * (2 * _SUB_BUCKETS)) + _INDEX_OFFSET
    if value >= _HIGH:
        return _OVERFLOW
    return _UNDERFLOW


def _bucket_bounds(index: int) -> tuple[float, float]:
    """[lower, upper) of bucket ``index``."""
    if index == _UNDERFLOW:
        return 0.0, _LOW
    if index == _OVERFLOW:
        return _HIGH, math.inf
    octave, sub = divmod(index - 1, _SUB_BUCKETS)
    e = octave + _E_MIN
    # The octave [2**(e-1), 2**e) in steps of 2**(e-1-6): exact in binary floating point.
    step = math.ldexp(1.0, e - 1 - _SUB_BITS)
    return (_SUB_BUCKETS + sub) * step, (_SUB_BUCKETS + sub + 1) * step


def _midpoint_of(index: int) -> float:
    if index == _OVERFLOW:
        return _HIGH  # unbounded above: the lower edge is the only honest point
    lower, upper = _bucket_bounds(index)
    return (lower + upper) / 2


_INDEXES = range(_NUM_BUCKETS)
# Looked up, not computed: a scrape asks for every non-empty bucket's of every histogram.
_MIDPOINTS = tuple(_midpoint_of(i) for i in range(_NUM_BUCKETS))
_bucket_midpoint = _MIDPOINTS.__getitem__


class _Cell:
    """One thread's share of a histogram; written only by that thread."""

    __slots__ = ("counts", "max", "min", "sum")

    def __init__(self) -> None:
        self.counts: list[int] = [0] * _NUM_BUCKETS
        # Starts as an int so integer observations keep an exact integer sum.
        self.sum: float = 0
        self.min = math.inf
        self.max = -math.inf

    def merge_into(self, other: _Cell) -> None:
        other.counts = list(map(add, other.counts, self.counts))
        other.sum += self.sum
        other.min = min(other.min, self.min)
        other.max = max(other.max, self.max)


@dataclass(frozen=True)
class HistogramSnapshot:
    """An immutable merged view of a histogram. All zeros when nothing was observed."""

    count: int = 0
    sum: float = 0.0
    min: float = 0.0
    max: float = 0.0
    # Non-empty buckets as (bucket index, count), ascending. Internal: use percentile()
    # and buckets().
    _counts: tuple[tuple[int, int], ...] = field(default=(), repr=False)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else 0.0

    def percentile(self, q: float) -> float:
        """The nearest-rank ``q``-th percentile (q in [0, 100]), within 1% of the true value.

        Nearest rank: the smallest observed value such that at least q% of the observations
        are at or below it (rank ceil(q/100 * count), at least 1). Rank 1 and rank count are
        answered exactly with min and max.
        """
        if not 0.0 <= q <= 100.0:
            raise ValueError(f"percentile must be in [0, 100], got {q}")
        total = self.count
        if total == 0:
            return 0.0
        # The tiny epsilon keeps q * total / 100 == 99.0000000001 (float noise) at rank 99.
        rank = min(total, max(1, math.ceil(q * total / 100.0 - 1e-9)))
        if rank == 1:
            return self.min
        if rank == total:
            return self.max
        seen = 0
        for index, n in self._counts:
            seen += n
            if seen >= rank:
                return min(self.max, max(self.min, _bucket_midpoint(index)))
        return self.max  # unreachable when counts are consistent

    @property
    def p50(self) -> float:
        return self.percentile(50.0)

    @property
    def p75(self) -> float:
        return self.percentile(75.0)

    @property
    def p95(self) -> float:
        return self.percentile(95.0)

    @property
    def p99(self) -> float:
        return self.percentile(99.0)

    @property
    def p99_9(self) -> float:
        return self.percentile(99.9)

    @property
    def p99_99(self) -> float:
        return self.percentile(99.99)

    def buckets(self, bounds: Sequence[float] | None = None) -> list[tuple[float, int]]:
        """Cumulative (upper bound, count of observations <= bound) pairs, ending with
        (inf, count): the shape of a Prometheus histogram's ``_bucket{le=...}`` series.

        ``bounds`` (ascending) defaults to ``DEFAULT_BUCKET_BOUNDS``. Each internal bucket
        is attributed by its midpoint, so a bound that is not a power of two is honoured to
        within the histogram's 1% resolution.
        """
        edges = list(DEFAULT_BUCKET_BOUNDS if bounds is None else bounds)
        if any(b >= a for a, b in zip(edges[1:], edges, strict=False)):
            raise ValueError("bucket bounds must be strictly ascending")
        if not edges or edges[-1] != math.inf:
            edges.append(math.inf)
        out: list[tuple[float, int]] = []
        cumulative = 0
        pending = iter(self._counts)
        nxt = next(pending, None)
        for bound in edges:
            while nxt is not None and _bucket_midpoint(nxt[0]) <= bound:
                cumulative += nxt[1]
                nxt = next(pending, None)
            out.append((bound, cumulative))
        return out


class Histogram(PerThreadCells[_Cell]):
    """Records values (in the metric's unit, e.g. µs) without locking; see the module doc."""

    __slots__ = ("_base",)

    def __init__(self) -> None:
        self._init_cells()
        self._base = _Cell()

    def observe(self, value: float) -> None:
        """Record one value. Negative values count as 0; NaN is ignored."""
        try:
            cell = self._local.cell
        except AttributeError:
            cell = self._register_cell(_Cell())
        # The common case inlined (a function call would cost as much as the rest).
        if _LOW <= value < _HIGH:
            m, e = math.frexp(value)
            cell.counts[(e << _SUB_BITS) + int(m * (2 * _SUB_BUCKETS)) + _INDEX_OFFSET] += 1
        elif value >= _HIGH:
            cell.counts[_OVERFLOW] += 1
        elif value < _LOW:
            if value < 0:
                value = 0
            cell.counts[_UNDERFLOW] += 1
        else:
            return  # NaN: no bucket, and it would poison sum, min and max
        cell.sum += value
        if value < cell.min:
            cell.min = value
        if value > cell.max:
            cell.max = value

    def snapshot(self) -> HistogramSnapshot:
        """Merge every thread's cell (and the folded cells of ended threads)."""
        with self._lock:
            self._fold_dead_locked()
            cells = [self._base] + [cell for cell, _ in self._cells.values()]
        # Merging outside the lock: live cells are only read, and the base cell is replaced
        # (never mutated in place) by _fold_dead_locked, so this list stays valid. Cells that
        # saw nothing (max untouched) are skipped, one alone is read where it is, and the
        # non-empty buckets are picked in C: a scrape snapshots every histogram of every
        # tablet, and merging and walking 2,562 buckets each in Python took half of a
        # 64-tablet server's scrape (review r34b).
        seen = [cell for cell in cells if cell.max != -math.inf]
        if not seen:
            return HistogramSnapshot()
        if len(seen) == 1:
            only = seen[0].counts
            counts = tuple((i, only[i]) for i in compress(_INDEXES, only))
        else:
            merged: dict[int, int] = {}
            for cell in seen:
                these = cell.counts
                for i in compress(_INDEXES, these):
                    merged[i] = merged.get(i, 0) + these[i]
            counts = tuple(sorted(merged.items()))
        total = sum(n for _, n in counts)
        if total == 0:
            return HistogramSnapshot()
        return HistogramSnapshot(
            count=total,
            sum=sum(cell.sum for cell in seen),
            min=min(cell.min for cell in seen),
            max=max(cell.max for cell in seen),
            _counts=counts,
        )

    def _fold_dead_locked(self) -> None:
        dead = self._dead
        if not dead:
            return
        base = _Cell()
        self._base.merge_into(base)
        while dead:
            entry = self._cells.pop(dead.popleft(), None)
            if entry is not None:
                entry[0].merge_into(base)
        # Replace rather than mutate: a snapshot may be merging the old base right now.
        self._base = base
