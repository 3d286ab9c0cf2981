"""Output nobody reads (stdout a pipe whose reader left: `raftlet … | head -1`): the output
goes to /dev/null from then on and the command carries on to its own exit status. Before,
the console raised BrokenPipeError and `cli.main` answered 0: `cluster up` stopped the
servers it had started, `tablet move-replica` stopped after its add, and `cluster status`
answered 0 for a WARN or ERROR verdict. Only a command that merely prints what it reads
(scan, metrics) stops then, with exit 0."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

import pytest

from raftlet.cli import certs_cmd, cluster_cmd, scan_cmd, tablet_cmd
from raftlet.cli.common import Credentials, Target, console, print_out
from raftlet.cli.main import main
from raftlet.client import health, membership
from raftlet.client.membership import TabletMembership
from raftlet.proto import consensus_pb2, tablet_pb2
from tests.unit.health_fakes import IDS, LAYOUT


def _unread_pipe() -> IO[str]:
    """The write end of a pipe whose read end is closed: a write raises BrokenPipeError."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return open(write_end, "w", encoding="utf-8")


def _is_devnull(stream: IO[str]) -> bool:
    return os.path.samestat(os.fstat(stream.fileno()), os.stat(os.devnull))


@pytest.fixture
def unread_stdout(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], IO[str]]]:
    """Makes ``sys.stdout`` a pipe whose reader has gone, when called in the test itself:
    pytest puts its own capture back between a fixture's setup and the test."""
    made: list[IO[str]] = []

    def make() -> IO[str]:
        made.append(_unread_pipe())
        monkeypatch.setattr(sys, "stdout", made[-1])
        return made[-1]

    yield make
    monkeypatch.undo()
    for stream in made:
        with contextlib.suppress(BrokenPipeError):  # still the pipe if the test failed
            stream.close()


def test_a_console_whose_reader_left_goes_quiet_and_the_command_carries_on(
    unread_stdout: Callable[[], IO[str]],
) -> None:
    stdout = unread_stdout()
    out = console()
    out.print("cluster is up")  # raised BrokenPipeError
    assert out.quiet
    assert _is_devnull(stdout)  # a later flush, even the interpreter's at exit, is fine
    out.print("next: raftlet cluster status")
    print("and a plain print", flush=True)
    # A command that merely prints what it reads (scan, metrics) stops, quiet all the same.
    stdout = unread_stdout()
    out = console(stop_when_unread=True)
    with pytest.raises(BrokenPipeError):
        out.print("key  value")
    assert out.quiet
    assert _is_devnull(stdout)
    out.print("(more rows)")  # quiet: nothing raised twice


def test_print_out_into_a_closed_pipe_carries_on(unread_stdout: Callable[[], IO[str]]) -> None:
    stdout = unread_stdout()
    print_out('{"status": "WARN"}')  # raised BrokenPipeError
    assert _is_devnull(stdout)
    err = _unread_pipe()  # stderr too (`2>&1 | head -1`)
    try:
        print_out("raftlet chaos: a fault", file=err)
        assert _is_devnull(err)
    finally:
        err.close()


def test_main_answers_0_for_an_unread_scan_but_not_for_a_command_that_changes_something(
    monkeypatch: pytest.MonkeyPatch, unread_stdout: Callable[[], IO[str]]
) -> None:
    """A BrokenPipeError that reaches `main` from a command that changes something is not
    its stdout's (that output carries on into /dev/null): it is no success."""

    def broken(_args: Any) -> int:
        raise BrokenPipeError

    monkeypatch.setattr(scan_cmd, "run", broken)
    unread_stdout()
    assert main(["scan", "kv", "--servers", "127.0.0.1:1"]) == 0
    monkeypatch.setattr(certs_cmd, "run", broken)
    with pytest.raises(BrokenPipeError):
        main(["certs", "create", "--dir", "/nonexistent", "--servers", "ts1"])


def test_an_unread_tablet_export_stops_with_0(
    monkeypatch: pytest.MonkeyPatch, unread_stdout: Callable[[], IO[str]]
) -> None:
    """`tablet export DIR | head` ended in a BrokenPipeError traceback (review r33a): like
    scan, it only prints what it reads."""

    def broken(_args: Any) -> int:
        raise BrokenPipeError

    monkeypatch.setattr(tablet_cmd, "run", broken)
    unread_stdout()
    assert main(["tablet", "export", "/nonexistent/kv-p0"]) == 0
    with pytest.raises(BrokenPipeError):
        main(["tablet", "remove-replica", "kv-p0", "ts1", "--servers", "127.0.0.1:1"])


def test_output_onto_a_full_disk_fails_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`scan --format json > file` on a full disk printed a traceback (review r33b)."""

    def prints(_args: Any) -> int:
        for i in range(10_000):
            print(f'{{"key": {i}}}')
        return 0

    monkeypatch.setattr(scan_cmd, "run", prints)
    with open("/dev/full", "w", encoding="utf-8") as full:
        monkeypatch.setattr(sys, "stdout", full)
        assert main(["scan", "kv", "--servers", "127.0.0.1:1"]) == 1
        monkeypatch.undo()
    err = capsys.readouterr().err
    assert "raftlet scan: error: No space left on device (writing its output, or a file" in err
    assert "Traceback" not in err


# --- cluster status: its verdict's exit status ----------------------------------------------


def _listed(node: str) -> tablet_pb2.ListTabletsResponse:
    response = tablet_pb2.ListTabletsResponse(server_uuid=node)
    response.tablets.add(
        tablet_id="kv-p0",
        table_name="kv",
        role=consensus_pb2.LEADER if node == "a" else consensus_pb2.FOLLOWER,
        term=2,
        voters=IDS,
        leader_uuid="a",
        leader_ready=True,
        commit_index=10,
        applied_index=10,
    )
    return response


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_cluster_status_into_a_closed_pipe_exits_with_its_verdict(
    monkeypatch: pytest.MonkeyPatch,
    unread_stdout: Callable[[], IO[str]],
    capsys: pytest.CaptureFixture[str],
    fmt: str,
) -> None:
    """`raftlet cluster status | head -1` exited 0 for WARN and ERROR."""
    target = Target(LAYOUT, None, ("a:1",), Credentials())  # type: ignore[arg-type]
    monkeypatch.setattr(cluster_cmd, "resolve_target", lambda *_a, **_k: target)
    for verdict, down, code in (("OK", (), 0), ("WARN", ("c",), 1), ("ERROR", IDS, 1)):
        probes = {
            n: (None, "DOWN", "connection refused") if n in down else (_listed(n), "UP", "")
            for n in IDS
        }
        monkeypatch.setattr(health, "probe_servers", lambda *_a, _p=probes, **_k: _p)
        stdout = unread_stdout()
        argv = ["cluster", "status", "--servers", "127.0.0.1:1", "--format", fmt]
        assert main(argv) == code, verdict
        assert _is_devnull(stdout)
        assert capsys.readouterr().err == ""


# --- a membership change runs to its end ----------------------------------------------------


def _group(voters: tuple[str, ...], index: int) -> TabletMembership:
    return TabletMembership("kv-p0", "ts1", 2, voters, (), index, index)


def test_a_move_into_a_closed_pipe_finishes_after_its_add(
    monkeypatch: pytest.MonkeyPatch, unread_stdout: Callable[[], IO[str]]
) -> None:
    """`raftlet tablet move-replica … --wait | head -1` stopped after the add: the group
    was left with four voters, and the command exited 0."""
    steps: list[str] = []

    def add(_client: Any, tablet: str, server: str, *, say: Any, **_k: Any) -> TabletMembership:
        say(f"{tablet}: {server} added as a learner (entry 22)")
        say(f"{tablet}: {server} caught up and promoted to voter (entry 23)")
        steps.append(f"add {server}")
        return _group(("ts1", "ts2", "ts3", "ts4"), 23)

    def remove(_client: Any, tablet: str, server: str, *, say: Any, **_k: Any) -> TabletMembership:
        steps.append(f"remove {server}")
        say(f"{tablet}: {server} removed (entry 24)")
        return _group(("ts1", "ts2", "ts4"), 24)

    monkeypatch.setattr(membership, "_check_server", lambda _client, _server: None)
    monkeypatch.setattr(
        membership, "leader_membership", lambda *_a, **_k: _group(("ts1", "ts2", "ts3"), 21)
    )
    monkeypatch.setattr(membership, "add_replica", add)
    monkeypatch.setattr(membership, "remove_replica", remove)
    closed: list[bool] = []
    client = SimpleNamespace(
        close=lambda: closed.append(True),
        table_of=lambda _tablet: "kv",
        replication_factor=lambda _table: 3,
    )
    monkeypatch.setattr(
        tablet_cmd,
        "resolve_target",
        lambda _args: SimpleNamespace(client=lambda **_k: client, check_tablet=str),
    )
    stdout = unread_stdout()
    argv = ["tablet", "move-replica", "kv-p0", "ts3", "ts4", "--servers", "127.0.0.1:1", "--wait"]
    assert main(argv) == 0
    assert steps == ["add ts4", "remove ts3"]
    assert closed == [True]
    assert _is_devnull(stdout)


# --- cluster up: the servers it started stay up ----------------------------------------------


def test_cluster_up_into_a_closed_pipe_leaves_its_cluster_running(
    monkeypatch: pytest.MonkeyPatch, unread_stdout: Callable[[], IO[str]], tmp_path: Path
) -> None:
    """`raftlet cluster up … | head -1`: the first progress line raised out of the launch,
    whose handler stopped every server again (no cluster.json), and the command exited 0."""
    from raftlet.deploy import local
    from raftlet.deploy.local import new_config

    config = new_config(tmp_path, servers=3, tablets=2)
    started: list[str] = []

    def create(_data_dir: Any, *, on_progress: Any, **_k: Any) -> Any:
        for s in config.servers:
            on_progress(f"started {s.id}")  # the launcher's progress lines
            started.append(s.id)
        servers = {
            s.id: SimpleNamespace(id=s.id, pid=1, rpc_addr=s.rpc_addr, status_url="http://x/")
            for s in config.servers
        }
        return SimpleNamespace(
            health=lambda: SimpleNamespace(tablets=[]),
            config=config,
            data_dir=tmp_path,
            config_path=tmp_path / "cluster.toml",
            servers=servers,
        )

    monkeypatch.setattr(local.LocalCluster, "create", create)
    stdout = unread_stdout()
    argv = ["cluster", "up", "--data-dir", str(tmp_path), "--cpu-affinity", "none"]
    assert main(argv) == 0
    assert started == ["ts1", "ts2", "ts3"]
    assert _is_devnull(stdout)
