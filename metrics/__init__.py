"""Contention-free statistics and the profiled lock.

Striped counters, gauges and concurrent log-linear histograms (per-thread cells merged only
when read), the profiled lock that times and reports contended acquires, and the registry
that exports everything as Prometheus text and Kudu-like JSON. Imports nothing else of the
project, so every other package may use it.
"""

# Primitives (metrics/counter.py, histogram.py, gauge.py, profiled_lock.py). The "X as X"
# form marks them as re-exports for ruff and mypy without a shared __all__ to edit.
# Last, so the re-exports above stay at the top; see raftlet/__init__.py.
from raftlet import require_namespaced
from raftlet.metrics.counter import StripedCounter as StripedCounter
from raftlet.metrics.gauge import FunctionGauge as FunctionGauge
from raftlet.metrics.gauge import Gauge as Gauge
from raftlet.metrics.histogram import Histogram as Histogram
from raftlet.metrics.histogram import HistogramSnapshot as HistogramSnapshot
from raftlet.metrics.profiled_lock import ProfiledLock as ProfiledLock
from raftlet.metrics.profiled_lock import (
    get_lock_contention_trace_threshold_ms as get_lock_contention_trace_threshold_ms,
)
from raftlet.metrics.profiled_lock import (
    set_lock_contention_trace_threshold_ms as set_lock_contention_trace_threshold_ms,
)

require_namespaced(__name__)
