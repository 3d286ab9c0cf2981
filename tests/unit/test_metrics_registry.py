"""The metric registry, its catalogue, and both exporters (Prometheus text and Kudu JSON)."""

from __future__ import annotations

import json
import math
import sys
import threading
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import exposition
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from raftlet.metrics import catalogue
from raftlet.metrics.export_json import (
    JsonOptions,
    generate_json,
    generate_json_text,
    options_from_query,
)
from raftlet.metrics.export_prometheus import (
    CONTENT_TYPE,
    EXPORT_BUCKET_BOUNDS,
    exposed_name,
    generate_prometheus_text,
    sample_labels,
)
from raftlet.metrics.profiled_lock import ProfiledLock
from raftlet.metrics.registry import (
    MetricDefinitionError,
    MetricLabelError,
    MetricPrototype,
    MetricRegistry,
    MetricType,
    MetricTypeError,
)
from tests.waiting import wait_for

WAIT = 30.0  # generous: a loaded CI box must not turn a slow wait into a failure

DESIGN_NAMES = {
    # The names the project promises (docs/ARCHITECTURE.md, "metrics"), each with its type.
    "rpcs_queue_overflow": MetricType.COUNTER,
    "rpc_incoming_queue_time_us": MetricType.HISTOGRAM,
    "rpcs_timed_out_in_queue": MetricType.COUNTER,
    "handler_latency_us": MetricType.HISTOGRAM,
    "consensus_lock_contention_time_us": MetricType.COUNTER,
    "consensus_lock_wait_time_us": MetricType.HISTOGRAM,
    "term_checks_total": MetricType.COUNTER,
    "op_prepare_run_time_us": MetricType.HISTOGRAM,
    "op_apply_run_time_us": MetricType.HISTOGRAM,
    "log_append_latency_us": MetricType.HISTOGRAM,
    "log_sync_latency_us": MetricType.HISTOGRAM,
    "log_group_commit_entries": MetricType.HISTOGRAM,
    "raft_term": MetricType.GAUGE,
    "raft_role": MetricType.GAUGE,
    "raft_commit_index": MetricType.GAUGE,
    "raft_applied_index": MetricType.GAUGE,
    "tablet_failed": MetricType.GAUGE,
    "leader_elections_total": MetricType.COUNTER,
    "write_ops_total": MetricType.COUNTER,
    "rows_inserted_total": MetricType.COUNTER,
    "write_row_errors_total": MetricType.COUNTER,
    "rpcs_failed": MetricType.COUNTER,
    "rows_upserted_total": MetricType.COUNTER,
    "rows_updated_total": MetricType.COUNTER,
    "rows_deleted_total": MetricType.COUNTER,
    "result_tracker_replays_total": MetricType.COUNTER,
    "result_tracker_evictions_total": MetricType.COUNTER,
    "result_tracker_clients": MetricType.GAUGE,
    "result_tracker_memory_bytes": MetricType.GAUGE,
    "scans_held": MetricType.GAUGE,
    "scans_refused_total": MetricType.COUNTER,
    "rpc_auth_denials": MetricType.COUNTER,
    "log_gc_segments_deleted_total": MetricType.COUNTER,
    "tablet_copies_installed_total": MetricType.COUNTER,
    "tablet_copy_sessions_total": MetricType.COUNTER,
    "consensus_tcp_connections": MetricType.GAUGE,
    "write_tcp_connections": MetricType.GAUGE,
    "tcp_connections_refused_total": MetricType.COUNTER,
    "write_memory_held_bytes": MetricType.GAUGE,
    "write_memory_refusals_total": MetricType.COUNTER,
    "tls_cert_expiry_seconds": MetricType.GAUGE,
    "build_info": MetricType.GAUGE,
    "tablet_log_bytes": MetricType.GAUGE,
    "tablet_log_segments": MetricType.GAUGE,
    "tablet_store_bytes": MetricType.GAUGE,
    "tablets_disk_bytes": MetricType.GAUGE,
    "tablet_copy_disk_bytes": MetricType.GAUGE,
}

DEBUG_GAUGE = MetricPrototype(
    "test_debug_gauge", MetricType.GAUGE, "things", "A debug-level gauge", level="debug"
)


def families(registry: MetricRegistry) -> dict[str, list[Sample]]:
    """Family name -> samples, as prometheus_client's own parser reads our text."""
    text = generate_prometheus_text(registry).decode()
    return {f.name: list(f.samples) for f in text_string_to_metric_families(text)}


def sample(samples: list[Sample], name: str, **labels: str) -> float:
    matches = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(matches) == 1, (name, labels, samples)
    return matches[0]


@pytest.fixture
def registry() -> MetricRegistry:
    return MetricRegistry()


# --- the catalogue ---------------------------------------------------------------------------


def test_catalogue_declares_every_design_metric_with_its_type() -> None:
    declared = {p.name: p.type for p in catalogue.ALL_PROTOTYPES}
    assert declared == DESIGN_NAMES
    assert len(catalogue.ALL_PROTOTYPES) == len(declared)  # no name declared twice
    for proto in catalogue.ALL_PROTOTYPES:
        assert proto.unit
        assert proto.help
        assert proto.level in ("info", "debug")
        assert catalogue.by_name(proto.name) is proto
        if proto.name.endswith("_us"):
            assert proto.unit == "microseconds", proto.name


def test_catalogue_labels_follow_design() -> None:
    assert catalogue.HANDLER_LATENCY_US.label_names == ("service", "method")
    assert catalogue.RPCS_QUEUE_OVERFLOW.label_names == ("service", "method")
    assert catalogue.TERM_CHECKS_TOTAL.label_names == ("mode",)
    assert catalogue.RAFT_TERM.entity_type == "tablet"
    assert catalogue.RPCS_QUEUE_OVERFLOW.entity_type == "server"


# --- instantiation -----------------------------------------------------------------------------


def test_entities_and_metrics_are_idempotent(registry: MetricRegistry) -> None:
    server = registry.entity("server", "ts-1", {})
    assert registry.entity("server", "ts-1") is server
    a = server.counter(catalogue.RPCS_QUEUE_OVERFLOW, service="tablet", method="Write")
    assert server.counter(catalogue.RPCS_QUEUE_OVERFLOW, service="tablet", method="Write") is a
    b = server.counter(catalogue.RPCS_QUEUE_OVERFLOW, service="consensus", method="Write")
    assert b is not a
    h = server.histogram(catalogue.HANDLER_LATENCY_US, service="tablet", method="Write")
    assert server.histogram(catalogue.HANDLER_LATENCY_US, method="Write", service="tablet") is h
    tablet = registry.entity("tablet", "t-1", {"table": "orders"})
    g = tablet.gauge(catalogue.RAFT_TERM)
    assert tablet.gauge(catalogue.RAFT_TERM) is g
    # The same prototype on another entity is another object.
    other = registry.entity("tablet", "t-2")
    assert other.gauge(catalogue.RAFT_TERM) is not g
    assert [e.id for e in registry.entities()] == ["ts-1", "t-1", "t-2"]


def test_entity_attributes_are_replaced_when_given(registry: MetricRegistry) -> None:
    tablet = registry.entity("tablet", "t-1", {"table": "orders"})
    assert registry.entity("tablet", "t-1") is tablet
    assert dict(tablet.attributes) == {"table": "orders"}
    registry.entity("tablet", "t-1", {"table": "orders_v2"})
    assert dict(tablet.attributes) == {"table": "orders_v2"}
    with pytest.raises(TypeError):
        tablet.attributes["table"] = "x"  # type: ignore[index]


def test_wrong_metric_kind_is_a_clear_type_error(registry: MetricRegistry) -> None:
    server = registry.entity("server", "ts-1")
    tablet = registry.entity("tablet", "t-1")
    with pytest.raises(MetricTypeError, match="declared as a histogram, not a counter"):
        server.counter(catalogue.HANDLER_LATENCY_US, service="s", method="m")
    with pytest.raises(TypeError, match="declared as a counter, not a gauge"):
        tablet.gauge(catalogue.WRITE_OPS_TOTAL)
    with pytest.raises(MetricTypeError, match="declared as a gauge, not a histogram"):
        tablet.histogram(catalogue.RAFT_TERM)
    # Settable and function gauges share a type but not an instance.
    tablet.gauge(catalogue.RAFT_TERM)
    with pytest.raises(MetricTypeError, match="settable gauge"):
        tablet.function_gauge(catalogue.RAFT_TERM, lambda: 1)
    tablet.function_gauge(catalogue.RAFT_COMMIT_INDEX, lambda: 1)
    with pytest.raises(MetricTypeError, match="function gauge"):
        tablet.gauge(catalogue.RAFT_COMMIT_INDEX)
    # A tablet metric on the server entity.
    with pytest.raises(MetricTypeError, match="belongs to tablet entities"):
        server.gauge(catalogue.RAFT_TERM)


def test_labels_must_match_the_prototype(registry: MetricRegistry) -> None:
    server = registry.entity("server", "ts-1", {"zone": "a"})
    with pytest.raises(MetricLabelError, match=r"takes labels \['service', 'method'\], got \[\]"):
        server.counter(catalogue.RPCS_QUEUE_OVERFLOW)
    with pytest.raises(MetricLabelError, match="takes labels"):
        server.counter(catalogue.RPCS_QUEUE_OVERFLOW, service="tablet")
    with pytest.raises(MetricLabelError, match="must be a str"):
        server.counter(catalogue.RPCS_QUEUE_OVERFLOW, service=3, method="W")  # type: ignore[arg-type]
    with pytest.raises(MetricLabelError, match="reserved"):
        MetricPrototype("x", MetricType.COUNTER, "u", "h", label_names=("le",))
    with pytest.raises(MetricLabelError, match="reserved"):
        MetricPrototype("x", MetricType.COUNTER, "u", "h", label_names=("tablet",))
    with pytest.raises(MetricLabelError, match="not a valid"):
        registry.entity("server", "ts-2", {"bad-name": "x"})
    with pytest.raises(MetricLabelError, match="must be a str"):
        registry.entity("server", "ts-2", {"zone": 1})  # type: ignore[dict-item]
    zoned = MetricPrototype("zoned", MetricType.COUNTER, "u", "h", label_names=("zone",))
    with pytest.raises(MetricLabelError, match="clash with attributes"):
        server.counter(zoned, zone="b")
    other = registry.entity("server", "ts-3")
    other.counter(zoned, zone="b")
    with pytest.raises(MetricLabelError, match="clash with labels"):
        registry.entity("server", "ts-3", {"zone": "a"})


def test_bad_entities_and_prototypes_are_rejected(registry: MetricRegistry) -> None:
    with pytest.raises(MetricLabelError, match="entity type"):
        registry.entity("tabelt", "t-1")
    with pytest.raises(MetricLabelError, match="non-empty"):
        registry.entity("tablet", "")
    with pytest.raises(MetricDefinitionError, match="not a valid name"):
        MetricPrototype("bad name", MetricType.GAUGE, "u", "h")
    with pytest.raises(MetricDefinitionError, match="level"):
        MetricPrototype("x", MetricType.GAUGE, "u", "h", level="warn")  # type: ignore[arg-type]
    with pytest.raises(MetricDefinitionError, match="help"):
        MetricPrototype("x", MetricType.GAUGE, "u", "")
    with pytest.raises(MetricDefinitionError, match="duplicate"):
        MetricPrototype("x", MetricType.GAUGE, "u", "h", label_names=("a", "a"))


def test_one_name_one_prototype(registry: MetricRegistry) -> None:
    registry.entity("tablet", "t-1").gauge(catalogue.RAFT_TERM)
    impostor = MetricPrototype("raft_term", MetricType.COUNTER, "terms", "not the real one")
    with pytest.raises(MetricDefinitionError, match="different prototype"):
        registry.entity("tablet", "t-2").counter(impostor)


def test_function_gauge_reregistration(registry: MetricRegistry) -> None:
    class Replica:
        def commit_index(self) -> int:
            return 5

    replica = Replica()
    tablet = registry.entity("tablet", "t-1")
    g = tablet.function_gauge(catalogue.RAFT_COMMIT_INDEX, replica.commit_index)
    # An equal callable (a fresh bound method of the same object) finds the same gauge.
    assert tablet.function_gauge(catalogue.RAFT_COMMIT_INDEX, replica.commit_index) is g
    assert g.value() == 5
    with pytest.raises(MetricDefinitionError, match="different function"):
        tablet.function_gauge(catalogue.RAFT_COMMIT_INDEX, Replica().commit_index)


def test_removed_entity_is_no_longer_exported(registry: MetricRegistry) -> None:
    tablet = registry.entity("tablet", "t-1")
    held = tablet.counter(catalogue.WRITE_OPS_TOTAL)
    held.increment(3)
    assert "write_ops" in families(registry)
    assert registry.remove_entity("tablet", "t-1") is True
    assert registry.remove_entity("tablet", "t-1") is False
    held.increment()  # a component still holding it keeps working
    assert held.value() == 4
    assert "write_ops" not in families(registry)
    assert generate_json(registry) == []
    # Re-creating the tablet starts from scratch.
    fresh = registry.entity("tablet", "t-1").counter(catalogue.WRITE_OPS_TOTAL)
    assert fresh is not held
    assert fresh.value() == 0


def test_concurrent_creation_yields_one_object(registry: MetricRegistry) -> None:
    threads_n = 8
    barrier = threading.Barrier(threads_n)
    got: list[object] = []
    lock = threading.Lock()

    def create() -> None:
        barrier.wait(WAIT)
        entity = registry.entity("server", "ts-1")
        for i in range(50):
            c = entity.counter(catalogue.RPCS_QUEUE_OVERFLOW, service=f"s{i}", method="Write")
            c.increment()
        with lock:
            got.append(entity.counter(catalogue.RPCS_QUEUE_OVERFLOW, service="s0", method="Write"))

    threads = [threading.Thread(target=create) for _ in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert len(got) == threads_n
    assert all(c is got[0] for c in got)
    (entity,) = registry.entities()
    assert len(entity.instances()) == 50
    assert all(inst.metric.value() == threads_n for inst in entity.instances())  # type: ignore[union-attr]


# --- Prometheus text -------------------------------------------------------------------------


def populated() -> MetricRegistry:
    registry = MetricRegistry()
    server = registry.entity("server", "ts-1", {})
    server.counter(catalogue.RPCS_QUEUE_OVERFLOW, service="tablet", method="Write").increment(3)
    server.counter(catalogue.RPCS_QUEUE_OVERFLOW, service="consensus", method="Write")
    latency = server.histogram(catalogue.HANDLER_LATENCY_US, service="tablet", method="Write")
    for v in (150, 300, 3000):
        latency.observe(v)
    tablet = registry.entity("tablet", "t-1", {"table": "orders"})
    tablet.gauge(catalogue.RAFT_TERM).set(7)
    tablet.function_gauge(catalogue.RAFT_COMMIT_INDEX, lambda: 42)
    tablet.counter(catalogue.TERM_CHECKS_TOTAL, mode="lockfree").increment(10)
    tablet.counter(catalogue.TERM_CHECKS_TOTAL, mode="locked").increment(2)
    return registry


def test_prometheus_counters_and_gauges_parse_with_right_values() -> None:
    fams = families(populated())
    # Counters: bare catalogue names, `_total` on the sample, never `_total_total`.
    overflow = fams["rpcs_queue_overflow"]
    assert (
        sample(
            overflow, "rpcs_queue_overflow_total", server="ts-1", service="tablet", method="Write"
        )
        == 3
    )
    assert (
        sample(
            overflow,
            "rpcs_queue_overflow_total",
            server="ts-1",
            service="consensus",
            method="Write",
        )
        == 0
    )
    checks = fams["term_checks"]
    labels = {"tablet": "t-1", "table": "orders"}
    assert sample(checks, "term_checks_total", mode="lockfree", **labels) == 10
    assert sample(checks, "term_checks_total", mode="locked", **labels) == 2
    assert sample(fams["raft_term"], "raft_term", **labels) == 7
    assert sample(fams["raft_commit_index"], "raft_commit_index", **labels) == 42
    assert exposed_name(catalogue.RPCS_QUEUE_OVERFLOW) == "rpcs_queue_overflow_total"
    assert exposed_name(catalogue.TERM_CHECKS_TOTAL) == "term_checks_total"
    assert exposed_name(catalogue.RAFT_TERM) == "raft_term"


def _rendered_by_prometheus_client(registry: MetricRegistry) -> str:
    """The registry as prometheus_client's families and ``generate_latest`` render it (as
    the page was made before it was written by hand): the reference for the page."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for entity in registry.entities():
        for instance in entity.instances():
            groups[instance.prototype.name].append((entity, instance))
    kinds = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily}
    families: list[Any] = []
    for name in sorted(groups):
        proto = groups[name][0][1].prototype
        rows = [(sample_labels(e, i), i) for e, i in groups[name]]
        label_names = sorted({k for labels, _ in rows for k in labels})
        family = kinds.get(proto.type.value, HistogramMetricFamily)(
            proto.name, proto.help, labels=label_names
        )
        for labels, instance in rows:
            values = [labels.get(k, "") for k in label_names]
            if proto.type.value != "histogram":
                family.add_metric(values, float(instance.metric.value()))
                continue
            snap = instance.metric.snapshot()
            buckets = [
                (floatToGoString(bound), float(n))
                for bound, n in snap.buckets(EXPORT_BUCKET_BOUNDS)
            ]
            family.add_metric(values, buckets, float(snap.sum))
        families.append(family)
    collector = SimpleNamespace(collect=lambda: iter(families))
    return exposition.generate_latest(collector).decode()  # type: ignore[arg-type]


def test_our_text_reads_as_prometheus_clients_rendering_of_the_same_families() -> None:
    """The page is written here, not by prometheus_client (whose per-line escaping cost a
    64-tablet server half a second a scrape): a parser must read the same families from
    both -- label values that need escaping, empty histograms and NaN included."""
    registry = populated()
    odd = registry.entity("tablet", 'a"b\\c\nd', {"table": "x\\y", "partition": '"'})
    odd.gauge(catalogue.RAFT_TERM).set(3.5)
    odd.histogram(catalogue.LOG_SYNC_LATENCY_US)  # nothing observed
    odd.function_gauge(catalogue.RAFT_APPLIED_INDEX, lambda: float("nan"))
    many = odd.histogram(catalogue.OP_APPLY_RUN_TIME_US)
    threads = [
        threading.Thread(target=lambda k=k: [many.observe(v * k) for v in range(1, 500)])
        for k in (1, 3, 1000)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    many.observe(1e12)  # past the last bound: +Inf only
    ours = text_string_to_metric_families(generate_prometheus_text(registry).decode())
    theirs = text_string_to_metric_families(_rendered_by_prometheus_client(registry))

    def canonical(fams: Any) -> list[Any]:
        return sorted(
            (f.name, f.type, f.documentation, sorted(
                (s.name, sorted(s.labels.items()), "nan" if s.value != s.value else s.value)
                for s in f.samples
            ))
            for f in fams
        )  # fmt: skip

    mine = canonical(ours)
    assert mine == canonical(theirs)
    assert any(s[1] == [("partition", '"'), ("table", "x\\y"), ("tablet", 'a"b\\c\nd')]
               for f in mine if f[0] == "raft_term" for s in f[3])  # fmt: skip


def test_prometheus_text_has_help_and_type_lines() -> None:
    text = generate_prometheus_text(populated()).decode()
    assert "# TYPE rpcs_queue_overflow_total counter" in text
    assert f"# HELP raft_term {catalogue.RAFT_TERM.help}" in text
    assert "# TYPE handler_latency_us histogram" in text
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_prometheus_histogram_buckets_sum_and_count() -> None:
    fams = families(populated())
    samples = fams["handler_latency_us"]
    labels = {"server": "ts-1", "service": "tablet", "method": "Write"}
    assert sample(samples, "handler_latency_us_count", **labels) == 3
    assert sample(samples, "handler_latency_us_sum", **labels) == 3450
    buckets = {s.labels["le"]: s.value for s in samples if s.name == "handler_latency_us_bucket"}
    assert len(buckets) == len(EXPORT_BUCKET_BOUNDS) + 1
    assert buckets["100.0"] == 0
    assert buckets["200.0"] == 1
    assert buckets["500.0"] == 2
    assert buckets["2000.0"] == 2
    assert buckets["5000.0"] == 3
    assert buckets["+Inf"] == 3
    values = [buckets[k] for k in sorted(buckets, key=float)]
    assert values == sorted(values)  # cumulative


def test_prometheus_empty_histogram_and_nan_gauge() -> None:
    registry = MetricRegistry()
    tablet = registry.entity("tablet", "t-1")
    tablet.histogram(catalogue.LOG_SYNC_LATENCY_US)

    def broken() -> float:
        raise RuntimeError("replica gone")

    tablet.function_gauge(catalogue.RAFT_APPLIED_INDEX, broken)
    fams = families(registry)
    assert sample(fams["log_sync_latency_us"], "log_sync_latency_us_count", tablet="t-1") == 0
    assert math.isnan(sample(fams["raft_applied_index"], "raft_applied_index", tablet="t-1"))


def test_mixed_label_sets_in_one_family_fill_with_empty() -> None:
    # Two tablets, one with an attribute the other lacks: one family, valid text.
    registry = MetricRegistry()
    registry.entity("tablet", "t-1", {"table": "orders"}).gauge(catalogue.RAFT_TERM).set(1)
    registry.entity("tablet", "t-2").gauge(catalogue.RAFT_TERM).set(2)
    samples = families(registry)["raft_term"]
    # The parser keeps the empty label; Prometheus treats it as absent.
    assert sample(samples, "raft_term", tablet="t-1", table="orders") == 1
    assert sample(samples, "raft_term", tablet="t-2", table="") == 2


def find_frame(thread: threading.Thread, function: str) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def test_profiled_lock_contention_reaches_prometheus() -> None:
    registry = MetricRegistry()
    tablet = registry.entity("tablet", "t-1")
    lock = ProfiledLock(
        "consensus",
        contention_counter=tablet.counter(catalogue.CONSENSUS_LOCK_CONTENTION_TIME_US),
        wait_histogram=tablet.histogram(catalogue.CONSENSUS_LOCK_WAIT_TIME_US),
        trace_threshold_ms=60_000,  # no trace log in this test
    )
    # Uncontended: nothing recorded.
    with lock:
        pass
    fams = families(registry)
    name = "consensus_lock_contention_time_us"
    assert sample(fams[name], name + "_total", tablet="t-1") == 0

    about_to_acquire = threading.Event()
    acquired = threading.Event()

    def waiter() -> None:
        about_to_acquire.set()
        with lock:
            acquired.set()

    lock.acquire()
    t = threading.Thread(target=waiter, name="lock-waiter")
    t.start()
    try:
        assert about_to_acquire.wait(WAIT)
        # Hold the lock until the waiter is provably blocked in the contended path.
        wait_for(lambda: find_frame(t, "_acquire_contended"))
        assert not acquired.is_set()
    finally:
        lock.release()
    assert acquired.wait(WAIT)
    t.join(WAIT)

    fams = families(registry)
    assert sample(fams[name], name + "_total", tablet="t-1") > 0
    wait_samples = fams["consensus_lock_wait_time_us"]
    assert sample(wait_samples, "consensus_lock_wait_time_us_count", tablet="t-1") == 1
    assert sample(wait_samples, "consensus_lock_wait_time_us_sum", tablet="t-1") > 0


# --- Kudu JSON ---------------------------------------------------------------------------------

KUDU_HISTOGRAM_KEYS = [
    "name",
    "labels",
    "total_count",
    "min",
    "mean",
    "percentile_75",
    "percentile_95",
    "percentile_99",
    "percentile_99_9",
    "percentile_99_99",
    "max",
    "total_sum",
]


def test_json_has_kudus_shape() -> None:
    doc = json.loads(generate_json_text(populated()))
    assert [(e["type"], e["id"]) for e in doc] == [("server", "ts-1"), ("tablet", "t-1")]
    for e in doc:
        assert list(e) == ["type", "id", "attributes", "metrics"]
    server, tablet = doc
    assert tablet["attributes"] == {"table": "orders"}
    by_name: dict[str, list[dict[str, Any]]] = {}
    for m in server["metrics"] + tablet["metrics"]:
        by_name.setdefault(m["name"], []).append(m)
    overflow = {m["labels"]["service"]: m["value"] for m in by_name["rpcs_queue_overflow"]}
    assert overflow == {"tablet": 3, "consensus": 0}
    # Unlabelled metrics carry no "labels" key, exactly Kudu's {"name", "value"}.
    assert by_name["raft_term"] == [{"name": "raft_term", "value": 7}]
    assert by_name["raft_commit_index"] == [{"name": "raft_commit_index", "value": 42}]
    (hist,) = by_name["handler_latency_us"]
    assert list(hist) == KUDU_HISTOGRAM_KEYS
    assert hist["labels"] == {"service": "tablet", "method": "Write"}
    assert (hist["total_count"], hist["min"], hist["max"], hist["total_sum"]) == (
        3,
        150,
        3000,
        3450,
    )
    assert hist["mean"] == 1150
    assert hist["percentile_99"] == 3000  # rank == count is reported exactly


def test_json_metric_filter_is_substring_and_drops_empty_entities() -> None:
    registry = populated()
    doc = generate_json(registry, options_from_query({"metrics": ["rpcs_queue"]}))
    assert [e["id"] for e in doc] == ["ts-1"]
    assert {m["name"] for m in doc[0]["metrics"]} == {"rpcs_queue_overflow"}
    doc = generate_json(registry, options_from_query({"metrics": ["raft_term,handler"]}))
    assert [[m["name"] for m in e["metrics"]] for e in doc] == [
        ["handler_latency_us"],
        ["raft_term"],
    ]
    assert generate_json(registry, JsonOptions(metrics=("no_such_metric",))) == []
    assert len(generate_json(registry, JsonOptions(metrics=("*",)))) == 2
    doc = generate_json(registry, options_from_query({"types": ["tablet"]}))
    assert [e["id"] for e in doc] == ["t-1"]
    doc = generate_json(registry, options_from_query({"ids": ["ts-1,t-9"]}))
    assert [e["id"] for e in doc] == ["ts-1"]


def test_json_level_and_schema_options() -> None:
    registry = populated()
    registry.entity("server", "ts-1").gauge(DEBUG_GAUGE).set(1)

    def names(options: JsonOptions) -> set[str]:
        return {m["name"] for e in generate_json(registry, options) for m in e["metrics"]}

    assert "test_debug_gauge" in names(JsonOptions())
    assert "test_debug_gauge" not in names(options_from_query({"level": ["info"]}))
    with pytest.raises(ValueError, match="level"):
        options_from_query({"level": ["loud"]})
    doc = generate_json(registry, options_from_query({"include_schema": ["1"], "ids": ["t-1"]}))
    term = next(m for m in doc[0]["metrics"] if m["name"] == "raft_term")
    assert term == {
        "name": "raft_term",
        "type": "gauge",
        "unit": "term",
        "description": catalogue.RAFT_TERM.help,
        "level": "info",
        "value": 7,
    }


def test_json_empty_histogram_and_nan_gauge_stay_valid_json() -> None:
    registry = MetricRegistry()
    tablet = registry.entity("tablet", "t-1")
    tablet.histogram(catalogue.LOG_GROUP_COMMIT_ENTRIES)
    tablet.function_gauge(catalogue.RAFT_APPLIED_INDEX, lambda: math.nan)
    text = generate_json_text(registry).decode()

    def reject(token: str) -> float:
        raise AssertionError(f"non-standard JSON constant {token}")

    doc = json.loads(text, parse_constant=reject)
    metrics = {m["name"]: m for m in doc[0]["metrics"]}
    assert metrics["raft_applied_index"]["value"] is None
    hist = metrics["log_group_commit_entries"]
    assert hist["total_count"] == 0
    assert hist["min"] == 0
    assert hist["max"] == 0


def test_the_architecture_metric_table_documents_every_prototype_as_declared() -> None:
    """docs/ARCHITECTURE.md's table is what an operator reads: a row for every metric, with
    the type, unit, entity and labels the catalogue gives it."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md").read_text()
    rows: dict[str, list[str]] = {}
    for line in doc.splitlines():
        m = re.match(r"\| `([a-z0-9_]+)` \|(.*)", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    declared = [v for v in vars(catalogue).values() if isinstance(v, MetricPrototype)]
    listed = (*catalogue.ALL_PROTOTYPES, *catalogue.PROCESS_PROTOTYPES)
    assert {p.name for p in declared} == {p.name for p in listed}, "a prototype not listed"
    for proto in listed:
        assert proto.name in rows, f"{proto.name} has no row in the metric table"
        kind, unit, entity, labels = rows[proto.name][:4]
        assert kind == proto.type.value, proto.name
        assert unit == proto.unit, proto.name
        assert entity == (proto.entity_type or "—"), proto.name
        # Label names are backquoted; what follows in parentheses are their values.
        documented = tuple(re.findall(r"`([a-z_]+)`", re.sub(r"\([^)]*\)", "", labels)))
        assert documented == proto.label_names, proto.name
