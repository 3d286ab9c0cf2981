"""``bench/row_decode.py`` runs, prints one row per batch size, and times the same work both
ways (the numbers are for docs/benchmarks.md, never asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from raftlet.schema.row_runs import decode_row_blocks, decode_row_runs
from tests.bench_scripts import load_bench

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "row_decode.py"


def test_prints_one_row_per_batch_size() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--blocks", "1,3", "--calls", "5", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=REPO,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and "µs" not in line]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "3"]


def test_both_ways_decode_the_same_rows() -> None:
    row_decode = load_bench("row_decode.py")
    blocks = row_decode.one_row_blocks(5)
    alone = [decode_row_runs(row_decode.SCHEMA, *b) for b in blocks]
    assert decode_row_blocks(row_decode.SCHEMA, blocks) == alone
    assert len({run[0][0].params[0][0] for run in alone}) == 5  # five distinct keys
