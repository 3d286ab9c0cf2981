"""The source side of tablet copy: sessions on a store snapshot, bounded -- one per
(tablet, requester), idle ones expire -- and every end reported to the leader's core once,
with where the requester now is."""

from __future__ import annotations

from pathlib import Path

import crc32c
import pytest

from raftlet.consensus.core import NotLeaderError
from raftlet.tserver.errors import CopySessionNotFound, InvalidRequest
from raftlet.tserver.tablet_copy_install import SnapshotInfo
from raftlet.tserver.tablet_copy_source import CopySessions


class FakeReplica:
    def __init__(self) -> None:
        self.reports: list[tuple[str, bool, int]] = []
        self.leader = True

    def copy_snapshot(self, dest: Path) -> SnapshotInfo:
        if not self.leader:
            raise NotLeaderError("b", 7)
        dest.write_bytes(b"snapshot-bytes" * 1000)
        return SnapshotInfo(40, 3, 7, ("a", "b", "c"), ("d",), 12)

    def report_copy(self, peer: str, ok: bool, index: int) -> None:
        self.reports.append((peer, ok, index))

    def has_member(self, server_id: str) -> bool:
        return server_id in ("a", "b", "c", "d")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _sessions(tmp_path: Path) -> tuple[CopySessions, FakeReplica, Clock, list[str]]:
    replica, clock, ended = FakeReplica(), Clock(), []
    sessions = CopySessions(
        tmp_path, lambda _t: replica, idle_timeout_s=10, on_ended=ended.append, clock=clock
    )
    return sessions, replica, clock, ended


def test_a_session_serves_its_snapshot_in_chunks_and_reports_its_end(tmp_path: Path) -> None:
    sessions, replica, _, ended = _sessions(tmp_path)
    s = sessions.begin("t1", "c")
    assert (s.index, s.term, s.source_term, s.voters) == (40, 3, 7, ("a", "b", "c"))
    assert (s.learners, s.config_index) == (("d",), 12)
    data = b"".join(sessions.fetch(s.session_id, off, 4096, "c") for off in range(0, s.size, 4096))
    assert crc32c.crc32c(data) == s.crc
    assert len(data) == s.size
    # Another server cannot use it.
    with pytest.raises(CopySessionNotFound):
        sessions.fetch(s.session_id, 0, 10, "b")
    # The requester found it held more already: the core learns that index.
    sessions.end(s.session_id, True, "c", installed_index=55)
    assert replica.reports == [("c", True, 55)]
    assert ended == ["installed"]
    assert not s.path.exists()
    with pytest.raises(CopySessionNotFound):
        sessions.fetch(s.session_id, 0, 10, "c")


def test_a_new_begin_replaces_the_requesters_old_session(tmp_path: Path) -> None:
    sessions, replica, _, ended = _sessions(tmp_path)
    old = sessions.begin("t1", "c")
    new = sessions.begin("t1", "c")
    assert sessions.active() == 1
    assert not old.path.exists()
    assert new.path.exists()
    assert replica.reports == []  # not an end: the copy goes on in the new session
    assert ended == ["replaced"]


def test_a_follower_that_died_mid_copy_is_asked_and_served_again_at_once(tmp_path: Path) -> None:
    """A learner killed mid-copy was back in 18 s, but its next copy began only when its
    abandoned session expired (60 s): the leader would not ask a peer with a session."""
    sessions, replica, clock, ended = _sessions(tmp_path)
    assert sessions.await_begin("t1", "c")
    old = sessions.begin("t1", "c")
    sessions.fetch(old.session_id, 0, 4096, "c")
    # c dies without ending the session; back well within the timeout, the core asks again.
    clock.now = 3
    assert sessions.await_begin("t1", "c")
    assert not sessions.await_begin("t1", "c")  # still one request at a time
    new = sessions.begin("t1", "c")
    assert sessions.active() == 1
    assert not old.path.exists()
    assert ended == ["replaced"]
    assert sessions.fetch(new.session_id, 0, 10, "c")
    with pytest.raises(CopySessionNotFound):  # the old one is gone for good
        sessions.fetch(old.session_id, 4096, 10, "c")
    sessions.end(new.session_id, True, "c")
    assert replica.reports == [("c", True, 40)]  # one end, no failure for the dead session
    clock.now = 100
    assert sessions.expire() == 0


def test_a_peer_asked_again_while_it_copies_is_not_reported_late(tmp_path: Path) -> None:
    sessions, replica, clock, ended = _sessions(tmp_path)
    s = sessions.begin("t1", "c")
    assert sessions.await_begin("t1", "c")  # c answers that its copy is under way
    for now in (6.0, 12.0):  # the request's deadline passes; the session stays in use
        clock.now = now
        sessions.fetch(s.session_id, 0, 10, "c")
        assert sessions.expire() == 0
    assert replica.reports == []
    sessions.end(s.session_id, False, "c")
    assert replica.reports == [("c", False, 40)]
    assert ended == ["failed"]
    assert sessions.await_begin("t1", "c")  # that end answered the request


def test_idle_sessions_and_copies_never_begun_expire_as_failed(tmp_path: Path) -> None:
    sessions, replica, clock, ended = _sessions(tmp_path)
    s = sessions.begin("t1", "c")
    assert sessions.await_begin("t1", "b")
    assert not sessions.await_begin("t1", "b")  # one request at a time
    clock.now = 5
    sessions.fetch(s.session_id, 0, 10, "c")  # a call keeps it alive
    clock.now = 12
    assert sessions.expire() == 1  # b never began
    assert replica.reports == [("b", False, 0)]
    clock.now = 16
    assert sessions.expire() == 1  # c went quiet
    assert replica.reports[-1] == ("c", False, 0)
    assert ended == ["expired"]
    assert not s.path.exists()


def test_only_a_leader_serves_a_copy(tmp_path: Path) -> None:
    sessions, replica, _, _ = _sessions(tmp_path)
    replica.leader = False
    with pytest.raises(NotLeaderError):
        sessions.begin("t1", "c")
    assert sessions.active() == 0
    assert list((tmp_path / ".tablet-copy").iterdir()) == []


def test_a_server_that_is_no_member_gets_no_copy(tmp_path: Path) -> None:
    """A server removed from the group whose replica was FAILED once copied the tablet
    back and ran it, a replica of a group it was no longer in."""
    sessions, _, _, _ = _sessions(tmp_path)
    with pytest.raises(InvalidRequest, match="e is no member of tablet t1's group"):
        sessions.begin("t1", "e")
    assert list(tmp_path.rglob("*")) == []  # no snapshot was taken for it


def test_a_source_that_cannot_write_its_snapshot_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk on the leader: the requester heard "internal server error (StoreError)"
    and the leader logged a traceback; now UNAVAILABLE with the reason, nothing left."""
    import errno

    from raftlet.tserver.errors import ServiceUnavailable

    sessions, replica, _, _ = _sessions(tmp_path)

    def full(dest: Path) -> SnapshotInfo:
        dest.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(replica, "copy_snapshot", full)
    with pytest.raises(ServiceUnavailable, match=r"t1: this server cannot make a copy: .*No space"):
        sessions.begin("t1", "c")
    assert sessions.active() == 0
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
