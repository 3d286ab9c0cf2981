"""The membership commands' waits, against a scripted leader: a change whose entry was
replaced by a new leader's at the same index is reported lost, and nothing is deleted; a
learner whose tablet copy is being installed is waited for; a group that lost its majority
fails the command at once."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from raftlet.client import membership
from raftlet.client.errors import InvalidArgument, RemoteError, Timeout
from raftlet.client.membership import ReplicaNotDeleted, TabletMembership, remove_replica
from raftlet.proto import consensus_pb2, tablet_pb2


def _group(voters: tuple[str, ...], commit: int, config: int, leader: str = "ts1") -> Any:
    return TabletMembership("kv-p0", leader, 2, voters, (), commit, config)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """What the leader answers, in turn, and what was asked of the servers."""
    calls: dict[str, list[Any]] = {"answers": [], "deleted": [], "checked": []}
    monkeypatch.setattr(membership, "_check_server", lambda _client, _server: None)
    monkeypatch.setattr(
        membership,
        "_check_change",
        lambda _c, tablet, _k, server, _t: calls["checked"].append((tablet, server)),
    )
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
    with pytest.raises(RemoteError, match=r"removing ts3 of kv-p0 \(entry 22\) did not hold"):
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


# --- two operators at once -------------------------------------------------------------------


class _NotFound(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.NOT_FOUND

    def details(self) -> str:
        return "tablet 'kv-p0' not found on this server"


def _with_learner(voters: tuple[str, ...], learner: str, commit: int = 30) -> Any:
    return TabletMembership("kv-p0", "ts1", 2, voters, (learner,), commit, commit)


def test_an_add_whose_server_left_the_group_fails_at_once(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It waited out its whole timeout "for the replica to catch up", then said so."""
    voters = ("ts1", "ts2", "ts3")
    scripted["answers"] = [_with_learner(voters, "ts4"), _group(voters, commit=31, config=31)]

    def gone(*_a: Any, **_k: Any) -> Any:
        raise _NotFound()

    monkeypatch.setattr(membership, "_state", gone)
    with pytest.raises(RemoteError, match="ts4 left kv-p0's group while it was being added"):
        membership._wait_caught_up(None, "kv-p0", "ts4", time.monotonic() + 60)  # type: ignore[arg-type]


def test_a_learner_whose_replica_was_deleted_gets_it_made_again(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another operator's leftover deletion raced the add: the group kept a learner that
    had no replica (MISSING) and the add timed out."""
    voters = ("ts1", "ts2", "ts3")
    scripted["answers"] = [_with_learner(voters, "ts4"), _with_learner(voters, "ts4")]
    states = [_NotFound(), SimpleNamespace(last_log_index=30, applied_index=30)]

    def state(*_a: Any, **_k: Any) -> Any:
        answer = states.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    made: list[tuple[str, tuple[str, ...]]] = []
    monkeypatch.setattr(membership, "_state", state)
    monkeypatch.setattr(
        membership,
        "_create_replica",
        lambda _c, tablet, server, m, _t: made.append((server, m.learners)),
    )
    membership._wait_caught_up(None, "kv-p0", "ts4", time.monotonic() + 60)  # type: ignore[arg-type]
    assert made == [("ts4", ("ts4",))]


def test_an_add_refused_deletes_the_replica_it_made(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another operator's change came first: the new replica stayed as one of no group."""
    voters = ("ts1", "ts2", "ts3")
    scripted["answers"] = [_group(voters, 21, 1), _group(voters, 23, 23)]
    made: list[str] = []
    monkeypatch.setattr(
        membership, "_create_replica", lambda _c, _t, server, *_a: made.append(server)
    )

    def refused(*_a: Any, **_k: Any) -> Any:
        raise RemoteError("a config change is in progress")

    monkeypatch.setattr(membership, "_change", refused)
    with pytest.raises(RemoteError, match="in progress"):
        membership.add_replica(None, "kv-p0", "ts4", timeout_s=5.0)  # type: ignore[arg-type]
    assert made == ["ts4"]
    assert scripted["deleted"] == [("kv-p0", "ts4")]


def test_a_promote_another_run_made_counts_as_done(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    voters = ("ts1", "ts2", "ts3")
    scripted["answers"] = [_with_learner(voters, "ts4"), _group((*voters, "ts4"), 31, 31)]
    monkeypatch.setattr(membership, "_wait_caught_up", lambda *_a: None)

    def refused(*_a: Any, **_k: Any) -> Any:
        raise RemoteError("ts4 is not a learner (voters ts1, ts2, ts3, ts4)")

    monkeypatch.setattr(membership, "_change", refused)
    m = membership.add_replica(None, "kv-p0", "ts4", timeout_s=5.0)  # type: ignore[arg-type]
    assert "ts4" in m.voters


# What the move asks of the client when its source left meanwhile: the table's factor.
FACTOR_3 = SimpleNamespace(table_of=lambda _tablet: "kv", replication_factor=lambda _table: 3)


def test_a_move_whose_source_left_meanwhile_takes_its_target_out_again(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two moves of one source at once left four voters where the table asks for three."""
    # Meanwhile the other move took ts3 to ts5; this one added ts4.
    after_add = _group(("ts1", "ts2", "ts4", "ts5"), 40, 40)
    scripted["answers"] = [_group(("ts1", "ts2", "ts3"), 21, 1), after_add]
    monkeypatch.setattr(membership, "add_replica", lambda *_a, **_k: after_add)
    removed: list[str] = []
    monkeypatch.setattr(
        membership, "remove_replica", lambda _c, _t, server, **_k: removed.append(server)
    )
    with pytest.raises(RemoteError, match="ts3 left kv-p0's group while ts4 was being added"):
        membership.move_replica(FACTOR_3, "kv-p0", "ts3", "ts4", timeout_s=5.0)  # type: ignore[arg-type]
    assert removed == ["ts4"]


def test_the_same_move_made_by_two_operators_at_once_keeps_the_target(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other run made this very move (ts3 to ts4) meanwhile: undoing the add took ts4
    out again, leaving the tablet two voters, and said "nothing moved"."""
    done = _group(("ts1", "ts2", "ts4"), 40, 40)
    scripted["answers"] = [_group(("ts1", "ts2", "ts3"), 21, 1), done]
    monkeypatch.setattr(membership, "add_replica", lambda *_a, **_k: done)
    removed: list[str] = []
    monkeypatch.setattr(
        membership, "remove_replica", lambda _c, _t, server, **_k: removed.append(server)
    )
    said: list[str] = []
    m = membership.move_replica(FACTOR_3, "kv-p0", "ts3", "ts4", timeout_s=5.0, say=said.append)  # type: ignore[arg-type]
    assert m.voters == ("ts1", "ts2", "ts4")
    assert removed == []
    assert "ts3 left the group meanwhile (another operator's move?)" in said[-1]


def test_two_moves_onto_one_server_at_once_remove_one_voter_not_two(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review r30a: ts1->ts4 and ts2->ts4 at once both exited 0, and kv-p2 was left with
    two voters (from there, one). Here the other move removed ts1 after this one's add: the
    removal of ts2 would leave two voters, fewer than the three the move began with, and is
    refused; and a removal is made only on the membership it was judged on."""
    changes: list[tuple[str, Any]] = []
    monkeypatch.setattr(
        membership,
        "_change",
        lambda _c, _t, _k, server, _s, cas=None: (
            changes.append((server, cas)) or SimpleNamespace(index=60)
        ),
    )
    monkeypatch.setattr(
        membership, "add_replica", lambda *_a, **_k: _group(("ts1", "ts2", "ts3", "ts4"), 40, 40)
    )
    scripted["answers"] = [
        _group(("ts1", "ts2", "ts3"), 21, 1),  # the move begins
        _group(("ts2", "ts3", "ts4"), 50, 50),  # its removal: the other move took ts1 out
    ]
    with pytest.raises(RemoteError) as refused:
        membership.move_replica(FACTOR_3, "kv-p0", "ts2", "ts4", timeout_s=5.0)  # type: ignore[arg-type]
    assert str(refused.value) == (
        "removing ts2 would leave kv-p0 2 voter(s) (ts3, ts4), fewer than the 3 this move "
        "keeps: another change ran meanwhile (another operator's move or removal?), so ts2 "
        "stays -- see `raftlet cluster status`"
    )
    assert changes == []
    assert scripted["deleted"] == []
    # Alone, the same move removes ts2 -- on the membership of entry 40, which the leader
    # refuses to change if another change came first.
    scripted["answers"] = [
        _group(("ts1", "ts2", "ts3"), 21, 1),
        _group(("ts1", "ts2", "ts3", "ts4"), 40, 40),
        _group(("ts1", "ts3", "ts4"), 60, 60),
    ]
    m = membership.move_replica(FACTOR_3, "kv-p0", "ts2", "ts4", timeout_s=5.0)  # type: ignore[arg-type]
    assert m.voters == ("ts1", "ts3", "ts4")
    assert changes == [("ts2", 40)]


def test_a_move_stopped_after_its_add_is_finished_by_running_it_again(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after "ts4 caught up and promoted", the rerun said "ts4 already holds a
    replica of kv-p0" and no command finished the move (the tablet kept four voters)."""
    scripted["answers"] = [_group(("ts1", "ts2", "ts3", "ts4"), 40, 40)]
    removed: list[str] = []

    def remove(_c: Any, _t: str, server: str, **_k: Any) -> Any:
        removed.append(server)
        return _group(("ts1", "ts2", "ts4"), 41, 41)

    monkeypatch.setattr(membership, "remove_replica", remove)
    said: list[str] = []
    m = membership.move_replica(FACTOR_3, "kv-p0", "ts3", "ts4", timeout_s=5.0, say=said.append)  # type: ignore[arg-type]
    assert (removed, m.voters) == (["ts3"], ("ts1", "ts2", "ts4"))
    assert said == ["kv-p0: ts4 is a voter already; removing ts3"]
    # Run once more after it finished: done already, not "ts3 holds no replica"; and what
    # ts3 may still run of the group (a run stopped before its deletion) is deleted.
    scripted["answers"] = [_group(("ts1", "ts2", "ts4"), 41, 41)]
    m = membership.move_replica(FACTOR_3, "kv-p0", "ts3", "ts4", timeout_s=5.0, say=said.append)  # type: ignore[arg-type]
    assert (removed, m.voters) == (["ts3"], ("ts1", "ts2", "ts4"))
    assert said[-2:] == [
        "kv-p0: the leftover replica on ts3 (no member of the group) was deleted",
        "kv-p0: ts4 is a voter and ts3 no member: moved already",
    ]
    assert scripted["deleted"] == [("kv-p0", "ts3")]
    # A target that is a voter where the group has no voter to spare: still refused.
    scripted["answers"] = [_group(("ts1", "ts3", "ts4"), 40, 40)]
    with pytest.raises(InvalidArgument, match="ts4 already holds a replica of kv-p0"):
        membership.move_replica(FACTOR_3, "kv-p0", "ts3", "ts4", timeout_s=5.0)  # type: ignore[arg-type]


def test_a_move_from_a_server_without_the_replica_is_not_called_done(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review r33a: a mistyped FROM (ts5 never held kv-p0) printed "moved already"."""
    scripted["answers"] = [_group(("ts1", "ts2", "ts4"), 41, 41)]

    def not_there(*_a: Any, **_k: Any) -> None:
        raise _NotFound()

    monkeypatch.setattr(membership, "_delete_replica", not_there)
    said: list[str] = []
    m = membership.move_replica(FACTOR_3, "kv-p0", "ts5", "ts4", timeout_s=5.0, say=said.append)  # type: ignore[arg-type]
    assert m.voters == ("ts1", "ts2", "ts4")
    assert said == [
        "kv-p0: ts4 is a voter and ts5 holds no replica of it: nothing to move (moved "
        "already, or is ts5 the wrong FROM?)"
    ]


def test_a_move_whose_removal_fails_says_what_it_left_and_how_to_finish(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted["answers"] = [_group(("ts1", "ts2", "ts3"), 21, 1)]
    monkeypatch.setattr(
        membership, "add_replica", lambda *_a, **_k: _group(("ts1", "ts2", "ts3", "ts4"), 40, 40)
    )

    def remove(*_a: Any, **_k: Any) -> Any:
        raise Timeout("kv-p0: timed out waiting for a ready leader of kv-p0")

    monkeypatch.setattr(membership, "remove_replica", remove)
    with pytest.raises(Timeout) as caught:
        membership.move_replica(FACTOR_3, "kv-p0", "ts3", "ts4", timeout_s=5.0)  # type: ignore[arg-type]
    said = str(caught.value)
    assert said.startswith("kv-p0: timed out waiting for a ready leader of kv-p0 -- ts4 is a voter")
    assert "run the same `raftlet tablet move-replica kv-p0 ts3 ts4` again" in said


def test_a_leftover_deletion_raced_by_an_add_says_so(scripted: dict[str, list[Any]]) -> None:
    voters = ("ts1", "ts2", "ts3")
    scripted["answers"] = [_group(voters, 21, 21), _with_learner(voters, "ts4", 23)]
    with pytest.raises(RemoteError, match=r"ts4 joined kv-p0's group .* while its replica"):
        remove_replica(None, "kv-p0", "ts4", timeout_s=5.0)  # type: ignore[arg-type]
    assert scripted["deleted"] == [("kv-p0", "ts4")]


def test_a_move_whose_source_another_move_removes_first_takes_its_target_out_again(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source left between the check after the add and the REMOVE: the loser failed
    with "ts1 is not a member" (or a refused step-down) and left its target a fourth voter."""
    scripted["answers"] = [
        _group(("ts1", "ts2", "ts3"), 21, 1),
        _group(("ts2", "ts3", "ts4", "ts5"), 50, 50),  # the other move's target, and ours
    ]
    monkeypatch.setattr(
        membership, "add_replica", lambda *_a, **_k: _group(("ts1", "ts2", "ts3", "ts4"), 40, 40)
    )
    calls: list[tuple[str, bool]] = []

    def remove(_c: Any, _t: str, server: str, **kwargs: Any) -> Any:
        calls.append((server, kwargs.get("leftovers", True)))
        if server == "ts1":
            raise membership._NotAMember("ts1 is no member of kv-p0's group any more")
        return _group(("ts2", "ts3", "ts5"), 50, 50)

    monkeypatch.setattr(membership, "remove_replica", remove)
    with pytest.raises(RemoteError, match="so ts4 was removed again: nothing moved"):
        membership.move_replica(FACTOR_3, "kv-p0", "ts1", "ts4", timeout_s=5.0)  # type: ignore[arg-type]
    assert calls == [("ts1", False), ("ts4", True)]


def test_a_promote_another_run_made_is_waited_for_then_counts_as_done(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    voters = ("ts1", "ts2", "ts3")
    promoted = (*voters, "ts4")
    scripted["answers"] = [
        _with_learner(voters, "ts4"),
        _group(promoted, commit=30, config=31),  # the other run's promote, not committed
        _group(promoted, commit=31, config=31),
    ]
    monkeypatch.setattr(membership, "_wait_caught_up", lambda *_a: None)

    def refused(*_a: Any, **_k: Any) -> Any:
        raise RemoteError("a config change is in progress")

    monkeypatch.setattr(membership, "_change", refused)
    m = membership.add_replica(None, "kv-p0", "ts4", timeout_s=5.0)  # type: ignore[arg-type]
    assert (m.voters, m.commit_index) == (promoted, 31)


def test_a_step_down_another_operator_already_made_is_no_failure(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    voters = ("ts1", "ts2", "ts3")
    scripted["answers"] = [
        _group(voters, 21, 1, leader="ts3"),
        _group(voters, 22, 1, leader="ts2"),  # after the refused step-down: moved anyway
        _group(("ts1", "ts2"), 22, 22, leader="ts2"),
    ]

    class Refusing:
        def leader_step_down(self, *_a: Any, **_k: Any) -> str:
            raise RemoteError("'ts2' is not another voter of kv-p0")

    monkeypatch.setattr(membership, "_live_voter", lambda _c, _t, voters: voters[0])
    m = remove_replica(Refusing(), "kv-p0", "ts3", timeout_s=5.0)  # type: ignore[arg-type]
    assert m.voters == ("ts1", "ts2")
    assert scripted["deleted"] == [("kv-p0", "ts3")]


def test_a_removal_of_the_leader_the_leader_would_refuse_moves_no_leadership(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked to remove its leader while another voter was down, the CLI handed the
    leadership over and only then heard the new leader refuse: the check comes first now."""
    voters = ("ts1", "ts2", "ts3")
    scripted["answers"] = [_group(voters, 21, 1, leader="ts3")]
    refusal = "it would leave 1 of the new group's 2 voters answering (ts2 not heard from"

    def refuse(_c: Any, _tablet: str, _kind: int, _server: str, _t: float) -> None:
        raise RemoteError(refusal)

    class NoStepDown:
        def leader_step_down(self, *_a: Any, **_k: Any) -> str:
            raise AssertionError("leadership moved for a change that is refused")

    monkeypatch.setattr(membership, "_check_change", refuse)
    with pytest.raises(RemoteError, match=re.escape(refusal)):
        remove_replica(NoStepDown(), "kv-p0", "ts3", timeout_s=5.0)  # type: ignore[arg-type]
    assert scripted["deleted"] == []


def test_leadership_goes_to_the_voter_that_answers_with_the_longest_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It went to the first other voter in order, even a dead one: the leader handed its
    term to it and the removal waited out its whole timeout."""
    logs = {"ts1": None, "ts3": 40, "ts4": 42, "ts5": 41}  # ts1 is down

    def state(_c: Any, server: str, _t: str, _timeout: float) -> Any:
        if logs[server] is None:
            raise _Refused(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
        return SimpleNamespace(last_log_index=logs[server])

    monkeypatch.setattr(membership, "_state", state)
    assert membership._live_voter(None, "kv-p0", ["ts1", "ts3", "ts4", "ts5"]) == "ts4"  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"no other voter of kv-p0 answers \(ts1\)"):
        membership._live_voter(None, "kv-p0", ["ts1"])  # type: ignore[arg-type]


def test_a_server_that_does_not_answer_is_called_so_with_its_address() -> None:
    client = SimpleNamespace(servers=lambda: {"ts1": SimpleNamespace(rpc_addr="127.0.0.1:7051")})
    said = membership._said(
        client,  # type: ignore[arg-type]
        "ts1",
        _Refused(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
    )
    assert said.startswith("ts1 (127.0.0.1:7051) is not answering (DEADLINE_EXCEEDED")
    assert "is it down? Start it, or pick another server" in said
    refused = _Refused(grpc.StatusCode.INVALID_ARGUMENT, "holds a replica's files already")
    assert membership._said(client, "ts1", refused) == "holds a replica's files already"  # type: ignore[arg-type]


def test_a_server_the_running_servers_do_not_list_says_they_must_run_the_new_file() -> None:
    """A server added to an operator's copy of cluster.toml, not yet to the servers' file,
    was just "unknown", with no word of why."""
    from types import SimpleNamespace

    from raftlet.client.errors import InvalidArgument

    client = SimpleNamespace(servers=lambda: {"ts1": None, "ts2": None})
    with pytest.raises(InvalidArgument, match=r"unknown server 'ts6': .* lists ts1, ts2 \("):
        membership._check_server(client, "ts6")  # type: ignore[arg-type]
    membership._check_server(client, "ts2")  # type: ignore[arg-type]


def _listing(hosted: dict[str, list[str]]) -> dict[str, Any]:
    """What ``Client.list_tablets`` answers: each server's replicas, by tablet id."""
    return {
        uuid: SimpleNamespace(tablets=[SimpleNamespace(tablet_id=t) for t in tablets])
        for uuid, tablets in hosted.items()
    }


def test_replace_server_deletes_leftovers_and_moves_nothing_onto_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run stopped between a removal and its deletion left ts4 a replica of kv-p1 it is no
    member of: a rerun said "no replicas" and left it; and replacing ts1 tried to create
    kv-p0 on ts2, which held a leftover, and stopped there with the others unmoved."""
    groups = {
        "kv-p0": TabletMembership("kv-p0", "ts1", 2, ("ts1", "ts3", "ts4"), (), 9, 9),
        "kv-p1": TabletMembership("kv-p1", "ts1", 2, ("ts1", "ts2", "ts3"), (), 9, 9),
    }
    client = SimpleNamespace(
        list_tablets=lambda **_k: _listing(
            {"ts1": ["kv-p0", "kv-p1"], "ts2": ["kv-p0", "kv-p1"], "ts3": ["kv-p0", "kv-p1"]}
            | {"ts4": ["kv-p0", "kv-p1"], "ts5": []}
        ),
        tablets=lambda _table: ["kv-p0", "kv-p1"],
        tables=lambda: ["kv"],
        replication_factor=lambda _table: 3,
    )
    deleted: list[tuple[str, str]] = []
    moves: list[tuple[str, str, str]] = []
    monkeypatch.setattr(membership, "_check_server", lambda _client, _server: None)
    monkeypatch.setattr(membership, "leader_membership", lambda _c, tid, _t: groups[tid])
    monkeypatch.setattr(
        membership,
        "_delete_replica",
        lambda _c, tablet, server, *_a, **_k: deleted.append((tablet, server)),
    )
    monkeypatch.setattr(
        membership,
        "move_replica",
        lambda _c, tablet, source, target, **_k: moves.append((tablet, source, target)),
    )
    assert membership.replace_server(client, "ts4") == {"kv-p0": "ts5", "kv-p1": ""}  # type: ignore[arg-type]
    assert deleted == [("kv-p1", "ts4")]  # its leftover, deleted
    # ts2 holds a leftover of kv-p0: the move goes to ts5, which holds nothing.
    assert moves == [("kv-p0", "ts4", "ts5")]

    # A leftover that will not go (an immutable file) is named at the end; the rest moves.
    def stuck(_c: Any, tablet: str, server: str, *_a: Any, **_k: Any) -> None:
        raise _Refused(grpc.StatusCode.FAILED_PRECONDITION, "could not remove /d/ts4/kv-p1/wal")

    monkeypatch.setattr(membership, "_delete_replica", stuck)
    monkeypatch.setattr(membership, "_said", lambda _c, _s, e: e.details())
    moves.clear()
    with pytest.raises(RemoteError, match=r"^kv-p1: deleting the leftover replica on ts4 failed"):
        membership.replace_server(client, "ts4")  # type: ignore[arg-type]
    assert moves == [("kv-p0", "ts4", "ts5")]


def test_replace_server_finishes_a_learner_an_earlier_run_left_instead_of_adding_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replace-server that timed out while ts4 caught up left ts4 a learner; run again,
    it moved the replica to ts3 and left ts4 a learner for good."""
    group = TabletMembership("kv-p0", "ts1", 2, ("ts1", "ts2", "ts5"), ("ts4",), 9, 9)
    client = SimpleNamespace(
        list_tablets=lambda **_k: _listing(
            {"ts1": ["kv-p0", "x", "y"], "ts2": ["kv-p0", "x", "y"], "ts3": [], "ts4": ["kv-p0"]}
            | {"ts5": ["kv-p0", "x", "y"]}
        ),
        tablets=lambda _table: ["kv-p0"],
        tables=lambda: ["kv"],
        replication_factor=lambda _table: 3,
    )
    moves: list[tuple[str, str]] = []
    monkeypatch.setattr(membership, "_check_server", lambda _client, _server: None)
    monkeypatch.setattr(membership, "leader_membership", lambda *_a, **_k: group)
    monkeypatch.setattr(
        membership,
        "move_replica",
        lambda _c, _tablet, source, target, **_k: moves.append((source, target)),
    )
    assert membership.replace_server(client, "ts5") == {"kv-p0": "ts4"}  # type: ignore[arg-type]
    assert moves == [("ts5", "ts4")]


# --- a tablet copy installed in the learner; a replica its server cannot delete -------------


class _Refused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _learner_server_answers(
    monkeypatch: pytest.MonkeyPatch, answers: list[Any]
) -> tuple[Any, list[Any]]:
    """A client whose learner ts4 answers GetConsensusStatus with ``answers`` in turn (the
    last one for ever)."""

    def state(*_a: Any, **_k: Any) -> Any:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(membership, "_state", state)
    servers = {"ts4": SimpleNamespace(rpc_addr="127.0.0.1:7054")}
    return SimpleNamespace(servers=lambda: servers), answers


def test_a_wait_for_a_learner_whose_server_went_silent_ends_naming_it(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review r30a: with ts4 killed after it was added, `add-replica --wait` was silent for
    its whole 120 s, then timed out, while `cluster status` said at once ts4 was down."""
    scripted["answers"] = [_with_learner(("ts1", "ts2", "ts3"), "ts4")]
    refused = _Refused(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    client, _ = _learner_server_answers(monkeypatch, [refused])
    monkeypatch.setattr(membership, "_SILENT_LEARNER_S", 0.3)
    began = time.monotonic()
    with pytest.raises(RemoteError) as raised:
        membership._wait_caught_up(client, "kv-p0", "ts4", time.monotonic() + 60)
    assert time.monotonic() - began < 10
    said = str(raised.value)
    assert "ts4 (127.0.0.1:7054) has not answered for 0.3 s (UNAVAILABLE" in said
    assert "add-replica kv-p0 ts4 --wait" in said
    assert "remove-replica kv-p0 ts4" in said


def test_a_learner_server_silent_for_a_moment_is_waited_for(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart is shorter than the silence that ends the wait: the add goes on."""
    scripted["answers"] = [_with_learner(("ts1", "ts2", "ts3"), "ts4")]
    silent = _Refused(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    caught_up = SimpleNamespace(last_log_index=30, applied_index=30)
    client, left = _learner_server_answers(monkeypatch, [silent, silent, caught_up])
    membership._wait_caught_up(client, "kv-p0", "ts4", time.monotonic() + 60)
    assert left == [caught_up]


def test_a_learner_being_filled_by_a_tablet_copy_is_waited_for_not_made_again(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a copy is installed the replica is out of its server's maps for a moment: the
    wait took that for a deleted replica, asked to create it again, and the refusal ("holds
    a replica's files already") failed the add, leaving a learner for good."""
    voters = ("ts1", "ts2", "ts3")
    scripted["answers"] = [_with_learner(voters, "ts4"), _with_learner(voters, "ts4")]
    states: list[Any] = [_NotFound(), SimpleNamespace(last_log_index=30, applied_index=30)]

    def state(*_a: Any, **_k: Any) -> Any:
        answer = states.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def create(*_a: Any, **_k: Any) -> None:
        raise _Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            "/data/ts4/kv-p0 holds a replica's files already; delete it first",
        )

    client = SimpleNamespace(admin_stub=lambda _server: SimpleNamespace(CreateReplica=create))
    monkeypatch.setattr(membership, "_state", state)
    membership._wait_caught_up(client, "kv-p0", "ts4", time.monotonic() + 60)  # type: ignore[arg-type]
    assert states == []


def test_a_replica_its_server_could_not_delete_fails_the_command_with_the_servers_words(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted["answers"] = [
        _group(("ts1", "ts2", "ts3"), commit=21, config=1),
        _group(("ts1", "ts3"), commit=22, config=22),
    ]
    why = "the replica of kv-p0 on ts2 was not deleted: /d/ts2/kv-p0/wal: Operation not permitted"

    def refuse(*_a: Any, **_k: Any) -> None:
        raise _Refused(grpc.StatusCode.FAILED_PRECONDITION, why)

    monkeypatch.setattr(membership, "_delete_replica", refuse)
    with pytest.raises(ReplicaNotDeleted) as failed:
        remove_replica(None, "kv-p0", "ts2", timeout_s=5.0)  # type: ignore[arg-type]
    assert str(failed.value) == f"ts2 left the group (voters ts1, ts3), but {why}"
    assert failed.value.membership.voters == ("ts1", "ts3")


def test_a_replica_on_a_server_that_is_down_is_left_for_later_and_the_removal_succeeds(
    scripted: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted["answers"] = [
        _group(("ts1", "ts2", "ts3"), commit=21, config=1),
        _group(("ts1", "ts3"), commit=22, config=22),
    ]

    def down(*_a: Any, **_k: Any) -> None:
        raise _Refused(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")

    monkeypatch.setattr(membership, "_delete_replica", down)
    said: list[str] = []
    m = remove_replica(None, "kv-p0", "ts2", timeout_s=5.0, say=said.append)  # type: ignore[arg-type]
    assert m.voters == ("ts1", "ts3")
    assert "(UNAVAILABLE: failed to connect to all addresses)" in said[-1], said
    assert "once ts2 is up, `raftlet tablet remove-replica kv-p0 ts2` deletes it" in said[-1]


def test_replace_server_moves_every_replica_and_then_names_those_it_could_not_delete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    groups = {
        tid: TabletMembership(tid, "ts1", 2, ("ts1", "ts2", "ts5"), (), 9, 9)
        for tid in ("kv-p0", "kv-p1")
    }
    client = SimpleNamespace(
        list_tablets=lambda **_k: _listing(
            {"ts1": ["kv-p0", "kv-p1"], "ts2": ["kv-p0", "kv-p1"], "ts3": []}
            | {"ts5": ["kv-p0", "kv-p1"]}
        ),
        tablets=lambda _table: ["kv-p0", "kv-p1"],
        tables=lambda: ["kv"],
        replication_factor=lambda _table: 3,
    )
    moves: list[str] = []

    def move(_c: Any, tablet: str, source: str, target: str, **_k: Any) -> None:
        moves.append(tablet)
        if tablet == "kv-p0":
            raise ReplicaNotDeleted("ts5 left the group, but ... not deleted: wal", groups[tablet])

    monkeypatch.setattr(membership, "_check_server", lambda _client, _server: None)
    monkeypatch.setattr(membership, "leader_membership", lambda _c, tid, _t: groups[tid])
    monkeypatch.setattr(membership, "move_replica", move)
    with pytest.raises(
        RemoteError, match=r"^kv-p0: ts5 left the group, .*wal \(moved: kv-p0, kv-p1\)$"
    ):
        membership.replace_server(client, "ts5")  # type: ignore[arg-type]
    assert moves == ["kv-p0", "kv-p1"]  # the second moved after the first's failure


def _lost_majority_client(failed: tuple[str, ...]) -> Any:
    """Servers ts1..ts3 listing kv-p0, those in ``failed`` FAILED (they failed to open), and
    no leader anywhere."""

    def listed(uuid: str) -> tablet_pb2.ListTabletsResponse:
        response = tablet_pb2.ListTabletsResponse(server_uuid=uuid)
        if uuid in failed:
            response.tablets.add(
                tablet_id="kv-p0",
                state=tablet_pb2.TABLET_STATE_FAILED,
                role=consensus_pb2.ROLE_UNKNOWN,
                failure_reason=f"OSError: [Errno 1] Operation not permitted: '/d/{uuid}/wal'",
            )
        else:
            response.tablets.add(
                tablet_id="kv-p0", role=consensus_pb2.FOLLOWER, term=3, voters=["ts1", "ts2", "ts3"]
            )
        return response

    return SimpleNamespace(
        replicas=lambda _tablet: ["ts1", "ts2", "ts3"],
        leader_of=lambda _tablet, refresh=False: None,
        list_tablets=lambda timeout_s=None: {u: listed(u) for u in ("ts1", "ts2", "ts3")},
    )


def test_a_tablet_whose_majority_is_failed_fails_the_command_fast_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It printed nothing for 120 s, then "timed out waiting for a ready leader"."""
    monkeypatch.setattr(membership, "_LEADERLESS_CHECK_S", 0.0)
    started = time.monotonic()
    with pytest.raises(RemoteError) as lost:
        membership.leader_membership(_lost_majority_client(("ts1", "ts2")), "kv-p0", 60.0)
    assert time.monotonic() - started < 10
    message = str(lost.value)
    assert message.startswith("kv-p0 has lost a majority of its replicas: 2 of its 3 voters")
    assert "/d/ts1/wal" in message
    assert "no membership change" in message
    assert "Restore the FAILED replicas' files" in message
    # One FAILED of three: an election may be under way; the wait goes on.
    with pytest.raises(Timeout, match="a ready leader of kv-p0"):
        membership.leader_membership(_lost_majority_client(("ts1",)), "kv-p0", 0.5)


def test_a_wait_for_a_leader_that_times_out_names_the_voters_that_do_not_answer() -> None:
    """A two-voter group with one voter down has no leader: the membership commands waited
    out their timeout and said only "timed out waiting for a ready leader"."""
    client = _lost_majority_client(())
    everyone = client.list_tablets
    client.list_tablets = lambda timeout_s=None: {u: a for u, a in everyone().items() if u == "ts1"}
    with pytest.raises(Timeout) as waited:
        membership.leader_membership(client, "kv-p0", 0.3)
    assert str(waited.value) == (
        "timed out waiting for a ready leader of kv-p0: 2 of its 3 voters do not answer "
        "(ts2, ts3), and a group elects a leader only with a majority of its voters -- start "
        "them again (`raftlet cluster status` shows which servers are down); no membership "
        "change can work without a leader"
    )
    # A minority silent: an election may be under way, nothing more to say.
    client.list_tablets = lambda timeout_s=None: {u: a for u, a in everyone().items() if u != "ts3"}
    with pytest.raises(Timeout) as waited:
        membership.leader_membership(client, "kv-p0", 0.3)
    assert str(waited.value) == "timed out waiting for a ready leader of kv-p0"


def test_a_replica_another_operator_just_added_is_not_called_a_leftover(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two moves onto ts1 at once: the loser said ts1's replica was a leftover and that
    remove-replica deletes it -- which would have left the tablet a voter short."""

    def create(*_a: Any, **_k: Any) -> None:
        raise _Refused(
            grpc.StatusCode.INVALID_ARGUMENT, "server ts1 already holds a replica of kv-p0"
        )

    client = SimpleNamespace(admin_stub=lambda _server: SimpleNamespace(CreateReplica=create))
    before = _group(("ts2", "ts3", "ts5"), 20, 20)
    joined = _group(("ts1", "ts2", "ts3", "ts5"), 30, 30)
    for now, said in ((joined, "ts1 joined kv-p0's group meanwhile"), (before, "a leftover")):
        monkeypatch.setattr(membership, "leader_membership", lambda *_a, now=now: now)
        with pytest.raises(InvalidArgument, match=said):
            membership._create_replica(client, "kv-p0", "ts1", before, 5.0)  # type: ignore[arg-type]


class _Denied(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.PERMISSION_DENIED

    def details(self) -> str:
        return "/raftlet.AdminService/GetConsensusStatus needs role admin; reader 'rd' may not"


class _Unverified(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7050: "
            "Ssl handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL "
            "routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED"
        )


@pytest.mark.parametrize(
    ("error", "starts", "names"),
    [
        # A reader's remove-replica polled its refusals for its whole timeout (120 s), then
        # said "timed out waiting for a ready leader" of a tablet that had one.
        (
            _Denied,
            "ts1 refused to show kv-p0's Raft state: PERMISSION_DENIED: ",
            "needs role admin",
        ),
        # Review r26v: with another CA's --tls-ca, add-replica polled for 30 s and said
        # "timed out", where scan, write and leader-step-down failed at once.
        (
            _Unverified,
            "this client could not verify ts1's certificate (is its CA, ",
            "CERTIFICATE_VERIFY_FAILED",
        ),
    ],
)
def test_a_membership_command_the_server_refuses_fails_at_once(
    monkeypatch: pytest.MonkeyPatch, error: type[grpc.RpcError], starts: str, names: str
) -> None:
    """Every membership command (add, remove, move, cluster replace-server) finds the
    leader's membership this way: a refusal that will not change is not polled."""
    client = SimpleNamespace(replicas=lambda _t: ("ts1",), leader_of=lambda _t, refresh: "ts1")
    asked: list[str] = []

    def refused(_c: Any, server: str, _t: str, _timeout: float) -> Any:
        asked.append(server)
        raise error()

    monkeypatch.setattr(membership, "_state", refused)
    with pytest.raises(RemoteError) as caught:
        membership.leader_membership(client, "kv-p0", timeout_s=60.0)  # type: ignore[arg-type]
    assert asked == ["ts1"]  # asked once: no polling of a refusal
    said = str(caught.value)
    assert said.startswith(starts)
    assert names in said
