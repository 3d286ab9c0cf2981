"""Process-wide figures read from the OS at scrape time: the server's CPU time, and when
the process started.

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
``/metrics.json`` carries the same two figures in the server entity (``figures``), so
``raftlet metrics`` shows each server's uptime and CPU time from the one page it reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from raftlet.metrics.catalogue import PROCESS_CPU_SECONDS, PROCESS_START_TIME_SECONDS
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
        """Each process figure's prototype and value, read now."""
        return (
            (PROCESS_CPU_SECONDS, float(self._cpu_seconds())),
            (PROCESS_START_TIME_SECONDS, _STARTED),
        )

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
