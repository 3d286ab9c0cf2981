"""The `raftlet` command without a cluster: argument handling, exit codes, one-line errors,
``--where`` parsing, the load generator's keys, metrics aggregation, the health verdict of a
cluster that is not running, and the launcher's refusal to signal processes not its own."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from raftlet.cli.common import human_count, human_us
from raftlet.cli.main import build_parser, main
from raftlet.cli.metrics_cmd import key_metrics
from raftlet.cli.scan_cmd import _columns_arg, _json_value, _text_value, parse_value, parse_where
from raftlet.cli.write_load import RowFactory
from raftlet.client.health import Severity, check_cluster
from raftlet.cluster import write_cluster_config
from raftlet.deploy.local import STATE_FILE, LocalCluster, new_config
from raftlet.schema.predicates import PredicateKind
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from tests.waiting import WAIT_S, wait_for


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("raftlet 0.")


def test_no_arguments_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "--version" in out
    for command in ("tserver", "cluster", "write", "scan", "metrics", "leader-step-down"):
        assert command in out


def test_unknown_argument_is_rejected() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sim"])
    assert exc.value.code == 2


def _commands(parser: argparse.ArgumentParser, path: list[str]) -> Iterator[list[str]]:
    """Every command and sub-command of ``parser``, as the words that name it."""
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if sub.prog.split()[-1] == name:  # an alias names the same parser again
                    yield from _commands(sub, [*path, name])


COMMANDS = [words for words in _commands(build_parser(), []) if words]


def test_every_command_is_found() -> None:
    assert ["cluster"] in COMMANDS
    assert ["cluster", "up"] in COMMANDS
    assert ["certs", "create"] in COMMANDS
    assert ["scan"] in COMMANDS


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_examples(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*words, "--help"])
    assert exc.value.code == 0
    assert "examples:" in capsys.readouterr().out


def test_the_top_help_names_every_exit_status_and_the_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "130 interrupted" in out
    assert "$RAFTLET_CLUSTER" in out
    assert "$RAFTLET_SERVERS" in out


def test_a_command_given_no_cluster_says_the_environment_names_one_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAFTLET_CLUSTER", raising=False)
    monkeypatch.delenv("RAFTLET_SERVERS", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(["scan", "kv"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--data-dir --cluster --servers is required" in err
    assert "$RAFTLET_CLUSTER or $RAFTLET_SERVERS" in err


def test_replace_server_help_says_what_the_replaced_server_does_when_started_again(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """It said a replaced server started with an empty data directory "makes its placement's
    replicas afresh, leftovers too"; it makes none of them since its peers tell it that
    their groups run without it (``tserver.empty_start``)."""
    import logging
    import re

    from raftlet.proto import tablet_pb2
    from raftlet.tserver.empty_start import read_peers

    with pytest.raises(SystemExit) as exc:
        main(["cluster", "replace-server", "--help"])
    assert exc.value.code == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "afresh" not in said
    assert "With an empty data directory it hosts nothing" in said
    assert "that replica opens FAILED and is repaired by a copy from the leader" in said
    # The log line it quotes is the server's: ts2 replaced, its group runs on ts1, ts3, ts4.
    quoted = re.search(r'its log: "([^"]+)"', said)
    assert quoted is not None, said
    peer = tablet_pb2.ListTabletsResponse(server_uuid="ts1")
    peer.tablets.add(tablet_id="kv-p0", voters=["ts1", "ts3", "ts4"])
    with caplog.at_level(logging.WARNING):
        view = read_peers("ts2", ["kv-p0"], [peer])
    assert view.without_me == {"kv-p0"}
    assert quoted.group(1) in caplog.text


# --- usage errors: exit 2, one line -------------------------------------------------------


@pytest.fixture(autouse=True)
def no_cluster_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAFTLET_CLUSTER", raising=False)
    monkeypatch.delenv("RAFTLET_SERVERS", raising=False)


USAGE_ERRORS = [
    # (argv, a fragment of the message)
    (["write", "--data-dir", "x"], "one of the arguments --rows --duration is required"),
    (["write", "--data-dir", "x", "--rows", "5", "--duration", "3"], "not allowed with"),
    (["write", "--data-dir", "x", "--rows", "0"], "must be at least 1"),
    (["write", "--data-dir", "x", "--rows", "ten"], "is not an integer"),
    (["write", "--rows", "5"], "one of the arguments --data-dir --cluster --servers"),
    (["write", "--rows", "5", "--data-dir", "a", "--servers", "h:1"], "not allowed with"),
    (["write", "--data-dir", "x", "--rows", "5", "--threads", "1000"], "at most 256"),
    (["write", "--data-dir", "x", "--rows", "5", "--flush-mode", "eager"], "invalid choice"),
    (
        ["write", "--data-dir", "x", "--rows", "5", "--threads", "2", "--in-flight", "8"],
        "--threads and --in-flight exclude each other for single-row writes",
    ),
    (
        [
            "write",
            "--data-dir",
            "x",
            "--rows",
            "5",
            "--in-flight",
            "8",
            "--batch-rows",
            "10",
            "--flush-mode",
            "sync",
        ],
        "--batch-rows needs --flush-mode background or manual",
    ),
    (["write", "--data-dir", "x", "--rows", "5", "--in-flight", "0"], "must be at least 1"),
    (["write", "--data-dir", "x", "--rows", "5", "--in-flight", "5000"], "at most 4096"),
    (
        ["write", "--data-dir", "x", "--rows", "5", "--in-flight", "8", "--flush-mode", "manual"],
        "use --flush-mode background (or just --batch-rows N) for batches in flight",
    ),
    (["scan", "kv", "--servers", "nohostport"], "is not host:port"),
    (["scan", "kv", "--servers", "http://127.0.0.1:7051"], "without a scheme"),
    (["scan", "kv", "--data-dir", "x", "--where", "key ~ 3"], "is not a condition"),
    (["scan", "kv", "--data-dir", "x", "--where", "key != 3"], "!= is not supported"),
    (["scan", "kv", "--data-dir", "x", "--where", "key = null"], "use 'key is-null'"),
    (["scan", "kv", "--data-dir", "x", "--limit", "-1"], "must be at least 1"),
    (["scan", "kv", "--data-dir", "x", "--min-index", "-1"], "must be in [0, 2**63)"),
    (["scan", "kv", "--data-dir", "x", "--min-index", "kv-p0=9223372036854775808"], "2**63"),
    (["scan", "kv", "--data-dir", "x", "--min-index", "x"], "expected TABLET=N"),
    (["scan", "kv", "--data-dir", "x", "--min-index", "=5"], "expected TABLET=N"),
    (["scan", "--data-dir", "x"], "the following arguments are required: TABLE"),
    (["cluster"], "the following arguments are required: ACTION"),
    (["cluster", "up", "--servers", "0"], "must be at least 1"),
    (["cluster", "up", "--term-check-mode", "sometimes"], "invalid choice"),
    (["cluster", "up", "--tserver-flag=--bogus=1"], "unrecognized arguments: --bogus=1"),
    (["cluster", "up", "--tserver-flag=--config=x.toml"], "the launcher sets --config itself"),
    # Chaos's own options, which its report names: as server flags they won unreported.
    (
        ["chaos", "--tserver-flag=--leader_read_mode=lease"],
        "set it with --leader-read-mode, which the report and the history name",
    ),
    (
        ["chaos", "--tserver-flag=--unsafe_ack_before_commit=true"],
        "set it with --unsafe early-ack",
    ),
    (["cluster", "up", "--cpu-affinity", "all"], "--cpu-affinity all: 'all' is not a CPU number"),
    (["cluster", "down"], "one of the arguments --data-dir --cluster is required"),
    (["metrics", "--data-dir", "x", "--format", "yaml"], "invalid choice"),
    (["leader-step-down", "--data-dir", "x"], "the following arguments are required: TABLET"),
    (["tserver"], "the following arguments are required"),
    (["certs", "create", "--dir", "x", "--servers", "ts1", "--days", "99999999"], "must be 1 to"),
    (["certs", "create", "--dir", "x", "--servers", "ts1", "--days", "0"], "must be 1 to"),
    (["certs", "create", "--dir", "x", "--servers", "../ts1"], "server id"),
    (["certs", "create", "--dir", "x", "--servers", "ts1,ts1"], "server ids repeat"),
    (["certs", "create", "--dir", "x", "--client", "d:reader", "--client", "d:admin"], "repeat"),
    # Every timeout flag: a positive number of seconds, at most a week (inf once overflowed
    # a clock with a traceback, nan waited forever).
    *[
        (
            [*command, "--timeout", value],
            "must be at most 604800 s" if value == "1e300" else "must be a positive number",
        )
        for command in (
            ["scan", "kv", "--data-dir", "x"],
            ["leader-step-down", "kv-p0", "--data-dir", "x"],
            ["metrics", "--data-dir", "x"],
            ["tablet", "add-replica", "kv-p0", "ts4", "--data-dir", "x"],
            ["cluster", "replace-server", "ts2", "--data-dir", "x"],
            ["cluster", "status", "--data-dir", "x"],
            ["write", "--data-dir", "x", "--rows", "5"],
        )
        for value in ("inf", "nan", "0", "-1", "1e300")
    ],
]


@pytest.mark.parametrize(
    ("argv", "fragment"), USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS]
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("raftlet")
    assert "error:" in lines[0]
    assert fragment in lines[0]
    assert "Traceback" not in captured.err


def test_the_environment_names_the_cluster_and_a_bad_value_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAFTLET_CLUSTER", str(tmp_path / "nope.toml"))
    assert main(["write", "--rows", "1"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"raftlet write: error: cluster config {tmp_path / 'nope.toml'} not found"
    monkeypatch.delenv("RAFTLET_CLUSTER")
    monkeypatch.setenv("RAFTLET_SERVERS", "nohostport")
    assert main(["write", "--rows", "1"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("raftlet write: error: $RAFTLET_SERVERS: ")
    assert "is not host:port" in line


def test_missing_cluster_is_an_operation_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Well-formed arguments naming a directory with no cluster: exit 1, one line.
    assert main(["write", "--data-dir", str(tmp_path), "--rows", "1"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("raftlet write: error: no cluster in")


def test_cli_as_a_process_usage_error(tmp_path: Path) -> None:
    # The real entry point, as a user runs it: status 2, one line, no traceback.
    proc = subprocess.run(
        [sys.executable, "-m", "raftlet", "scan", "kv", "--data-dir", "x", "--where", "k"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1, proc.stderr


# --- --where ---------------------------------------------------------------------------------

SCHEMA = Schema(
    [
        ColumnSchema("key", DataType.INT64, is_key=True),
        ColumnSchema("value", DataType.STRING, nullable=True),
        ColumnSchema("ratio", DataType.DOUBLE, nullable=True),
        ColumnSchema("flag", DataType.BOOL, nullable=True),
        ColumnSchema("blob", DataType.BINARY, nullable=True),
        ColumnSchema("ts", DataType.UNIXTIME_MICROS, nullable=True),
    ]
)


@pytest.mark.parametrize(
    ("text", "column", "op", "values"),
    [
        ("key = 5", "key", "=", ("5",)),
        ("key==5", "key", "=", ("5",)),
        ("key<100", "key", "<", ("100",)),
        (" key <= -3 ", "key", "<=", ("-3",)),
        ("key > 0x10", "key", ">", ("0x10",)),
        ("key >= 7", "key", ">=", ("7",)),
        ("value = 'a b, c'", "value", "=", ("'a b, c'",)),
        ("value = 'a\nb'", "value", "=", ("'a\nb'",)),  # as `in (...)` takes it
        ("key in (1, 2,3)", "key", "in", ("1", "2", "3")),
        ("value IN ('a,b', \"c\")", "value", "in", ("'a,b'", '"c"')),
        ("value is-null", "value", "is-null", ()),
        ("value is null", "value", "is-null", ()),
        ("value not-null", "value", "not-null", ()),
        ("value is not null", "value", "not-null", ()),
    ],
)
def test_parse_where(text: str, column: str, op: str, values: tuple[str, ...]) -> None:
    w = parse_where(text)
    assert (w.column, w.op, w.values) == (column, op, values)


@pytest.mark.parametrize(
    "text", ["key", "key 5", "= 5", "key <", "key in ()", "key in (1,,2)", "value in ('a)"]
)
def test_parse_where_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"\w"):
        parse_where(text)


def test_where_becomes_a_typed_predicate() -> None:
    p = parse_where("key >= 10").predicate(SCHEMA)
    assert (p.kind, p.lower, p.lower_inclusive, p.upper) == (PredicateKind.RANGE, 10, True, None)
    p = parse_where("key < 10").predicate(SCHEMA)
    assert (p.upper, p.upper_inclusive) == (10, False)
    p = parse_where("key <= 10").predicate(SCHEMA)
    assert (p.upper, p.upper_inclusive) == (10, True)
    p = parse_where("key in (3, 1)").predicate(SCHEMA)
    assert (p.kind, p.values) == (PredicateKind.IN_LIST, (3, 1))
    p = parse_where("value = 'x y'").predicate(SCHEMA)
    assert p.values == ("x y",)
    assert parse_where("value is null").predicate(SCHEMA).kind is PredicateKind.IS_NULL


def test_where_errors_name_the_clause() -> None:
    from raftlet.cli.common import UsageError

    with pytest.raises(UsageError, match=r"no column 'nope' \(columns: key, value"):
        parse_where("nope = 1").predicate(SCHEMA)
    with pytest.raises(UsageError, match="'abc' is not an integer"):
        parse_where("key = abc").predicate(SCHEMA)
    with pytest.raises(UsageError, match="out of range"):
        parse_where(f"key = {2**63}").predicate(SCHEMA)


def test_parse_value_by_type() -> None:
    assert parse_value(DataType.INT64, "1_000") == 1000
    assert parse_value(DataType.INT32, "-0x10") == -16
    assert parse_value(DataType.DOUBLE, "2.5") == 2.5
    assert parse_value(DataType.BOOL, "TRUE") is True
    assert parse_value(DataType.BOOL, "no") is False
    assert parse_value(DataType.STRING, '"quoted"') == "quoted"
    assert parse_value(DataType.STRING, "12") == "12"
    assert parse_value(DataType.BINARY, "0xff00") == b"\xff\x00"
    assert parse_value(DataType.BINARY, "abc") == b"abc"
    assert parse_value(DataType.UNIXTIME_MICROS, "1000000") == 1_000_000
    # No offset means UTC.
    assert parse_value(DataType.UNIXTIME_MICROS, "1970-01-01T00:00:01") == 1_000_000
    assert parse_value(DataType.UNIXTIME_MICROS, "1970-01-01T01:00:01+01:00") == 1_000_000
    for dtype, text in [
        (DataType.INT8, "300"),
        (DataType.DOUBLE, "nan"),
        (DataType.BOOL, "maybe"),
        (DataType.BINARY, "0xzz"),
        (DataType.UNIXTIME_MICROS, "yesterday"),
    ]:
        with pytest.raises(ValueError, match=r"\w"):
            parse_value(dtype, text)


def test_a_time_finer_than_a_microsecond_is_refused_not_cut() -> None:
    # fromisoformat drops the seventh digit on: .1234567 was stored as .123456.
    with pytest.raises(ValueError, match="finer than a microsecond"):
        parse_value(DataType.UNIXTIME_MICROS, "1970-01-01T00:00:01.1234567Z")
    assert parse_value(DataType.UNIXTIME_MICROS, "1970-01-01T00:00:01.1234560Z") == 1_123_456
    assert parse_value(DataType.UNIXTIME_MICROS, "1970-01-01 00:00:01,5") == 1_500_000
    with pytest.raises(ValueError, match="finer than a microsecond"):  # ISO's basic format
        parse_value(DataType.UNIXTIME_MICROS, "19700101T000001.9999999Z")


def test_an_integer_of_thousands_of_digits_is_out_of_range() -> None:
    # int() refuses text past 4,300 digits with a message about Python, not the column.
    with pytest.raises(ValueError, match=r"an integer of 5000 characters is out of range \(INT64"):
        parse_value(DataType.INT64, "7" * 5000)


NUMBERS = Schema(
    [
        ColumnSchema("i", DataType.INT64, is_key=True),
        ColumnSchema("f", DataType.FLOAT, nullable=True),
        ColumnSchema("d", DataType.DOUBLE, nullable=True),
        ColumnSchema("t", DataType.UNIXTIME_MICROS, nullable=True),
    ]
)


@pytest.mark.parametrize(
    ("where", "message"),
    [
        # Each was "'...' is not a number": normalize's reason was swallowed.
        ("d = NaN", r"--where 'd = NaN': NaN is not supported in DOUBLE"),
        ("f < 1e39", r"--where 'f < 1e39': 1e\+39 is out of range for FLOAT"),
        # Was silently inf.
        ("d = 1e400", r"'1e400' is out of range for DOUBLE .*write inf or -inf for infinity"),
        ("d > -1e400", r"'-1e400' is out of range for DOUBLE"),
        ("f = 1e400", r"out of range for FLOAT \(beyond \+-3.40282e\+38; write inf"),
        # Was Python's "invalid literal for int() with base 0".
        ("i = 010", r"'010': a decimal integer cannot start with 0 \(write 10, or 0x"),
        ("t >= -0_07", r"'-0_07': a decimal integer cannot start with 0 \(write -7,"),
        ("d = abc", r"'abc' is not a number \(DOUBLE column\)"),
    ],
)
def test_where_number_errors_say_the_real_reason(where: str, message: str) -> None:
    from raftlet.cli.common import UsageError

    with pytest.raises(UsageError, match=message):
        parse_where(where).predicate(NUMBERS)


def test_where_numbers_that_are_fine() -> None:
    assert parse_where("d = inf").predicate(NUMBERS).values == (math.inf,)
    assert parse_where("d < -Infinity").predicate(NUMBERS).upper == -math.inf
    assert parse_where("f = 0.5").predicate(NUMBERS).values == (0.5,)
    assert parse_where("f < 1e38").predicate(NUMBERS).upper == pytest.approx(1e38)
    assert parse_where("i in (0, 00, 0x10, 1_0)").predicate(NUMBERS).values == (0, 0, 16, 10)


def test_where_on_a_float_column_means_the_value_a_write_would_store() -> None:
    """As in Kudu, a FLOAT literal is the float32 a write of it stores: "f = 0.1" finds the
    row written as 0.1, and "f > 0.4999999999" is "f > 0.5"."""
    written = parse_value(DataType.FLOAT, "0.1")
    assert written != 0.1
    assert parse_where("f = 0.1").predicate(NUMBERS).values == (written,)
    p = parse_where("f > 0.4999999999").predicate(NUMBERS)
    assert (p.lower, p.lower_inclusive) == (0.5, False)


# --- the load generator's rows ------------------------------------------------------------------


def test_row_factory_keys_are_unique_per_thread_and_run() -> None:
    schema = Schema(
        [
            ColumnSchema("key", DataType.INT64, is_key=True),
            ColumnSchema("value", DataType.STRING, nullable=True),
        ]
    )
    a = RowFactory(schema, 50, run_id=1)
    b = RowFactory(schema, 50, run_id=2)
    keys = {a.row(t, n)["key"] for t in range(4) for n in range(100)}
    keys |= {b.row(t, n)["key"] for t in range(4) for n in range(100)}
    assert len(keys) == 800
    assert all(0 <= k < 2**63 for k in keys if isinstance(k, int))
    row = a.row(3, 7)
    assert isinstance(row["value"], str)
    assert len(row["value"]) == 50
    # The largest run id, thread and sequence still fit a positive INT64.
    assert RowFactory(schema, 0, run_id=2**22 - 1).key_of(255, 2**32 - 1) < 2**63


def test_scattered_keys_are_unique_and_land_all_over_each_writers_range() -> None:
    from raftlet.cli.common import UsageError

    schema = Schema([ColumnSchema("key", DataType.INT64, is_key=True)])
    rising = RowFactory(schema, 0, run_id=5)
    scattered = RowFactory(schema, 0, run_id=5, keys="scattered")
    for thread in (0, 255):
        keys = [scattered.key_of(thread, n) for n in range(20_000)]
        assert len(set(keys)) == len(keys)
        # The same range as the rising keys of that writer, spread across all of it.
        low, high = rising.key_of(thread, 0), rising.key_of(thread, 2**32 - 1)
        assert all(low <= k <= high for k in keys)
        span = high - low
        assert max(keys) - min(keys) > span * 0.99
        # Consecutive keys fall far apart: not one run of the rising order.
        gaps = sorted(abs(b - a) for a, b in itertools.pairwise(keys))
        assert gaps[len(gaps) // 2] > span // 100
    assert scattered.key_of(255, 2**32 - 1) < 2**63
    with pytest.raises(UsageError, match="rising, scattered"):
        RowFactory(schema, 0, keys="random")


def test_row_factory_needs_an_int64_key() -> None:
    from raftlet.cli.common import UsageError

    schema = Schema([ColumnSchema("name", DataType.STRING, is_key=True)])
    with pytest.raises(UsageError, match="one INT64 or UNIXTIME_MICROS column"):
        RowFactory(schema, 10)
    # Both are accepted, as the message says.
    for dtype in (DataType.INT64, DataType.UNIXTIME_MICROS):
        RowFactory(Schema([ColumnSchema("k", dtype, is_key=True)]), 10)


# --- metrics --------------------------------------------------------------------------------------


def _metrics_doc() -> list[dict[str, Any]]:
    def tablet(tid: str, role: int, lock_us: int, wait_p99: float) -> dict[str, Any]:
        return {
            "type": "tablet",
            "id": tid,
            "attributes": {"table": "kv"},
            "metrics": [
                {"name": "raft_role", "value": role},
                {"name": "tablet_failed", "value": int(role == 0)},
                {"name": "write_ops_total", "value": 10},
                {"name": "consensus_lock_contention_time_us", "value": lock_us},
                {
                    "name": "consensus_lock_wait_time_us",
                    "total_count": 4,
                    "mean": 5.0,
                    "percentile_99": wait_p99,
                },
                {"name": "term_checks_total", "labels": {"mode": "lockfree"}, "value": 7},
                {"name": "term_checks_total", "labels": {"mode": "locked"}, "value": 0},
            ],
        }

    server = {
        "type": "server",
        "id": "ts1",
        "attributes": {},
        "metrics": [
            {
                "name": "rpcs_queue_overflow",
                "labels": {"service": "tablet", "method": "Write"},
                "value": 3,
            },
            {
                "name": "rpcs_queue_overflow",
                "labels": {"service": "tablet", "method": "Scan"},
                "value": 1,
            },
            {
                "name": "rpcs_queue_overflow",
                "labels": {"service": "consensus", "method": "X"},
                "value": 9,
            },
            {
                "name": "rpc_incoming_queue_time_us",
                "labels": {"service": "tablet"},
                "total_count": 2,
                "mean": 150.0,
                "percentile_99": 900.0,
            },
            {"name": "write_memory_refusals_total", "value": 31},
            {"name": "write_memory_held_bytes", "value": 4096},
        ],
    }
    return [server, tablet("kv-p0", 3, 100, 40.0), tablet("kv-p1", 0, 50, 70.0)]


def test_key_metrics_aggregate_per_server() -> None:
    m = key_metrics(_metrics_doc())
    assert m["leaders"] == 1
    assert m["failed_replicas"] == 1  # a FAILED replica had no row: only /metrics said so
    assert m["write_ops"] == 20
    assert m["tablet_queue_overflows"] == 4  # summed over methods, tablet service only
    assert m["consensus_queue_overflows"] == 9
    # Writes refused for the server's memory limit show beside the queue's refusals.
    assert (m["write_memory_refusals"], m["write_memory_held"]) == (31, 4096)
    assert m["tablet_queue_time_mean"] == 150.0
    assert m["tablet_queue_time_p99"] == 900.0
    assert m["lock_contention_time"] == 150
    assert m["lock_contended_acquires"] == 8
    assert m["lock_wait_p99"] == 70.0  # the worst tablet
    assert (m["term_checks_lockfree"], m["term_checks_locked"]) == (14, 0)
    assert m["wal_fsync_p99"] is None  # never observed: shown as "-"


def test_a_client_command_does_not_load_the_servers_settings() -> None:
    """The server's flags come with the consensus driver and the log: ~0.1 s of CPU that
    every `raftlet row` or `scan` paid before it did anything. `tserver --help` keeps them."""
    code = (
        "import contextlib, io, sys\n"
        "from raftlet.cli.main import main\n"
        "for argv in (['row', '--help'], ['cluster', 'up', '--help'], ['--help']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        main(argv)\n"
        "print(sorted(m for m in ('raftlet.tserver.settings', 'raftlet.consensus.raft_consensus',"
        " 'raftlet.consensus.log') if m in sys.modules))\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "    main(['tserver', '--help'])\n"
        "print('--heartbeat_ticks' in out.getvalue())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "True"]


def test_metrics_show_uptime_and_cpu_time_and_the_youngest_server_for_the_cluster() -> None:
    """A restarted server's counters start from zero: its uptime says so (review r31a)."""
    from raftlet.cli.metrics_cmd import KEY_METRICS, _format, _totals
    from raftlet.metrics.catalogue import PROCESS_CPU_SECONDS, PROCESS_START_TIME_SECONDS
    from raftlet.metrics.export_json import generate_json
    from raftlet.metrics.registry import MetricRegistry

    registry = MetricRegistry()
    registry.entity("server", "ts1")

    def shown(started_ago: float, cpu: float) -> dict[str, float | None]:
        figures = (
            (PROCESS_CPU_SECONDS, cpu),
            (PROCESS_START_TIME_SECONDS, time.time() - started_ago),
        )
        return key_metrics(generate_json(registry, server_figures=figures))

    old, young = shown(7200, 95.5), shown(30, 1.25)
    assert 7199 <= (old["uptime"] or 0) < 7300
    assert old["cpu_time"] == 95.5
    assert _format("seconds", old["uptime"]).startswith("2h")
    total = _totals(list(KEY_METRICS), {"ts1": old, "ts2": young})
    assert 29 <= total["uptime"] < 130  # the youngest: the sums count from its start
    assert total["cpu_time"] == 96.75
    # A server too old to send the figures shows "-", not zero.
    none = key_metrics(generate_json(registry))
    assert (none["uptime"], none["cpu_time"]) == (None, None)
    assert _format("seconds", none["uptime"]) == "-"


def test_human_units() -> None:
    assert human_us(850) == "850 µs"
    assert human_us(12_345) == "12.3 ms"
    assert human_us(4_560_000) == "4.56 s"
    assert human_us(None) == "-"
    assert human_count(950) == "950"
    assert human_count(12_345) == "12.3k"
    assert human_count(4_560_000) == "4.56M"


# --- health and the launcher, without servers --------------------------------------------------


def test_health_of_a_cluster_that_is_not_running(tmp_path: Path) -> None:
    config = new_config(tmp_path, servers=3, tablets=2)
    health = check_cluster(config, processes={"ts1": False, "ts2": False, "ts3": False})
    assert health.severity is Severity.ERROR
    assert [s.state for s in health.servers] == ["DOWN"] * 3
    assert all(t.leader is None for t in health.tablets)
    assert health.summary().startswith("ERROR: 0/3 servers up, 0/2 tablets")
    assert any("process not running" in i for i in health.issues)
    json.dumps(health.to_json())  # serializable for --format json


def test_a_stopped_process_is_told_from_a_running_one() -> None:
    """`cluster status` says a server is stopped (SIGSTOP), not just "running but not
    answering" (review r32c)."""
    from raftlet.deploy.local import pid_alive, pid_stopped

    child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    try:
        wait_for(lambda: pid_alive(child.pid), WAIT_S, "the child to run")
        assert not pid_stopped(child.pid)
        os.kill(child.pid, signal.SIGSTOP)
        wait_for(lambda: pid_stopped(child.pid), WAIT_S, "the child stopped")
        assert pid_alive(child.pid)
        os.kill(child.pid, signal.SIGCONT)
        wait_for(lambda: not pid_stopped(child.pid), WAIT_S, "the child continued")
    finally:
        child.kill()
        child.wait(WAIT_S)
    assert not pid_stopped(child.pid)


def test_down_never_signals_a_process_that_is_not_ours(tmp_path: Path) -> None:
    # A state file whose PID now belongs to another program (PID reuse): left alone.
    config = write_cluster_config(
        new_config(tmp_path, servers=1, tablets=1), tmp_path / "cluster.toml"
    )
    # It waits for a signal: had it been sent one, it would exit at once.
    stranger = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    try:
        state = {
            "format": 1,
            "config": "cluster.toml",
            "servers": [
                {
                    "id": "ts1",
                    "pid": stranger.pid,
                    "rpc_addr": config.servers[0].rpc_addr,
                    "http_addr": config.servers[0].http_addr,
                    "log": "ts1.log",
                    "argv": [
                        "python",
                        "-m",
                        "raftlet",
                        "tserver",
                        "--config",
                        str(tmp_path / "cluster.toml"),
                        "--server_id",
                        "ts1",
                    ],
                }
            ],
        }
        (tmp_path / STATE_FILE).write_text(json.dumps(state))
        cluster = LocalCluster.load(tmp_path)
        assert cluster.running() == {"ts1": False}
        (stop,) = cluster.down(timeout=1.0)
        assert stop.outcome == "not ours"
        # Had it been signalled, it would exit at once: give it the chance, then check.
        with pytest.raises(subprocess.TimeoutExpired):
            stranger.wait(timeout=0.2)
        assert not (tmp_path / STATE_FILE).exists()
    finally:
        stranger.send_signal(signal.SIGKILL)
        stranger.wait(timeout=10)


# A server restarted by hand: it holds ts1's data directory's lock, its command line names
# tserver and ts1 but not the config as `up` passed it, and it ignores SIGTERM.
_HAND_RESTARTED = """
import fcntl, os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
print("ready", flush=True)
while True:
    signal.pause()  # SIGTERM is ignored; SIGKILL ends it
"""


def test_down_kills_a_server_restarted_by_hand_that_ignores_sigterm(tmp_path: Path) -> None:
    config = write_cluster_config(
        new_config(tmp_path, servers=1, tablets=1), tmp_path / "cluster.toml"
    )
    data_dir = config.servers[0].data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=10)  # the PID the state file recorded: that process is gone
    recorded = ["python", "-m", "raftlet", "tserver", "--config",
                str(tmp_path / "cluster.toml"), "--server_id", "ts1"]  # fmt: skip
    addrs = {"rpc_addr": config.servers[0].rpc_addr, "http_addr": config.servers[0].http_addr}
    server = {"id": "ts1", "pid": gone.pid, **addrs, "log": "ts1.log", "argv": recorded}
    state = {"format": 1, "config": "cluster.toml", "servers": [server]}
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    lock = str(data_dir / "server.lock")
    argv = [sys.executable, "-c", _HAND_RESTARTED, lock, "tserver", "--server_id", "ts1"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as by_hand:
        try:
            assert by_hand.stdout is not None
            assert by_hand.stdout.readline().strip() == "ready"
            cluster = LocalCluster.load(tmp_path)
            assert cluster.pids() == {"ts1": by_hand.pid}
            # SIGTERM is ignored; the SIGKILL after the timeout must reach it (it was
            # spared, and down then said it survived SIGKILL).
            (stop,) = cluster.down(timeout=0.5)
            assert (stop.pid, stop.outcome) == (by_hand.pid, "killed")
            assert by_hand.wait(timeout=10) == -signal.SIGKILL
            assert not (tmp_path / STATE_FILE).exists()
        finally:
            if by_hand.poll() is None:
                by_hand.kill()


def test_up_refuses_a_mismatched_existing_cluster(tmp_path: Path) -> None:
    from raftlet.deploy.local import LauncherError

    write_cluster_config(new_config(tmp_path, servers=3, tablets=4), tmp_path / "cluster.toml")
    with pytest.raises(LauncherError, match="already holds a cluster of 3 servers"):
        LocalCluster.create(tmp_path, servers=5)
    assert not (tmp_path / STATE_FILE).exists()
    assert os.listdir(tmp_path) == ["cluster.toml"]


def test_scan_output_is_safe_for_terminals_and_strict_json_parsers() -> None:
    # A stored escape sequence must not reach the terminal as one.
    assert _text_value(DataType.STRING, "a\x1b[31mb\nc\x9b") == "'a\\x1b[31mb\\x0ac\\x9b'"
    assert _text_value(DataType.STRING, "ünï 日本") == "ünï 日本"
    # Format characters and line separators: a reversed or split row.
    assert _text_value(DataType.STRING, "a\u202eb\u2028c\u200b") == "'a\\u202eb\\u2028c\\u200b'"
    # An escaped NUL in quotes: the four characters \x00 are printed as they are.
    assert _text_value(DataType.STRING, "\x00") == "'\\x00'"
    assert _text_value(DataType.STRING, "\\x00") == "\\x00"
    # In quotes a backslash is doubled: " \x00" (text) and " " + NUL differed in nothing.
    assert _text_value(DataType.STRING, " \\x00") == "' \\\\x00'"
    assert _text_value(DataType.STRING, " \x00") == "' \\x00'"
    # Empty and blank strings, which left a cell that looked empty.
    assert _text_value(DataType.STRING, "") == "''"
    assert _text_value(DataType.STRING, "  ") == "'  '"
    assert _text_value(DataType.STRING, " a") == "' a'"
    # NULL and the string 'NULL' printed the same line.
    assert _text_value(DataType.STRING, None) == "NULL"
    assert _text_value(DataType.STRING, "NULL") == "'NULL'"
    assert _text_value(DataType.STRING, "null") == "'null'"
    assert _text_value(DataType.STRING, "'NULL'") == "'''NULL'''"
    assert _text_value(DataType.STRING, "it's") == "it's"
    assert _text_value(DataType.STRING, "NULLS") == "NULLS"
    # What the table shows in quotes reads back, in --where or row, as the same string.
    # Backslashes too (review r28v: 'C:\\dir ' shown with its backslash doubled found no
    # row, as --where read the pair as two).
    # A double quote too (review r31b: '"q"' was printed bare, and read back as q).
    assert _text_value(DataType.STRING, '"q"') == "'\"q\"'"
    for text in ["'", "''", "'NULL'", "it's", "", "  ", "NULL", "C:\\dir ", " \\x00", "\\'"]:
        assert parse_value(DataType.STRING, _text_value(DataType.STRING, text)) == text
    for text in ['"q"', '"', '""', '"a b"']:
        assert parse_value(DataType.STRING, _text_value(DataType.STRING, text)) == text
    # A value of thousands of characters is echoed cut short.
    with pytest.raises(ValueError, match=r"^'x{60}\.\.\.\(5000 characters\)' is not an int"):
        parse_value(DataType.INT64, "x" * 5000)
    # JSON has no infinity: json.dumps wrote the bare word, which strict parsers refuse.
    values = [_json_value(DataType.DOUBLE, v) for v in (float("inf"), float("-inf"), 1.5)]
    assert json.loads(json.dumps(values, allow_nan=False)) == ["Infinity", "-Infinity", 1.5]
    with pytest.raises(argparse.ArgumentTypeError, match="column 'k' named twice"):
        _columns_arg("k, v,k")


def test_json_scan_that_fails_midway_never_parses_as_complete(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from raftlet.cli.scan_cmd import print_json_rows
    from raftlet.client import Timeout

    schema = Schema(
        [
            ColumnSchema("key", DataType.INT64, is_key=True),
            ColumnSchema("value", DataType.STRING, nullable=True),
        ]
    )

    def rows_then_failure() -> Iterator[dict[str, Any]]:
        yield {"key": 1, "value": "a"}
        yield {"key": 2, "value": "b"}
        raise Timeout("tablet kv-p1: no replica answered")

    with pytest.raises(Timeout):
        print_json_rows(rows_then_failure(), ["key", "value"], schema)
    partial = capsys.readouterr().out
    assert '"key": 2' in partial
    with pytest.raises(json.JSONDecodeError):
        json.loads(partial)

    print_json_rows(iter([{"key": 1, "value": "a"}]), ["key", "value"], schema)
    assert json.loads(capsys.readouterr().out) == [{"key": 1, "value": "a"}]
    print_json_rows(iter([]), ["key"], schema)
    assert json.loads(capsys.readouterr().out) == []


def test_the_table_format_prints_rows_as_they_come_aligned(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built as one rich table, a 300,000-row scan printed nothing for six minutes and held
    2.7 GB; now a thousand rows at a time (two here), columns only ever widening."""
    from raftlet.cli import scan_cmd

    monkeypatch.setattr(scan_cmd, "_TABLE_CHUNK_ROWS", 2)
    schema = Schema(
        [
            ColumnSchema("key", DataType.INT64, is_key=True),
            ColumnSchema("value", DataType.STRING, nullable=True),
        ]
    )
    printed_before: list[str] = []

    def rows() -> Iterator[dict[str, Any]]:
        yield {"key": 1, "value": "中文"}
        yield {"key": 22, "value": None}
        printed_before.append(capsys.readouterr().out)  # the first two are out already
        yield {"key": 333, "value": "[red]x"}

    scan_cmd._print_table(rows(), ["key", "value"], schema, "kv")
    assert printed_before == ["key  value\n  1  中文\n 22  NULL\n"]
    assert capsys.readouterr().out == "333  [red]x\n(3 rows from kv)\n"


def test_metrics_server_takes_the_status_url_cluster_status_prints() -> None:
    from raftlet.cli.metrics_cmd import _server_arg

    assert _server_arg("http://127.0.0.1:57261/") == "127.0.0.1:57261"
    assert _server_arg("https://127.0.0.1:57261/metrics.json") == "127.0.0.1:57261"
    assert _server_arg(" ts2 ") == "ts2"
    assert _server_arg("127.0.0.1:7051") == "127.0.0.1:7051"
    for empty in ("", " ", "http://", "/"):
        with pytest.raises(argparse.ArgumentTypeError, match="names no server"):
            _server_arg(empty)


def test_a_tls_cluster_directory_lends_its_ca_to_your_own_certificate_or_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raftlet.cli.common import UsageError, credentials_from_args

    for env in ("RAFTLET_TLS_CA", "RAFTLET_TLS_CERT", "RAFTLET_TLS_KEY", "RAFTLET_TOKEN"):
        monkeypatch.delenv(env, raising=False)
    tls = tmp_path / "tls"
    tls.mkdir()
    for name in ("ca.crt", "client-admin.crt", "client-admin.key"):
        (tls / name).write_text("pem")

    def creds(**given: str | None) -> tuple[str | None, ...]:
        args = argparse.Namespace(tls_ca=None, tls_cert=None, tls_key=None, token=None)
        vars(args).update(given)
        c = credentials_from_args(args, tmp_path)
        return (c.ca, c.cert, c.key, c.token)

    ca, admin = str(tls / "ca.crt"), str(tls / "client-admin.crt")
    mine, my_key = tmp_path / "me.crt", tmp_path / "me.key"
    mine.write_text("pem")
    my_key.write_text("pem")
    assert creds() == (ca, admin, str(tls / "client-admin.key"), None)
    assert creds(tls_cert=str(mine), tls_key=str(my_key)) == (ca, str(mine), str(my_key), None)
    assert creds(token="t0k") == (ca, None, None, "t0k")
    with pytest.raises(UsageError, match="--tls-cert needs --tls-ca or"):
        credentials_from_args(
            argparse.Namespace(tls_ca=None, tls_cert=str(mine), tls_key=str(my_key), token=None),
            None,
        )
    # Each refusal names where the value came from: a flag, or a variable never typed.
    monkeypatch.setenv("RAFTLET_TOKEN", "t0k")
    with pytest.raises(UsageError, match=r"\$RAFTLET_TOKEN needs --tls-ca or \$RAFTLET_TLS_CA"):
        credentials_from_args(argparse.Namespace(tls_ca=None, tls_cert=None, tls_key=None), None)
    monkeypatch.setenv("RAFTLET_TLS_CA", "/nonexist/ca.crt")
    with pytest.raises(UsageError, match=r"\$RAFTLET_TLS_CA /nonexist/ca.crt: no such file"):
        credentials_from_args(argparse.Namespace(tls_ca=None), tmp_path)
    with pytest.raises(UsageError, match=r"--tls-ca /elsewhere\.crt: no such file"):
        credentials_from_args(argparse.Namespace(tls_ca="/elsewhere.crt"), tmp_path)
    with pytest.raises(UsageError, match="is a directory, not a PEM file"):
        credentials_from_args(argparse.Namespace(tls_ca=str(tmp_path)), tmp_path)
    # `--tls-ca <(cat ca.crt)`: a pipe is a file to read.
    pipe = tmp_path / "ca.fifo"
    os.mkfifo(pipe)
    monkeypatch.delenv("RAFTLET_TOKEN")
    got = credentials_from_args(argparse.Namespace(tls_ca=str(pipe)), tmp_path)
    assert got.ca == str(pipe)


def test_a_where_error_quotes_a_long_clause_cut_short() -> None:
    from raftlet.cli.common import UsageError

    schema = Schema([ColumnSchema("key", DataType.INT64, is_key=True)])
    clause = parse_where("key in (" + ",".join(map(str, range(10_001))) + ")")
    with pytest.raises(UsageError) as caught:
        clause.predicate(schema)
    message = str(caught.value)
    assert "IN list of 10001 values (at most 10000)" in message
    assert len(message) < 200, message


def test_completion_into_a_closed_pipe_is_no_error() -> None:
    """`raftlet completion bash | true`: a BrokenPipeError traceback and exit 1 before."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before anything is written
    try:
        done = subprocess.run(
            [sys.executable, "-m", "raftlet", "completion", "bash"],
            stdout=write_end, stderr=subprocess.PIPE, timeout=60, check=False,
            cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr


def test_remove_data_keeps_a_directory_a_server_runs_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server started by hand (a relative --config, or an older build's launcher state)
    that `down` did not stop: --remove-data deleted the directory under it."""
    import fcntl

    from raftlet.deploy.local import MADE_BY_UP_FILE

    config = write_cluster_config(
        new_config(tmp_path, servers=1, tablets=1), tmp_path / "cluster.toml"
    )
    (tmp_path / MADE_BY_UP_FILE).write_text("")
    data_dir = config.servers[0].data_dir
    data_dir.mkdir(parents=True)
    fd = os.open(data_dir / "server.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running server holds it
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        code = main(["cluster", "down", "--data-dir", str(tmp_path), "--remove-data"])
        assert code == 1
        assert f"pid {os.getpid()} runs server ts1" in capsys.readouterr().err
        assert data_dir.is_dir()
    finally:
        os.close(fd)
    assert main(["cluster", "down", "--data-dir", str(tmp_path), "--remove-data"]) == 0
    assert not tmp_path.exists()


class _SocketClosed(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:x: Socket closed"


@pytest.mark.parametrize(
    ("creds", "hint"),
    [
        ({}, "a TLS cluster? give --tls-ca"),
        ({"ca": "ca.crt"}, "ask for a client certificate (mutual TLS): give --tls-cert"),
        ({"ca": "ca.crt", "cert": "c.crt", "key": "c.key"}, None),
    ],
)
def test_a_connection_closed_at_once_hints_at_what_tls_needs(
    monkeypatch: pytest.MonkeyPatch, creds: dict[str, str], hint: str | None
) -> None:
    """A TLS port closes a plaintext connection at once, and gRPC says only "Socket
    closed": the operator was not told to give --tls-ca."""
    from raftlet.cli.common import CliError, Credentials, fetch_config
    from raftlet.client import channels

    class Pool:
        def __init__(self, *_a: Any, **_k: Any) -> None:
            pass

        def stub(self, _addr: str) -> Any:
            def refused(_timeout: float) -> Any:
                raise _SocketClosed()

            return SimpleNamespace(get_cluster_config=refused)

        def close(self) -> None:
            pass

    monkeypatch.setattr(channels, "ChannelPool", Pool)
    monkeypatch.setattr(Credentials, "channel_credentials", lambda _self: None)
    with pytest.raises(CliError) as caught:
        fetch_config(["127.0.0.1:1", "127.0.0.1:2"], 1.0, Credentials(**creds))
    said = str(caught.value)
    if hint is None:  # a client with everything TLS asks for: a hint would mislead
        assert said.endswith("Socket closed)")
    else:
        assert hint in said


def test_an_interrupted_command_does_not_wait_for_good_on_its_clients_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gRPC's channel close after a Ctrl-C that cut a call short can wait for good:
    `replace-server` hung after "interrupted" until SIGKILL."""
    import threading

    from raftlet.cli import common

    monkeypatch.setattr(common, "_CLOSE_AFTER_INTERRUPT_S", 0.05)
    stuck = threading.Event()
    closes: list[str] = []

    class Client:
        def close(self) -> None:
            closes.append(threading.current_thread().name)
            stuck.wait()  # never set while the test waits: a close that hangs

    def interrupted_command() -> None:
        try:
            raise KeyboardInterrupt
        finally:
            common.close_client(Client())

    with pytest.raises(KeyboardInterrupt):
        interrupted_command()
    assert closes == ["close-after-interrupt"]
    stuck.set()  # let the abandoned close end

    class Quick:
        def close(self) -> None:
            closes.append(threading.current_thread().name)

    common.close_client(Quick())  # no interrupt: closed here, and waited for
    assert closes[-1] == threading.current_thread().name


def test_a_where_range_beyond_a_columns_type_matches_all_or_none() -> None:
    """Review r31b: `--where "i8 < 1000"` exited 2 (out of range for INT8)."""
    every = parse_where(f"key < {2**70}").predicate(SCHEMA)
    assert (every.upper, every.upper_inclusive) == (2**63 - 1, True)
    none = parse_where(f"key >= {2**64}").predicate(SCHEMA)
    assert (none.lower, none.lower_inclusive) == (2**63 - 1, False)
