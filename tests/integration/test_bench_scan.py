"""``bench/scan.py`` still runs end to end, on a few rows: it starts its cluster, loads,
scans in both forms, prints both tables and removes everything it made."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlet.deploy.local import pid_alive
from tests.bench_scripts import run_bench

pytestmark = pytest.mark.integration


def test_the_scan_benchmark_runs_on_a_few_rows(tmp_path: Path) -> None:
    out = run_bench("scan.py", "--rows", "3000", "--repeat", "1", directory=tmp_path)
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    names = [line.split("|")[1].strip() for line in rows]
    assert names[1].startswith("load: write --batch-rows 1000 --in-flight 4")
    assert names[2].startswith("scan: packed")
    assert names[3].startswith("scan: cells")
    assert all(line.split("|")[2].strip() == "3,000" for line in rows[1:4])
    servers = [n for n in names if n.startswith("ts")]
    assert len(servers) == 3
    for name in servers:  # every server it started is gone too
        assert not pid_alive(int(name.split("pid ")[1].rstrip(")")))
