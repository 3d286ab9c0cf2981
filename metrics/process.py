"""Process-wide figures read from the OS at scrape time: the server's CPU time, when the
process started, its resident memory, and its open files and their limit.

``ProcessCollector`` is a prometheus_client custom collector that the status server appends
to ``/metrics``: ``process_cpu_seconds_total`` (``catalogue.PROCESS_CPU_SECONDS``; the usual
Prometheus name for it), the user + system CPU time of every thread of this process, read
with ``time.process_time()`` (``CLOCK_PROCESS_CPUTIME_ID``: nanosecond resolution, unlike the
10 ms ticks of ``/proc/self/stat``) when the page is built. Nothing counts anything on a hot
path. The sample carries ``server="<id>"`` when the registry holds exactly one server entity
(a tablet server's), so it joins the server's other series. ``process_start_time_seconds``
(``catalogue.PROCESS_START_TIME_SECONDS``, Prometheus's name too) tells a restart: the
counters of the process after it start again from zero.

``raftlet write`` reads both before and after a run for the server CPU per acknowledged
write (a server restarted meanwhile has no figure: its first process's CPU is gone).
``/metrics.json`` carries the same figures in the server entity (``figures``), so
``raftlet metrics`` shows each server's uptime and CPU time from the one page it reads.
``process_resident_memory_bytes``, ``process_open_fds`` and ``process_max_fds`` (the
standard process collector's names) let an alert see memory grow or descriptors run out
before writes fail (review r34b: the README sizes memory, and nothing exported it).
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from raftlet.metrics.catalogue import (
    PROCESS_CPU_SECONDS,
    PROCESS_MAX_FDS,
    PROCESS_OPEN_FDS,
    PROCESS_RESIDENT_MEMORY_BYTES,
    PROCESS_START_TIME_SECONDS,
)
from raftlet.metrics.registry import MetricPrototype, MetricRegistry

__all__ = ["ProcessCollector"]

# When this process started, to a millisecond (time.time() at import: before the server
# serves anything, and unique to the process).
_STARTED = round(time.time(), 3)


class ProcessCollector:
    def __init__(
        self,
        registry: MetricRegistry | None = None,
        cpu_seconds: Callable[[], float] = time.process_time,
    ) -> None:
        self._registry = registry
        self._cpu_seconds = cpu_seconds

    def figures(self) -> tuple[tuple[MetricPrototype, float], ...]:
        """Each process figure's prototype and value, read now (those the OS does not
        offer -- no /proc -- left out)."""
        read: list[tuple[MetricPrototype, float | None]] = [
            (PROCESS_CPU_SECONDS, float(self._cpu_seconds())),
            (PROCESS_START_TIME_SECONDS, _STARTED),
            (PROCESS_RESIDENT_MEMORY_BYTES, _resident_bytes()),
            (PROCESS_OPEN_FDS, _open_fds()),
            (PROCESS_MAX_FDS, _max_fds()),
        ]
        return tuple((proto, value) for proto, value in read if value is not None)

    def collect(self) -> Iterator[Metric]:
        servers = (
            [e for e in self._registry.entities() if e.type == "server"]
            if self._registry is not None
            else []
        )
        labels = {"server": servers[0].id} if len(servers) == 1 else {}
        for proto, value in self.figures():
            kind = CounterMetricFamily if proto is PROCESS_CPU_SECONDS else GaugeMetricFamily
            family = kind(proto.name, proto.help, labels=list(labels))
            family.add_metric(list(labels.values()), value)
            yield family


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _resident_bytes() -> float | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return float(int(f.read().split()[1]) * _PAGE_BYTES)
    except (OSError, IndexError, ValueError):
        return None


def _open_fds() -> float | None:
    try:
        return float(len(os.listdir("/proc/self/fd")) - 1)  # not the one listdir opened
    except OSError:
        return None


def _max_fds() -> float:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return math.inf if soft == resource.RLIM_INFINITY else float(soft)
