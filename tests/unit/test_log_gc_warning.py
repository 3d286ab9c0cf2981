"""``tserver.log_gc``: GC that goes past what a voter holds (``--log_max_segments_retained``)
is said once in the log, since that voter will need a tablet copy -- before, it went by
without a word -- and said again only after that voter has caught up and fallen behind anew."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from raftlet.consensus.log import Log, LogOptions
from raftlet.tserver.log_gc import LogGc
from tests.unit.wal_helpers import entries

LOGGER = "raftlet.tserver.log_gc"
SMALL = LogOptions(segment_size_bytes=600, fsync=False)


class FlushedStore:
    """The part of a store log GC uses: everything is flushed up to ``index``."""

    def __init__(self) -> None:
        self.index = 0

    def flush(self) -> int:
        return self.index


def grow(log: Log, store: FlushedStore, last: int, n: int = 80) -> int:
    """``n`` more entries, one record each (a record never spans segments), all flushed."""
    for e in entries(last + 1, last + n + 1):
        log.append([e])
    store.index = last + n
    return last + n


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    out = [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING
    ]
    caplog.clear()
    return out


def test_gc_past_a_voter_is_said_once_per_time_it_falls_behind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    store = FlushedStore()
    held = [0]  # what every voter holds: one is down from the start
    with Log.open(tmp_path, SMALL) as log:
        gc = LogGc(
            "kv-p0",
            log,
            store,
            lambda: held[0],
            interval_s=0,
            max_segments=2,  # type: ignore[arg-type]
        )
        last = 0
        for _ in range(3):
            last = grow(log, store, last)
            assert gc.collect() > 0
        [message] = warnings(caplog)  # three passes went past it, one line
        assert message.startswith("kv-p0: log GC discarded entries a voter lacks (every voter ")
        assert "held up to 0; the log now starts at " in message
        assert "--log_max_segments_retained" in message
        assert "tablet copy" in message

        # The voter comes back by a tablet copy and keeps up for a while; then it stops again.
        for _ in range(2):
            last = grow(log, store, last)
            held[0] = last
            assert gc.collect() > 0
        assert warnings(caplog) == []  # GC below what every voter holds: nothing to say
        for _ in range(3):
            last = grow(log, store, last)
            gc.collect()
        [message] = warnings(caplog)
        assert f"held up to {held[0]};" in message


def test_gc_below_what_every_voter_holds_says_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    store = FlushedStore()
    with Log.open(tmp_path, SMALL) as log:
        last = grow(log, store, 0, 120)
        gc = LogGc("kv-p0", log, store, lambda: last, interval_s=0, max_segments=2)  # type: ignore[arg-type]
        assert gc.collect() > 0
    assert warnings(caplog) == []


def test_a_leader_names_the_voters_that_will_need_a_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A leader knows each voter's match: the line names the one(s) left behind."""
    caplog.set_level(logging.INFO, LOGGER)
    store = FlushedStore()
    asked: list[int] = []

    def behind(index: int) -> list[str]:
        asked.append(index)
        return ["ts3"]

    with Log.open(tmp_path, SMALL) as log:
        gc = LogGc(
            "kv-p0",
            log,
            store,  # type: ignore[arg-type]
            lambda: 0,
            interval_s=0,
            max_segments=2,
            voters_behind=behind,
        )
        grow(log, store, 0, 160)
        assert gc.collect() > 0
        [message] = warnings(caplog)
        assert asked == [log.first_index()]
    assert message.startswith("kv-p0: log GC discarded entries ts3 lacks (every voter held ")
    assert message.endswith("ts3, down or far behind, will need a tablet copy to catch up")
