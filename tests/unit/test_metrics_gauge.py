"""Gauge and FunctionGauge."""

from __future__ import annotations

import logging
import math
import threading

import pytest

from raftlet.metrics import FunctionGauge, Gauge

WAIT = 30.0


def test_gauge_set_increment_decrement() -> None:
    g = Gauge()
    assert g.value() == 0
    g.set(10)
    g.increment()
    g.increment(5)
    g.decrement(2)
    g.decrement()
    assert g.value() == 13
    g.set(2.5)
    assert g.value() == 2.5


def test_gauge_concurrent_increments_and_decrements_are_exact() -> None:
    g = Gauge()
    start = threading.Barrier(16)

    def work(i: int) -> None:
        start.wait(WAIT)
        for _ in range(10_000):
            if i % 2:
                g.increment(3)
            else:
                g.decrement()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert g.value() == 8 * 10_000 * 3 - 8 * 10_000


def test_function_gauge_is_computed_at_read_time() -> None:
    state = {"term": 1}
    g = FunctionGauge(lambda: state["term"])
    assert g.value() == 1.0
    state["term"] = 7
    assert g.value() == 7.0


def test_function_gauge_error_is_nan_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> float:
        raise RuntimeError("replica is shutting down")

    g = FunctionGauge(broken)
    with caplog.at_level(logging.WARNING, logger="raftlet.metrics.gauge"):
        assert math.isnan(g.value())
        assert math.isnan(g.value())  # rate-limited: not logged again
    records = [r for r in caplog.records if r.name == "raftlet.metrics.gauge"]
    assert len(records) == 1
    assert records[0].exc_info is not None
    assert "replica is shutting down" in caplog.text
