"""``bench/reads.py`` still runs end to end, briefly: it starts both clusters, loads, reads
in every mode at 1 and 16 in flight, prints its table, shows the lease served, and removes
everything it made -- every server it started is gone too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raftlet.deploy.local import pid_alive
from tests.bench_scripts import run_bench, tables

pytestmark = pytest.mark.integration


def test_the_reads_benchmark_runs_briefly(tmp_path: Path) -> None:
    out = run_bench(
        "reads.py", "--seconds", "0.3", "--repeat", "1", "--keys", "50", directory=tmp_path
    )
    (rows,) = tables(out)
    cells = [(r[0], r[1]) for r in rows]
    modes = ("leader ReadIndex", "leader lease", "follower")
    assert cells == [(n, m) for n in ("1", "16") for m in modes]
    assert all(float(r[2].replace(",", "")) > 0 for r in rows)
    assert {r[5] for r in rows if r[1] == "leader ReadIndex"} == {"1.00x"}
    served = re.search(r"lease_reads (\d+), read_index_reads", out)
    assert served is not None
    assert int(served.group(1)) > 0
    pids = [int(p) for p in re.findall(r"pid (\d+)", out)]
    assert len(pids) == 6
    assert not any(pid_alive(p) for p in pids)


def test_percentiles_are_nearest_rank() -> None:
    from tests.bench_scripts import load_bench

    bench = load_bench("reads.py")
    values = [float(v) for v in range(1, 101)]
    assert bench.percentile(values, 0.5) == 50.0
    assert bench.percentile(values, 0.99) == 99.0
    assert bench.percentile([], 0.5) != bench.percentile([], 0.5)  # nan
