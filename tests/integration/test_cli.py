"""The `raftlet` CLI against a real local cluster, run as a user runs it: as processes.

One cluster for the whole module (``cluster up`` takes a few seconds); the tests run in file
order and the last ones take it apart: status with a killed server, then ``cluster down``,
which must leave none of the PIDs recorded in ``cluster.json`` alive.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlet.deploy.local import LocalCluster, NoClusterError, pid_alive
from raftlet.tserver.sched_batch import sched_batch_supported
from raftlet.tserver.worker_nice import thread_nice, worker_nice_supported
from tests.integration.cli_run import REPO, TIMEOUT_S, ok, raftlet
from tests.integration.tserver_cluster import START_TIMEOUT_S, _read_line, free_ports, wait_for

pytestmark = pytest.mark.integration


def state(data_dir: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((data_dir / "cluster.json").read_text())
    return doc


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("cli-cluster")
    out = ok(raftlet("cluster", "up", "--data-dir", str(d), "--tablets", "2"))
    assert "is up: 3 servers" in out
    pids = [s["pid"] for s in state(d)["servers"]]
    try:
        yield d
    finally:
        # Whatever the tests did: no server outlives the module.
        with contextlib.suppress(NoClusterError):
            LocalCluster.load(d).down(timeout=10)
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_up_prints_urls_and_records_live_pids(data_dir: Path) -> None:
    doc = state(data_dir)
    assert [s["id"] for s in doc["servers"]] == ["ts1", "ts2", "ts3"]
    for s in doc["servers"]:
        assert pid_alive(s["pid"])
        assert (data_dir / s["log"]).exists()
    assert (data_dir / "cluster.toml").exists()


def _of_every_thread(pid: int, read: Callable[[str], object]) -> set[object]:
    """``read(tid)`` for each thread of ``pid``, skipping threads that end meanwhile."""
    seen = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            seen.add(read(tid))
    return seen


def _cpus_of_threads(pid: int) -> set[object]:
    def cpus(tid: str) -> str:
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
        return line.split(":", 1)[1].strip()

    return _of_every_thread(pid, cpus)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc")
def test_up_gives_each_server_one_cpu_round_robin(data_dir: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    for i, s in enumerate(state(data_dir)["servers"]):
        assert _cpus_of_threads(s["pid"]) == {str(cpus[i % len(cpus)])}, s["id"]


@pytest.mark.skipif(not sched_batch_supported(), reason="needs Linux's SCHED_BATCH")
def test_every_thread_of_every_server_runs_under_sched_batch(data_dir: Path) -> None:
    for s in state(data_dir)["servers"]:
        policies = _of_every_thread(s["pid"], lambda tid: os.sched_getscheduler(int(tid)))
        assert policies == {os.SCHED_BATCH}, s["id"]


@pytest.mark.skipif(not worker_nice_supported(), reason="needs Linux's per-thread nice")
def test_the_write_pipeline_runs_ten_nice_levels_below_the_rest(data_dir: Path) -> None:
    # The replica worker pool and the WAL appenders have threads once the leaders are up.
    for s in state(data_dir)["servers"]:
        base = thread_nice(s["pid"])  # the main thread's
        levels = _of_every_thread(s["pid"], lambda tid: thread_nice(int(tid)))
        assert levels == {base, min(19, base + 10)}, s["id"]


def test_status_is_ok_on_a_healthy_cluster(data_dir: Path) -> None:
    out = ok(raftlet("cluster", "status", "--data-dir", str(data_dir)))
    assert "OK: 3/3 servers up, 2/2 tablets with a ready leader" in out
    assert re.search(r"^server +state .* replicas +disk +release +note", out, re.M), out
    assert "releases:" not in out  # said only when servers run more than one
    doc = json.loads(
        ok(raftlet("cluster", "status", "--data-dir", str(data_dir), "--format", "json"))
    )
    assert doc["status"] == "OK"
    # Each server runs the release `raftlet --version` names; /metrics says so too.
    release = ok(raftlet("--version")).split()[-1]
    assert {s["version"] for s in doc["servers"]} == {release}
    assert re.search(rf"^ts1 +UP .* {re.escape(release)} *$", out, re.M), out
    ts1 = doc["servers"][0]
    with urllib.request.urlopen(f"http://{ts1['http_addr']}/metrics", timeout=10) as page:
        assert f'build_info{{server="ts1",version="{release}"}} 1.0' in page.read().decode()
    assert all(t["leader"] for t in doc["tablets"])
    # What each server's replicas' WAL segments and store files take (an idle cluster: the
    # files stay as they are between the answer and this count).
    for server in doc["servers"]:
        files = [
            p
            for pattern in ("*/wal/wal-*.seg", "*/store.sqlite", "*/store.sqlite-*")
            for p in (data_dir / server["id"]).glob(pattern)
        ]
        assert server["disk_bytes"] == sum(p.stat().st_size for p in files) > 0, server
        mine = [r for t in doc["tablets"] for r in t["replicas"] if r["server"] == server["id"]]
        assert sum(r["disk_bytes"] for r in mine) == server["disk_bytes"]


def test_a_servers_files_are_its_users_alone(data_dir: Path) -> None:
    # Review r27a: under the shell's umask 022 every row and log was world-readable,
    # around the roles that guard the RPCs (the servers' --umask, 077 by default).
    made = [p for s in ("ts1", "ts2", "ts3") for p in (data_dir / s).rglob("*")]
    made += [data_dir / f"{s}.log" for s in ("ts1", "ts2", "ts3")]
    assert any(p.name == "store.sqlite" for p in made)
    shared = [f"{p} {p.stat().st_mode & 0o777:o}" for p in made if p.stat().st_mode & 0o077]
    assert shared == []


def scan_json(data_dir: Path, *args: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(
        ok(raftlet("scan", "kv", "--data-dir", str(data_dir), "--format", "json", *args))
    )
    return rows


def test_write_then_scan_round_trip(data_dir: Path) -> None:
    before = len(scan_json(data_dir))
    doc = json.loads(
        ok(
            raftlet(
                "write", "--data-dir", str(data_dir), "--rows", "300", "--threads", "4",
                "--row-bytes", "20", "--flush-mode", "background", "--format", "json",
            )
        )
    )  # fmt: skip
    assert doc["rows"] == 300
    assert doc["errors_by_cause"] == {}
    assert doc["writes"] >= 1
    assert doc["client_cpu_s"] > 0
    assert doc["latency_us"]["p50"] > 0
    rows = scan_json(data_dir)
    assert len(rows) == before + 300
    keys = [r["key"] for r in rows]
    assert len(set(keys)) == len(keys)
    assert all(len(r["value"]) == 20 for r in rows)

    # Predicates, projection and limit go through to the servers.
    some = sorted(keys)[10]
    assert scan_json(data_dir, "--where", f"key = {some}") == [
        next(r for r in rows if r["key"] == some)
    ]
    below = scan_json(data_dir, "--where", f"key <= {some}", "--columns", "key")
    assert sorted(r["key"] for r in below) == sorted(keys)[:11]
    assert all(list(r) == ["key"] for r in below)
    assert len(scan_json(data_dir, "--limit", "7", "--follower-reads")) == 7
    assert scan_json(data_dir, "--where", "value is-null") == []

    # The table format is for people: a row count at the end.
    out = ok(raftlet("scan", "kv", "--data-dir", str(data_dir), "--limit", "3"))
    assert out.rstrip().endswith("(3 rows from kv)")


def test_a_scan_whose_reader_goes_away_exits_0(data_dir: Path) -> None:
    """`raftlet scan … | head` under `set -o pipefail`: the reader leaving is no error (rich
    used to exit 1 for it).  Output well past a pipe's 64 KiB, so the reader leaves first."""
    ok(raftlet("write", "--data-dir", str(data_dir), "--rows", "1500", "--row-bytes", "100"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "raftlet", "scan", "kv", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    assert proc.stdout.readline()
    proc.stdout.close()
    code = proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert code == 0, err
    assert "Traceback" not in err


def _rows_in_kv(data_dir: Path) -> int:
    out = ok(
        raftlet("scan", "kv", "--data-dir", str(data_dir), "--columns", "key", "--format", "json")
    )
    return len(json.loads(out))


def test_a_cluster_config_from_a_pipe_is_read_once(data_dir: Path) -> None:
    """`--cluster <(…)` or `--cluster /dev/stdin`: the client read the file a second time,
    found it empty, and said the config had no [cluster] table."""
    for argv in (["scan", "kv", "--limit", "1"], ["write", "--rows", "5", "--in-flight", "2"]):
        done = subprocess.run(
            [sys.executable, "-m", "raftlet", *argv, "--cluster", "/dev/stdin"],
            input=(data_dir / "cluster.toml").read_text(), capture_output=True, text=True,
            timeout=TIMEOUT_S, cwd=REPO, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


def test_scan_arguments_of_the_wrong_kind_are_invalid_argument(data_dir: Path) -> None:
    """Partition pruning read the predicates before anything checked them: one Predicate
    instead of a list was a TypeError, a string an AttributeError."""
    from raftlet.client import Client, InvalidArgument, Predicate

    with Client.from_config(data_dir / "cluster.toml", timeout_s=10) as client:
        for wrong in (Predicate.equals("key", 1), ["key > 1"], "key > 1"):
            with pytest.raises(InvalidArgument, match="predicates"):
                client.scan("kv", predicates=wrong)  # type: ignore[arg-type]


def test_a_write_whose_reader_goes_away_finishes_its_load(data_dir: Path) -> None:
    """`raftlet write … | head -1`: the first progress line after the reader left raised
    BrokenPipeError out of the load, which stopped (its writer threads on a closed client)
    and exited 0 with a fraction of the rows written."""
    before = _rows_in_kv(data_dir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "raftlet", "write", "--data-dir", str(data_dir), "--rows",
         "3000", "--threads", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stderr is not None
    assert proc.stdout.readline()  # the headline; then the reader leaves
    proc.stdout.close()
    code = proc.wait(timeout=120)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert code == 0, err
    assert "Traceback" not in err
    assert _rows_in_kv(data_dir) == before + 3000


@pytest.mark.parametrize(
    "how",
    [
        ["--batch-rows", "50", "--in-flight", "3", "--threads", "2"],
        ["--flush-mode", "manual", "--batch-rows", "40", "--row-format", "cells"],
    ],
    ids=["batches-in-flight", "per-cell-form"],
)
def test_batched_writes_in_flight_or_per_cell_all_arrive(data_dir: Path, how: list[str]) -> None:
    before = len(scan_json(data_dir))
    out = ok(
        raftlet("write", "--data-dir", str(data_dir), "--rows", "500", "--format", "json", *how)
    )
    doc = json.loads(out)
    assert (doc["rows"], doc["failed_rows"]) == (500, 0)
    assert doc["writes"] >= 500 // 50
    assert len(scan_json(data_dir)) == before + 500


def test_sync_write_with_seed_servers_and_summary_table(data_dir: Path) -> None:
    seeds = ",".join(s["rpc_addr"] for s in state(data_dir)["servers"])
    out = ok(raftlet("write", "--servers", seeds, "--rows", "40", "--threads", "2"))
    for fragment in (
        "rows written",
        "rows/s",
        "writes/s",
        "p50",
        "p99.9",
        "max",
        "retries",
        "errors",
    ):
        assert fragment in out, out


def test_the_environment_names_the_cluster_when_no_flag_does(data_dir: Path) -> None:
    seeds = ",".join(s["rpc_addr"] for s in state(data_dir)["servers"])
    out = ok(raftlet("write", "--rows", "5", RAFTLET_SERVERS=seeds))
    assert "rows written" in out, out
    config = str(data_dir / "cluster.toml")
    ok(raftlet("scan", "kv", "--limit", "1", RAFTLET_CLUSTER=config))
    # A flag still wins over the environment.
    proc = raftlet("scan", "kv", "--cluster", str(data_dir / "nope.toml"), RAFTLET_CLUSTER=config)
    assert proc.returncode == 1
    assert "nope.toml not found" in proc.stderr


def test_scan_usage_error_needs_the_schema(data_dir: Path) -> None:
    # Only the schema says the column does not exist: still a usage error (exit 2), one line.
    proc = raftlet("scan", "kv", "--data-dir", str(data_dir), "--where", "nope = 1")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "raftlet scan: error: --where 'nope = 1': no column 'nope' (columns: key, value)"
    ]


def test_a_plain_min_index_on_a_scan_of_several_tablets_says_the_flag_to_use(
    data_dir: Path,
) -> None:
    proc = raftlet(
        "scan", "kv", "--data-dir", str(data_dir), "--follower-reads", "--min-index", "5"
    )
    assert proc.returncode == 2
    assert "--min-index TABLET=N, once for each tablet" in proc.stderr
    assert "{" not in proc.stderr  # not the library's words for it


def test_a_projection_given_as_a_generator_is_read_once(data_dir: Path) -> None:
    from raftlet.client import Client

    with Client.from_config(data_dir / "cluster.toml", timeout_s=10) as client:
        with client.new_session() as session:
            session.upsert("kv", {"key": -424242, "value": "projected away"})
        rows = list(client.scan("kv", projection=(c for c in ["key"]), limit=2))
    assert rows
    assert all(list(r) == ["key"] for r in rows)


def test_metrics_show_the_writes(data_dir: Path) -> None:
    doc = json.loads(ok(raftlet("metrics", "--data-dir", str(data_dir), "--format", "json")))
    assert set(doc["servers"]) == {"ts1", "ts2", "ts3"}
    assert doc["cluster"]["write_ops"] > 0
    assert doc["cluster"]["leaders"] == 2
    assert doc["cluster"]["term_checks_lockfree"] > 0
    out = ok(raftlet("metrics", "--data-dir", str(data_dir), "--server", "ts1", "--filter", "lock"))
    assert "consensus lock contention" in out
    assert "write ops" not in out


def test_leader_step_down_moves_leadership(data_dir: Path) -> None:
    status = json.loads(
        ok(raftlet("cluster", "status", "--data-dir", str(data_dir), "--format", "json"))
    )
    tablet = next(t for t in status["tablets"] if t["tablet_id"] == "kv-p0")
    target = next(r["server"] for r in tablet["replicas"] if r["server"] != tablet["leader"])
    out = ok(raftlet("leader-step-down", "kv-p0", "--data-dir", str(data_dir), "--to", target))
    assert f"-> {target} (term" in out


def _leaders(data_dir: Path) -> dict[str, str]:
    status = json.loads(
        ok(raftlet("cluster", "status", "--data-dir", str(data_dir), "--format", "json"))
    )
    return {t["tablet_id"]: t["leader"] for t in status["tablets"]}


def test_balance_leaders_spreads_leaders_piled_on_one_server(data_dir: Path) -> None:
    leaders = _leaders(data_dir)
    pile = leaders["kv-p0"]
    if leaders["kv-p1"] != pile:
        ok(raftlet("leader-step-down", "kv-p1", "--data-dir", str(data_dir), "--to", pile))
    assert set(_leaders(data_dir).values()) == {pile}
    out = ok(raftlet("cluster", "balance-leaders", "--data-dir", str(data_dir), "--dry-run"))
    assert "would move" in out
    assert set(_leaders(data_dir).values()) == {pile}  # a dry run moves nothing
    out = ok(raftlet("cluster", "balance-leaders", "--data-dir", str(data_dir)))
    assert f"moving kv-p0: {pile} -> " in out
    assert len(set(_leaders(data_dir).values())) == 2
    out = ok(raftlet("cluster", "balance-leaders", "--data-dir", str(data_dir)))
    assert "balanced: no move would even them out further" in out


def test_status_reports_a_killed_server(data_dir: Path) -> None:
    victim = state(data_dir)["servers"][1]
    os.kill(victim["pid"], signal.SIGKILL)
    wait_for(lambda: not pid_alive(victim["pid"]), 10, f"{victim['id']} to die")
    proc = raftlet("cluster", "status", "--data-dir", str(data_dir), "--timeout", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"server {victim['id']} (" in proc.stdout
    assert "process not running" in proc.stdout
    assert f"--data-dir {data_dir}` starts {victim['id']} again" in proc.stdout
    assert "WARN: 2/3 servers up" in proc.stdout or "ERROR:" in proc.stdout
    # Stopping one more would leave every tablet without a majority: refused, as said, and
    # nothing stopped (review r30a: it said "stopped gracefully", and writes stalled).
    other = next(s for s in state(data_dir)["servers"] if s["id"] != victim["id"])
    refused = raftlet("cluster", "down", "--data-dir", str(data_dir), "--server", other["id"])
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"stopping {other['id']} would leave 2 tablet(s) without a majority" in refused.stderr
    assert f"{victim['id']} not answering" in refused.stderr
    assert "or pass --force" in refused.stderr
    assert pid_alive(other["pid"])

    # `up` starts the one that is not running, as it was, and leaves the others alone.
    others = {s["id"]: s["pid"] for s in state(data_dir)["servers"] if s["id"] != victim["id"]}
    flagged = raftlet(
        "cluster", "up", "--data-dir", str(data_dir), "--tserver-flag=--tick_interval_ms=50"
    )
    assert flagged.returncode == 1
    assert "without --tserver-flag" in flagged.stderr
    out = ok(raftlet("cluster", "up", "--data-dir", str(data_dir)))
    assert f"{victim['id']} is not running (pid {victim['pid']}): starting it again" in out
    now = {s["id"]: s["pid"] for s in state(data_dir)["servers"]}
    assert {sid: now[sid] for sid in others} == others
    assert pid_alive(now[victim["id"]])
    ok(raftlet("cluster", "status", "--data-dir", str(data_dir)))


def test_down_of_one_server_leaves_the_others_and_up_starts_it_again(data_dir: Path) -> None:
    """A rolling restart (new flags, new certificates) had no command: only kill by PID."""
    before = {s["id"]: s["pid"] for s in state(data_dir)["servers"]}
    victim = sorted(before)[2]
    out = ok(raftlet("cluster", "down", "--data-dir", str(data_dir), "--server", victim))
    assert f"{victim} is down, the others run" in out
    assert not pid_alive(before[victim])
    assert all(pid_alive(pid) for sid, pid in before.items() if sid != victim)
    assert (data_dir / "cluster.json").exists()
    out = ok(raftlet("cluster", "up", "--data-dir", str(data_dir)))
    assert f"{victim} is not running (pid {before[victim]}): starting it again" in out
    ok(raftlet("cluster", "status", "--data-dir", str(data_dir)))
    http = {s["id"]: s["http_addr"] for s in state(data_dir)["servers"]}
    for sid in before:  # what a rolling restart waits for before the next server
        wait_for(lambda sid=sid: readyz(http[sid]) == (200, "ready\n"), 60, f"{sid} ready")
    # A new cluster's first start takes an empty data directory for new at once; a restart
    # must not (its directory may have been wiped meanwhile: it waits for its peers' word).
    argv = {s["id"]: s["argv"] for s in state(data_dir)["servers"]}
    assert "--empty_dir_wait_s=0" in argv[sorted(before)[0]]
    assert "--empty_dir_wait_s=0" not in argv[victim]
    bad = raftlet("cluster", "down", "--data-dir", str(data_dir), "--server", "ts9")
    assert bad.returncode == 2  # a name no config knows is a usage error, as elsewhere
    assert "no server 'ts9'" in bad.stderr
    both = raftlet(
        "cluster", "down", "--data-dir", str(data_dir), "--server", victim, "--remove-data"
    )
    assert both.returncode == 2
    assert "--remove-data would delete the others' data" in both.stderr
    # A second server stopped while one is down: refused, as it leaves no majority; forced,
    # said so, not "the others run".
    second = sorted(before)[1]
    ok(raftlet("cluster", "down", "--data-dir", str(data_dir), "--server", victim))
    refused = raftlet("cluster", "down", "--data-dir", str(data_dir), "--server", second)
    assert refused.returncode == 1
    assert "without a majority of answering voters" in refused.stderr
    out = ok(raftlet("cluster", "down", "--data-dir", str(data_dir), "--server", second, "--force"))
    assert f"{second} is down, and {victim} is not running either" in out
    assert "has no leader until" in out
    # The one left has no working group: not ready, saying so of every tablet.
    alone = sorted(before)[0]
    wait_for(lambda: "no leader known" in readyz(http[alone])[1], 60, f"{alone} not ready")
    assert readyz(http[alone])[0] == 503
    ok(raftlet("cluster", "up", "--data-dir", str(data_dir)))


def readyz(addr: str) -> tuple[int, str]:
    """A server's /readyz: its status and text (0, "" when it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://{addr}/readyz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def test_down_leaves_no_process(data_dir: Path) -> None:
    pids = [s["pid"] for s in state(data_dir)["servers"]]
    out = ok(raftlet("cluster", "down", "--data-dir", str(data_dir)))
    assert "no process left" in out
    assert not any(pid_alive(pid) for pid in pids)
    assert not (data_dir / "cluster.json").exists()
    # Idempotent, so cleanup scripts can always call it.
    assert "nothing to stop" in ok(raftlet("cluster", "down", "--data-dir", str(data_dir)))
    # A client command against the stopped cluster fails in one line, within its timeout.
    proc = raftlet("write", "--data-dir", str(data_dir), "--rows", "1", "--timeout", "2")
    assert proc.returncode == 1
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("raftlet write: error:")
    # --remove-data removes the directory `up` made, and again is no error.
    assert "removed" in ok(raftlet("cluster", "down", "--data-dir", str(data_dir), "--remove-data"))
    assert not data_dir.exists()
    again = ok(raftlet("cluster", "down", "--data-dir", str(data_dir), "--remove-data"))
    assert "gone already" in again


def test_a_restart_after_down_keeps_the_server_flags_unless_it_gives_new_ones(
    tmp_path: Path,
) -> None:
    """`up` after `down` started the servers with none of the first start's
    --tserver-flag, silently (a restart of some servers keeps them)."""
    d = str(tmp_path / "c")

    def argv() -> list[str]:
        (server,) = state(Path(d))["servers"]
        return list(server["argv"])

    try:
        ok(
            raftlet(
                "cluster",
                "up",
                "--data-dir",
                d,
                "--servers",
                "1",
                "--tablets",
                "1",
                "--tserver-flag=--log_level=WARNING",
                "--term-check-mode",
                "locked",
            )
        )
        # As a cluster started by a build from before the record: `down` takes the flags
        # from the state file, which it removes.
        (Path(d) / "launch.json").unlink()
        ok(raftlet("cluster", "down", "--data-dir", d))
        out = ok(raftlet("cluster", "up", "--data-dir", d))
        assert (
            "with the server flags of its last start: --tserver-flag=--log_level=WARNING "
            "--term-check-mode locked"
        ) in out
        assert "--log_level=WARNING" in argv()
        assert "locked" in argv()
        ok(raftlet("cluster", "down", "--data-dir", d))
        out = ok(raftlet("cluster", "up", "--data-dir", d, "--tserver-flag=--log_level=ERROR"))
        assert (
            "without the last start's --tserver-flag=--log_level=WARNING --term-check-mode "
            "locked, which this command does not give"
        ) in out
        assert "--log_level=ERROR" in argv()
        assert "--log_level=WARNING" not in argv()
        assert "locked" not in argv()
    finally:
        raftlet("cluster", "down", "--data-dir", d, "--remove-data")


def test_remove_data_removes_only_what_up_made(tmp_path: Path) -> None:
    """A hand-written config's folder is not a cluster's data directory: `down --cluster
    FILE --remove-data` once removed it, whatever else it held; and `up` does not take a
    directory that holds other files (which `--remove-data` would remove with it)."""
    conf = tmp_path / "conf"
    conf.mkdir()
    shutil.copy(REPO / "deploy" / "examples" / "cluster.toml", conf / "cluster.toml")
    (conf / "notes.txt").write_text("keep me\n")
    proc = raftlet("cluster", "down", "--cluster", str(conf / "cluster.toml"), "--remove-data")
    assert proc.returncode == 2, proc.stderr
    assert "has no .made-by-cluster-up, the mark of a directory" in proc.stderr
    assert (conf / "notes.txt").read_text() == "keep me\n"
    proc = raftlet("cluster", "up", "--data-dir", str(tmp_path))
    assert proc.returncode == 1, proc.stderr
    assert "holds files but no cluster" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf"]
    not_a_dir = tmp_path / "conf" / "notes.txt"
    proc = raftlet("cluster", "up", "--data-dir", str(not_a_dir))
    assert proc.returncode == 1
    assert "cannot make the data directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_down_stops_a_cluster_whose_directory_name_is_not_utf8(tmp_path: Path) -> None:
    """The server's command line, read back from /proc with undecodable bytes replaced,
    no longer matched the one recorded: `down` left it running ("now another program"),
    said no process was left, and --remove-data deleted the directory under it."""
    root = Path(os.fsdecode(os.fsencode(tmp_path) + b"/c\xfe"))
    cluster = LocalCluster.create(root, servers=1, tablets=1)
    pids = [s.pid for s in cluster.servers.values()]
    try:
        assert all(cluster.owns(s) for s in cluster.servers.values())
        down = subprocess.run(
            [sys.executable, "-m", "raftlet", "cluster", "down", "--data-dir", str(root),
             "--remove-data"],
            capture_output=True, timeout=TIMEOUT_S, cwd=REPO, check=False,
        )  # fmt: skip
        assert down.returncode == 0, down.stderr
        assert b"stopped gracefully" in down.stdout
        assert not any(pid_alive(pid) for pid in pids)
        assert not root.exists()
    finally:
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            cluster.down(timeout=10)  # collects its child processes' exit status


def test_cluster_up_stopped_by_sigterm_stops_the_servers_it_started(tmp_path: Path) -> None:
    """SIGTERM (a CI runner's timeout) killed `cluster up` at once: exit 143 and its
    servers ran on. Now it stops as for Ctrl-C: the servers stopped, exit 130."""
    root = tmp_path / "c"
    proc = subprocess.Popen(
        [sys.executable, "-m", "raftlet", "cluster", "up", "--data-dir", str(root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    pids: list[int] = []
    try:

        def spawned() -> bool:
            try:
                pids[:] = [s["pid"] for s in state(root)["servers"]]
            except (OSError, ValueError, KeyError):
                return False
            return len(pids) == 3

        wait_for(spawned, 60, "cluster up to start its servers")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        assert code == 130, err
        assert "interrupted" in err
        assert "Traceback" not in err
        wait_for(lambda: not any(pid_alive(p) for p in pids), 30, "its servers to stop")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_table_repartitioned_in_the_config_is_refused_at_up(tmp_path: Path) -> None:
    """4 partitions edited to 8 between `down` and `up` was taken as it was: half the keys
    were sought in tablets that never held them (found nothing; inserted twice)."""
    root = tmp_path / "c"
    ok(raftlet("cluster", "up", "--data-dir", str(root), "--tablets", "2"))
    try:
        ok(raftlet("write", "--data-dir", str(root), "--rows", "50", "--threads", "1"))
        ok(raftlet("cluster", "down", "--data-dir", str(root)))
        config = root / "cluster.toml"
        text = config.read_text()
        assert "partitions = 2" in text
        config.write_text(text.replace("partitions = 2", "partitions = 4"))
        up = raftlet("cluster", "up", "--data-dir", str(root))
        assert up.returncode == 1, up.stdout
        assert "says 4 partitions, but its replicas here were made for 2" in up.stderr
        assert "Traceback" not in up.stderr
        config.write_text(text)  # put back: the cluster comes up with every row
        ok(raftlet("cluster", "up", "--data-dir", str(root)))
        out = ok(
            raftlet("scan", "kv", "--data-dir", str(root), "--columns", "key", "--format", "json")
        )
        assert len(json.loads(out)) == 50
    finally:
        with contextlib.suppress(NoClusterError):
            LocalCluster.load(root).down(timeout=10)


def test_a_server_removed_from_the_config_while_it_holds_replicas_is_refused(
    tmp_path: Path,
) -> None:
    """Its [[servers]] entry deleted (and the replication factor lowered to fit): the groups
    kept it as a voter nobody could reach or remove, and status said OK."""
    root = tmp_path / "c"
    ok(raftlet("cluster", "up", "--data-dir", str(root), "--tablets", "1"))
    try:
        ok(raftlet("cluster", "down", "--data-dir", str(root)))
        config = root / "cluster.toml"
        text = config.read_text()
        head, ts3 = text.split('[[servers]]\nid = "ts3"')
        rest = ts3[ts3.index("[[tables]]") :]
        config.write_text(head + rest.replace("replication_factor = 3", "replication_factor = 2"))
        up = raftlet("cluster", "up", "--data-dir", str(root))
        assert up.returncode == 1, up.stdout
        assert "group has ts3 as a member, which the config no longer lists" in up.stderr
        assert "Traceback" not in up.stderr
    finally:
        with contextlib.suppress(NoClusterError):
            LocalCluster.load(root).down(timeout=10)


@pytest.mark.parametrize("tls", [[], ["--tls"]], ids=["plaintext", "tls"])
def test_servers_added_to_the_config_of_a_cluster_with_rows_start_empty(
    tmp_path: Path, tls: list[str]
) -> None:
    """Two [[servers]] entries added between `down` and `up`: `up` started all five at once,
    the new ones made replicas before the old ones answered, and two of them -- a majority
    of a three-server placement -- elected leaders among empty replicas: scans lost rows.
    With --tls the new servers had no certificates, and `up` stopped every server."""
    root = tmp_path / "c"
    ok(raftlet("cluster", "up", "--data-dir", str(root), "--tablets", "8", *tls))
    try:
        ok(raftlet("write", "--data-dir", str(root), "--rows", "500", "--threads", "2"))
        ok(raftlet("cluster", "down", "--data-dir", str(root)))
        config = root / "cluster.toml"
        ports = free_ports(4)
        entries = "".join(
            f'[[servers]]\nid = "ts{4 + i}"\nrpc_addr = "127.0.0.1:{ports[2 * i]}"\n'
            f'http_addr = "127.0.0.1:{ports[2 * i + 1]}"\ndata_dir = "ts{4 + i}"\n\n'
            for i in range(2)
        )
        config.write_text(config.read_text().replace("[[tables]]", entries + "[[tables]]", 1))
        assert "5 servers" in ok(raftlet("cluster", "up", "--data-dir", str(root)))
        out = ok(
            raftlet("scan", "kv", "--data-dir", str(root), "--columns", "key", "--format", "json")
        )
        assert len(json.loads(out)) == 500
        seen: list[dict[str, Any]] = []

        def status_ok() -> bool:  # followers may still be catching up just after `up`
            argv = ("cluster", "status", "--data-dir", str(root), "--format", "json")
            seen[:] = [json.loads(raftlet(*argv).stdout)]
            return bool(seen[0]["status"] == "OK")

        wait_for(status_ok, 60, "status OK on the grown cluster")
        replicas = [s["replicas"] for s in seen[0]["servers"] if s["id"] in ("ts4", "ts5")]
        assert replicas == [0, 0]
    finally:
        with contextlib.suppress(NoClusterError):
            LocalCluster.load(root).down(timeout=10)


@pytest.mark.parametrize("tables", [2, 0])
def test_up_on_a_hand_written_config_says_what_it_starts(tmp_path: Path, tables: int) -> None:
    """`up` on a new directory holding a hand-written cluster.toml said it was "restarting"
    a cluster "(its data is kept)", named only the first table, advised `scan kv` of a
    cluster with no such table, and failed with an IndexError on a config of no tables."""
    root = tmp_path / "hand"
    root.mkdir()
    rpc, http = free_ports(2)
    text = (
        f'[cluster]\nname = "hand"\n\n[[servers]]\nid = "ts1"\nrpc_addr = "127.0.0.1:{rpc}"\n'
        f'http_addr = "127.0.0.1:{http}"\n\n'
    )
    for name, partitions in [("events", 2), ("logs", 1)][:tables]:
        text += (
            f'[[tables]]\nname = "{name}"\npartitions = {partitions}\nreplication_factor = 1\n'
            'columns = [{ name = "id", type = "INT64", key = true }]\n\n'
        )
    (root / "cluster.toml").write_text(text)
    try:
        out = ok(raftlet("cluster", "up", "--data-dir", str(root)))
        assert "restarting" not in out
        assert f"starting the cluster of {root / 'cluster.toml'}" in out
        if tables:
            tables_said = "tables events in 2 tablets x 1 replica, logs in 1 tablet x 1 replica"
            assert f"1 server, {tables_said}" in out
            assert "raftlet scan events" in out
            assert f"raftlet write --data-dir {root} --table events" in out
        else:
            assert "1 server, no tables" in out
            assert "raftlet scan" not in out
            assert "leaders" not in out
    finally:
        with contextlib.suppress(NoClusterError):
            LocalCluster.load(root).down(timeout=10)


def test_down_stops_a_server_restarted_by_hand_and_keeps_its_directory_until_then(
    tmp_path: Path,
) -> None:
    """A rolling upgrade restarts each server by hand, so the PID recorded is gone: `down`
    said "no process left" and --remove-data deleted the directory under the running
    server."""
    root = tmp_path / "c"
    ok(raftlet("cluster", "up", "--data-dir", str(root), "--tablets", "1"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        ts1 = state(root)["servers"][0]
        os.kill(ts1["pid"], signal.SIGTERM)
        wait_for(lambda: not pid_alive(ts1["pid"]), 30, "ts1 to stop")
        # As an operator would: from the cluster's directory, the config named relatively.
        argv = list(ts1["argv"])
        argv[argv.index("--config") + 1] = "cluster.toml"
        proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert "ready" in _read_line(proc, START_TIMEOUT_S)
        # `up` sees it running (it started a second ts1, which failed on the lock).
        again = raftlet("cluster", "up", "--data-dir", str(root))
        assert "already running" in again.stderr, again.stdout + again.stderr
        assert proc.poll() is None
        # Status names its process as it is now, not the one recorded at `up` (whatever
        # its verdict: the tablet may be electing a leader again).
        doc = json.loads(
            raftlet("cluster", "status", "--data-dir", str(root), "--format", "json").stdout
        )
        assert doc["servers"][0]["pid"] == proc.pid
        assert doc["servers"][0]["process_alive"] is True
        out = ok(raftlet("cluster", "down", "--data-dir", str(root), "--remove-data"))
        assert proc.wait(timeout=30) is not None  # stopped by `down`
        assert not root.exists(), out
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        with contextlib.suppress(NoClusterError):
            LocalCluster.load(root).down(timeout=10)


def test_cluster_up_whose_reader_goes_away_leaves_its_cluster_running(tmp_path: Path) -> None:
    """`raftlet cluster up … | head -1`: the progress line after the reader left raised
    BrokenPipeError into the launch, whose handler stopped every server again (no
    cluster.json), and the command exited 0. Now it carries on: the cluster is up."""
    d = tmp_path / "c"
    proc = subprocess.Popen(
        [sys.executable, "-m", "raftlet", "cluster", "up", "--data-dir", str(d), "--servers",
         "3", "--tablets", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        assert proc.stdout.readline()  # the first server's progress line; then the reader leaves
        proc.stdout.close()
        code = proc.wait(timeout=TIMEOUT_S)
        err = proc.stderr.read().decode()
        assert code == 0, err
        assert "Traceback" not in err
        assert [s["id"] for s in state(d)["servers"]] == ["ts1", "ts2", "ts3"]
        out = ok(raftlet("cluster", "status", "--data-dir", str(d)))
        assert "OK: 3/3 servers up, 2/2 tablets with a ready leader" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        raftlet("cluster", "down", "--data-dir", str(d), "--remove-data")


def test_up_with_a_tablet_that_lost_a_majority_leaves_the_others_serving(tmp_path: Path) -> None:
    """Two of a tablet's three replica directories deleted while the cluster was stopped:
    `up` waited its whole timeout for a leader the tablet cannot elect, said only "no ready
    leader", and stopped every server -- the other tablet's too, and with them the state
    `cluster status` would have explained. The survivor's rows are then read offline."""
    root = tmp_path / "c"
    ok(raftlet("cluster", "up", "--data-dir", str(root), "--tablets", "2"))
    try:
        ok(raftlet("write", "--data-dir", str(root), "--rows", "50", "--threads", "1"))
        scanned = json.loads(ok(raftlet("scan", "kv", "--data-dir", str(root), "--format", "json")))
        ok(raftlet("cluster", "down", "--data-dir", str(root)))
        for server in ("ts2", "ts3"):
            shutil.rmtree(root / server / "kv-p0")
        started = time.monotonic()
        up = raftlet("cluster", "up", "--data-dir", str(root), "--timeout", "60")
        assert up.returncode == 1, up.stdout + up.stderr
        assert time.monotonic() - started < 50, "it waited out the timeout"
        assert "kv-p0: lost a majority of its replicas: 2 of 3 voters are FAILED" in up.stdout
        assert "1 tablet lost a majority of its replicas" in up.stdout
        assert "every other tablet serves" in up.stdout
        assert "raftlet write" not in up.stdout  # it would wait out its timeout
        assert "Traceback" not in up.stderr
        assert "kv-p0=none, kv-p1=ts" in up.stdout  # the other tablet has its leader
        status = raftlet("cluster", "status", "--data-dir", str(root))
        assert "lost a majority" in status.stdout, status.stdout
        # What the surviving replica holds is read from its stopped server's files.
        refused = raftlet("tablet", "export", str(root / "ts1" / "kv-p0"))
        assert refused.returncode == 1
        assert "in use by a running server" in refused.stderr
        ok(raftlet("cluster", "down", "--data-dir", str(root), "--server", "ts1"))
        saved = []
        for tablet in ("kv-p0", "kv-p1"):
            export = raftlet("tablet", "export", str(root / "ts1" / tablet))
            saved += json.loads(ok(export))
            assert f"rows of {tablet} (table kv)" in export.stderr
        assert sorted(saved, key=lambda r: r["key"]) == sorted(scanned, key=lambda r: r["key"])
    finally:
        with contextlib.suppress(NoClusterError):
            LocalCluster.load(root).down(timeout=10)


def test_a_server_added_to_the_config_while_the_others_run_is_named_not_counted(
    tmp_path: Path,
) -> None:
    """`up` said "is up: 4 servers" with ts4 never started, and a second `up` only that the
    cluster was running."""
    root = tmp_path / "c"
    ok(raftlet("cluster", "up", "--data-dir", str(root), "--tablets", "1"))
    try:
        rpc, http = free_ports(2)
        config = root / "cluster.toml"
        text = config.read_text()
        at = text.index("[[tables]]")
        added = (
            f'[[servers]]\nid = "ts4"\nrpc_addr = "127.0.0.1:{rpc}"\n'
            f'http_addr = "127.0.0.1:{http}"\ndata_dir = "ts4"\n\n'
        )
        config.write_text(text[:at] + added + text[at:])
        again = raftlet("cluster", "up", "--data-dir", str(root))
        assert again.returncode == 1
        assert "ts4, added to cluster.toml since it started, is not running" in again.stderr
        ok(raftlet("cluster", "down", "--data-dir", str(root), "--server", "ts1"))
        out = ok(raftlet("cluster", "up", "--data-dir", str(root)))
        assert "is up: 3 of 4 servers" in out
        assert "ts4, added to cluster.toml since it started, is not running" in out
    finally:
        with contextlib.suppress(NoClusterError):
            LocalCluster.load(root).down(timeout=10)


def test_a_server_taken_out_of_the_config_is_stopped_by_down_and_not_started_again(
    tmp_path: Path,
) -> None:
    """The way to retire a server (empty it, take it out of cluster.toml) made `status`,
    `up` and `down` fail with a traceback on the server the state file still named, and
    `down` left the others running (review r33a)."""
    from raftlet.cluster import load_cluster_config

    root = tmp_path / "c"
    ok(raftlet("cluster", "up", "--data-dir", str(root), "--servers", "4", "--tablets", "1"))
    try:
        config = root / "cluster.toml"
        (placement,) = load_cluster_config(config).placements()
        (empty,) = {"ts1", "ts2", "ts3", "ts4"} - set(placement.replicas)
        pids = LocalCluster.load(root).pids()
        text = config.read_text()
        start = text.index(f'[[servers]]\nid = "{empty}"')
        end = text.index("[[", start + 2)
        config.write_text(text[:start] + text[end:])

        status = raftlet("cluster", "status", "--data-dir", str(root))
        assert "Traceback" not in status.stderr, status.stderr
        said = " ".join(status.stdout.split())  # the console wraps long lines
        assert f"server {empty} (pid {pids[empty]}) still runs but is no longer in" in said
        # Counted with the config's servers, it would pass for one of them: stopped first.
        refused = raftlet("cluster", "up", "--data-dir", str(root))
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"server {empty} (pid {pids[empty]}) still runs but is no longer in" in " ".join(
            refused.stderr.split()
        )
        stop = ok(raftlet("cluster", "down", "--data-dir", str(root), "--server", empty))
        assert f"{empty} is down; it is no longer in cluster.toml" in stop
        again = raftlet("cluster", "up", "--data-dir", str(root))
        assert again.returncode == 1, again.stdout + again.stderr
        assert f"{empty}, no longer in cluster.toml, not started again" in again.stdout
        assert "a cluster is already running" in again.stderr
        ok(raftlet("cluster", "down", "--data-dir", str(root)))
        assert not any(pid_alive(pid) for pid in pids.values())
        up = ok(raftlet("cluster", "up", "--data-dir", str(root)))
        assert set(LocalCluster.load(root).pids()) == set(placement.replicas)
        assert "Traceback" not in up
    finally:
        with contextlib.suppress(NoClusterError):
            LocalCluster.load(root).down(timeout=10)
