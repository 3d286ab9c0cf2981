"""The store-apply benchmark still runs: a row per batch size, the commit split out.
(The numbers themselves are for docs/benchmarks.md, never asserted.)"""

from __future__ import annotations

from pathlib import Path

from tests.bench_scripts import run_bench, tables


def test_the_store_apply_benchmark_prints_every_batch_size(tmp_path: Path) -> None:
    out = run_bench(
        "store_apply.py",
        "--writes-per-apply",
        "1,5",
        "--writes",
        "300",
        "--repeat",
        "1",
        directory=tmp_path,
    )
    (rows,) = tables(out)
    assert [row[0] for row in rows] == ["1", "5"]
    for row in rows:
        # Both parts of a transaction were timed.
        assert float(row[1]) > 0
        assert float(row[2]) > 0
        assert row[3].endswith("%")
