"""The pure part of ``bench/pass_cpu.py --gaps`` (``bench/_gaps.py``): each pass's CPU sorted
by the time since its server last ran the same pass.  Synthetic passes; no cluster."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench_scripts import load_bench

MS = 1_000_000  # ns


@pytest.fixture(scope="module")
def gaps() -> ModuleType:
    return load_bench("_gaps.py")


def test_a_pass_is_bucketed_by_the_gap_since_the_same_pass_ended(gaps: ModuleType) -> None:
    events = [
        ("apply stage", 1, 0, 1 * MS, 300e-6),  # the first: no gap, not counted
        ("prepare stage", 2, 0, 1 * MS, 900e-6),  # another pass: its own history
        ("apply stage", 1, int(1.1 * MS), 2 * MS, 100e-6),  # 0.1 ms after
        ("apply stage", 3, int(2.5 * MS), 3 * MS, 150e-6),  # 0.5 ms after
        ("apply stage", 1, 10 * MS, 11 * MS, 400e-6),  # 7 ms after
        ("  of which store transaction", 1, 10 * MS, 11 * MS, 200e-6),  # nested: left out
    ]
    cells = gaps.cpu_by_gap(events)
    assert set(cells) == {"apply stage"}  # prepare ran once
    assert cells["apply stage"] == [[pytest.approx(100)], [pytest.approx(150)], [], [], [400]]


def test_overlapping_passes_measure_from_the_latest_end(gaps: ModuleType) -> None:
    # Two threads run the pass at once; the third call's gap counts from the later end,
    # whichever started first, and events need not come in order.
    events = [
        ("WAL appender turn", 2, int(0.5 * MS), 5 * MS, 1e-6),
        ("WAL appender turn", 1, 0, 1 * MS, 1e-6),
        ("WAL appender turn", 1, int(5.1 * MS), 6 * MS, 2e-6),
    ]
    cells = gaps.cpu_by_gap(events)["WAL appender turn"]
    # 0.5 -> 0 is a negative gap (it started before the first ended): the first bucket.
    assert [len(c) for c in cells] == [2, 0, 0, 0, 0]


def test_the_report_has_a_table_per_server(gaps: ModuleType) -> None:
    events = [("apply stage", 1, 0, MS, 1e-4), ("apply stage", 1, 6 * MS, 7 * MS, 3e-4)]
    text = gaps.report({"ts2": events, "ts1": events})
    assert text.index("\nts1\n") < text.index("\nts2\n")
    assert "| apply stage | - | - | - | - | 300 (1) |" in text
    heads = gaps.bucket_labels()
    assert heads == ["0-0.2 ms", "0.2-1 ms", "1-2 ms", "2-4 ms", ">= 4 ms"]
