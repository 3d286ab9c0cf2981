"""Kudu-style JSON of a `MetricRegistry` (the status server's `/metrics.json`).

Shape (what Kudu's `/metrics` page returns, so Kudu-minded tooling reads it):

    [{"type": "server", "id": "ts-1", "attributes": {},
      "metrics": [{"name": "rpcs_queue_overflow", "labels": {"service": "tablet"}, "value": 3},
                  {"name": "handler_latency_us", "labels": {"service": …, "method": …},
                   "total_count": 10, "min": 5, "mean": 7.5, "percentile_75": 8,
                   "percentile_95": 9, "percentile_99": 9, "percentile_99_9": 9,
                   "percentile_99_99": 9, "max": 9, "total_sum": 75}]},
     {"type": "tablet", "id": "t-1", "attributes": {"table": "orders"}, "metrics": […]}]

Kudu spells method and service into the metric name; we keep the catalogue name and put them
in `"labels"`, present exactly when the prototype declares label names. Names are the bare
catalogue names (no Prometheus `_total` suffix added here).

Filters, as query parameters of `/metrics.json` (all optional, comma-separated lists):
- `metrics=a,b` — keep metrics whose name contains any of the substrings (Kudu's filter);
  `*` matches all. Entities left with no metrics are omitted, as in Kudu.
- `types=tablet`, `ids=t-1,t-2` — keep entities of those types / ids (exact match).
- `level=info` — only info-level metrics; `level=debug` (the default) shows all.
- `include_schema=1` — add each metric's `type`, `unit`, `description` and `level`.

`server_figures` are figures kept outside the registry (the process's CPU time and start
time, read when the page is built: `metrics.process`), shown in the server entity as its
own metrics are, filters included.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raftlet.metrics.histogram import Histogram
from raftlet.metrics.registry import LEVELS, MetricInstance, MetricPrototype, MetricRegistry

__all__ = [
    "CONTENT_TYPE",
    "JsonOptions",
    "generate_json",
    "generate_json_text",
    "options_from_query",
]

CONTENT_TYPE = "application/json; charset=utf-8"

# Kudu's histogram fields, in Kudu's order, and the snapshot attribute each comes from.
_HISTOGRAM_FIELDS: tuple[tuple[str, str], ...] = (
    ("total_count", "count"),
    ("min", "min"),
    ("mean", "mean"),
    ("percentile_75", "p75"),
    ("percentile_95", "p95"),
    ("percentile_99", "p99"),
    ("percentile_99_9", "p99_9"),
    ("percentile_99_99", "p99_99"),
    ("max", "max"),
    ("total_sum", "sum"),
)


@dataclass(frozen=True, slots=True)
class JsonOptions:
    """What to include; the defaults include everything."""

    metrics: tuple[str, ...] = ()  # name substrings; empty = all
    types: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()
    level: str = "debug"
    include_schema: bool = False

    def wants_metric(self, name: str) -> bool:
        return not self.metrics or any(p == "*" or p in name for p in self.metrics)


def _split(values: Sequence[str]) -> tuple[str, ...]:
    # `?metrics=a,b&metrics=c` and `?metrics=a,b,c` mean the same; empty items are dropped.
    return tuple(item.strip() for v in values for item in v.split(",") if item.strip())


def options_from_query(params: Mapping[str, Sequence[str]]) -> JsonOptions:
    """Options from parsed query parameters (`urllib.parse.parse_qs` output).

    Raises ValueError on a bad `level`, which the status server answers with 400.
    """
    level = params.get("level", ["debug"])[-1]
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}")
    flag = params.get("include_schema", ["0"])[-1].lower()
    return JsonOptions(
        metrics=_split(params.get("metrics", [])),
        types=_split(params.get("types", [])),
        ids=_split(params.get("ids", [])),
        level=level,
        include_schema=flag in ("1", "true", "yes"),
    )


def _number(value: float) -> float | int | None:
    # JSON has no NaN/Infinity; a gauge that reports one is shown as null rather than
    # producing a document strict parsers reject.
    if isinstance(value, int):
        return value
    value = float(value)
    if not math.isfinite(value):
        return None
    return int(value) if value.is_integer() else value


def _head_json(
    proto: MetricPrototype, labels: dict[str, str] | None, include_schema: bool
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": proto.name}
    if labels is not None:
        out["labels"] = labels
    if include_schema:
        out["type"] = proto.type.value
        out["unit"] = proto.unit
        out["description"] = proto.help
        out["level"] = proto.level
    return out


def _metric_json(inst: MetricInstance, include_schema: bool) -> dict[str, Any]:
    proto = inst.prototype
    out = _head_json(proto, dict(inst.labels) if proto.label_names else None, include_schema)
    metric = inst.metric
    if isinstance(metric, Histogram):
        snap = metric.snapshot()
        for key, attr in _HISTOGRAM_FIELDS:
            out[key] = _number(getattr(snap, attr))  # an empty snapshot is all zeros
    else:
        # A FunctionGauge whose function raises reads as NaN (and logs), shown as null.
        out["value"] = _number(metric.value())
    return out


def generate_json(
    registry: MetricRegistry,
    options: JsonOptions | None = None,
    server_figures: Sequence[tuple[MetricPrototype, float]] = (),
) -> list[dict[str, Any]]:
    """The registry as Kudu-style JSON-able objects (see the module docstring)."""
    opts = options or JsonOptions()

    def wanted(proto: MetricPrototype) -> bool:
        return (opts.level != "info" or proto.level == "info") and opts.wants_metric(proto.name)

    result: list[dict[str, Any]] = []
    filtering = bool(opts.metrics)
    for entity in registry.entities():
        if opts.types and entity.type not in opts.types:
            continue
        if opts.ids and entity.id not in opts.ids:
            continue
        metrics = [
            _metric_json(inst, opts.include_schema)
            for inst in entity.instances()
            if wanted(inst.prototype)
        ]
        if entity.type == "server":
            for proto, value in server_figures:
                if wanted(proto):
                    metrics.append(
                        _head_json(proto, None, opts.include_schema) | {"value": _number(value)}
                    )
        if filtering and not metrics:
            continue
        result.append(
            {
                "type": entity.type,
                "id": entity.id,
                "attributes": dict(entity.attributes),
                "metrics": metrics,
            }
        )
    return result


def generate_json_text(
    registry: MetricRegistry,
    options: JsonOptions | None = None,
    server_figures: Sequence[tuple[MetricPrototype, float]] = (),
) -> bytes:
    """`generate_json` serialized (indented, like Kudu's page, for humans with curl)."""
    doc = generate_json(registry, options, server_figures)
    return (json.dumps(doc, indent=2) + "\n").encode()
