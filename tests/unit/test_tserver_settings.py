"""tserver/settings.py: the flag table and ``ServerSettings`` -- defaults, overrides, and
the settings' own validation."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from raftlet.cluster import ClusterConfig, RaftTimings, load_cluster_config
from raftlet.consensus.log.options import LogOptions
from raftlet.consensus.raft_consensus import LeaderReadMode, TermCheckMode
from raftlet.tserver.flag_registry import render_flag_value
from raftlet.tserver.flag_spec import FlagError
from raftlet.tserver.settings import FLAGS, ServerSettings
from tests.unit.tserver_settings_helpers import MiB, parse, write_config


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    return write_config(tmp_path)


# --- defaults and overrides ----------------------------------------------------------------


def test_defaults(config_path: Path) -> None:
    s = parse(config_path)
    assert s.server_id == "ts1"
    assert s.config == load_cluster_config(config_path)
    assert s.data_dir == config_path.parent / "ts1"
    assert (s.rpc_addr, s.http_addr) == ("127.0.0.1:7051", "127.0.0.1:8051")
    # [raft] of the config, with the built-in default for what it leaves out.
    assert s.raft == RaftTimings(50, 6, 3)
    assert (s.rpc_service_queue_length, s.rpc_num_service_threads) == (50, 10)
    assert (s.consensus_service_queue_length, s.consensus_num_service_threads) == (100, 4)
    assert s.term_check_mode is TermCheckMode.LOCKFREE
    assert (s.log_inject_latency_ms, s.log_inject_latency_jitter_ms) == (0, 0)
    assert s.group_commit_queue_size_bytes == 4 * MiB
    assert s.log_segment_size_bytes == LogOptions().segment_size_bytes
    assert s.lock_contention_trace_threshold_ms == 100
    assert s.max_message_bytes == 16 * MiB
    assert s.max_batch_rows == 10_000
    assert s.log_level == "INFO"
    assert s.server == s.config.server("ts1")
    assert s.placements() == s.config.placements_for("ts1")


def test_server_entry_decides_addresses_and_data_dir(config_path: Path) -> None:
    s = parse(config_path, server="ts2")
    assert s.rpc_addr == "127.0.0.1:7052"
    assert s.data_dir == config_path.parent / "disks" / "two"


def test_every_tunable_has_a_flag_and_help() -> None:
    names = {spec.name for spec in FLAGS}
    fields = {f.name for f in dataclasses.fields(ServerSettings)} - {"raft"}
    assert fields <= names
    assert names - fields == {"tick_interval_ms", "election_ticks", "heartbeat_ticks"}
    for spec in FLAGS:
        assert len(spec.help) > 40, spec.name
        field = next((f for f in dataclasses.fields(ServerSettings) if f.name == spec.name), None)
        if field is not None and field.default is not dataclasses.MISSING:
            # The help states the default, taken from the dataclass (one source of truth).
            shown = render_flag_value(field.default)
            if isinstance(field.default, int) and field.default >= MiB:
                shown = f"{field.default // MiB} MiB"
            assert f"default {shown}" in spec.help or f"{shown} (default)" in spec.help, spec.name


OVERRIDES: list[tuple[list[str], str, object]] = [
    (["--rpc_addr", "0.0.0.0:9000", "--insecure"], "rpc_addr", "0.0.0.0:9000"),
    (["--http-addr", "[::1]:9001"], "http_addr", "[::1]:9001"),
    (["--rpc_service_queue_length", "1"], "rpc_service_queue_length", 1),
    (["--rpc-num-service-threads", "1"], "rpc_num_service_threads", 1),
    (["--consensus_service_queue_length", "7"], "consensus_service_queue_length", 7),
    (["--consensus_num_service_threads", "2"], "consensus_num_service_threads", 2),
    (["--admin_service_queue_length", "3"], "admin_service_queue_length", 3),
    (["--admin-num-service-threads", "1"], "admin_num_service_threads", 1),
    (["--term_check_mode", "locked"], "term_check_mode", TermCheckMode.LOCKED),
    (["--term-check-mode=LOCKED"], "term_check_mode", TermCheckMode.LOCKED),
    (["--log_inject_latency_ms", "12.5"], "log_inject_latency_ms", 12.5),
    (["--log-inject-latency-jitter-ms", "3"], "log_inject_latency_jitter_ms", 3.0),
    (["--group_commit_queue_size_bytes", "1024"], "group_commit_queue_size_bytes", 1024),
    (["--log_segment_size_bytes", "65536"], "log_segment_size_bytes", 65536),
    (["--lock_contention_trace_threshold_ms", "0"], "lock_contention_trace_threshold_ms", 0.0),
    (["--max_message_bytes", "1048576"], "max_message_bytes", MiB),
    (["--max-batch-rows", "5"], "max_batch_rows", 5),
    (["--log_level", "debug"], "log_level", "DEBUG"),
    (["--umask", "027"], "umask", "027"),
]


@pytest.mark.parametrize(("argv", "name", "value"), OVERRIDES, ids=[o[0][0] for o in OVERRIDES])
def test_override(config_path: Path, argv: list[str], name: str, value: object) -> None:
    assert getattr(parse(config_path, *argv), name) == value


def test_raft_flags_override_the_config(config_path: Path) -> None:
    s = parse(config_path, "--tick_interval_ms", "10", "--heartbeat-ticks", "2")
    assert s.raft == RaftTimings(10, 6, 2)
    opts = s.consensus_options()
    assert opts.tick_interval_s == pytest.approx(0.01)
    assert (opts.election_ticks, opts.heartbeat_ticks) == (6, 2)
    assert opts.term_check_mode is TermCheckMode.LOCKFREE


def test_relative_data_dir_flag_is_relative_to_the_working_directory(
    config_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    s = parse(config_path, "--data_dir", "here/ts1")
    assert s.data_dir == tmp_path / "here" / "ts1"
    assert s.data_dir.is_absolute()


def test_log_options(config_path: Path) -> None:
    s = parse(
        config_path,
        "--log_segment_size_bytes=4096",
        "--group_commit_queue_size_bytes=2048",
        "--log_inject_latency_ms=5",
        "--log_inject_latency_jitter_ms=1",
    )
    assert s.log_options() == LogOptions(
        segment_size_bytes=4096,
        group_commit_queue_size_bytes=2048,
        inject_latency_ms=5.0,
        inject_latency_jitter_ms=1.0,
    )


def test_from_args_with_a_partial_namespace(config_path: Path) -> None:
    config = load_cluster_config(config_path)
    s = ServerSettings.from_args(argparse.Namespace(server_id="ts3"), config)
    assert s == ServerSettings(
        "ts3",
        config,
        config_path.parent / "ts3",
        "127.0.0.1:7053",
        "127.0.0.1:8053",
        RaftTimings(50, 6, 3),
    )


def test_settings_validate_when_built_directly(config_path: Path) -> None:
    config: ClusterConfig = load_cluster_config(config_path)
    base = ServerSettings("ts1", config, Path("/d"), "127.0.0.1:1", "127.0.0.1:2")
    with pytest.raises(FlagError, match=r"^--max_batch_rows: must be >= 1, got 0$"):
        dataclasses.replace(base, max_batch_rows=0)
    with pytest.raises(FlagError, match=r"^--rpc_addr: 'nope' is not host:port"):
        dataclasses.replace(base, rpc_addr="nope")
    with pytest.raises(FlagError, match=r"^--server_id: unknown server id 'x'"):
        dataclasses.replace(base, server_id="x")
    with pytest.raises(FlagError, match=r"expected an integer, got 2\.5"):
        dataclasses.replace(base, rpc_num_service_threads=2.5)  # type: ignore[arg-type]
    with pytest.raises(FlagError, match=r"^--replica_worker_max_threads \(1\) is below"):
        dataclasses.replace(base, replica_worker_max_threads=1)
    with pytest.raises(FlagError, match=r"^--log_appender_threads: must be in 1\.\.1024, got 0$"):
        dataclasses.replace(base, log_appender_threads=0)
    for mask in ("8", "0777x", "1777", "", "rw"):
        with pytest.raises(FlagError, match=r"^--umask: expected an octal mask such as 077"):
            dataclasses.replace(base, umask=mask)


# --- leader reads ------------------------------------------------------------------------


def test_leader_read_mode_defaults_to_read_index_and_lease_flags_reach_consensus(
    config_path: Path,
) -> None:
    s = parse(config_path)
    assert s.leader_read_mode is LeaderReadMode.READ_INDEX
    assert s.consensus_options().leader_read_mode is LeaderReadMode.READ_INDEX
    assert s.stall_margin_s() is None
    leased = parse(config_path, "--leader_read_mode", "LEASE", "--lease-clock-drift", "0.2")
    opts = leased.consensus_options()
    assert (opts.leader_read_mode, opts.lease_clock_drift) == (LeaderReadMode.LEASE, 0.2)
    # [raft] 50 ms, 6/3: the span is 150 ms, the lease 150 * 0.8 - 50 ms.
    assert opts.lease_duration_s() == pytest.approx(0.07)
    assert leased.stall_margin_s() == pytest.approx(0.15 * 0.2 + 0.05)
    assert render_flag_value(leased.leader_read_mode) == "lease"


def test_a_lease_the_raft_timings_leave_no_room_for_is_refused(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse(config_path, "--leader_read_mode", "lease", "--heartbeat_ticks", "5")
    assert "--leader_read_mode: these Raft timings leave no lease" in capsys.readouterr().err
    base = parse(config_path)
    with pytest.raises(FlagError, match="no lease"):
        dataclasses.replace(base, leader_read_mode=LeaderReadMode.LEASE, raft=RaftTimings(50, 6, 5))
    with pytest.raises(SystemExit):
        parse(config_path, "--leader_read_mode", "sometimes")
    with pytest.raises(SystemExit):
        parse(config_path, "--lease_clock_drift", "0.7")


def test_the_lost_quorum_switch_turns_check_quorum_off_and_is_refused_with_a_lease(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse(config_path).consensus_options().check_quorum is True
    unsafe = parse(config_path, "--unsafe_leader_keeps_lost_quorum=true")
    assert unsafe.consensus_options().check_quorum is False
    with pytest.raises(SystemExit):
        parse(config_path, "--unsafe_leader_keeps_lost_quorum=true", "--leader_read_mode", "lease")
    assert "--unsafe_leader_keeps_lost_quorum: not with --leader_read_mode=lease" in (
        capsys.readouterr().err
    )
