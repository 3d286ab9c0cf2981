"""``tserver.log_gc``: ``--log_max_segments_retained`` holds between the passes of
``--log_gc_interval_s``. Before, GC ran only at the interval, so a log taking segments faster
held the cap plus what one interval wrote: 16-20 segments with a cap of 16 (review r26c)."""

from __future__ import annotations

from pathlib import Path

from raftlet.consensus.log import Log, LogOptions
from raftlet.tserver.log_gc import LogGc
from tests.unit.wal_helpers import entries

SMALL = LogOptions(segment_size_bytes=600, fsync=False)
CAP = 3


class Store:
    """The part of a store log GC uses, flushed up to ``index``; counts the flushes."""

    def __init__(self) -> None:
        self.index = 0
        self.flushes = 0

    def flush(self) -> int:
        self.flushes += 1
        return self.index


def segments(log: Log) -> int:
    return len(log.segment_paths())


def never_due(log: Log, store: Store) -> LogGc:
    """A GC whose interval never comes (the clock stands still), a voter down from the start."""
    return LogGc(
        "kv-p0",
        log,
        store,  # type: ignore[arg-type]
        lambda: 0,
        interval_s=10,
        max_segments=CAP,
        clock=lambda: 0.0,
    )


def test_the_cap_holds_after_every_applied_batch_not_only_at_the_interval(
    tmp_path: Path,
) -> None:
    store = Store()
    with Log.open(tmp_path, SMALL) as log:
        gc = never_due(log, store)
        most = 0
        for e in entries(1, 400):
            log.append([e])
            store.index = e.index  # applied and flushed as it comes
            gc.maybe_collect()  # what the apply worker does after each batch
            most = max(most, segments(log))
        assert log.first_index() > 300  # dozens of segments came and went
        assert most <= CAP
        assert segments(log) == CAP


def test_a_roll_over_past_the_cap_makes_gc_due_for_the_ticker(tmp_path: Path) -> None:
    store = Store()
    with Log.open(tmp_path, SMALL) as log:
        gc = never_due(log, store)
        last = 0
        while segments(log) <= CAP:
            last += 1
            log.append(entries(last, last + 1))
            store.index = last
            if segments(log) <= CAP:
                assert not gc.due()
        assert gc.due()  # so the ticker nudges an idle apply stage
        assert gc.maybe_collect() == 1
        assert segments(log) == CAP
        assert not gc.due()


def test_a_pass_that_cannot_delete_waits_for_the_next_segment(tmp_path: Path) -> None:
    """The store has not applied what the cap would discard (a restart replays it from the
    log): the log keeps it, and GC does not flush again at every batch until more comes."""
    store = Store()  # applied nothing
    with Log.open(tmp_path, SMALL) as log:
        gc = never_due(log, store)
        last = 0
        while segments(log) <= CAP:
            last += 1
            log.append(entries(last, last + 1))
        assert gc.maybe_collect() == 0
        assert store.flushes == 1
        for _ in range(5):
            assert gc.maybe_collect() == 0
        assert store.flushes == 1
        assert not gc.due()
        count = segments(log)
        while segments(log) == count:
            last += 1
            log.append(entries(last, last + 1))
        store.index = last
        assert gc.due()
        assert gc.maybe_collect() > 0
        assert store.flushes == 2
        assert segments(log) == CAP
