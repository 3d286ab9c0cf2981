"""`cluster up`'s wait for leaders: when none comes in time, what it says."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from raftlet.client.health import ClusterHealth, ServerHealth, Severity, TabletHealth
from raftlet.deploy.local import (
    LauncherError,
    LocalCluster,
    _exited,
    _last_error_line,
    _this_start,
)


def test_no_leader_in_time_names_the_servers_the_check_could_not_ask() -> None:
    """With certificates the check's connections refused, `cluster up` said only "no ready
    leader" -- the leaders were there; the check could not ask."""
    health = ClusterHealth(
        "c1",
        [
            ServerHealth("ts1", "a:1", "a:2", "UP"),
            ServerHealth("ts2", "b:1", "b:2", "DOWN", error="UNAVAILABLE: certificate has expired"),
        ],
        [TabletHealth("kv-p0", "kv", 0, [])],
        [],
        Severity.ERROR,
    )
    cluster = SimpleNamespace(
        health=lambda _options: health, data_dir="/d/c1", _check_children=lambda: None
    )
    with pytest.raises(LauncherError) as failed:
        LocalCluster.wait_leaders(cluster, timeout=0)  # type: ignore[arg-type]
    assert "no ready leader within 0 s for kv-p0; ts2 did not answer the check: " in str(
        failed.value
    )
    assert "certificate has expired" in str(failed.value)


def test_a_server_that_died_after_it_was_ready_is_named_at_once(tmp_path: Path) -> None:
    """Killed after its ready line, `cluster up` waited its whole timeout for leaders and
    then blamed the check's refused connections."""
    log = tmp_path / "ts1.log"
    log.write_text(
        "==== 2026-12-05 10:00:00 raftlet cluster up: starting ts1\nraftlet tserver ts1 ready\n"
    )
    dead = SimpleNamespace(poll=lambda: -9)
    cluster = SimpleNamespace(
        _children={"ts1": dead},
        servers={"ts1": SimpleNamespace(log=log)},
        health=lambda _options: pytest.fail("asked the servers of a dead cluster"),
    )
    cluster._check_children = lambda: LocalCluster._check_children(cluster)  # type: ignore[arg-type]
    with pytest.raises(LauncherError) as failed:
        LocalCluster.wait_leaders(cluster, timeout=60)  # type: ignore[arg-type]
    assert str(failed.value).startswith(
        f"ts1 was killed by SIGKILL after it was ready (log: {log})"
    )


def test_a_start_cut_short_names_no_marker_as_its_last_words() -> None:
    """The log was cut at the marker mid-line, so the launcher's own "raftlet cluster up:
    starting ts1" passed for the reason a server died."""
    text = "old run's lines\n==== 2026-12-05 10:00:00 raftlet cluster up: starting ts1\n"
    this_start = _this_start(text, "raftlet cluster up: starting ts1")
    assert this_start == ""
    assert _last_error_line(this_start) == "(no output)"
    assert _exited(-9) == "was killed by SIGKILL"
    assert _exited(2) == "exited with status 2"


def test_up_names_a_running_server_that_does_not_answer() -> None:
    """Review r30a: with ts3 paused (SIGSTOP), `up` restarted ts1, left ts3 alone as a
    running process, and called the cluster up without a word about it."""
    health = ClusterHealth(
        "c1",
        [
            ServerHealth("ts1", "a:1", "a:2", "UP"),
            ServerHealth("ts2", "b:1", "b:2", "UP"),
            ServerHealth("ts3", "c:1", "c:2", "DOWN", error="DEADLINE_EXCEEDED"),
        ],
        [],
        [],
        Severity.WARN,
    )
    said: list[str] = []
    cluster = SimpleNamespace(
        config=SimpleNamespace(server=lambda sid: sid),
        servers={"ts1": SimpleNamespace(status_url="u1"), "ts3": SimpleNamespace(pid=628)},
        data_dir="/d/c1",
        _spawn=lambda *_a: None,
        _wait_ready=lambda *_a: None,
        wait_leaders=lambda *_a, **_k: health,
    )
    stopped = [SimpleNamespace(id="ts1", pid=11, rpc_addr="a:1", argv=["tserver", "ts1"])]
    LocalCluster._start_again(cluster, stopped, 1.0, 1.0, said.append)  # type: ignore[arg-type]
    assert said[-1] == (
        "ts3 (pid 628) runs but does not answer (DEADLINE_EXCEEDED): paused or hung? "
        "`raftlet cluster status --data-dir /d/c1` shows it; stopping it (`cluster down "
        "--server`) and `up` starts it again"
    )
    assert not any(line.startswith(("ts1 (", "ts2 (")) for line in said)
