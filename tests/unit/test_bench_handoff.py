"""``bench/handoff.py`` runs and prints one row per placement (the numbers are for
docs/benchmarks.md, never asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "handoff.py"


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity")
def test_prints_both_placements() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--handoffs", "200", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and "µs" not in line]
    assert [r.split("|")[1].strip() for r in rows] == [
        "any CPU",
        f"CPU {min(os.sched_getaffinity(0))} only",
    ]
    for row in rows:
        wall = float(row.split("|")[2])
        assert wall > 0


def test_bad_arguments_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--handoffs", "1"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "--handoffs must be at least 2" in done.stderr
