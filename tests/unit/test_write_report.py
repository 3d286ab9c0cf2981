"""cli/write_report.py: the summary `raftlet write` prints after its run."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from raftlet.cli.server_cpu import CpuReading, ServerCpu
from raftlet.cli.write_load import LoadSummary
from raftlet.cli.write_report import print_summary


def _summary(**given: Any) -> LoadSummary:
    fields: dict[str, Any] = {
        "table": "kv",
        "threads": 4,
        "flush_mode": "sync",
        "row_bytes": 100,
        "elapsed_s": 2.0,
        "rows": 400,
        "writes": 400,
        "latency_us": dict.fromkeys(("p50", "p95", "p99", "p99.9", "max"), 1.0),
        "retries_by_cause": {},
        "errors_by_cause": {},
        "first_error": "",
        "interrupted": False,
    }
    return LoadSummary(**(fields | given))


def _printed(cpu: ServerCpu | None) -> str:
    """The server CPU row, and the note under the table if there is one."""
    summary = _summary(server_cpu=cpu)
    out = io.StringIO()
    # Wide enough that no cell wraps: the lines are matched whole.
    print_summary(summary, Console(file=out, width=400, color_system=None))
    lines = out.getvalue().splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("server CPU"))
    notes = [line for line in lines[row + 1 :] if "server CPU" in line]
    return " | ".join(" ".join(line.split()) for line in [lines[row], *notes])


def test_unknown_server_cpu_names_the_servers_without_a_reading() -> None:
    # The cluster was stopped during the run: nobody answered the reading after it.
    one = CpuReading(1.0, started=100.0)
    cpu = ServerCpu.between(
        dict.fromkeys(("ts1", "ts2", "ts3"), one), dict.fromkeys(("ts1", "ts2", "ts3"))
    )
    assert _printed(cpu) == (
        "server CPU - unknown | server CPU is unknown: ts1 (missed a /metrics reading before "
        "or after the run), ts2 (missed a /metrics reading before or after the run), ts3 "
        "(missed a /metrics reading before or after the run)"
    )
    assert _printed(ServerCpu({})) == "server CPU - unknown (no server to read it from)"
    assert _printed(None) == "server CPU - not read"
    # The note is under the table: the rate column is as wide as its widest figure.
    out = io.StringIO()
    print_summary(_summary(server_cpu=cpu), Console(file=out, width=400, color_system=None))
    assert max(len(line) for line in out.getvalue().splitlines() if "rows/s" in line) < 60
    # With some readings, the figure is theirs, and says whom it leaves out and why.
    cpu = ServerCpu.between(
        dict.fromkeys(("ts1", "ts2", "ts3", "ts4"), one),
        {
            "ts1": CpuReading(1.6, 100.0),
            "ts2": CpuReading(1.2, 100.0),
            "ts4": CpuReading(9.0, 250.0),  # a new process: its 9 s are not the run's
        },
    )
    assert _printed(cpu) == (
        "server CPU 0.80 s 2.000 ms/write * | * server CPU leaves out ts4 (restarted during the "
        "run), ts3 (missed a /metrics reading before or after the run)"
    )


def test_failed_rows_whose_outcome_is_unknown_are_told_apart() -> None:
    """A timed-out row may be in the table all the same: the report says how many of the
    failed rows are such, where a refused row (NOT_LEADER to the end) is surely not."""
    from raftlet.cli.write_load import LoadState
    from raftlet.client.errors import NotLeader, Timeout

    state = LoadState()
    state.failed(Timeout("write timed out"))
    state.failed(Timeout("write timed out", may_have_applied=False))
    state.failed(NotLeader("no leader", may_have_applied=False))
    state.failed(RuntimeError("a bug"))  # says nothing: unknown
    assert (sum(state.errors.values()), state.maybe_applied) == (4, 2)
    summary = _summary(
        errors_by_cause=dict(state.errors),
        first_error="write timed out",
        failed_rows_maybe_applied=state.maybe_applied,
    )
    assert summary.to_json()["failed_rows"] == 4
    assert summary.to_json()["failed_rows_maybe_applied"] == 2
    out = io.StringIO()
    print_summary(summary, Console(file=out, width=400, color_system=None))
    (line,) = [row for row in out.getvalue().splitlines() if row.startswith("errors")]
    assert "(2 of these rows may have been written all the same" in line
