"""The CLI behind `make sim` and the demo behind `make demo`."""

from __future__ import annotations

import pytest

from tests.sim import demo, run, scenarios
from tests.sim.scenarios import Stats


def test_run_reports_success(capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["--seeds", "3", "--steps", "60"]) == 0
    out = capsys.readouterr().out
    assert "3 seeds" in out
    assert "0 failed" in out
    assert "elections" in out
    assert "FAIL" not in out


def test_run_reports_failure_with_replay(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(seed: int) -> Stats:
        if seed == 1:
            raise AssertionError(f"boom\n  replay: {scenarios.replay_command('broken', seed)}")
        if seed == 2:
            raise IndexError("core blew up")  # no replay in it: run.py adds one
        return Stats()

    monkeypatch.setitem(scenarios.SCENARIOS, "broken", broken)
    assert run.main(["--seeds", "3", "--scenario", "broken"]) == 1
    lines = capsys.readouterr().out.splitlines()
    fails = [ln for ln in lines if ln.startswith("FAIL")]
    assert len(fails) == 2
    assert "boom" in fails[0]
    assert "--scenario broken --seed 1" in fails[0]
    assert "IndexError" in fails[1]
    assert "--scenario broken --seed 2" in fails[1]
    assert "2 failed" in lines[-1]


def test_random_replay_command_round_trips() -> None:
    p = scenarios.RandomParams.from_seed(5, 80)
    cmd = scenarios.replay_command("random", 5, *p.cli_args())
    args = run._parser().parse_args(cmd.split()[3:])
    params = run._random_job(args).params
    assert params is not None
    assert params(5) == p


def test_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main([]) == 0
    out = capsys.readouterr().out
    assert "simulat" in out.lower()
    assert "leader" in out
