"""``bench/wal_bytes.py`` still runs end to end, briefly: both clusters start, both writers
write, rows of samples come out, and everything it started and made is gone at the end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raftlet.deploy.local import pid_alive
from tests.bench_scripts import run_bench, tables

pytestmark = pytest.mark.integration


def test_the_wal_bytes_benchmark_runs_briefly(tmp_path: Path) -> None:
    out = run_bench(
        "wal_bytes.py", "--minutes", "0.05", "--sample", "1", "--in-flight", "4",
        directory=tmp_path, timeout=180,
    )  # fmt: skip
    (rows,) = tables(out)
    assert len(rows) >= 2
    last = rows[-1]
    assert int(last[1].replace(",", "")) > 0  # entries written with GC on
    assert int(last[4].replace(",", "")) > 0  # and with GC off
    assert float(last[2]) > 0
    assert out.count("exit 0") == 2
    pids = [int(p) for p in re.findall(r"pid (\d+)", out)]
    assert len(pids) == 6
    assert not any(pid_alive(p) for p in pids)
