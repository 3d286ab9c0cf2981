"""The pure parts of ``bench/batched_writes.py``: a cell from `raftlet write`'s JSON summary,
medians and the printed table. No cluster is started; the numbers are never asserted."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench_scripts import load_bench


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("batched_writes.py")


def _summary(rows: int, rate: float, by_server: dict[str, float]) -> dict[str, object]:
    return {
        "rows": rows,
        "rows_per_s": rate,
        "latency_us": {"p50": 2500.0},
        "server_cpu_s_by_server": by_server,
        "failed_rows": 0,
    }


def test_a_cell_splits_cpu_per_row_by_role(bench: ModuleType) -> None:
    cell = bench.cell_from(
        _summary(1000, 500.0, {"ts1": 0.004, "ts2": 0.002, "ts3": 0.003}), 0.01, {"ts1"}
    )
    assert cell.client_us == pytest.approx(10.0)
    assert cell.leader_us == pytest.approx(4.0)
    assert cell.follower_us == pytest.approx(2.5)
    assert cell.total_us == pytest.approx(19.0)
    assert cell.p50_ms == pytest.approx(2.5)


def test_the_table_has_medians_and_rates_relative_to_cells(bench: ModuleType) -> None:
    def cell(rate: float) -> object:
        return bench.Cell(rate, 1.0, 1.0, 1.0, 1.0, 0)

    table = bench.format_table(
        {"cells": [cell(10.0), cell(30.0), cell(20.0)], "block": [cell(60.0), cell(60.0)]}
    )
    rows = [line for line in table.splitlines() if line.startswith("| ") and "rows/s" not in line]
    assert rows[0].startswith("| cells | 20 |")
    assert "1.00x" in rows[0]
    assert rows[1].startswith("| block | 60 |")
    assert "3.00x" in rows[1]


def test_unknown_configurations_are_refused(bench: ModuleType) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--configs", "cells,nope"])
