"""``Config.max_applying_bytes``: committed entries are handed out for applying no faster
than the state machine reports them applied. A follower back from an outage was handed its
whole backlog in one Ready (review r31a: 93 -> 459 MiB for 225,000 entries of 2 KB)."""

from __future__ import annotations

import pytest

from raftlet.consensus.core import Entry
from raftlet.consensus.core.config import Config, RaftConfigError
from raftlet.consensus.core.raft_log import RaftLog
from raftlet.consensus.core.storage import MemoryStorage

DATA = b"x" * 976  # Entry.size() is 1,000 bytes


def _log(cap: int, n: int = 100) -> RaftLog:
    """A log of ``n`` durable, committed entries, none applied."""
    storage = MemoryStorage()
    storage.append([Entry(term=1, index=i, data=DATA) for i in range(1, n + 1)])
    log = RaftLog(storage, committed=0, applied=0, max_applying_bytes=cap)
    log.commit_to(n)
    return log


def test_entries_are_handed_out_as_room_is_freed_by_what_was_applied() -> None:
    log = _log(cap=10_000)
    first = log.committed_to_apply()
    assert [e.index for e in first] == list(range(1, 11))  # 10 of 1,000 bytes
    assert log.applying_bytes == 10_000
    assert not log.has_committed_to_apply()
    assert log.committed_to_apply() == []
    log.applied_to(4)  # part of the first hand-out is not room yet: it was handed as one
    assert not log.has_committed_to_apply()
    log.applied_to(10)
    assert (log.applying_bytes, log.has_committed_to_apply()) == (0, True)
    assert [e.index for e in log.committed_to_apply()] == list(range(11, 21))
    handed = 20
    while log.has_committed_to_apply() or log.applied < handed:
        log.applied_to(handed)
        out = log.committed_to_apply()
        handed = out[-1].index if out else handed
    assert (log.applied, log.applying, log.applying_bytes) == (100, 100, 0)


def test_one_entry_larger_than_the_cap_is_still_handed_out_alone() -> None:
    log = _log(cap=500, n=3)
    assert [e.index for e in log.committed_to_apply()] == [1]
    assert log.committed_to_apply() == []
    log.applied_to(1)
    assert [e.index for e in log.committed_to_apply()] == [2]


def test_without_a_cap_everything_committed_is_handed_out_at_once() -> None:
    log = _log(cap=0)
    assert len(log.committed_to_apply()) == 100
    assert log.applying_bytes == 0


def test_a_negative_cap_is_refused() -> None:
    with pytest.raises(RaftConfigError, match="max_applying_bytes"):
        Config(id="a", voters=["a"], max_applying_bytes=-1).validate()
