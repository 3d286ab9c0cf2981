"""The cold-code benchmark still runs: a row per wait and pause, both pieces timed.
(The numbers themselves are for docs/benchmarks.md, never asserted.)"""

from __future__ import annotations

from pathlib import Path

from tests.bench_scripts import run_bench, tables


def test_the_cold_code_benchmark_prints_every_pause_of_every_wait(tmp_path: Path) -> None:
    out = run_bench(
        "cold_code.py",
        "--gaps-ms",
        "0.01,0.2",
        "--samples",
        "5",
        "--repeat",
        "1",
        "--cpu",
        "0",
        directory=tmp_path,
    )
    (rows,) = tables(out)
    assert [(row[0], row[1]) for row in rows] == [
        ("spin", "0.01"),
        ("spin", "0.2"),
        ("sleep", "0.01"),
        ("sleep", "0.2"),
    ]
    for row in rows:
        python_p50, python_p90 = (float(v) for v in row[2].split(" / "))
        store_p50, store_p90 = (float(v) for v in row[4].split(" / "))
        assert 0 < python_p50 <= python_p90
        assert 0 < store_p50 <= store_p90
    # Each wait's shortest pause is its own yardstick.
    assert rows[0][3] == rows[2][3] == "1.00"
    assert rows[0][5] == rows[2][5] == "1.00"
