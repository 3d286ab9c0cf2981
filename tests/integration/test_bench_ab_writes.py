"""``bench/ab_writes.py`` still runs end to end, briefly: two clusters per repetition (here
of one tree, B with a server flag of its own) start, both are written to, in the other
order in the second repetition, the table comes out, and everything it started and made is
gone at the end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raftlet.deploy.local import pid_alive
from tests.bench_scripts import ROOT, run_bench, tables

pytestmark = pytest.mark.integration


def test_the_ab_writes_benchmark_runs_briefly(tmp_path: Path) -> None:
    out = run_bench(
        "ab_writes.py", "--a", str(ROOT), "--b", str(ROOT),
        "--b-flag=--rpc_num_service_threads=2", "--write-arg=--keys=scattered",
        "--tablets", "1", "--in-flight", "2", "--reps", "2", "--seconds", "1",
        directory=tmp_path, timeout=240,
    )  # fmt: skip
    (rows,) = tables(out)
    ((in_flight, a_rate, b_rate, ratio, a_cpu, b_cpu, a_p50, b_p50, a_client, b_client),) = rows
    assert in_flight == "2"
    figures = [a_rate, b_rate, ratio, a_cpu, b_cpu, a_p50, b_p50, a_client, b_client]
    assert all(float(f.replace(",", "")) > 0 for f in figures), rows
    assert "--rpc_num_service_threads=2" in out  # B's flag, said in the header
    assert "raftlet write --keys=scattered" in out  # the writer's, too
    # New clusters in every repetition, B first in the second.
    assert re.findall(r"^cluster ([AB]):", out, re.M) == ["A", "B", "B", "A"]
    assert re.findall(r"^rep (\d) in flight +2 ([AB]):", out, re.M) == [
        ("1", "A"), ("1", "B"), ("2", "B"), ("2", "A"),
    ]  # fmt: skip
    pids = [int(p) for line in re.findall(r"server pids ([\d ]+)", out) for p in line.split()]
    assert len(set(pids)) == 12
    assert not any(pid_alive(p) for p in pids)
