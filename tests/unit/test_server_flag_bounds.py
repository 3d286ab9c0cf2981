"""Server flags with bounds from a review of hostile values: each was accepted and then
filled a disk, wedged or spun a server, or was treated as something it did not say; and
flags valid one by one but not together are a usage error of `cluster up`, before any
server starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftlet.cli.main import main
from raftlet.cluster import ClusterConfigError, RaftTimings
from raftlet.deploy.local import LocalCluster
from raftlet.tserver.flag_spec import positive
from tests.unit.test_cli_tserver_args import usage_error
from tests.unit.tserver_settings_helpers import parse, write_config

MiB = 1 << 20
GiB = 1 << 30


def _flag_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    argv = ["--config", str(write_config(tmp_path)), "--server_id", "ts1", *flags]
    return usage_error(capsys, argv)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        # 1 TiB filled the machine's disk: every new segment reserves its whole size.
        (["--log_segment_size_bytes", str(1 << 40)], "must be in 1..1073741824"),
        (["--log_segment_size_bytes", str(GiB + 1)], "must be in 1..1073741824"),
        # Below a write's own size it would refuse all but one write at a time.
        (["--write_memory_limit_bytes", str(MiB - 1)], "must be in 1048576..1099511627776"),
        (["--write_memory_limit_bytes", str((1 << 40) + 1)], "must be in 1048576.."),
        # 1e13 killed the ticker thread (OverflowError); 0.001 spun endless elections.
        (["--tick_interval_ms", "1e13"], "must be in 1..60000, got 1"),
        (["--tick_interval_ms", "0.001"], "must be in 1..60000, got 0.001"),
        (["--tick_interval_ms", "-1"], "must be in 1..60000, got -1.0"),
        (["--election_ticks", "99999999999999999999"], "must be in 2..10000"),
        (["--heartbeat_ticks", "10000"], "must be in 1..9999"),
        # Passes back to back kept every CPU busy at idle.
        (["--store_verify_interval_s", "0.0000001"], "must be 0 (off) or in 1..604800"),
        (["--store_verify_interval_s", "0.001"], "must be 0 (off) or in 1..604800"),
        # Below a second it was silently a second (the repair loop turns once a second).
        (["--tablet_copy_repair_interval_s", "0.5"], "must be 0 (off) or in 1..3600"),
        # int() took these, and gave a raw "invalid literal for int()" for 1.5.
        (["--consensus_tcp_port", "1_000"], "expected an integer, got '1_000'"),
        (["--consensus_tcp_port", "\uff11\uff10\uff10\uff10"], "expected an integer"),
        (["--consensus_tcp_port", "1.5"], "expected an integer, got '1.5'"),
        (["--write_tcp_port", "1_000"], "expected an integer, got '1_000'"),
        (["--write_tcp_port", "1.5"], "expected an integer, got '1.5'"),
        (["--write_tcp_port", "65536"], "must be in 0..65535"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_out_of_bounds_values_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    err = _flag_error(tmp_path, capsys, *flags)
    assert message in err
    assert "invalid literal" not in err


def test_bounds_keep_the_values_in_use(tmp_path: Path) -> None:
    s = parse(
        write_config(tmp_path),
        *("--log_segment_size_bytes", str(GiB), "--tick_interval_ms", "1"),
        *("--store_verify_interval_s", "1", "--tablet_copy_repair_interval_s", "0"),
        *("--consensus_tcp_port", "7100", "--write_tcp_port", "0"),
    )
    assert s.log_segment_size_bytes == GiB
    assert s.raft.tick_interval_ms == 1
    assert (s.store_verify_interval_s, s.tablet_copy_repair_interval_s) == (1, 0)
    assert (s.consensus_tcp_port, s.write_tcp_port) == (7100, 0)
    s = parse(write_config(tmp_path))
    assert s.write_memory_limit_bytes == GiB
    s = parse(write_config(tmp_path), "--write_memory_limit_bytes", str(MiB))
    assert s.write_memory_limit_bytes == MiB
    s = parse(write_config(tmp_path), "--tick_interval_ms", "60000", "--election_ticks", "30")
    assert s.raft.election_ticks == 30


def test_an_election_timeout_past_half_an_hour_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each value alone is in range; together a dead leader would go unnoticed for an hour.
    err = _flag_error(tmp_path, capsys, "--tick_interval_ms", "60000", "--election_ticks", "31")
    assert "--election_ticks: 31 ticks of 60000 ms is an election timeout of 1860 s" in err
    assert "at most 1800000 ms (30 minutes)" in err


def test_the_config_raft_table_has_the_same_bounds() -> None:
    cases: list[tuple[dict[str, float], str, str]] = [
        ({"tick_interval_ms": 1e13}, "tick_interval_ms", "in 1..60000, got 1"),
        ({"tick_interval_ms": 0.001}, "tick_interval_ms", "in 1..60000, got 0.001"),
        ({"election_ticks": 99999999999999999999}, "election_ticks", "at most 10000"),
        ({"heartbeat_ticks": 10_000, "election_ticks": 10_001}, "heartbeat_ticks", "1..9999"),
        ({"tick_interval_ms": 1000, "election_ticks": 1801}, "election_ticks", "30 minutes"),
    ]
    for values, field, fragment in cases:
        with pytest.raises(ClusterConfigError) as exc:
            RaftTimings(**values)  # type: ignore[arg-type]
        assert exc.value.field == field
        assert fragment in exc.value.reason
    assert RaftTimings(tick_interval_ms=1000, election_ticks=1800).election_ticks == 1800


def test_a_negative_is_told_the_same_bound_as_zero() -> None:
    for value in (0, -1, -0.5):
        with pytest.raises(ValueError, match=r"^must be > 0, got "):
            positive(value)


@pytest.fixture
def no_servers_started(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kwargs: object) -> LocalCluster:
        raise AssertionError("a server was started: the flags should have been refused first")

    monkeypatch.setattr(LocalCluster, "create", refuse)


@pytest.mark.usefixtures("no_servers_started")
@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (
            ["--tserver-flag=--heartbeat_ticks=10"],
            ["[raft] election_ticks: must be an integer greater than --heartbeat_ticks (10)"],
        ),
        (
            ["--tserver-flag=--replica_worker_max_threads=1",
             "--tserver-flag=--replica_worker_min_threads=4"],
            ["--replica_worker_max_threads (1) is below --replica_worker_min_threads (4)"],
        ),
        (
            ["--tserver-flag=--tick_interval_ms=60000", "--tserver-flag=--election_ticks=100"],
            ["--election_ticks: 100 ticks of 60000 ms"],
        ),
    ],
    ids=["heartbeat", "workers", "election span"],
)  # fmt: skip
def test_cluster_up_refuses_flags_that_conflict_before_starting_a_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], fragments: list[str]
) -> None:
    data_dir = tmp_path / "c"
    try:
        code = main(["cluster", "up", "--data-dir", str(data_dir), *flags])
    except SystemExit as e:
        code = int(e.code or 0)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert "--tserver-flag: " in err
    assert "ts1 would refuse to start with these flags" in err
    for fragment in fragments:
        assert fragment in err
    assert not data_dir.exists()


needs_affinity = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform"
)


@needs_affinity
@pytest.mark.usefixtures("no_servers_started")
@pytest.mark.parametrize("flag", ["--cpu-affinity={}", "--tserver-flag=--cpu_affinity={}"])
def test_cluster_up_refuses_a_cpu_this_machine_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    missing = max(os.sched_getaffinity(0)) + 1
    argv = [flag.format(missing)]
    try:
        code = main(["cluster", "up", "--data-dir", str(tmp_path / "c"), *argv])
    except SystemExit as e:
        code = int(e.code or 0)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"CPU {missing} is not one this process may run on" in err


@needs_affinity
def test_tserver_refuses_a_cpu_this_machine_lacks_as_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = max(os.sched_getaffinity(0)) + 1
    err = _flag_error(tmp_path, capsys, "--cpu_affinity", f"0,{missing}")
    assert f"--cpu_affinity: CPU {missing} is not one this process may run on" in err
    err = _flag_error(tmp_path, capsys, "--cpu_affinity", "0-99999999999")
    assert "CPU numbers go up to 8191" in err
