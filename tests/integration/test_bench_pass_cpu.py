"""``bench/pass_cpu.py`` still runs end to end, briefly, with both of its traces (one run:
each of the two cost a cluster of its own, ~20 s of CI): the restarted servers time their
passes, the tables come out with the passes a write takes on its leader and followers, the
lone writes' critical path is traced (--timeline), each pass's CPU is shown against the
time since its server last ran it (--gaps), and the servers it started and the files it
made are gone at the end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raftlet.deploy.local import pid_alive
from tests.bench_scripts import run_bench, tables

pytestmark = pytest.mark.integration


def test_the_pass_cpu_benchmark_runs_briefly_with_its_timeline_and_gaps(tmp_path: Path) -> None:
    out = run_bench(
        "pass_cpu.py", "--tablets", "1", "--in-flight", "1", "--seconds", "1",
        "--timeline", "--gaps", directory=tmp_path, timeout=240,
    )  # fmt: skip
    all_tables = tables(out)
    per_server, traced, by_gap = all_tables[:3], all_tables[3:-3], all_tables[-3:]
    roles = re.findall(r"^(ts\d) \((leads kv-p0|follows)\)", out, re.M)
    assert sorted(r for _, r in roles) == ["follows", "follows", "leads kv-p0"]
    for (server, role), rows in zip(roles, per_server, strict=True):
        timed = {name: float(per_write) for name, _calls, per_write, _per_call in rows}
        passes = ["WAL appender turn", "apply stage"]
        passes += ["prepare stage"] if role.startswith("leads") else ["frame from a leader"]
        for name in passes:
            assert any(k.startswith(name) and v > 0 for k, v in timed.items()), (server, rows)
    # --timeline: the lone writes' critical path, its segments adding up to the whole.
    (lone,) = re.findall(r"^The critical path of a lone write: ([\d,]+) of ([\d,]+)", out, re.M)
    assert int(lone[0].replace(",", "")) > 0
    segments, passes_by_role = traced[:2]
    assert len(segments) == 10
    assert sum(float(row[3].rstrip("%")) for row in segments) == pytest.approx(100, abs=6)
    assert {"leader", "follower A", "follower B"} <= {row[0] for row in passes_by_role}
    # --gaps: per server, a table of the passes it ran more than once (the main table's
    # top-level rows), each with calls in some gap bucket.
    for rows, gap_rows in zip(per_server, by_gap, strict=True):
        passes_timed = {row[0] for row in rows}
        # The WAL appender runs every round; a follower on a loaded machine may apply all a
        # one-second run committed in a single pass, which has no gap to show (CI once).
        assert "WAL appender turn" in {row[0] for row in gap_rows}
        for name, *cells in gap_rows:
            assert name in passes_timed
            counts = [int(c.split("(")[1].strip(")").replace(",", "")) for c in cells if c != "-"]
            assert sum(counts) > 0, (name, cells)
    (pids,) = re.findall(r"^servers: pids ([\d ]+)$", out, re.M)
    assert not any(pid_alive(int(p)) for p in pids.split())
