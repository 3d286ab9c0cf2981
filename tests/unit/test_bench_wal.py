"""The WAL benchmarks still run: every row they print, in quick runs of a fraction of a
second per cell.  (The numbers themselves are for docs/benchmarks.md, never asserted.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def table_rows(script: str, *args: str, directory: Path) -> list[list[str]]:
    """Run ``bench/<script>`` with ``args`` and its temporary files in ``directory``; the
    cells of its table's rows, header left out.  Checks that nothing was left behind."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args, "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    ).stdout
    assert list(directory.iterdir()) == []  # every temporary file was removed
    lines = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    return [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines[1:]]


def test_the_wal_benchmark_prints_every_mode(tmp_path: Path) -> None:
    rows = table_rows(
        "wal.py", "--seconds", "0.1", "--producers", "1,2", "--sizes", "100", directory=tmp_path
    )
    modes = [row[0] for row in rows]
    assert modes.count("fsync/entry") == 1
    assert modes.count("group commit") == 2
    assert modes.count("group, asyncio") == 2
    assert {"bare floor", "bare, asyncio", "bare, async cb"} <= set(modes)


def test_the_fsync_spacing_benchmark_prints_every_cell(tmp_path: Path) -> None:
    rows = table_rows(
        "fsync_spacing.py",
        "--seconds",
        "0.05",
        "--repeat",
        "1",
        "--gaps",
        "0,50",
        directory=tmp_path,
    )
    cells = {(row[0], row[1]) for row in rows}
    assert cells == {("130", "0"), ("130", "50"), ("4160", "0"), ("4160", "50")}
