"""The Log: appends, reads, roll-over, reopen, suffix overwrite, GC."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

import pytest

from raftlet.consensus.core.types import Entry
from raftlet.consensus.log import (
    Log,
    LogEntryCompactedError,
    LogError,
    LogOptions,
)
from raftlet.consensus.log import log as log_module
from raftlet.consensus.log import segment as segment_module
from raftlet.consensus.log.log import CUT_BYTES_KEPT_S
from raftlet.consensus.log.segment import parse_segment_name
from tests.unit.wal_helpers import RecordingObserver, entries, entry, no_op

# Small segments so a few dozen entries span several of them; fsync off where the test is
# about logic, not durability (the recovery and group-commit tests sync for real).
SMALL = LogOptions(segment_size_bytes=600, fsync=False)


def log_contents(log: Log) -> list[Entry]:
    return log.entries(log.first_index(), log.last_index() + 1)


def test_new_log_is_empty(tmp_path: Path) -> None:
    with Log.open(tmp_path / "wal") as log:
        assert (log.first_index(), log.last_index()) == (1, 0)
        assert log.term(0) == 0
        assert log.entries(1, 1) == []
        with pytest.raises(IndexError):
            log.term(1)
        with pytest.raises(IndexError):
            log.entries(1, 2)
        assert len(log.segment_paths()) == 1


def test_append_read_and_reopen(tmp_path: Path) -> None:
    written = [*entries(1, 4), no_op(4, 2), *entries(5, 9, term=2, size=30)]
    with Log.open(tmp_path) as log:
        log.append(written[:3])
        log.append(written[3:4])
        log.append(written[4:])
        assert log.last_index() == 8
        assert [log.term(i) for i in range(9)] == [0, 1, 1, 1, 2, 2, 2, 2, 2]
        assert log_contents(log) == written
    with Log.open(tmp_path) as log:
        assert log_contents(log) == written
        assert log.entries(3, 6) == written[2:5]
        log.append(entries(9, 11, term=3))
        assert log.last_index() == 10


def test_roll_over_keeps_every_entry(tmp_path: Path) -> None:
    written = entries(1, 61, size=40)
    with Log.open(tmp_path, SMALL) as log:
        for e in written:
            log.append([e])
        paths = log.segment_paths()
        assert len(paths) > 4
        assert all(os.path.getsize(p) <= SMALL.segment_size_bytes for p in paths)
        assert log_contents(log) == written
    names = sorted(n for n in os.listdir(tmp_path) if parse_segment_name(n) is not None)
    assert [parse_segment_name(n) for n in names] == list(range(1, len(names) + 1))
    with Log.open(tmp_path, SMALL) as log:
        assert log_contents(log) == written


def test_record_bigger_than_a_segment_gets_its_own(tmp_path: Path) -> None:
    with Log.open(tmp_path, SMALL) as log:
        log.append(entries(1, 2))
        log.append([entry(2, data=b"x" * 2000)])
        log.append(entries(3, 4))
        assert len(log.segment_paths()) == 3
    with Log.open(tmp_path, SMALL) as log:
        assert log.entries(2, 3)[0].data == b"x" * 2000


def test_a_large_batch_is_cut_at_segment_size_so_gc_can_reach_its_tail(tmp_path: Path) -> None:
    # A follower catching up takes its whole backlog in one append: as one record it would
    # fill the active segment, which GC never deletes, until the next append.
    written = entries(1, 201, size=40)
    with Log.open(tmp_path, SMALL) as log:
        log.append(written)
        paths = log.segment_paths()
        assert len(paths) > 10
        slack = written[0].size() + 16  # a record may end just past the segment's size
        assert all(os.path.getsize(p) <= SMALL.segment_size_bytes + slack for p in paths)
        log.gc(200)
        assert log.first_index() > 180
        assert log_contents(log) == written[log.first_index() - 1 :]
    with Log.open(tmp_path, SMALL) as log:
        assert log_contents(log) == written[-len(log_contents(log)) :]
        assert log.last_index() == 200


def test_reads_come_back_from_disk_when_the_cache_is_tiny(tmp_path: Path) -> None:
    written = entries(1, 41, size=40)
    with Log.open(tmp_path, LogOptions(segment_size_bytes=600, cache_size_bytes=200)) as log:
        for lo in range(1, 41, 7):
            log.append(written[lo - 1 : lo + 6])
        assert log.entries(1, 41) == written
        assert log.entries(13, 29) == written[12:28]
        # A capped read stops early but always returns at least one entry.
        one = log.entries(1, 41, max_size=1)
        assert one == written[:1]
        some = log.entries(3, 41, max_size=3 * written[0].size())
        assert some == written[2:5]


def test_max_size_across_disk_and_cache(tmp_path: Path) -> None:
    written = entries(1, 21, size=100)
    with Log.open(tmp_path, LogOptions(cache_size_bytes=5 * written[0].size())) as log:
        log.append(written)
        size = written[0].size()
        assert log.entries(1, 21, max_size=size * 18) == written[:18]
        assert log.entries(14, 21, max_size=size * 2) == written[13:15]


def test_suffix_overwrite_is_immediate_and_survives_reopen(tmp_path: Path) -> None:
    with Log.open(tmp_path, SMALL) as log:
        log.append(entries(1, 30, size=30))
        log.append([no_op(12, 2), *entries(13, 15, term=2)])
        assert log.last_index() == 14
        assert [log.term(i) for i in (11, 12, 14)] == [1, 2, 2]
        after = log_contents(log)
        assert [e.index for e in after] == list(range(1, 15))
        with pytest.raises(IndexError):
            log.term(15)
    with Log.open(tmp_path, SMALL) as log:
        assert log_contents(log) == after
        log.append(entries(15, 17, term=2))
        assert log.last_index() == 16


def test_overwrite_reaching_back_into_an_older_segment(tmp_path: Path) -> None:
    with Log.open(tmp_path, SMALL) as log:
        for i in range(1, 40):
            log.append([entry(i, data=b"v" * 30)])
        assert len(log.segment_paths()) > 3
        log.append(entries(5, 8, term=3))
        want = log_contents(log)
    assert [e.term for e in want] == [1, 1, 1, 1, 3, 3, 3]
    with Log.open(tmp_path, SMALL) as log:
        assert log_contents(log) == want


def test_overwrite_of_a_batch_still_queued(tmp_path: Path) -> None:
    with Log.open(tmp_path) as log:
        done: list[int] = []
        log.append_async(entries(1, 6), lambda err: done.append(1))
        log.append_async(entries(3, 5, term=2), lambda err: done.append(2))
        assert log.last_index() == 4
        log.append([])
        assert done == [1, 2]
        want = log_contents(log)
    assert [e.term for e in want] == [1, 1, 2, 2]
    with Log.open(tmp_path) as log:
        assert log_contents(log) == want


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        (entries(5, 6), "gap"),
        ([entry(2, term=1)], "term goes back"),
        (entries(1, 2, term=5), None),  # replacing everything is allowed
    ],
)
def test_append_position_is_checked(tmp_path: Path, batch: list[Entry], match: str | None) -> None:
    with Log.open(tmp_path) as log:
        log.append(entries(1, 3, term=2))
        if match is None:
            log.append(batch)
            assert log.last_index() == 1
        else:
            with pytest.raises(ValueError, match=match):
                log.append(batch)
            assert log.last_index() == 2


def test_empty_log_must_start_at_its_first_index(tmp_path: Path) -> None:
    with Log.open(tmp_path) as log, pytest.raises(ValueError, match="empty log"):
        log.append(entries(2, 3))


def test_one_log_per_directory(tmp_path: Path) -> None:
    with Log.open(tmp_path), pytest.raises(LogError, match="already open"):
        Log.open(tmp_path)
    Log.open(tmp_path).close()  # released on close


# --- garbage collection ---------------------------------------------------------------------


def fill(log: Log, n: int) -> None:
    for i in range(1, n + 1):
        log.append([entry(i, data=b"g" * 40)])


@pytest.mark.parametrize("how", ["segment", "directory", "replaced"])
def test_a_log_whose_active_segment_is_gone_fails_instead_of_writing_nowhere(
    tmp_path: Path, how: str
) -> None:
    """A tablet directory deleted under a running replica: its appends went on into the
    deleted file, acknowledged as durable, lost to any restart."""
    wal = tmp_path / "wal"
    with Log.open(wal, SMALL) as log:
        log.append(entries(1, 3))
        log.check_present()  # all there: nothing happens
        (active,) = log.segment_paths()
        if how == "directory":
            shutil.rmtree(wal)
        else:
            os.unlink(active)
            if how == "replaced":
                Path(active).write_bytes(b"")
        with pytest.raises(LogError, match=r"deleted or replaced while the log was writing"):
            log.check_present()
        with pytest.raises(LogError, match="has failed"):
            log.append(entries(3, 4))


def test_an_older_segment_gone_under_a_running_log_fails_it(tmp_path: Path) -> None:
    """Review r34a: one removed by hand went unnoticed until a returning follower needed
    its entries (and a restart would refuse the log)."""
    with Log.open(tmp_path, SMALL) as log:
        fill(log, 60)
        assert log.gc(20) > 0
        log.check_present()  # GC's own deletions are no damage
        paths = log.segment_paths()
        assert len(paths) > 2
        os.unlink(paths[1])
        with pytest.raises(LogError, match=r"deleted while the log held entries in it"):
            log.check_present()
        with pytest.raises(LogError, match="has failed"):
            log.append(entries(61, 62))


def test_bytes_a_cut_kept_aside_go_after_thirty_days(tmp_path: Path) -> None:
    """Review r34a: they stayed for good, up to a segment each, and every tablet copy
    carried them into the new replica."""
    with Log.open(tmp_path, SMALL) as log:
        log.append(entries(1, 3))
    old = tmp_path / "wal-0000000000000001.seg.cut-at-40"
    fresh = tmp_path / "wal-0000000000000001.seg.cut-at-90"
    for path in (old, fresh):
        path.write_bytes(b"torn")
    month = time.time() - CUT_BYTES_KEPT_S - 60
    os.utime(old, (month, month))
    with Log.open(tmp_path, SMALL) as log:
        assert log.last_index() == 2
    assert (old.exists(), fresh.exists()) == (False, True)


def test_gc_deletes_whole_old_segments_and_reopen_knows_the_first_index(tmp_path: Path) -> None:
    with Log.open(tmp_path, SMALL) as log:
        fill(log, 60)
        before = log.segment_paths()
        deleted = log.gc(30)
        assert deleted > 0
        after = log.segment_paths()
        assert after == before[deleted:]
        assert all(not os.path.exists(p) for p in before[:deleted])
        first = log.first_index()
        assert 1 < first <= 31
        assert log.entries(first, 61)[0].index == first
        with pytest.raises(LogEntryCompactedError):
            log.entries(first - 1, 61)
        with pytest.raises(LogEntryCompactedError):
            log.term(first - 1)
        with pytest.raises(ValueError, match="compacted"):
            log.append(entries(first - 1, first))
        kept = log_contents(log)
    with Log.open(tmp_path, SMALL) as log:
        assert log.first_index() == first
        assert log_contents(log) == kept


def test_gc_keeps_the_active_segment_and_the_newest_entry(tmp_path: Path) -> None:
    with Log.open(tmp_path, SMALL) as log:
        fill(log, 60)
        log.gc(10_000)
        paths = log.segment_paths()
        assert len(paths) >= 1
        assert log.last_index() == 60
        assert log.entries(60, 61)[0].index == 60
    with Log.open(tmp_path, SMALL) as log:
        assert log.last_index() == 60
        assert log.first_index() <= 60


def test_gc_below_the_first_segment_end_deletes_nothing(tmp_path: Path) -> None:
    with Log.open(tmp_path, SMALL) as log:
        fill(log, 60)
        assert log.gc(1) == 0
        assert log.first_index() == 1


def test_gc_after_an_overwrite_then_reopen(tmp_path: Path) -> None:
    # Segments full of entries a later batch replaced hold nothing live; GC may drop them,
    # and replay of what is left must give the same log as memory.
    with Log.open(tmp_path, SMALL) as log:
        fill(log, 40)
        log.append(entries(8, 10, term=2))
        for i in range(10, 40):
            log.append([entry(i, term=2, data=b"h" * 40)])
        log.gc(20)
        first = log.first_index()
        kept = log_contents(log)
    with Log.open(tmp_path, SMALL) as log:
        assert log.first_index() == first
        assert log_contents(log) == kept


# --- the cache ------------------------------------------------------------------------------


def test_entries_not_yet_written_are_read_from_the_cache(tmp_path: Path) -> None:
    obs = RecordingObserver()
    with Log.open(tmp_path, LogOptions(cache_size_bytes=0), obs) as log:
        log.append(entries(1, 3))
        obs.stall()
        log.append_async(entries(3, 4), lambda err: None)
        assert obs.stalled.wait(30)  # the appender is held: what follows stays queued
        log.append_async(entries(4, 9), lambda err: None)
        log.append_async(entries(6, 8, term=2), lambda err: None)
        assert [(e.index, e.term) for e in log.entries(1, 8)] == [
            (1, 1),
            (2, 1),
            (3, 1),
            (4, 1),
            (5, 1),
            (6, 2),
            (7, 2),
        ]
        # GC may not take the segment whose entries are still only in memory.
        log.gc(100)
        obs.release()
        log.append([])
        want = log.entries(log.first_index(), 8)
    with Log.open(tmp_path) as log:
        assert log.entries(log.first_index(), 8) == want
        assert log.last_index() == 7


def test_old_entries_are_read_back_from_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    real = segment_module.read_record

    def counting(fd: int, path: str, offset: int, frame_size: int) -> bytes:
        reads.append(offset)
        return real(fd, path, offset, frame_size)

    monkeypatch.setattr(log_module, "read_record", counting)
    written = entries(1, 101, size=100)
    with Log.open(tmp_path, LogOptions(cache_size_bytes=10 * written[0].size())) as log:
        for e in written:
            log.append([e])
        assert log.entries(95, 101) == written[94:]
        assert reads == []  # recent: from the cache
        assert log.entries(1, 11) == written[:10]
        assert len(reads) == 10  # one record per batch, each read once


def test_gc_never_leaves_a_crash_without_the_newest_durable_entry(tmp_path: Path) -> None:
    obs = RecordingObserver()
    live = tmp_path / "live"
    with Log.open(live, SMALL, obs) as log:
        fill(log, 40)
        obs.stall()
        log.append_async([entry(41, data=b"p" * 40)], lambda err: None)
        assert obs.stalled.wait(30)
        # Queued, not yet written: a crash now loses them.
        log.append_async(entries(42, 50, size=40), lambda err: None)
        log.gc(10_000)
        shutil.copytree(live, tmp_path / "crashed")  # the disk as a crash would leave it
        obs.release()
    with Log.open(tmp_path / "crashed", SMALL) as log:
        assert log.last_index() == 41
        assert log.entries(41, 42)[0].data == b"p" * 40


def test_a_roll_that_fails_never_closes_a_descriptor_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The roll closed the full segment, then could not create the next (ENOSPC); the log's
    close closed the old segment's descriptor again -- by then perhaps another file's."""
    import errno

    log = Log.open(tmp_path, SMALL)
    real_create = segment_module.SegmentWriter.create

    def full_disk(*args: object, **kwargs: object) -> segment_module.SegmentWriter:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(segment_module.SegmentWriter, "create", full_disk)

    def fill() -> None:
        for e in entries(1, 61, size=40):
            log.append([e])

    with pytest.raises(Exception, match="No space left"):
        fill()
    monkeypatch.setattr(segment_module.SegmentWriter, "create", real_create)
    # The lowest free descriptor number: the one the roll closed, if nothing took it since.
    bystander = os.open(tmp_path / "bystander", os.O_CREAT | os.O_RDWR)
    try:
        with contextlib.suppress(Exception):  # the failed log may report its failure
            log.close()
        os.fstat(bystander)  # still open: nobody closed it on the log's behalf
        os.write(bystander, b"still mine")
    finally:
        os.close(bystander)
    assert (tmp_path / "bystander").read_bytes() == b"still mine"
    with pytest.raises(OSError, match="Bad file descriptor"):  # its lock went with it
        os.close(log._lock_fd)
