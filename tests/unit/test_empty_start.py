"""A server that starts with an empty data directory: the peers' record of the servers they
heard from (``tserver.servers_heard``), and what the server reads from their answers
(``tserver.empty_start``) -- new, or wiped while it was a member."""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

import pytest

from raftlet.proto import tablet_pb2
from raftlet.tserver import servers_heard
from raftlet.tserver.empty_start import can_decide, gather_answers, read_peers
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
    # Where a FAILED replica of kv-p7, a group off its placement, looks for a copy.
    assert view.voters == {"kv-p0": ("ts1", "ts2", "ts3"), "kv-p7": ("ts3", "ts4", "ts5")}


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


class _Peers:
    """Peers that start answering at given times of a fake clock."""

    def __init__(self, answers_from: dict[str, tuple[float, tuple[str, ...]]]) -> None:
        self.now = 0.0
        self.asked: list[tuple[float, list[str]]] = []
        self._from = answers_from  # id -> (time it starts answering, the servers it heard)

    def ask(self, ids: Collection[str]) -> dict[str, tablet_pb2.ListTabletsResponse]:
        self.asked.append((self.now, sorted(ids)))
        return {
            sid: _listing(sid, heard)
            for sid, (since, heard) in self._from.items()
            if sid in ids and self.now >= since
        }

    def sleep(self, seconds: float) -> None:
        assert 0 < seconds <= 1.0
        self.now += seconds


def _gather(peers: _Peers, wait_s: float) -> list[str]:
    answers = gather_answers(
        "ts1", ["ts2", "ts3"], peers.ask, wait_s, clock=lambda: peers.now, sleep=peers.sleep
    )
    return sorted(a.server_uuid for a in answers)


def test_every_peer_answering_at_once_ends_the_wait_at_once() -> None:
    peers = _Peers({"ts2": (0, ()), "ts3": (0, ())})
    assert _gather(peers, 30) == ["ts2", "ts3"]
    assert peers.asked == [(0, ["ts2", "ts3"])]


def test_a_peer_that_heard_from_the_server_decides_it_without_the_others() -> None:
    peers = _Peers({"ts2": (3, ("ts1",))})  # ts3 never answers
    assert _gather(peers, 30) == ["ts2"]
    assert peers.now == 3  # asked once a second until ts2 answered, then no more


def test_peers_that_boot_late_are_waited_for_and_only_the_missing_asked_again() -> None:
    """A power cut: the wiped server boots first, its peers some seconds later."""
    peers = _Peers({"ts2": (4, ()), "ts3": (7, ())})
    assert _gather(peers, 30) == ["ts2", "ts3"]
    assert peers.now == 7
    assert peers.asked[5] == (5, ["ts3"])


def test_no_answer_within_the_wait_decides_nothing_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The caller then makes no replica until a peer answers (``_ask_peers`` is None)."""
    peers = _Peers({})
    with caplog.at_level(logging.WARNING):
        assert _gather(peers, 5) == []
    assert peers.now == 5
    assert "waiting up to 5 s for ts2, ts3 to answer" in caplog.text
    assert "none of ts2, ts3 answered within 5 s: no replica is made until one does" in (
        caplog.text
    )


def test_peers_that_did_not_answer_are_named_when_the_others_decide(
    caplog: pytest.LogCaptureFixture,
) -> None:
    peers = _Peers({"ts2": (0, ())})
    with caplog.at_level(logging.WARNING):
        assert _gather(peers, 5) == ["ts2"]
    assert peers.now == 5  # one of two is no majority: it waited for the other
    assert (
        "ts3 did not answer: this server is taken for a new one on the word of ts2, which "
        "never heard from it"
    ) in caplog.text


def test_a_majority_of_the_peers_answering_ends_the_wait() -> None:
    """Servers added together: each would wait out the whole wait for the others, which
    answer nobody until they decide."""
    peers = _Peers({"ts2": (0, ()), "ts3": (0, ()), "ts4": (0, ())})  # ts5 is added too
    answers = gather_answers(
        "ts1",
        ["ts2", "ts3", "ts4", "ts5"],
        peers.ask,
        30,
        clock=lambda: peers.now,
        sleep=peers.sleep,
    )
    assert sorted(a.server_uuid for a in answers) == ["ts2", "ts3", "ts4"]
    assert peers.now == 0


def test_no_wait_asks_once_and_warns_of_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """0: the caller makes a new cluster whose servers start one at a time."""
    peers = _Peers({})
    with caplog.at_level(logging.WARNING):
        assert _gather(peers, 0) == []
    assert peers.asked == [(0, ["ts2", "ts3"])]
    assert caplog.text == ""


def test_a_stop_ends_the_wait_at_once_without_a_verdict(caplog: pytest.LogCaptureFixture) -> None:
    """A signal while the server waits: it returns after the sleep the stop woke, and says
    nothing of a decision (the caller makes nothing)."""
    peers = _Peers({})
    stop_after = [2]

    def stopped() -> bool:
        return peers.now >= stop_after[0]

    with caplog.at_level(logging.WARNING):
        answers = gather_answers(
            "ts1",
            ["ts2", "ts3"],
            peers.ask,
            30,
            clock=lambda: peers.now,
            sleep=peers.sleep,
            stopped=stopped,
        )
    assert answers == []
    assert peers.now == 2
    assert "no replica is made" not in caplog.text


def _wiped(sid: str, heard: tuple[str, ...] = ()) -> tablet_pb2.ListTabletsResponse:
    listing = _listing(sid, heard)
    listing.wiped_at_start = True
    return listing


def test_a_peer_wiped_itself_does_not_tell_a_new_server(caplog: pytest.LogCaptureFixture) -> None:
    """Two servers of three wiped at once, in a new cluster's first seconds (before the
    followers shared whom they heard from): the one that had led came back wiped, and the
    other was taken for new on its word and a lagging follower's, then elected that
    follower -- every acknowledged row lost, `cluster up` OK."""
    lagging, leader_wiped = _listing("ts3", ()), _wiped("ts2")
    assert not can_decide("ts1", 2, [lagging, leader_wiped], waited=True)
    assert not can_decide("ts1", 2, [leader_wiped], waited=True)
    assert can_decide("ts1", 2, [lagging], waited=True)  # a peer down, not wiped: as before
    assert can_decide("ts1", 2, [_wiped("ts2", ("ts1",))], waited=False)  # it heard it since
    others = [_listing(s, ()) for s in ("ts3", "ts4", "ts5")]
    assert can_decide("ts1", 4, [_wiped("ts2"), *others], waited=False)  # a majority besides

    class WipedTs2(_Peers):
        def ask(self, ids: Collection[str]) -> dict[str, tablet_pb2.ListTabletsResponse]:
            answers = super().ask(ids)
            if "ts2" in answers:
                answers["ts2"].wiped_at_start = True
            return answers

    peers = WipedTs2({"ts2": (0, ()), "ts3": (0, ())})
    with caplog.at_level(logging.WARNING):
        answers = gather_answers(
            "ts1", ["ts2", "ts3"], peers.ask, 5, clock=lambda: peers.now, sleep=peers.sleep
        )
    assert peers.now == 5  # it waited for a majority of peers that were not wiped
    assert not can_decide("ts1", 2, answers, waited=True)  # so the server makes nothing
    assert "ts2 started from a wiped data directory" in caplog.text
    assert "no majority of the peers not wiped themselves answered" in caplog.text
