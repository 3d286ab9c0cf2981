"""Histogram: exact count/sum/min/max under threads, percentiles within 1%, folding."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlet.metrics import Histogram, HistogramSnapshot
from raftlet.metrics.histogram import (
    _HIGH,
    _LOW,
    DEFAULT_BUCKET_BOUNDS,
    MAX_RELATIVE_ERROR,
    _bucket_bounds,
    _bucket_index,
)

WAIT = 30.0
TOLERANCE = 0.01  # the stated bound; the design gives MAX_RELATIVE_ERROR (< 0.79%)
QUANTILES = (0.0, 1.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99, 100.0)


def nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """The reference: the smallest value with at least q% of the values at or below it."""
    n = len(sorted_values)
    rank = min(n, max(1, math.ceil(q * n / 100.0 - 1e-9)))
    return sorted_values[rank - 1]


def _run_threads(targets: Sequence[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()


def test_sixteen_threads_times_100k_observations_exact_count_sum_min_max() -> None:
    hist = Histogram()
    threads, per_thread = 16, 100_000
    start = threading.Barrier(threads)

    def work(i: int) -> Callable[[], None]:
        def run() -> None:
            start.wait(WAIT)
            observe = hist.observe
            for j in range(per_thread):
                observe(i * 1000 + j % 1000 + 1)  # thread i: i*1000+1 .. i*1000+1000

        return run

    _run_threads([work(i) for i in range(threads)])
    snap = hist.snapshot()
    assert snap.count == threads * per_thread
    expected_sum = sum(
        (per_thread // 1000) * sum(i * 1000 + k + 1 for k in range(1000)) for i in range(threads)
    )
    assert snap.sum == expected_sum
    assert snap.min == 1
    assert snap.max == threads * 1000
    assert snap.mean == expected_sum / snap.count
    # Values are uniform over 1..16000, so the median is near 8000.
    assert abs(snap.p50 - 8000) / 8000 <= TOLERANCE
    assert snap.buckets()[-1] == (math.inf, snap.count)


def test_cells_of_finished_threads_are_folded_not_lost_or_leaked() -> None:
    hist = Histogram()
    hist.observe(5.0)  # the main thread's cell stays live

    def work() -> None:
        for v in range(1, 101):
            hist.observe(float(v))

    for _ in range(3):
        _run_threads([work] * 5)
        hist.snapshot()  # reads between batches must not double-count folded cells
    snap = hist.snapshot()
    assert snap.count == 1 + 15 * 100
    assert snap.sum == 5.0 + 15 * 5050
    assert (snap.min, snap.max) == (1.0, 100.0)
    assert hist._live_cells() == 1


values_in_range = st.one_of(
    st.floats(min_value=1.0, max_value=3.6e9, allow_nan=False),
    st.integers(min_value=1, max_value=3_600_000_000).map(float),
    # log-uniform, so small values are as common as large ones
    st.floats(min_value=0.0, max_value=math.log(3.6e9)).map(math.exp),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(values_in_range, min_size=1, max_size=400),
    threads=st.integers(min_value=1, max_value=4),
    extra_q=st.floats(min_value=0.0, max_value=100.0),
)
def test_merged_percentiles_match_a_sorted_list(
    values: list[float], threads: int, extra_q: float
) -> None:
    hist = Histogram()
    chunks = [values[i::threads] for i in range(threads)]

    def observer(chunk: list[float]) -> Callable[[], None]:
        def run() -> None:
            for v in chunk:
                hist.observe(v)

        return run

    _run_threads([observer(c) for c in chunks])
    snap = hist.snapshot()
    ordered = sorted(values)
    assert snap.count == len(values)
    assert snap.min == ordered[0]
    assert snap.max == ordered[-1]
    assert math.isclose(snap.sum, math.fsum(values), rel_tol=1e-9)
    for q in (*QUANTILES, extra_q):
        expected = nearest_rank(ordered, q)
        got = snap.percentile(q)
        assert abs(got - expected) <= TOLERANCE * expected, (q, got, expected)


@given(st.floats(min_value=_LOW, max_value=_HIGH, exclude_max=True))
def test_every_tracked_value_lies_in_a_narrow_bucket(value: float) -> None:
    lower, upper = _bucket_bounds(_bucket_index(value))
    assert lower <= value < upper
    assert (upper - lower) / lower <= 2 * MAX_RELATIVE_ERROR
    midpoint = (lower + upper) / 2
    assert abs(midpoint - value) / value <= MAX_RELATIVE_ERROR < TOLERANCE


def test_range_edges() -> None:
    assert _bucket_index(0.0) == _bucket_index(_LOW / 2) == 0
    assert _bucket_index(_LOW) == 1
    assert _bucket_index(_HIGH) == _bucket_index(1e300) == _bucket_index(math.inf)
    assert _bucket_index(_HIGH) == _bucket_index(math.nextafter(_HIGH, 0)) + 1
    assert _HIGH >= 3.6e9  # one hour in µs is tracked with full resolution
    assert _LOW <= 1.0


def test_empty_snapshot_is_all_zeros() -> None:
    snap = Histogram().snapshot()
    assert snap == HistogramSnapshot()
    assert (snap.count, snap.sum, snap.min, snap.max, snap.mean) == (0, 0, 0, 0, 0)
    assert (snap.p50, snap.p75, snap.p95, snap.p99, snap.p99_9, snap.p99_99) == (0,) * 6
    assert snap.percentile(100) == 0.0
    buckets = snap.buckets()
    assert all(count == 0 for _, count in buckets)
    assert buckets[-1][0] == math.inf


def test_negatives_clamp_to_zero_and_nan_is_ignored() -> None:
    hist = Histogram()
    hist.observe(-5.0)
    hist.observe(math.nan)
    hist.observe(0.0)
    snap = hist.snapshot()
    assert (snap.count, snap.sum, snap.min, snap.max) == (2, 0, 0, 0)
    assert snap.p99 == 0.0


def test_values_beyond_the_tracked_range_keep_exact_extremes() -> None:
    hist = Histogram()
    for v in (1e12, 2e12, 0.001):
        hist.observe(v)
    snap = hist.snapshot()
    assert (snap.min, snap.max) == (0.001, 2e12)
    assert snap.percentile(100) == 2e12
    assert snap.percentile(0) == 0.001
    assert snap.sum == 1e12 + 2e12 + 0.001


def test_named_percentiles() -> None:
    hist = Histogram()
    for v in range(1, 10_001):
        hist.observe(v)
    snap = hist.snapshot()
    for name, q in [
        ("p50", 50.0),
        ("p75", 75.0),
        ("p95", 95.0),
        ("p99", 99.0),
        ("p99_9", 99.9),
        ("p99_99", 99.99),
    ]:
        expected = math.ceil(q * 100 - 1e-9)  # nearest rank of 1..10000
        assert abs(getattr(snap, name) - expected) <= TOLERANCE * expected, name
    with pytest.raises(ValueError, match="percentile"):
        snap.percentile(100.5)
    with pytest.raises(ValueError, match="percentile"):
        snap.percentile(-1)


@given(st.lists(values_in_range, min_size=1, max_size=200))
def test_default_buckets_are_exact_cumulative_counts(values: list[float]) -> None:
    hist = Histogram()
    for v in values:
        hist.observe(v)
    buckets = hist.snapshot().buckets()
    assert [b for b, _ in buckets] == [*DEFAULT_BUCKET_BOUNDS, math.inf]
    # The bounds are bucket edges, so each count is exact: values strictly below the bound
    # (a value equal to a bound is counted in the next one up).
    for bound, count in buckets[:-1]:
        assert count == sum(1 for v in values if v < bound)
    assert buckets[-1] == (math.inf, len(values))


def test_custom_bucket_bounds_within_resolution() -> None:
    hist = Histogram()
    values = [float(v) for v in range(1, 5001)]
    for v in values:
        hist.observe(v)
    buckets = hist.snapshot().buckets([10.0, 100.0, 1000.0, math.inf])
    assert [b for b, _ in buckets] == [10.0, 100.0, 1000.0, math.inf]
    for bound, count in buckets[:-1]:
        low = sum(1 for v in values if v <= bound * (1 - 2 * MAX_RELATIVE_ERROR))
        high = sum(1 for v in values if v <= bound * (1 + 2 * MAX_RELATIVE_ERROR))
        assert low <= count <= high
    assert buckets[-1] == (math.inf, 5000)
    with pytest.raises(ValueError, match="ascending"):
        hist.snapshot().buckets([10.0, 5.0])
