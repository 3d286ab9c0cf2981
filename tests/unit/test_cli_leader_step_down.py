"""`raftlet leader-step-down`'s word when leadership did not move as asked, against a
scripted cluster: the leader each look at the servers finds, on a clock that only the
command's own waits move. With `--to ts2` and ts2 stopped, ts1 stays leader in its term,
and the command said "no new leader within 8 s (was ts1, term 2)", which read as a tablet
left without a leader."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from raftlet.cli import admin_cmd
from raftlet.cli.common import Credentials, Target
from raftlet.cli.main import main
from raftlet.client import health

WHICH = "(`raftlet cluster status` shows which)"


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int] | None]:
    """What each look at the servers finds: the first is before the step-down, the last
    repeats for every look after it."""
    found: list[tuple[str, int] | None] = []

    def leader(*_a: Any, **_k: Any) -> tuple[str, int] | None:
        return found.pop(0) if len(found) > 1 else found[0]

    config = SimpleNamespace(
        placement=lambda _tablet: None, server_ids=("ts1", "ts2", "ts3"), placements=list
    )
    client = SimpleNamespace(leader_step_down=lambda *_a, **_k: None, close=lambda: None)
    names = Target(config, None, ())  # type: ignore[arg-type]  # its checks of the names
    target = SimpleNamespace(
        config=config,
        creds=Credentials(),
        client=lambda **_k: client,
        check_tablet=names.check_tablet,
        check_server=names.check_server,
    )
    monkeypatch.setattr(admin_cmd, "resolve_target", lambda _args: target)
    monkeypatch.setattr(admin_cmd, "_check_voter", lambda *_a: None)
    monkeypatch.setattr(health, "check_cluster", lambda *_a, **_k: SimpleNamespace(tablets=[]))
    monkeypatch.setattr(admin_cmd, "current_leader", leader)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    monkeypatch.setattr(admin_cmd, "time", SimpleNamespace(monotonic=lambda: now[0], sleep=sleep))
    return found


def _step_down(capsys: pytest.CaptureFixture[str], *to: str) -> str:
    argv = ["leader-step-down", "kv-p0", "--servers", "127.0.0.1:1", "--timeout", "8"]
    assert main([*argv, *(["--to", *to] if to else [])]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("raftlet leader-step-down: error: "), err
    return " ".join(err.split())


def test_a_target_that_does_not_take_over_leaves_the_leader_in_its_term_and_says_so(
    looks: list[tuple[str, int] | None], capsys: pytest.CaptureFixture[str]
) -> None:
    looks[:] = [("ts1", 2), ("ts1", 2)]  # ts2 stopped: the transfer fails, ts1 leads on
    assert _step_down(capsys, "ts2").endswith(
        "error: kv-p0: ts2 did not take over within 8 s: ts1 still leads (term 2, "
        f"unchanged); ts2 may be down or behind {WHICH}"
    )
    looks[:] = [("ts1", 2), ("ts1", 2)]  # no --to: neither follower took over
    assert _step_down(capsys).endswith(
        "error: kv-p0: no other replica took over within 8 s: ts1 still leads (term 2, "
        f"unchanged); the others may be down or behind {WHICH}"
    )


def test_another_leader_than_the_one_asked_for_is_named(
    looks: list[tuple[str, int] | None], capsys: pytest.CaptureFixture[str]
) -> None:
    looks[:] = [("ts1", 2), ("ts1", 2), None, ("ts3", 3)]
    assert _step_down(capsys, "ts2").endswith(
        "error: kv-p0: ts2 did not take over: ts3 took over instead (term 2 -> 3); ts2 may be "
        f"down or behind {WHICH}"
    )
    # Not "leadership moved to ts1": it never left ts1, which won the election that followed.
    looks[:] = [("ts1", 2), None, ("ts1", 3)]
    assert _step_down(capsys, "ts2").endswith(
        "error: kv-p0: ts2 did not take over: ts1 was elected again (term 2 -> 3); ts2 may be "
        f"down or behind {WHICH}"
    )


def test_no_leader_at_all_at_the_end_of_the_wait_is_said_apart(
    looks: list[tuple[str, int] | None], capsys: pytest.CaptureFixture[str]
) -> None:
    looks[:] = [("ts1", 2), None]
    assert _step_down(capsys, "ts2").endswith(
        "error: kv-p0: ts2 did not take over within 8 s, and no replica leads now (ts1 led in "
        f"term 2): an election may be under way, or too few replicas answer {WHICH}"
    )


def test_a_target_whose_replica_is_failed_is_refused_with_its_reason(
    looks: list[tuple[str, int] | None],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reviewer asked a replica on a full disk to lead: the wait ended in "ts2 may be down
    or behind", where the replica was FAILED, with a reason, on a server that answered."""
    looks[:] = [("ts1", 2)]
    why = "replica on ts2 is FAILED: StoreError: database or disk is full"
    tablet = SimpleNamespace(
        tablet_id="kv-p0",
        replicas=[
            SimpleNamespace(server="ts1", state="OK"),
            SimpleNamespace(server="ts2", state="FAILED"),
        ],
        issues=[why],
    )
    monkeypatch.setattr(
        health, "check_cluster", lambda *_a, **_k: SimpleNamespace(tablets=[tablet])
    )
    assert _step_down(capsys, "ts2") == f"raftlet leader-step-down: error: --to ts2: {why}"


def test_no_leader_found_says_what_the_check_said_of_the_servers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review r27a: with a client certificate every server refused, the command said only
    "kv-p0 has no ready leader to step down", of a tablet that had one."""
    refused = (
        "server ts1 (127.0.0.1:1) is down: UNAVAILABLE: Socket closed -- it closed the "
        "connection at the handshake"
    )
    config = SimpleNamespace(
        placement=lambda _tablet: None, server_ids=("ts1", "ts2", "ts3"), placements=list
    )
    target = Target(config, None, ())  # type: ignore[arg-type]
    monkeypatch.setattr(admin_cmd, "resolve_target", lambda _args: target)
    checked = SimpleNamespace(tablets=[], issues=[refused, "kv-p0: no replica answers"])
    monkeypatch.setattr(health, "check_cluster", lambda *_a, **_k: checked)
    assert _step_down(capsys) == (
        f"raftlet leader-step-down: error: kv-p0 has no ready leader to step down ({refused})"
    )


def test_a_target_that_already_leads_is_success(
    looks: list[tuple[str, int] | None], capsys: pytest.CaptureFixture[str]
) -> None:
    """Review r28a: it exited 1, so an upgrade script moving leaders had to tell that apart
    from a failure itself."""
    looks[:] = [("ts2", 3)]
    argv = ["leader-step-down", "kv-p0", "--servers", "127.0.0.1:1", "--to", "ts2"]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == "kv-p0: ts2 already leads it (term 3)"
