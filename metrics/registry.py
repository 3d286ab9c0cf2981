"""Metric prototypes, entities and the registry the exporters read.

The Kudu shape: a metric is *declared* once, as a `MetricPrototype` in `metrics.catalogue`
(name, type, unit, help, level, the label names it takes), and *instantiated* per entity —
the server, or one tablet replica — with label values:

    server = registry.entity("server", "ts-1", {})
    overflow = server.counter(catalogue.RPCS_QUEUE_OVERFLOW, service="tablet", method="Write")
    overflow.increment()          # hot path: the StripedCounter itself, no registry involved

Rules this module keeps:
- Instantiation is idempotent: the same prototype and label values on one entity return the
  very same object, so components may look their metrics up instead of threading them around.
- Instantiation is type-checked against the prototype (`MetricTypeError`), label names are
  checked against the prototype's `label_names` (`MetricLabelError`), and one registry never
  holds two different prototypes under one name (`MetricDefinitionError`).
- Only creation and removal take the registry lock. The returned primitives are used without
  any registry lock, and the exporters read copy-on-write snapshots (an entity's metric table
  and the registry's entity table are replaced, never mutated, under the lock), so a scrape
  never blocks a hot path nor a creation blocks a scrape for longer than one dict copy.
- Removing an entity (a deleted tablet) only stops its export; objects a component still holds
  keep working, they are just no longer reachable from the registry.
"""

from __future__ import annotations

import enum
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from raftlet.metrics.counter import StripedCounter
from raftlet.metrics.gauge import FunctionGauge, Gauge
from raftlet.metrics.histogram import Histogram

__all__ = [
    "ENTITY_TYPES",
    "LEVELS",
    "MetricDefinitionError",
    "MetricEntity",
    "MetricError",
    "MetricInstance",
    "MetricLabelError",
    "MetricPrototype",
    "MetricRegistry",
    "MetricType",
    "MetricTypeError",
]

# The kinds of entity metrics hang off. A closed set so that a typo ("tabelt") fails at
# creation instead of silently exporting a new series nobody's dashboard looks at.
ENTITY_TYPES: frozenset[str] = frozenset({"server", "tablet"})

Level = Literal["info", "debug"]
LEVELS: tuple[Level, ...] = ("info", "debug")

# Prometheus' legacy metric/label name grammar; we keep every name inside it so the text
# exposition needs no escaping and the JSON and Prometheus names are the same.
_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# `le` is the histogram bucket label; `entity` names nothing yet but is kept free; the entity
# types are used as the entity-id label (`tablet="<id>"`), so labels and attributes may not
# take those names either.
_RESERVED_LABELS: frozenset[str] = frozenset({"le", "entity"}) | ENTITY_TYPES


class MetricError(Exception):
    """Base of the registry's errors: all are programming errors, raised at creation time."""


class MetricTypeError(MetricError, TypeError):
    """A prototype was instantiated as a different kind of metric than it declares."""


class MetricLabelError(MetricError, ValueError):
    """Label names do not match the prototype's, or a label/attribute name is invalid."""


class MetricDefinitionError(MetricError, ValueError):
    """A prototype is malformed, or two different prototypes share one name."""


class MetricType(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


def _check_label_name(name: str, what: str) -> None:
    if not _NAME_RE.match(name) or name.startswith("__"):
        raise MetricLabelError(f"{what} {name!r} is not a valid Prometheus label name")
    if name in _RESERVED_LABELS:
        raise MetricLabelError(f"{what} {name!r} is reserved (one of {sorted(_RESERVED_LABELS)})")


@dataclass(frozen=True, slots=True)
class MetricPrototype:
    """The declaration of one metric: everything about it except where it lives.

    `unit` is a plain word ("requests", "microseconds", "bytes", "entries") shown in JSON with
    `?include_schema=1` and in docs; it is not appended to the Prometheus name (the names in
    the catalogue already carry `_us` where it matters). `entity_type`, when set, is the only
    kind of entity the metric may be instantiated on.
    """

    name: str
    type: MetricType
    unit: str
    help: str
    level: Level = "info"
    label_names: tuple[str, ...] = ()
    entity_type: str | None = None

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name) or self.name.startswith("__"):
            raise MetricDefinitionError(f"metric name {self.name!r} is not a valid name")
        if not isinstance(self.type, MetricType):
            raise MetricDefinitionError(f"{self.name}: type must be a MetricType")
        if self.level not in LEVELS:
            raise MetricDefinitionError(f"{self.name}: level must be one of {LEVELS}")
        if not self.help:
            raise MetricDefinitionError(f"{self.name}: help text is required")
        if self.entity_type is not None and self.entity_type not in ENTITY_TYPES:
            raise MetricDefinitionError(
                f"{self.name}: entity_type must be one of {sorted(ENTITY_TYPES)}"
            )
        if len(set(self.label_names)) != len(self.label_names):
            raise MetricDefinitionError(f"{self.name}: duplicate label names")
        for label in self.label_names:
            _check_label_name(label, f"{self.name}: label")


# A metric's identity inside an entity: its name plus its label values in label-name order.
_Key = tuple[str, tuple[str, ...]]
Metric = StripedCounter | Gauge | FunctionGauge | Histogram


@dataclass(frozen=True, slots=True)
class MetricInstance:
    """One instantiated metric as the exporters see it."""

    prototype: MetricPrototype
    # (label name, value) pairs in the prototype's label_names order.
    labels: tuple[tuple[str, str], ...]
    metric: Metric
    # Only for function gauges: the callable, kept so a second registration can be compared.
    fn: Callable[[], float] | None = field(default=None, compare=False)


class MetricEntity:
    """The metrics of one server or one tablet replica. Obtain through `MetricRegistry.entity`."""

    def __init__(
        self, registry: MetricRegistry, type: str, id: str, attributes: Mapping[str, str]
    ) -> None:
        self._registry = registry
        self.type = type
        self.id = id
        self._attributes: Mapping[str, str] = MappingProxyType(dict(attributes))
        # Copy-on-write (see the module docstring): replaced whole under the registry lock,
        # read without it by exporters.
        self._metrics: dict[_Key, MetricInstance] = {}

    def __repr__(self) -> str:
        return f"MetricEntity({self.type!r}, {self.id!r}, {dict(self._attributes)!r})"

    @property
    def attributes(self) -> Mapping[str, str]:
        """Read-only view of the entity's attributes (exported as labels / JSON attributes)."""
        return self._attributes

    def _set_attributes(self, attributes: Mapping[str, str]) -> None:
        self._attributes = MappingProxyType(dict(attributes))

    def instances(self) -> list[MetricInstance]:
        """A snapshot of this entity's metrics, ordered by name then label values."""
        metrics = self._metrics  # one read: the dict is never mutated in place
        return [metrics[k] for k in sorted(metrics)]

    def counter(self, proto: MetricPrototype, **labels: str) -> StripedCounter:
        metric = self._get_or_create(proto, MetricType.COUNTER, labels, StripedCounter, None)
        assert isinstance(metric, StripedCounter)
        return metric

    def histogram(self, proto: MetricPrototype, **labels: str) -> Histogram:
        metric = self._get_or_create(proto, MetricType.HISTOGRAM, labels, Histogram, None)
        assert isinstance(metric, Histogram)
        return metric

    def gauge(self, proto: MetricPrototype, **labels: str) -> Gauge:
        metric = self._get_or_create(proto, MetricType.GAUGE, labels, Gauge, None)
        if not isinstance(metric, Gauge):
            raise MetricTypeError(
                f"{proto.name}{labels} on {self.type} {self.id!r} is a function gauge; "
                "it cannot also be a settable gauge"
            )
        return metric

    def function_gauge(
        self, proto: MetricPrototype, fn: Callable[[], float], **labels: str
    ) -> FunctionGauge:
        """A gauge whose value is `fn()` at read time.

        Registering the same prototype and labels again with an equal callable (bound methods
        of the same object compare equal) returns the existing gauge; with a different one it
        is an error, because silently keeping either function would export the wrong object's
        state (remove the entity first when the object it describes is replaced).
        """
        metric = self._get_or_create(proto, MetricType.GAUGE, labels, lambda: FunctionGauge(fn), fn)
        if not isinstance(metric, FunctionGauge):
            raise MetricTypeError(
                f"{proto.name}{labels} on {self.type} {self.id!r} is a settable gauge; "
                "it cannot also be a function gauge"
            )
        return metric

    def _get_or_create(
        self,
        proto: MetricPrototype,
        wanted: MetricType,
        labels: Mapping[str, str],
        make: Callable[[], Metric],
        fn: Callable[[], float] | None,
    ) -> Metric:
        if not isinstance(proto, MetricPrototype):
            raise MetricDefinitionError(f"expected a MetricPrototype, got {proto!r}")
        if proto.type is not wanted:
            raise MetricTypeError(
                f"metric {proto.name!r} is declared as a {proto.type.value}, not a {wanted.value}"
            )
        if proto.entity_type is not None and proto.entity_type != self.type:
            raise MetricTypeError(
                f"metric {proto.name!r} belongs to {proto.entity_type} entities, "
                f"not to {self.type} {self.id!r}"
            )
        if set(labels) != set(proto.label_names):
            raise MetricLabelError(
                f"metric {proto.name!r} takes labels {list(proto.label_names)}, "
                f"got {sorted(labels)}"
            )
        for name, value in labels.items():
            if not isinstance(value, str):
                raise MetricLabelError(
                    f"metric {proto.name!r}: label {name}={value!r} must be a str"
                )
        clash = set(labels) & set(self._attributes)
        if clash:
            # Both become Prometheus labels; one would silently overwrite the other.
            raise MetricLabelError(
                f"metric {proto.name!r}: labels {sorted(clash)} clash with attributes of "
                f"{self.type} {self.id!r}"
            )
        values = tuple(labels[n] for n in proto.label_names)
        key: _Key = (proto.name, values)

        # Fast path without the lock: a plain dict read of the current snapshot.
        existing = self._metrics.get(key)
        if existing is None:
            with self._registry._lock:
                self._registry._check_prototype_unlocked(proto)
                existing = self._metrics.get(key)
                if existing is None:
                    instance = MetricInstance(
                        proto, tuple(zip(proto.label_names, values, strict=True)), make(), fn
                    )
                    self._metrics = {**self._metrics, key: instance}
                    return instance.metric
        if existing.prototype != proto:
            raise MetricDefinitionError(
                f"metric {proto.name!r} is already registered with a different prototype"
            )
        if fn is not None and existing.fn is not None and existing.fn != fn:
            raise MetricDefinitionError(
                f"function gauge {proto.name}{dict(labels)} on {self.type} {self.id!r} is "
                "already registered with a different function"
            )
        return existing.metric


class MetricRegistry:
    """All entities of one process (one per server); what the exporters walk."""

    def __init__(self) -> None:
        # Guards creation and removal only (see the module docstring).
        self._lock = threading.Lock()
        self._entities: dict[tuple[str, str], MetricEntity] = {}
        self._prototypes: dict[str, MetricPrototype] = {}

    def entity(
        self, type: str, id: str, attributes: Mapping[str, str] | None = None
    ) -> MetricEntity:
        """The entity `(type, id)`, created on first use.

        Asking again returns the same entity; if `attributes` is given it replaces the
        entity's attributes (a table can be renamed while its tablets live on).
        """
        if type not in ENTITY_TYPES:
            raise MetricLabelError(f"entity type {type!r} is not one of {sorted(ENTITY_TYPES)}")
        if not isinstance(id, str) or not id:
            raise MetricLabelError(f"entity id must be a non-empty str, got {id!r}")
        attrs = dict(attributes or {})
        for name, value in attrs.items():
            _check_label_name(name, "entity attribute")
            if not isinstance(value, str):
                raise MetricLabelError(f"entity attribute {name}={value!r} must be a str")
        with self._lock:
            entity = self._entities.get((type, id))
            if entity is None:
                entity = MetricEntity(self, type, id, attrs)
                self._entities = {**self._entities, (type, id): entity}
            elif attributes is not None:
                taken = {name for inst in entity.instances() for name, _ in inst.labels}
                if taken & set(attrs):
                    raise MetricLabelError(
                        f"attributes {sorted(taken & set(attrs))} of {type} {id!r} clash "
                        "with labels of its metrics"
                    )
                entity._set_attributes(attrs)
            return entity

    def remove_entity(self, type: str, id: str) -> bool:
        """Stop exporting the entity (a deleted tablet). True if it was registered."""
        with self._lock:
            if (type, id) not in self._entities:
                return False
            self._entities = {k: v for k, v in self._entities.items() if k != (type, id)}
            return True

    def entities(self) -> list[MetricEntity]:
        """A snapshot of the registered entities: servers first, then by id."""
        entities = self._entities  # one read: never mutated in place
        return [entities[k] for k in sorted(entities)]

    def _check_prototype_unlocked(self, proto: MetricPrototype) -> None:
        """Caller holds `_lock`. One name, one prototype, across all entities."""
        known = self._prototypes.get(proto.name)
        if known is None:
            self._prototypes[proto.name] = proto
        elif known != proto:
            raise MetricDefinitionError(
                f"metric {proto.name!r} is already registered with a different prototype "
                f"({known.type.value}, {known.unit}); declare each metric once in "
                "metrics.catalogue"
            )
