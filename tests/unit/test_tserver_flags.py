"""The `raftlet tserver` flags: defaults, overrides, one-line errors, the runtime registry."""

from __future__ import annotations

import argparse
import dataclasses
import threading
from pathlib import Path

import pytest

from raftlet.cluster import ClusterConfig, RaftTimings, load_cluster_config
from raftlet.consensus.log.options import LogOptions
from raftlet.consensus.raft_consensus import TermCheckMode
from raftlet.tserver.flags import (
    FLAGS,
    FlagError,
    FlagRegistry,
    ServerSettings,
    add_tserver_arguments,
    build_tserver_parser,
    parse_tserver_args,
    render_flag_value,
    settings_from_args,
)

MiB = 1 << 20

CONFIG = """\
[cluster]
name = "flags"

[raft]
tick_interval_ms = 50
election_ticks = 6

[[servers]]
id = "ts1"
rpc_addr = "127.0.0.1:7051"
http_addr = "127.0.0.1:8051"

[[servers]]
id = "ts2"
rpc_addr = "127.0.0.1:7052"
http_addr = "127.0.0.1:8052"
data_dir = "disks/two"

[[servers]]
id = "ts3"
rpc_addr = "127.0.0.1:7053"
http_addr = "127.0.0.1:8053"

[[tables]]
name = "kv"
partitions = 3
replication_factor = 2
columns = [{ name = "k", type = "INT64", key = true }]
"""


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(CONFIG)
    return path


def parse(config_path: Path, *extra: str, server: str = "ts1") -> ServerSettings:
    return parse_tserver_args(["--config", str(config_path), "--server_id", server, *extra])


def usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the parser expecting exit 2; return its stderr, which must be one line."""
    with pytest.raises(SystemExit) as exc:
        parse_tserver_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("raftlet tserver: error: ")
    return err.strip()


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
    (["--rpc_addr", "0.0.0.0:9000"], "rpc_addr", "0.0.0.0:9000"),
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
]


@pytest.mark.parametrize(("argv", "name", "value"), OVERRIDES, ids=[o[0][0] for o in OVERRIDES])
def test_override(config_path: Path, argv: list[str], name: str, value: object) -> None:
    assert getattr(parse(config_path, *argv), name) == value


def test_server_id_dashed_alias(config_path: Path) -> None:
    s = parse_tserver_args(["--config", str(config_path), "--server-id", "ts3"])
    assert s.server_id == "ts3"


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
    (["--log_inject_latency_ms", "-1"], "argument --log_inject_latency_ms: must be >= 0, got -1.0"),
    (["--log_inject_latency_jitter_ms", "nan"], "expected a finite number, got 'nan'"),
    (["--group_commit_queue_size_bytes", "0"], "must be >= 1, got 0"),
    (["--group_commit_queue_size_bytes", "4MiB"], "expected an integer, got '4MiB'"),
    (["--log_segment_size_bytes", "-1"], "argument --log_segment_size_bytes: must be >= 1"),
    (["--lock_contention_trace_threshold_ms", "inf"], "expected a finite number, got 'inf'"),
    (["--max_message_bytes", "100"], "argument --max_message_bytes: must be in 1024..2147483647"),
    (["--max_message_bytes", str(2**31)], "must be in 1024..2147483647"),
    (["--max_batch_rows", "0"], "argument --max_batch_rows: must be >= 1, got 0"),
    (["--term_check_mode", "fast"], "expected one of lockfree, locked, got 'fast'"),
    (["--log_level", "loud"], "expected one of DEBUG, INFO, WARNING, ERROR, got 'loud'"),
    (["--tick_interval_ms", "0"], "argument --tick_interval_ms: must be > 0, got 0.0"),
    (["--election_ticks", "1"], "argument --election_ticks: must be >= 2, got 1"),
    (["--heartbeat_ticks", "0"], "argument --heartbeat_ticks: must be >= 1, got 0"),
    (["--rpc_addr", "localhost"], "argument --rpc_addr: 'localhost' is not host:port"),
    (["--http_addr", "h:0"], "argument --http_addr: 'h:0': port must be a number in 1..65535"),
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


# --- the runtime registry ------------------------------------------------------------------

RUNTIME = ["lock_contention_trace_threshold_ms", "log_inject_latency_jitter_ms",
           "log_inject_latency_ms"]  # fmt: skip


@pytest.fixture
def registry(config_path: Path) -> FlagRegistry:
    return FlagRegistry.from_settings(parse(config_path, "--log_inject_latency_ms", "2"))


def test_registry_lists_every_flag_as_on_the_command_line(
    registry: FlagRegistry, config_path: Path
) -> None:
    flags = registry.render()
    assert set(flags) == {spec.name for spec in FLAGS}
    assert flags["log_inject_latency_ms"] == "2"
    assert flags["group_commit_queue_size_bytes"] == str(4 * MiB)
    assert flags["term_check_mode"] == "lockfree"
    assert flags["config"] == str(config_path)
    assert flags["tick_interval_ms"] == "50"
    assert registry.render(["max_batch_rows", "--log-level"]) == {
        "max_batch_rows": "10000",
        "log_level": "INFO",
    }
    assert registry.runtime_names() == RUNTIME
    assert registry.get("term_check_mode") is TermCheckMode.LOCKFREE


def test_set_returns_the_old_value_which_restores_it(registry: FlagRegistry) -> None:
    old = registry.set("log_inject_latency_ms", "25.5")
    assert old == "2"
    assert registry.get("log_inject_latency_ms") == 25.5
    assert registry.render(["log_inject_latency_ms"]) == {"log_inject_latency_ms": "25.5"}
    assert registry.set("log_inject_latency_ms", old) == "25.5"
    assert registry.get("log_inject_latency_ms") == 2.0
    # The names a user might type work too.
    registry.set("--lock-contention-trace-threshold-ms", "0")
    assert registry.get("lock_contention_trace_threshold_ms") == 0.0


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("log_inject_latency_ms", "-1", "flag 'log_inject_latency_ms': must be >= 0, got -1.0"),
        ("log_inject_latency_ms", "slow", "expected a number, got 'slow'"),
        ("log_inject_latency_jitter_ms", "nan", "expected a finite number"),
        ("lock_contention_trace_threshold_ms", "", "expected a number, got ''"),
        ("log_inject_latency", "1", "unknown flag 'log_inject_latency'; did you mean "
         "'log_inject_latency_ms'?"),
        ("no_such_flag", "1", "unknown flag 'no_such_flag'"),
        ("max_batch_rows", "5", "flag 'max_batch_rows' cannot be changed at runtime (restart "
         "the server with --max_batch_rows=...; settable at runtime: "
         "lock_contention_trace_threshold_ms, log_inject_latency_jitter_ms, "
         "log_inject_latency_ms)"),
        ("term_check_mode", "locked", "cannot be changed at runtime"),
    ],
)  # fmt: skip
def test_set_rejects_and_changes_nothing(
    registry: FlagRegistry, name: str, value: str, message: str
) -> None:
    before = registry.render()
    seen: list[object] = []
    for runtime in RUNTIME:
        registry.subscribe(runtime, seen.append)
    with pytest.raises(FlagError) as exc:
        registry.set(name, value)
    assert message in str(exc.value)
    assert registry.render() == before
    assert seen == []


def test_get_and_render_of_unknown_flags(registry: FlagRegistry) -> None:
    with pytest.raises(FlagError, match="unknown flag 'nope'"):
        registry.get("nope")
    with pytest.raises(FlagError, match="unknown flag 'nope'"):
        registry.render(["max_batch_rows", "nope"])
    with pytest.raises(FlagError, match="already defined"):
        registry.define("max_batch_rows", 1)


def test_listeners_see_each_change_and_can_unsubscribe(registry: FlagRegistry) -> None:
    a: list[float] = []
    b: list[float] = []
    unsubscribe_a = registry.subscribe("log_inject_latency_ms", a.append)
    registry.subscribe("log_inject_latency_ms", b.append)
    # A listener may read the registry: it sees the new value, and nothing deadlocks.
    reads: list[float] = []
    registry.subscribe("log_inject_latency_ms", lambda _: reads.append(registry.get(
        "log_inject_latency_ms")))  # fmt: skip
    registry.set("log_inject_latency_ms", "5")
    unsubscribe_a()
    unsubscribe_a()  # idempotent
    registry.set("log_inject_latency_ms", "7")
    assert a == [5.0]
    assert b == [5.0, 7.0]
    assert reads == [5.0, 7.0]
    # Listeners of one flag are not called for another.
    registry.set("log_inject_latency_jitter_ms", "1")
    assert b == [5.0, 7.0]


def test_a_failing_listener_does_not_stop_the_others(
    registry: FlagRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    after: list[float] = []

    def broken(value: float) -> None:
        raise RuntimeError("log is closed")

    registry.subscribe("log_inject_latency_ms", broken)
    registry.subscribe("log_inject_latency_ms", after.append)
    with pytest.raises(RuntimeError, match="log is closed"):
        registry.set("log_inject_latency_ms", "9")
    assert after == [9.0]
    assert registry.get("log_inject_latency_ms") == 9.0  # what is in force for the others
    assert "listener of flag log_inject_latency_ms failed" in caplog.text


def test_concurrent_sets_are_serialized_with_their_listeners(registry: FlagRegistry) -> None:
    seen: list[float] = []
    registry.subscribe("log_inject_latency_ms", seen.append)
    threads = [
        threading.Thread(
            target=lambda t=t: [
                registry.set("log_inject_latency_ms", str(t * 1000 + i)) for i in range(200)
            ]
        )
        for t in range(8)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(seen) == 8 * 200
    assert len(set(seen)) == 8 * 200
    # Listeners ran in the order the values were stored: the last one seen is in force.
    assert registry.get("log_inject_latency_ms") == seen[-1]
    for t in range(8):  # and each thread's own sets in its order
        mine = [v for v in seen if t * 1000 <= v < t * 1000 + 200]
        assert mine == sorted(mine)


def test_render_flag_value() -> None:
    assert render_flag_value(100.0) == "100"
    assert render_flag_value(0.25) == "0.25"
    assert render_flag_value(1e20) == "1e+20"
    assert render_flag_value(TermCheckMode.LOCKED) == "locked"
    assert render_flag_value(Path("/x")) == "/x"
    assert render_flag_value(None) == ""
    assert render_flag_value(7) == "7"
