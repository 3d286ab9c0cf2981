"""The restart benchmark still runs: every case it prints, on a log of a few thousand entries.
(The numbers themselves are for docs/benchmarks.md, never asserted.)"""

from __future__ import annotations

from pathlib import Path

from tests.bench_scripts import run_bench, tables


def test_the_restart_benchmark_prints_every_case(tmp_path: Path) -> None:
    out = run_bench("restart.py", "--entries", "3000", "--lag", "1000", directory=tmp_path)
    cases, phases = tables(out)
    assert [row[:3] for row in cases] == [
        ["store lags 1,000", "3,000", "1,000"],
        ["clean", "3,000", "0"],
        ["empty store", "3,000", "3,000"],
    ]
    assert [row[0] for row in phases] == [row[0] for row in cases]
