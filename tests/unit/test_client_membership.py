"""The membership commands' waits, against a scripted leader: a change whose entry was
replaced by a new leader's at the same index is reported lost, and nothing is deleted."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from raftlet.client import membership
from raftlet.client.errors import RemoteError
from raftlet.client.membership import TabletMembership, remove_replica


def _group(voters: tuple[str, ...], commit: int, config: int, leader: str = "ts1") -> Any:
    return TabletMembership("kv-p0", leader, 2, voters, (), commit, config)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """What the leader answers, in turn, and what was asked of the servers."""
    calls: dict[str, list[Any]] = {"answers": [], "deleted": []}
    monkeypatch.setattr(membership, "_check_server", lambda _client, _server: None)
    monkeypatch.setattr(membership, "leader_membership", lambda *_a, **_k: calls["answers"].pop(0))
    monkeypatch.setattr(membership, "_change", lambda *_a, **_k: SimpleNamespace(index=22))
    monkeypatch.setattr(
        membership,
        "_delete_replica",
        lambda _client, tablet, server, *_a, **_k: calls["deleted"].append((tablet, server)),
    )
    return calls


def test_a_removal_lost_to_a_new_leader_deletes_nothing(scripted: dict[str, list[Any]]) -> None:
    voters = ("ts1", "ts2", "ts3")
    scripted["answers"] = [
        _group(voters, commit=21, config=1),  # before: ts3 a voter
        _group(voters, commit=22, config=1, leader="ts2"),  # entry 22 is the new leader's
    ]
    with pytest.raises(RemoteError, match=r"removing ts3 of kv-p0 \(entry 22\) was lost"):
        remove_replica(None, "kv-p0", "ts3", timeout_s=5.0)  # type: ignore[arg-type]
    assert scripted["deleted"] == []


def test_a_committed_removal_deletes_the_replica(scripted: dict[str, list[Any]]) -> None:
    scripted["answers"] = [
        _group(("ts1", "ts2", "ts3"), commit=21, config=1),
        _group(("ts1", "ts2"), commit=22, config=22),
    ]
    m = remove_replica(None, "kv-p0", "ts3", timeout_s=5.0)  # type: ignore[arg-type]
    assert m.voters == ("ts1", "ts2")
    assert scripted["deleted"] == [("kv-p0", "ts3")]
