"""A chaos run's options, its report's verdict, and the command line's usage errors."""

from __future__ import annotations

from pathlib import Path

import pytest

import raftlet.chaos.run as run_mod
from raftlet.chaos.checker import CheckResult, InsertVerdict, KeyVerdict
from raftlet.chaos.history import Op, OpKind, Outcome
from raftlet.chaos.nemesis import FaultEvent
from raftlet.chaos.options import ChaosOptions, WorkloadOptions
from raftlet.chaos.run import ChaosReport
from raftlet.cli.main import main


def _inserts(lost: list[int] | None = None) -> InsertVerdict:
    return InsertVerdict(
        lost or [], [], [], ok_count=10, fail_count=1, info_count=2, info_present=1
    )


def _report(verdicts: dict[int, KeyVerdict], **kwargs: object) -> ChaosReport:
    """A report of a short run; ``kwargs`` replace its fields."""
    base: dict[str, object] = {
        "backend": "netns",
        "seed": 1,
        "duration_s": 10.0,
        "ops": {"write": {"ok": 5, "info": 1}, "read": {"ok": 4, "fail": 2}},
        "faults": [FaultEvent("pause", ["ts1"], 1.0, 2.5), FaultEvent("kill", ["ts2"], 3.0, 4.0)],
        "terms_advanced": 3,
        "verdicts": verdicts,
        "inserts": _inserts(),
        "replicas": {"t-p0": (True, "5 rows at index 9")},
    }
    base.update(kwargs)
    return ChaosReport(**base)  # type: ignore[arg-type]


def _verdict(key: int, result: CheckResult, counterexample: list[Op] | None = None) -> KeyVerdict:
    return KeyVerdict(key, result, 10, 0.01, counterexample or [])


STALE = [
    Op(1, 0, OpKind.WRITE, 0, 1, 0, 1_000_000, Outcome.OK),
    Op(2, 1, OpKind.WRITE, 0, 2, 2_000_000, 3_000_000, Outcome.OK),
    Op(3, 2, OpKind.READ, 0, 1, 4_000_000, 5_000_000, Outcome.OK),
]


def test_the_report_says_why_operations_were_not_ok() -> None:
    """18% of reads showed as "fail" with no reason: expected refusals, but only the
    history said which (review r32c)."""
    ops = [
        Op(1, 0, OpKind.READ, 0, None, 0, 1, Outcome.FAIL, "ts2: FAILED_PRECONDITION"),
        Op(2, 0, OpKind.READ, 0, None, 0, 1, Outcome.FAIL, "ts3: FAILED_PRECONDITION"),
        Op(3, 0, OpKind.READ, 0, None, 0, 1, Outcome.INFO, "ts1: DEADLINE_EXCEEDED"),
        Op(4, 0, OpKind.WRITE, 0, 1, 0, 1, Outcome.INFO, "NOT_LEADER: not the leader"),
        Op(5, 0, OpKind.WRITE, 0, 2, 0, 1, Outcome.OK),
    ]
    not_ok = run_mod._not_ok_causes(ops)
    assert not_ok == {
        "read": {"FAILED_PRECONDITION": 2, "DEADLINE_EXCEEDED": 1},
        "write": {"NOT_LEADER": 1},
    }
    text = _report({0: _verdict(0, CheckResult.LINEARIZABLE)}, not_ok=not_ok).format()
    assert "    read not ok, why: FAILED_PRECONDITION 2, DEADLINE_EXCEEDED 1" in text
    assert "    write not ok, why: NOT_LEADER 1" in text
    assert run_mod._cause_of("") == "no error recorded"
    # As the workload records them: a client read's failure and a row error, cause first.
    from raftlet.chaos.workload import _row_error
    from raftlet.client.errors import Timeout
    from raftlet.proto import tablet_pb2

    timeout = Timeout("scan of tablet registers-p3 timed out after 2 s (5 attempts)")
    assert run_mod._cause_of(f"{timeout.cause}: {timeout}") == "TIMEOUT"
    refused = tablet_pb2.RowErrorPB(code=tablet_pb2.RowErrorPB.KEY_EXISTS, message="key 7")
    assert run_mod._cause_of(_row_error(refused)) == "KEY_EXISTS"


def test_a_clean_run_passes_and_says_so() -> None:
    report = _report({0: _verdict(0, CheckResult.LINEARIZABLE)})
    assert report.ok
    assert report.linearizable is True
    text = report.format()
    assert "verdict: PASS" in text
    assert "faults: 2 (kill 1, pause 1)" in text
    assert "  write                 6       5       0       1" in text


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"verdicts": {0: _verdict(0, CheckResult.NOT_LINEARIZABLE, STALE)}}, "NOT LINEARIZABLE"),
        ({"verdicts": {0: _verdict(0, CheckResult.UNKNOWN)}}, "unknown (budget)"),
        ({"inserts": _inserts(lost=[7])}, "1 lost acknowledged"),
        ({"replicas": {"t-p0": (False, "applied indexes differ")}}, "replicas DIFFERENT"),
        ({"problems": ["register 3 could not be read after healing"]}, "problem: register 3"),
    ],
)
def test_any_violation_or_undecided_check_fails_the_run(
    change: dict[str, object], why: str
) -> None:
    report = _report(**{"verdicts": {0: _verdict(0, CheckResult.LINEARIZABLE)}, **change})
    assert not report.ok
    text = report.format()
    assert "verdict: FAIL" in text
    assert why in text


def test_the_report_shows_the_shortest_counter_example() -> None:
    long = _verdict(0, CheckResult.NOT_LINEARIZABLE, STALE * 2)
    short = _verdict(1, CheckResult.NOT_LINEARIZABLE, STALE)
    text = _report({0: long, 1: short}).format()
    assert "shortest counter-example (key 1)" in text
    assert "read(0) 1 ok" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "docker"}, "backend must be one of"),
        ({"unsafe": ("no-fsync",)}, "unknown unsafe switches"),
        ({"servers": 2}, "at least 3 servers"),
        ({"servers": 10}, "at most 9 servers"),
        ({"duration_s": 0}, "duration must be positive"),
        ({"leader_read_mode": "gossip"}, "leader_read_mode must be one of"),
        (
            {"unsafe": ("stale-reads",), "leader_read_mode": "lease"},
            "a leader lease needs it",
        ),
    ],
)
def test_bad_options_are_refused_with_the_reason(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ChaosOptions(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keys": 0}, "keys must be at least 1"),
        (
            {"register_workers": 0, "insert_workers": 0, "async_insert_workers": 0},
            "at least one worker",
        ),
        ({"async_insert_workers": -1}, "cannot be negative"),
        ({"direct_read_fraction": 1.5}, r"direct_read_fraction must be in \[0, 1\]"),
        ({"op_timeout_s": 0}, "op_timeout_s must be positive"),
    ],
)
def test_bad_workloads_are_refused_with_the_reason(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkloadOptions(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--faults", "kill,flood"], "unknown fault kinds ['flood']"),
        (["--unsafe", "no-fsync"], "unknown unsafe switches"),
        (["--unsafe", "stale-reads", "--leader-read-mode", "lease"], "a leader lease needs it"),
        (["--tserver-flag=--unsafe_leader_keeps_lost_quorum=true"], "set it with --unsafe"),
        (["--keys", "0"], "keys must be at least 1"),
    ],
)
def test_the_command_refuses_bad_arguments_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["chaos", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raftlet chaos: error: ")
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_the_report_lists_the_ids_of_lost_inserts_up_to_a_limit() -> None:
    lost = list(range(100, 130))
    text = _report(
        {0: _verdict(0, CheckResult.LINEARIZABLE)},
        inserts=InsertVerdict(lost, [7, 9], [], 40, 2, 0, 0),
    ).format()
    assert "lost (acknowledged, missing): 30: 100, 101, " in text
    assert ", 119, … and 10 more" in text
    assert "120" not in text
    assert "failed but present: 2: 7, 9" in text


@pytest.mark.parametrize("servers", ["2", "10", "201", "300", "three"])
def test_the_server_count_is_bounded_before_anything_starts(
    servers: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_mod, "open_cluster", _must_not_start)
    with pytest.raises(SystemExit) as exited:  # argparse's own usage error
        main(["chaos", "--servers", servers])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("raftlet chaos: error: argument --servers: ")
    assert "must be 3 to 9" in err or "not a number" in err
    assert len(err.strip().splitlines()) == 1


def _must_not_start(*_args: object) -> None:
    raise AssertionError("a cluster was started despite a usage error")


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["chaos", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raftlet chaos: error: ")
    assert len(err.strip().splitlines()) == 1
    return err


def test_a_used_work_dir_is_a_usage_error_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_mod, "open_cluster", _must_not_start)
    (tmp_path / "cluster.toml").write_text("")
    err = _usage_error(["--work-dir", str(tmp_path)], capsys)
    assert f"--work-dir {tmp_path} is not empty (a previous run's cluster?" in err
    assert "give a new or empty directory" in err
    afile = tmp_path / "cluster.toml"
    assert f"--work-dir {afile} is not a directory" in _usage_error(
        ["--work-dir", str(afile)], capsys
    )


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("missing/h.jsonl", "its directory {tmp}/missing does not exist"),
        ("afile/h.jsonl", "its directory {tmp}/afile is not a directory"),
        (".", "is a directory"),
    ],
)
def test_a_history_path_that_cannot_be_written_is_a_usage_error_before_anything_starts(
    name: str,
    why: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(run_mod, "open_cluster", _must_not_start)
    (tmp_path / "afile").write_text("")
    path = tmp_path / name
    err = _usage_error(["--history", str(path)], capsys)
    assert f"--history {path}" in err
    assert why.format(tmp=tmp_path) in err
