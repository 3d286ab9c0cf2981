"""`raftlet row insert|upsert|update|delete` against a real one-server cluster, as processes.

One cluster for the module, from a hand-written config with two tables: ``kv`` and
``typed`` (a two-column key and a column of every type), so a scan's JSON output can be
written back and compared value for value.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlet.client import Client
from raftlet.deploy.local import LocalCluster, NoClusterError
from raftlet.schema.predicates import Predicate
from tests.integration.cli_run import REPO, ok, raftlet, rpc_addresses
from tests.integration.tserver_cluster import free_ports, wait_for

pytestmark = pytest.mark.integration

_TYPED_COLUMNS = """\
columns = [
  { name = "id", type = "INT64", key = true },
  { name = "name", type = "STRING", key = true },
  { name = "small", type = "INT8", nullable = true },
  { name = "ratio", type = "FLOAT", nullable = true },
  { name = "score", type = "DOUBLE", nullable = true },
  { name = "ok", type = "BOOL", nullable = true },
  { name = "blob", type = "BINARY", nullable = true },
  { name = "at", type = "UNIXTIME_MICROS", nullable = true },
]
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("rows")
    rpc, http = free_ports(2)
    (root / "cluster.toml").write_text(
        f'[cluster]\nname = "rows"\n\n[[servers]]\nid = "ts1"\nrpc_addr = "127.0.0.1:{rpc}"\n'
        f'http_addr = "127.0.0.1:{http}"\n\n'
        '[[tables]]\nname = "kv"\npartitions = 2\nreplication_factor = 1\n'
        'columns = [{ name = "key", type = "INT64", key = true },'
        ' { name = "value", type = "STRING", nullable = true }]\n\n'
        '[[tables]]\nname = "typed"\npartitions = 3\nreplication_factor = 1\n' + _TYPED_COLUMNS
    )
    ok(raftlet("cluster", "up", "--data-dir", str(root)))
    try:
        yield root
    finally:
        with contextlib.suppress(NoClusterError):
            LocalCluster.load(root).down(timeout=10)


def row(cluster: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return raftlet("row", *args, "--data-dir", str(cluster), stdin=stdin)


def scan(cluster: Path, table: str, *args: str) -> list[dict[str, Any]]:
    out = ok(raftlet("scan", table, "--data-dir", str(cluster), "--format", "json", *args))
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def test_one_row_inserted_updated_and_deleted_with_what_each_step_says(cluster: Path) -> None:
    out = ok(row(cluster, "insert", "kv", "key=1", "value=hello world"))
    assert out.startswith("inserted 1 row in kv (tablet kv-p")
    assert scan(cluster, "kv", "--where", "key = 1") == [{"key": 1, "value": "hello world"}]

    again = row(cluster, "insert", "kv", "key=1", "value=x")
    assert again.returncode == 1
    assert "raftlet row insert: error: KEY_EXISTS: key (1,) already present" in again.stderr

    ok(row(cluster, "update", "kv", "key=1", "value=null"))
    assert scan(cluster, "kv", "--where", "key = 1") == [{"key": 1, "value": None}]
    ok(row(cluster, "upsert", "kv", "key=1", "value='null'"))
    assert scan(cluster, "kv", "--where", "key = 1") == [{"key": 1, "value": "null"}]

    missing = row(cluster, "update", "kv", "key=2", "value=x")
    assert missing.returncode == 1
    assert "KEY_NOT_FOUND" in missing.stderr
    assert ok(row(cluster, "delete", "kv", "key=1")).startswith("deleted 1 row in kv")
    assert scan(cluster, "kv", "--where", "key = 1") == []
    assert row(cluster, "delete", "kv", "key=1").returncode == 1


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["insert", "kv", "value=x"], "give the key: key=..."),
        (["delete", "kv", "key=1", "value=x"], "a delete gives the key columns only"),
        (["update", "kv", "key=1"], "an update gives a column to change besides the key"),
        (["upsert", "kv", "kye=1"], "no column 'kye' (columns: key, value)"),
        (["upsert", "kv", "key=x1"], "'x1' is not an integer (INT64 column)"),
        (["upsert", "nope", "key=1"], "no table 'nope' (tables: kv, typed)"),
        (["upsert", "kv", "key=1", "--json", "-"], "COLUMN=VALUE arguments or --json FILE"),
    ],
)
def test_arguments_that_cannot_make_the_row_are_usage_errors(
    cluster: Path, args: list[str], said: str
) -> None:
    proc = row(cluster, *args)
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr


def test_a_writes_log_index_lets_a_follower_read_see_it(cluster: Path) -> None:
    doc = json.loads(ok(row(cluster, "upsert", "kv", "key=7", "value=seven", "--format", "json")))
    assert (doc["written"], doc["failed"]) == (1, 0)
    assert doc["op_index"] > 0
    seen = scan(
        cluster, "kv", "--follower-reads", "--where", "key = 7",
        "--min-index", f"{doc['tablet_id']}={doc['op_index']}",
    )  # fmt: skip
    assert seen == [{"key": 7, "value": "seven"}]


def _typed_rows() -> list[dict[str, Any]]:
    return [
        {"id": -(2**63), "name": "", "small": -128, "ratio": math.inf, "score": -math.inf,
         "ok": True, "blob": b"\x00\xff\x80", "at": -(2**63)},
        {"id": 2**63 - 1, "name": "é\u202e\x1b[31m\n", "small": 127, "ratio": 0.1,
         "score": 1e308, "ok": False, "blob": b"", "at": 2**63 - 1},
        {"id": 0, "name": "null", "small": None, "ratio": None, "score": None, "ok": None,
         "blob": None, "at": None},
        {"id": 0, "name": "0", "small": 0, "ratio": -0.0, "score": 5e-324, "ok": True,
         "blob": bytes(range(256)), "at": 0},
    ]  # fmt: skip


def test_a_tables_rows_go_out_as_scan_json_and_back_in_unchanged(
    cluster: Path, tmp_path: Path
) -> None:
    with Client(rpc_addresses(cluster)) as client, client.new_session() as session:
        for r in _typed_rows():
            session.insert("typed", r)
    exported = ok(raftlet("scan", "typed", "--data-dir", str(cluster), "--format", "json"))
    before = json.loads(exported)
    assert len(before) == 4
    dump = tmp_path / "typed.json"
    dump.write_text(exported)

    assert ok(row(cluster, "delete", "typed", "--json", str(dump))).startswith(
        "deleted 4 rows in typed"
    )
    assert scan(cluster, "typed") == []
    ok(row(cluster, "insert", "typed", "--json", str(dump)))
    assert scan(cluster, "typed") == before
    # Once more from stdin, as JSON lines: every key is there already.
    lines = "".join(json.dumps(r) + "\n" for r in before)
    doc = json.loads(ok_or_1(row(cluster, "insert", "typed", "--json", "-", "--format", "json",
                                 stdin=lines)))  # fmt: skip
    assert (doc["rows"], doc["written"], doc["failed"]) == (4, 0, 4)
    assert doc["errors_by_code"] == {"KEY_EXISTS": 4}
    assert [e["line"] for e in doc["first_errors"]] == [1, 2, 3, 4]


def ok_or_1(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_a_file_goes_on_past_refused_rows_and_stops_at_one_it_cannot_read(
    cluster: Path, tmp_path: Path
) -> None:
    ok(row(cluster, "upsert", "kv", "key=102", "value=there before"))
    text = (
        '[\n{"key": 100, "value": "a"},\n{"key": 101},\n'
        '{"key": 102, "value": "b"},\n{"key": 103, "value": "c"},\n'
        '{"key": 104, "value": 5},\n{"key": 105, "value": "after"}\n]\n'
    )
    path = tmp_path / "rows.json"
    path.write_text(text)
    proc = row(cluster, "insert", "kv", "--json", str(path))
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("inserted 3 of 4 rows in kv")
    assert "  row 3 (line 4): KEY_EXISTS: key (102,) already present" in proc.stdout
    assert (
        "stopped: row 5 (line 6): column 'value': STRING needs a str, got int; no row after "
        "row 4 (line 5) was sent" in proc.stdout
    )
    # A compact array is one line: its rows are told apart by their numbers.
    compact = '[{"key": 110, "value": "a"}, {"key": 102}, {"key": 111, "x": 1}]'
    proc = row(cluster, "insert", "kv", "--json", "-", stdin=compact)
    assert proc.returncode == 1, proc.stderr
    assert "  row 2 (line 1): KEY_EXISTS: key (102,) already present" in proc.stdout
    assert "stopped: row 3 (line 1): no column 'x'" in proc.stdout
    assert "no row after row 2 (line 1) was sent" in proc.stdout
    got = scan(cluster, "kv", "--where", "key >= 100", "--where", "key <= 105")
    assert got == [
        {"key": 100, "value": "a"},
        {"key": 101, "value": None},
        {"key": 102, "value": "there before"},
        {"key": 103, "value": "c"},
    ]
    assert scan(cluster, "kv", "--where", "key >= 110", "--where", "key <= 111") == [
        {"key": 110, "value": "a"}
    ]


def test_a_file_that_is_not_there_is_one_line(cluster: Path, tmp_path: Path) -> None:
    proc = row(cluster, "upsert", "kv", "--json", str(tmp_path / "missing.json"))
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"raftlet row upsert: error: --json {tmp_path / 'missing.json'}: No such file or directory"
    )


def test_an_interrupt_stops_a_file_between_rows_and_says_how_far_it_got(cluster: Path) -> None:
    """SIGTERM (or Ctrl-C) used to stop the file wherever the row it was writing stood:
    the summary then counted a row that was never sent."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTLET_CLUSTER", "RAFTLET_SERVERS")}
    with subprocess.Popen(
        [sys.executable, "-m", "raftlet", "row", "insert", "kv", "--json", "-",
         "--data-dir", str(cluster)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=REPO, env={**env, "NO_COLOR": "1"},
    ) as proc:  # fmt: skip
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        try:
            proc.stdin.write("".join(f'{{"key": {1000 + i}}}\n' for i in range(500)))
            proc.stdin.flush()
            written = [Predicate.range("key", lower=1000, upper=3000)]
            with Client(rpc_addresses(cluster)) as client:
                wait_for(lambda: len(list(client.scan("kv", predicates=written))) == 500, 60)
            proc.send_signal(signal.SIGTERM)
            ready, _, _ = select.select([proc.stderr], [], [], 60)
            assert ready, "no word of the interrupt"
            assert proc.stderr.readline().startswith("stopping after the rows sent so far")
            # Rows after the interrupt are read, but none is sent.
            proc.stdin.write("".join(f'{{"key": {2000 + i}}}\n' for i in range(500)))
            proc.stdin.close()
            out = proc.stdout.read()
            assert proc.wait(timeout=60) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
    assert "inserted 500 rows in kv" in out
    assert "stopped: interrupted; no row after line 500 was sent" in out
    keys = [
        r["key"] for r in scan(cluster, "kv", "--where", "key >= 1000", "--where", "key < 3000")
    ]
    assert sorted(keys) == list(range(1000, 1500))
