"""``bench/pingpong.py`` still runs: a few round trips on each path, one table of two rows."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.bench_scripts import ROOT, tables

pytestmark = pytest.mark.integration


def test_the_pingpong_benchmark_measures_both_paths() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pingpong.py"), "--messages", "50", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    ).stdout
    (rows,) = tables(out)
    assert [r[0] for r in rows] == ["grpc.aio stream", "socket"]
    for _, per_second, latency_us, cpu_us in rows:
        assert float(per_second.replace(",", "")) > 0
        assert float(latency_us) > 0
        assert float(cpu_us) >= 0
