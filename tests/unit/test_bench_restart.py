"""The restart benchmark still runs: every case it prints, on a log of a few thousand entries.
(The numbers themselves are for docs/benchmarks.md, never asserted.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tables(out: str) -> list[list[list[str]]]:
    """The cells of each printed table's rows, header left out."""
    found: list[list[list[str]]] = []
    rows: list[list[str]] | None = None
    for line in out.splitlines():
        if not line.startswith("|"):
            rows = None
            continue
        if rows is None:  # a header
            rows = []
            found.append(rows)
        elif "---" not in line:
            rows.append([cell.strip() for cell in line.split("|")[1:-1]])
    return found


def test_the_restart_benchmark_prints_every_case(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "restart.py"),
            "--entries",
            "3000",
            "--lag",
            "1000",
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
    assert list(tmp_path.iterdir()) == []  # the replica directory was removed
    cases, phases = tables(out)
    assert [row[:3] for row in cases] == [
        ["store lags 1,000", "3,000", "1,000"],
        ["clean", "3,000", "0"],
        ["empty store", "3,000", "3,000"],
    ]
    assert [row[0] for row in phases] == [row[0] for row in cases]
