"""``bench/tablet_copy.py`` still runs end to end, on a few rows: it starts its cluster,
loads, wipes a follower twice, sees it come back by tablet copy each time, prints its table
and removes everything it made. (The numbers are for docs/benchmarks.md, never asserted.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench_scripts import run_bench

pytestmark = pytest.mark.integration


def test_the_tablet_copy_benchmark_runs_on_a_few_rows(tmp_path: Path) -> None:
    out = run_bench(
        "tablet_copy.py", "--rows", "20000", "--repeat", "2", directory=tmp_path, timeout=300
    )
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0].startswith("| store MiB | stop + start s | start to copy installed s")
    assert len(rows) == 1 + 2  # a row per copy
