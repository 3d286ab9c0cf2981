"""Prometheus text exposition of a `MetricRegistry`.

Nothing here is on a hot path: at scrape time `generate_prometheus_text` reads our own
primitives (striped counters, gauges, histogram snapshots) and writes the text format 0.0.4
itself, each instance's label text escaped once for all its lines. (Built as
prometheus_client `*MetricFamily` objects and rendered by its `generate_latest`, which
escapes and validates every label of every line, a scrape of a server of 64 tablets --
12,000 lines, most of them histogram buckets -- took 0.5 s of the server's CPU: review
r34b; that rendering is the unit tests' reference for this one.)
Extra collectors (the process figures) are rendered by `generate_latest`.

Exposed names (the contract dashboards and tests rely on; docs/ARCHITECTURE.md lists them):
- Names are the catalogue's bare names, with no `raftlet_` prefix, so the docs, the JSON page
  and Prometheus agree.
- Counters: the text format requires a `_total` sample suffix. prometheus_client strips a
  trailing `_total` from a counter family's name and appends it to the sample, so
  `rpcs_queue_overflow` is exposed as `rpcs_queue_overflow_total` and `term_checks_total` stays
  `term_checks_total` (never `_total_total`). Rule: a counter's exposed name is its catalogue
  name with `_total` appended unless it already ends in `_total`.
- Gauges: the catalogue name. Histograms: `<name>_bucket{le=…}`, `<name>_sum`, `<name>_count`.
- The prototype's unit is *not* passed to prometheus_client (it would append `_<unit>` to the
  name); the names already say `_us` where it matters.

Labels on every sample: `<entity type>="<entity id>"` (`server="ts-1"` or `tablet="t-17"`),
each entity attribute as a label (e.g. `table="orders"`), then the metric's own labels
(`service`, `method`, `mode`). Within one family the label set is the union over its
samples; a sample lacking one of them gets the empty string, which Prometheus treats exactly
like an absent label.

Histogram buckets: our histograms have log-linear buckets with <1% relative error (thousands
of them across the tracked range). Exporting those would create a series per fine bucket, and
which ones exist would change from scrape to scrape, so the snapshot reports its cumulative
counts on a fixed 1-2-5 ladder, `EXPORT_BUCKET_BOUNDS` (1, 2, 5, 10, … 5e7, 1e8: 1 µs … 100 s
for `_us` metrics), plus `+Inf` (`HistogramSnapshot.buckets(bounds)`, exact to the fine
buckets' 1% resolution). `_count` is the snapshot's count and `_sum` its sum.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import cast

from prometheus_client import exposition, utils
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from raftlet.metrics.counter import StripedCounter
from raftlet.metrics.gauge import FunctionGauge, Gauge
from raftlet.metrics.histogram import Histogram
from raftlet.metrics.registry import MetricEntity, MetricInstance, MetricPrototype, MetricRegistry

__all__ = [
    "CONTENT_TYPE",
    "EXPORT_BUCKET_BOUNDS",
    "exposed_name",
    "generate_prometheus_text",
    "sample_labels",
]

# generate_latest renders the classic text format, version 0.0.4; say so, rather than
# prometheus_client's CONTENT_TYPE_LATEST, which names a newer version it may not render.
CONTENT_TYPE = exposition.CONTENT_TYPE_PLAIN_0_0_4

EXPORT_BUCKET_BOUNDS: tuple[float, ...] = (
    *(float(m * 10**e) for e in range(8) for m in (1, 2, 5)),
    1e8,
)

# prometheus_client's own formatting of `le` values (Go-style, "1e+06"), so our buckets read
# like any other exporter's; the function is untyped upstream.
_le_text = cast(Callable[[float], str], utils.floatToGoString)


def exposed_name(proto: MetricPrototype) -> str:
    """The sample name a scraper sees for a counter or gauge (histograms add suffixes)."""
    if proto.type.value == "counter" and not proto.name.endswith("_total"):
        return proto.name + "_total"
    return proto.name


def sample_labels(entity: MetricEntity, instance: MetricInstance) -> dict[str, str]:
    """The Prometheus labels of one instance (see the module docstring)."""
    labels = {entity.type: entity.id}
    labels.update(entity.attributes)
    labels.update(instance.labels)
    return labels


def _asked(proto: MetricPrototype, names: Collection[str]) -> bool:
    """Whether ``names`` holds ``proto``'s name or one of the sample names it exports."""
    samples: tuple[str, ...] = (exposed_name(proto),)
    if proto.type.value == "histogram":
        samples = (f"{proto.name}_bucket", f"{proto.name}_sum", f"{proto.name}_count")
    return proto.name in names or _any_in(samples, names)


_Members = list[tuple[MetricEntity, MetricInstance]]


def _groups(registry: MetricRegistry) -> dict[str, _Members]:
    """Every instance by metric name across entities: the text format wants one family
    (one HELP/TYPE) per name, with all its samples together."""
    groups: dict[str, _Members] = defaultdict(list)
    for entity in registry.entities():
        for instance in entity.instances():
            groups[instance.prototype.name].append((entity, instance))
    return groups


# The `le` label of each exported bucket, ending with +Inf, as prometheus_client writes it.
_LE_TEXTS = tuple(f'le="{_le_text(b)}"' for b in (*EXPORT_BUCKET_BOUNDS, math.inf))


def _write_family(members: _Members, out: list[str]) -> None:
    """One family's HELP, TYPE and sample lines, appended to ``out``."""
    proto = members[0][1].prototype
    kind = proto.type.value
    name = exposed_name(proto)
    rows = [(sample_labels(e, i), i) for e, i in members]
    label_names = sorted({k for labels, _ in rows for k in labels})
    out.append(f"# HELP {name} {_escape_help(proto.help)}\n# TYPE {name} {kind}\n")
    for labels, inst in rows:
        # A label an instance lacks is written empty, which Prometheus reads as absent.
        text = ",".join(f'{k}="{_escape_value(labels.get(k, ""))}"' for k in label_names)
        metric = inst.metric
        braces = f"{{{text}}}" if text else ""
        if kind != "histogram":
            assert isinstance(metric, StripedCounter | Gauge | FunctionGauge)
            # A FunctionGauge whose function raises reads as NaN (and logs): the scrape goes on.
            out.append(f"{name}{braces} {_number(metric.value())}\n")
            continue
        assert isinstance(metric, Histogram)
        snap = metric.snapshot()
        lead = f"{name}_bucket{{{text}," if text else f"{name}_bucket{{"
        out.extend(
            f"{lead}{le}}} {float(n)!r}\n"
            for le, (_, n) in zip(_LE_TEXTS, snap.buckets(EXPORT_BUCKET_BOUNDS), strict=True)
        )
        out.append(f"{name}_count{braces} {float(snap.count)!r}\n")
        out.append(f"{name}_sum{braces} {_number(snap.sum)}\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(text: str) -> str:
    if "\\" in text or '"' in text or "\n" in text:
        return text.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")
    return text


def _number(value: float) -> str:
    """A sample value as the text format writes it (NaN, +Inf, -Inf spelled out)."""
    value = float(value)
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def generate_prometheus_text(
    registry: MetricRegistry,
    extra_collectors: Iterable[Collector] = (),
    names: Collection[str] | None = None,
) -> bytes:
    """The registry in Prometheus text format 0.0.4 (serve with `CONTENT_TYPE`).

    `extra_collectors` (e.g. prometheus_client's `ProcessCollector`) are appended as-is;
    they must not reuse our metric names. `names`: only the metrics of those family or
    sample names (all when None).
    """
    out: list[str] = []
    groups = _groups(registry)
    for name in sorted(groups):
        members = groups[name]
        if names is None or _asked(members[0][1].prototype, names):
            _write_family(members, out)
    text = "".join(out).encode()
    for collector in extra_collectors:
        text += exposition.generate_latest(collector if names is None else _Only(collector, names))
    return text


def _any_in(candidates: Iterable[str], names: Collection[str]) -> bool:
    return any(n in names for n in candidates)


class _Only:
    """The families of ``collector`` named in ``names`` (by family or sample name)."""

    def __init__(self, collector: Collector, names: Collection[str]) -> None:
        self._collector = collector
        self._names = names

    def collect(self) -> Iterator[Metric]:
        for family in self._collector.collect():
            if family.name in self._names or _any_in((s.name for s in family.samples), self._names):
                yield family
