"""The WAL benchmarks still run: every row they print, in quick runs of a fraction of a
second per cell.  (The numbers themselves are for docs/benchmarks.md, never asserted.)"""

from __future__ import annotations

from pathlib import Path

from tests.bench_scripts import run_bench, tables


def table_rows(script: str, *args: str, directory: Path) -> list[list[str]]:
    """The rows of the one table ``bench/<script>`` prints."""
    (rows,) = tables(run_bench(script, *args, directory=directory))
    return rows


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
