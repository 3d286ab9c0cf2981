"""`raftlet tablet remove-replica` that leaves a tablet fewer voters than its table's
replication factor still removes it (an operator may mean it), but warns on stderr and says
how to add one back. Before, it printed only `voters ts3, ts4` and exit 0, and one more
failure left the tablet without a leader (review r26a). A move, which adds before it
removes, says nothing of the kind."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from raftlet.cli import tablet_cmd
from raftlet.cli.main import main
from raftlet.client import membership
from raftlet.client.membership import TabletMembership

SERVERS = ["--servers", "127.0.0.1:1", "--wait"]


def _group(voters: tuple[str, ...], index: int) -> TabletMembership:
    return TabletMembership("kv-p0", voters[0], 2, voters, (), index, index)


def _cluster(monkeypatch: pytest.MonkeyPatch, factor: int, before: tuple[str, ...]) -> None:
    """A tablet kv-p0 of table kv (``factor`` replicas) whose voters are ``before``."""
    voters = list(before)

    def remove(_client: Any, tablet: str, server: str, *, say: Any, **_k: Any) -> TabletMembership:
        voters.remove(server)
        say(f"{tablet}: {server} removed (entry 24)")
        return _group(tuple(voters), 24)

    def add(_client: Any, tablet: str, server: str, *, say: Any, **_k: Any) -> TabletMembership:
        voters.append(server)
        say(f"{tablet}: {server} caught up and promoted to voter (entry 23)")
        return _group(tuple(voters), 23)

    monkeypatch.setattr(membership, "_check_server", lambda _client, _server: None)
    monkeypatch.setattr(
        membership, "leader_membership", lambda *_a, **_k: _group(tuple(voters), 21)
    )
    monkeypatch.setattr(membership, "remove_replica", remove)
    monkeypatch.setattr(membership, "add_replica", add)
    client = SimpleNamespace(
        close=lambda: None,
        table_of=lambda tablet: {"kv-p0": "kv"}[tablet],
        replication_factor=lambda table: {"kv": factor}[table],
    )
    monkeypatch.setattr(
        tablet_cmd,
        "resolve_target",
        lambda _args: SimpleNamespace(client=lambda **_k: client, check_tablet=str),
    )


def test_a_removal_below_the_replication_factor_is_done_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _cluster(monkeypatch, 3, ("ts2", "ts3", "ts4"))
    assert main(["tablet", "remove-replica", "kv-p0", "ts2", *SERVERS]) == 0
    out, err = capsys.readouterr()
    assert "kv-p0: voters ts3, ts4 (leader ts3)" in out
    [line] = err.splitlines()
    assert line == (
        "raftlet tablet remove-replica: warning: kv-p0 now has 2 voters, fewer than the "
        "replication factor 3 of table kv: one more failed voter leaves it without a majority, "
        "and its writes stop. `raftlet tablet add-replica kv-p0 SERVER` adds one back"
    )


def test_a_removal_from_five_to_four_says_how_many_failures_it_now_takes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _cluster(monkeypatch, 5, ("ts1", "ts2", "ts3", "ts4", "ts5"))
    assert main(["tablet", "remove-replica", "kv-p0", "ts5", *SERVERS]) == 0
    err = capsys.readouterr().err
    assert "kv-p0 now has 4 voters, fewer than the replication factor 5 of table kv" in err
    assert "2 more failed voters stop its writes (with 5 it would take 3)" in err


def test_a_removal_of_a_voter_too_many_says_nothing_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _cluster(monkeypatch, 3, ("ts1", "ts2", "ts3", "ts4"))
    assert main(["tablet", "remove-replica", "kv-p0", "ts4", *SERVERS]) == 0
    out, err = capsys.readouterr()
    assert "kv-p0: voters ts1, ts2, ts3 (leader ts1)" in out
    assert err == ""


def test_a_move_which_removes_after_its_add_says_nothing_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _cluster(monkeypatch, 3, ("ts1", "ts2", "ts3"))
    assert main(["tablet", "move-replica", "kv-p0", "ts3", "ts4", *SERVERS]) == 0
    out, err = capsys.readouterr()
    assert "kv-p0: voters ts1, ts2, ts4 (leader ts1)" in out
    assert err == ""


def test_replace_server_says_nothing_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _cluster(monkeypatch, 3, ("ts1", "ts2", "ts3"))

    def replace(_client: Any, server: str, *, say: Any, **_k: Any) -> dict[str, str]:
        # Through the real move: its removal goes below the factor only for a moment.
        membership.move_replica(_client, "kv-p0", server, "ts4", say=say)
        return {"kv-p0": "ts4"}

    monkeypatch.setattr(membership, "replace_server", replace)
    assert main(["cluster", "replace-server", "ts3", "--servers", "127.0.0.1:1"]) == 0
    out, err = capsys.readouterr()
    assert "ts3: 1 replica(s) moved" in out
    assert err == ""


def test_an_interrupted_move_says_what_it_may_leave_and_how_to_finish_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Review r30a: an interrupted move said only "interrupted", though it may have left a
    learner behind."""
    _cluster(monkeypatch, 3, ("ts1", "ts2", "ts3"))

    def cut_short(*_a: Any, **_k: Any) -> TabletMembership:
        raise KeyboardInterrupt

    monkeypatch.setattr(membership, "move_replica", cut_short)
    assert main(["tablet", "move-replica", "kv-p0", "ts3", "ts4", *SERVERS]) == 130
    assert capsys.readouterr().err.splitlines() == [
        "raftlet tablet move-replica: note: kv-p0's group may be left mid-change (a learner "
        "added, a replica not yet removed): `raftlet cluster status` shows it, and the same "
        "command run again finishes it",
        "raftlet tablet move-replica: error: interrupted",
    ]
