"""``tserver.peer_contact``: a peer sent messages that sends none back is named in the log,
once after a quiet spell and again at long intervals; its return is said once."""

from __future__ import annotations

import logging

import pytest

from raftlet.tserver.peer_contact import PeerContact

LOGGER = "raftlet.tserver.peer_contact"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def contact(clock: Clock) -> PeerContact:
    return PeerContact(
        {"ts2": "127.0.0.1:7051", "ts3": "127.0.0.1:7052"}, quiet_s=10, repeat_s=60, clock=clock
    )


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    out = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]
    caplog.clear()
    return out


def intervals(
    contact: PeerContact, clock: Clock, n: int, *, asked: tuple[str, ...], heard: tuple[str, ...]
) -> None:
    """``n`` check intervals of 2 s, each with these marks."""
    for _ in range(n):
        for sid in asked:
            contact.asked(sid)
        for sid in heard:
            contact.heard(sid)
        clock.now += 2
        contact.check()


def test_a_peer_that_answers_is_never_named(
    contact: PeerContact, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    intervals(contact, clock, 30, asked=("ts2", "ts3"), heard=("ts2", "ts3"))
    assert lines(caplog) == []
    assert contact.silent_for("ts2") is None


def test_an_answer_in_the_next_interval_is_no_silence(
    contact: PeerContact, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """An answer that crosses an interval's end clears the count it began."""
    caplog.set_level(logging.INFO, LOGGER)
    for _ in range(30):
        intervals(contact, clock, 1, asked=("ts2",), heard=())
        intervals(contact, clock, 1, asked=(), heard=("ts2",))
    assert lines(caplog) == []


def test_a_silent_peer_is_named_after_the_quiet_spell_then_at_the_repeat_interval(
    contact: PeerContact, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    intervals(contact, clock, 4, asked=("ts2", "ts3"), heard=("ts3",))
    assert lines(caplog) == []  # 8 s: not yet
    intervals(contact, clock, 1, asked=("ts2", "ts3"), heard=("ts3",))
    [(level, message)] = lines(caplog)
    assert level == logging.WARNING
    assert message.startswith("peer ts2 (127.0.0.1:7051) has not answered for 10 s")
    assert "`raftlet cluster status`" in message
    assert contact.silent_for("ts2") == 10
    intervals(contact, clock, 29, asked=("ts2", "ts3"), heard=("ts3",))
    assert lines(caplog) == []  # 68 s: within the repeat interval
    intervals(contact, clock, 1, asked=("ts2", "ts3"), heard=("ts3",))
    [(level, message)] = lines(caplog)
    assert level == logging.WARNING
    assert "has not answered for 70 s" in message
    intervals(contact, clock, 1, asked=("ts2", "ts3"), heard=("ts2", "ts3"))
    [(level, message)] = lines(caplog)
    assert level == logging.INFO
    assert message == "peer ts2 (127.0.0.1:7051) answers again, after 72 s without an answer"
    assert contact.silent_for("ts2") is None


def test_silence_while_nothing_is_sent_is_not_held_against_a_peer(
    contact: PeerContact, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A follower's fellow followers: never asked, never heard.  And a peer asked once, then
    left alone for a long time, is judged afresh when asked again."""
    caplog.set_level(logging.INFO, LOGGER)
    intervals(contact, clock, 30, asked=(), heard=())
    intervals(contact, clock, 1, asked=("ts2",), heard=())
    intervals(contact, clock, 30, asked=(), heard=())
    intervals(contact, clock, 1, asked=("ts2",), heard=())
    intervals(contact, clock, 1, asked=(), heard=("ts2",))
    assert lines(caplog) == []


def test_a_peer_missing_from_the_addresses_is_still_named(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    contact = PeerContact({}, quiet_s=4, clock=clock)
    caplog.set_level(logging.INFO, LOGGER)
    intervals(contact, clock, 2, asked=("ts9",), heard=())
    [(_, message)] = lines(caplog)
    assert message.startswith("peer ts9 (address unknown) has not answered for 4 s")


def test_a_warned_peer_nothing_is_sent_to_any_more_gets_a_last_line(
    contact: PeerContact, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Its replicas moved off (`cluster replace-server`): no answer will come, so the
    warning is closed by a line of its own rather than left standing."""
    caplog.set_level(logging.INFO, LOGGER)
    intervals(contact, clock, 5, asked=("ts2",), heard=())
    [(level, _)] = lines(caplog)
    assert level == logging.WARNING
    intervals(contact, clock, 1, asked=(), heard=())
    [(level, message)] = lines(caplog)
    assert level == logging.INFO
    assert message == (
        "peer ts2 (127.0.0.1:7051): this server has stopped sending it anything (no group "
        "here needs it now), after 12 s without an answer; its silence is no longer watched"
    )
    intervals(contact, clock, 3, asked=(), heard=())
    assert lines(caplog) == []
    assert contact.silent_for("ts2") is None
