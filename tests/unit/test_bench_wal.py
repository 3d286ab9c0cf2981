"""The WAL benchmarks still run: every row they print, in quick runs of a fraction of a
second per cell.  (The numbers themselves are for docs/benchmarks.md, never asserted.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wal_benchmark_prints_every_mode(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "wal.py"),
            "--seconds",
            "0.1",
            "--producers",
            "1,2",
            "--sizes",
            "100",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    modes = [row.split("|")[1].strip() for row in rows[1:]]
    assert modes.count("fsync/entry") == 1
    assert modes.count("group commit") == 2
    assert modes.count("group, asyncio") == 2
    assert {"bare floor", "bare, asyncio", "bare, async cb"} <= set(modes)
    assert list(tmp_path.iterdir()) == []  # every temporary log was removed


def test_the_fsync_spacing_benchmark_prints_every_cell(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "fsync_spacing.py"),
            "--seconds",
            "0.05",
            "--repeat",
            "1",
            "--gaps",
            "0,50",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=True,
    ).stdout
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ")]
    cells = {(row[1].strip(), row[2].strip()) for row in rows[1:]}
    assert cells == {("130", "0"), ("130", "50"), ("4160", "0"), ("4160", "50")}
    assert list(tmp_path.iterdir()) == []
