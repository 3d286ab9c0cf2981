"""cli/tserver_args.py: the ``raftlet tserver`` command line -- aliases, help, and every bad
value or config as one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from raftlet.cli.tserver_args import (
    add_tserver_arguments,
    build_tserver_parser,
    parse_tserver_args,
    settings_from_args,
)
from raftlet.tserver.settings import FLAGS
from tests.unit.tserver_settings_helpers import CONFIG, write_config


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    return write_config(tmp_path)


def usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the parser expecting exit 2; return its stderr, which must be one line."""
    with pytest.raises(SystemExit) as exc:
        parse_tserver_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("raftlet tserver: error: ")
    return err.strip()


def test_server_id_dashed_alias(config_path: Path) -> None:
    s = parse_tserver_args(["--config", str(config_path), "--server-id", "ts3"])
    assert s.server_id == "ts3"


def test_abbreviations_are_not_accepted(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--rpc_num` would silently mean something else once another --rpc_num* flag exists.
    err = usage_error(
        capsys, ["--config", str(config_path), "--server_id", "ts1", "--rpc_num", "3"]
    )
    assert "unrecognized arguments: --rpc_num 3" in err


def test_flags_added_to_a_cli_subcommand(config_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="raftlet")
    sub = parser.add_subparsers(dest="command", required=True)
    add_tserver_arguments(sub.add_parser("tserver"))
    args = parser.parse_args(
        ["tserver", "--config", str(config_path), "--server-id", "ts2", "--max_batch_rows", "9"]
    )
    s = settings_from_args(parser, args)
    assert (s.server_id, s.max_batch_rows) == ("ts2", 9)


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_tserver_parser().parse_args(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for spec in FLAGS:
        assert f"--{spec.name}" in out
    assert "Settable at runtime" in out


# --- bad values: exit 2, one line naming the flag ------------------------------------------

BAD_FLAGS: list[tuple[list[str], str]] = [
    (["--rpc_service_queue_length", "0"],
     "argument --rpc_service_queue_length: must be >= 1, got 0"),
    (["--rpc_num_service_threads", "0"], "argument --rpc_num_service_threads: must be in 1..1024"),
    (["--rpc-num-service-threads", "100000"], "must be in 1..1024, got 100000"),
    (["--consensus_num_service_threads", "x"], "expected an integer, got 'x'"),
    (["--consensus_service_queue_length", "-5"], "must be >= 1, got -5"),
    (["--log_inject_latency_ms", "-1"],
     "argument --log_inject_latency_ms: must be in 0..10000, got -1.0"),
    (["--log_inject_latency_jitter_ms", "nan"], "expected a finite number, got 'nan'"),
    (["--group_commit_queue_size_bytes", "0"], "must be >= 1, got 0"),
    (["--group_commit_queue_size_bytes", "4MiB"], "expected an integer, got '4MiB'"),
    (["--log_segment_size_bytes", "-1"],
     "argument --log_segment_size_bytes: must be in 1..1073741824"),
    (["--lock_contention_trace_threshold_ms", "inf"], "expected a finite number, got 'inf'"),
    (["--max_message_bytes", "100"], "argument --max_message_bytes: must be in 1024..2147418111"),
    # 2 GiB - 1 less the 64 KiB peers accept beyond it (a gRPC limit is a C int).
    (["--max_message_bytes", str(2**31 - 2**16)], "must be in 1024..2147418111"),
    (["--max_batch_rows", "0"], "argument --max_batch_rows: must be >= 1, got 0"),
    (["--term_check_mode", "fast"], "expected one of lockfree, locked, got 'fast'"),
    (["--log_level", "loud"], "expected one of DEBUG, INFO, WARNING, ERROR, got 'loud'"),
    (["--tick_interval_ms", "0"], "argument --tick_interval_ms: must be in 1..60000, got 0.0"),
    (["--election_ticks", "1"], "argument --election_ticks: must be in 2..10000, got 1"),
    (["--heartbeat_ticks", "0"], "argument --heartbeat_ticks: must be in 1..9999, got 0"),
    (["--rpc_addr", "localhost"], "argument --rpc_addr: 'localhost' is not host:port"),
    (["--http_addr", "h:0"], "argument --http_addr: 'h:0': port must be a number in 1..65535"),
    (["--cpu_affinity", "x"], "--cpu_affinity: 'x' is not a CPU number or range (e.g. 0, 2-3)"),
    (["--cpu_affinity", "3-1"], "--cpu_affinity: '3-1' is not a CPU number or range"),
    # Cross-flag and flag-vs-config checks, after parsing.
    (["--heartbeat_ticks", "6"],
     "[raft] election_ticks: must be an integer greater than --heartbeat_ticks (6), got 6"),
    (["--election_ticks", "3", "--heartbeat_ticks", "3"],
     "--election_ticks: must be an integer greater than --heartbeat_ticks (3), got 3"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "message"), BAD_FLAGS, ids=[" ".join(b[0]) for b in BAD_FLAGS])
def test_bad_value_exits_2_with_one_line(
    config_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    err = usage_error(capsys, ["--config", str(config_path), "--server_id", "ts1", *extra])
    assert message in err
    assert err.endswith("(see --help)")


def test_unknown_server_id_lists_the_known_ones(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error(capsys, ["--config", str(config_path), "--server_id", "ts9"])
    assert "--server_id: unknown server id 'ts9' (known: ts1, ts2, ts3)" in err


def test_required_flags(config_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "required: --config" in usage_error(capsys, ["--server_id", "ts1"])
    assert "required: --server_id" in usage_error(capsys, ["--config", str(config_path)])


def test_bad_config_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(CONFIG.replace("replication_factor = 2", "replication_factor = 5"))
    err = usage_error(capsys, ["--config", str(path), "--server_id", "ts1"])
    assert f"{path}:27: tables[0].replication_factor: 5 is more than the 3 servers" in err
    err = usage_error(capsys, ["--config", str(tmp_path / "nope.toml"), "--server_id", "ts1"])
    assert "cannot read the cluster config" in err
