"""A server that starts with an empty data directory: the peers' record of the servers they
heard from (``tserver.servers_heard``), and what the server reads from their answers
(``tserver.empty_start``) -- new, or wiped while it was a member."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from raftlet.proto import tablet_pb2
from raftlet.tserver import servers_heard
from raftlet.tserver.empty_start import read_peers
from raftlet.tserver.servers_heard import SERVERS_HEARD_FILE, ServersHeard


def _loaded(data_dir: Path, peers: tuple[str, ...] = ("ts2", "ts3")) -> ServersHeard:
    record = ServersHeard(data_dir, peers)
    record.load()
    return record


def test_a_peer_heard_from_is_on_disk_once_and_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = _loaded(tmp_path)
    assert record.heard == frozenset()
    record.note("ts2")
    assert _loaded(tmp_path).heard == {"ts2"}
    # Heard again, nothing is written: what a message costs is a set lookup.
    monkeypatch.setattr(
        servers_heard, "replace_durably", lambda *_a: pytest.fail("wrote the record again")
    )
    record.note("ts2")
    # A name that is no peer of the config (a message's claimed sender) is not recorded.
    record.note("ts9")
    record.note("")
    assert _loaded(tmp_path).heard == {"ts2"}


def test_the_record_only_grows_across_restarts(tmp_path: Path) -> None:
    _loaded(tmp_path).note("ts2")
    again = _loaded(tmp_path)
    again.note("ts3")
    assert _loaded(tmp_path).heard == {"ts2", "ts3"}


def test_a_peers_record_is_taken_in_whole_less_what_is_no_peer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the leader heard (the other follower, say) is taken in by a follower that never
    hears from that follower itself; its own name and unknown names are left out."""
    record = _loaded(tmp_path)
    record.note_all(["ts3", "ts1", "ts9"])  # ts1: this server itself (no peer of its own)
    assert _loaded(tmp_path).heard == {"ts3"}
    monkeypatch.setattr(
        servers_heard, "replace_durably", lambda *_a: pytest.fail("wrote the record again")
    )
    record.note_all(["ts3"])
    record.note_all([])


def test_a_record_that_cannot_be_read_starts_empty_and_is_written_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / SERVERS_HEARD_FILE
    for text in ("{not json", '{"servers": "ts2"}', "[1, 2]"):
        path.write_text(text)
        with caplog.at_level(logging.WARNING):
            record = _loaded(tmp_path)
        assert record.heard == frozenset()
        assert str(path) in caplog.text
        caplog.clear()
    record.note("ts3")
    assert _loaded(tmp_path).heard == {"ts3"}


def test_a_record_that_cannot_be_written_is_logged_and_the_peer_still_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    record = _loaded(tmp_path / "gone")  # its directory does not exist: the write fails
    with caplog.at_level(logging.WARNING):
        record.note("ts2")
    assert "not recorded that ts2 ran" in caplog.text
    assert record.heard == {"ts2"}  # not tried again for every message


def _listing(
    server: str, heard: tuple[str, ...], *groups: tuple[str, tuple[str, ...]]
) -> tablet_pb2.ListTabletsResponse:
    answer = tablet_pb2.ListTabletsResponse(server_uuid=server, servers_heard_from=heard)
    for tablet, voters in groups:
        answer.tablets.add(tablet_id=tablet, voters=voters)
    return answer


def test_a_server_no_peer_heard_from_is_new() -> None:
    view = read_peers(
        "ts3",
        ["kv-p0", "kv-p1"],
        [
            _listing("ts1", ("ts2",), ("kv-p0", ("ts1", "ts2", "ts3"))),
            _listing("ts2", ("ts1",), ("kv-p0", ("ts1", "ts2", "ts3"))),
        ],
    )
    assert view.heard_by == frozenset()
    assert view.with_me == {"kv-p0"}
    assert view.without_me == frozenset()


def test_a_server_a_peer_heard_from_was_wiped() -> None:
    view = read_peers(
        "ts3",
        ["kv-p0"],
        [
            _listing("ts1", ("ts2",)),
            # ts2 heard from ts3: ts3 voted or acknowledged before, whatever ts1 says.
            _listing("ts2", ("ts1", "ts3"), ("kv-p0", ("ts1", "ts2", "ts3"))),
            # A tablet moved onto ts3 by move-replica is one of its groups too.
            _listing("ts4", ("ts3",), ("kv-p7", ("ts3", "ts4", "ts5"))),
        ],
    )
    assert view.heard_by == {"ts2", "ts4"}
    assert view.with_me == {"kv-p0", "kv-p7"}


def test_a_group_any_peer_lists_without_the_server_is_not_joined(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        view = read_peers(
            "ts3",
            ["kv-p0", "kv-p1"],
            [
                # ts1 lags behind the move that took kv-p0 and kv-p9 off ts3; ts2 has it.
                _listing("ts1", ("ts3",), ("kv-p0", ("ts1", "ts2", "ts3")), ("kv-p9", ("ts3",))),
                _listing("ts2", ("ts3",), ("kv-p0", ("ts1", "ts2", "ts4")), ("kv-p9", ("ts4",))),
            ],
        )
    assert view.without_me == {"kv-p0"}  # placed here: said so
    assert view.with_me == frozenset()  # kv-p9 is not one of its groups either
    assert "tablet kv-p0: placed here, but its group runs on other servers" in caplog.text
    assert "kv-p9" not in caplog.text
