"""Segment preallocation: the active segment's space is reserved (fallocate, KEEP_SIZE), its
size stays the bytes written, a full segment gives back what it did not use, and a log
written with reservations reads back exactly as one written without.

A reservation the disk cannot hold is given back whole: ext4's fallocate keeps the blocks
it got before ENOSPC, so a 1 GiB segment on a 365 MB filesystem took all of it (and every
tablet's store then failed). The segment is then written unreserved."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import pytest

from raftlet.consensus.log import Log, LogOptions, prealloc
from tests.unit.wal_helpers import entries

SEGMENT = 1 << 20


def _allocated(path: str) -> int:
    return os.stat(path).st_blocks * 512


def _reserves(tmp_path: Path) -> bool:
    """Whether this filesystem honours FALLOC_FL_KEEP_SIZE (ext4, xfs and tmpfs do)."""
    with Log.open(tmp_path / "probe", LogOptions(segment_size_bytes=SEGMENT)) as log:
        return _allocated(log.segment_paths()[-1]) >= SEGMENT


def test_the_active_segment_is_reserved_and_sized_by_its_bytes(tmp_path: Path) -> None:
    if not _reserves(tmp_path):
        pytest.skip("this filesystem does not reserve space with fallocate")
    with Log.open(tmp_path / "wal", LogOptions(segment_size_bytes=SEGMENT)) as log:
        log.append(entries(1, 11))
        path = log.segment_paths()[-1]
        assert os.path.getsize(path) < 4096  # only what was written
        assert _allocated(path) >= SEGMENT


def test_a_full_segment_gives_back_its_unused_reservation(tmp_path: Path) -> None:
    if not _reserves(tmp_path):
        pytest.skip("this filesystem does not reserve space with fallocate")
    opts = LogOptions(segment_size_bytes=SEGMENT)
    with Log.open(tmp_path / "wal", opts) as log:
        for lo in range(1, 3001, 100):
            log.append(entries(lo, lo + 100, size=1000))
        paths = log.segment_paths()
        assert len(paths) >= 3
        for path in paths[:-1]:
            # Rounded up to the filesystem's blocks, never the whole reservation left over.
            assert _allocated(path) < os.path.getsize(path) + 64 * 1024
        assert _allocated(paths[-1]) >= SEGMENT


@pytest.mark.parametrize("preallocate", [True, False])
def test_reopened_log_reads_what_was_written(tmp_path: Path, preallocate: bool) -> None:
    opts = LogOptions(segment_size_bytes=SEGMENT, preallocate_segments=preallocate)
    written = entries(1, 2001, size=900)
    with Log.open(tmp_path / "wal", opts) as log:
        for lo in range(0, 2000, 50):
            log.append(written[lo : lo + 50])
    with Log.open(tmp_path / "wal", opts) as log:
        assert log.entries(1, 2001) == written
        log.append(entries(2001, 2002))  # and it appends after the last record
    with Log.open(tmp_path / "wal", opts) as log:
        assert log.last_index() == 2001


@pytest.fixture
def disk_full_halfway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """fallocate as ext4 does it on a nearly full disk: half of what was asked is
    allocated (and kept), then ENOSPC. Returns the lengths asked for."""
    if prealloc._fallocate is None or not _reserves(tmp_path):
        pytest.skip("this filesystem does not reserve space with fallocate")
    real = prealloc._fallocate
    asked: list[int] = []

    def half_then_enospc(fd: int, mode: int, offset: int, length: int) -> int:
        asked.append(length)
        assert real(fd, mode, offset, length // 2) == 0  # type: ignore[operator]
        ctypes.set_errno(errno.ENOSPC)
        return -1

    monkeypatch.setattr(prealloc, "_fallocate", half_then_enospc)
    return asked


def test_a_reservation_that_does_not_fit_is_given_back(
    tmp_path: Path, disk_full_halfway: list[int]
) -> None:
    with Log.open(tmp_path / "wal", LogOptions(segment_size_bytes=SEGMENT)) as log:
        path = log.segment_paths()[-1]
        assert disk_full_halfway == [SEGMENT]
        # Without the give-back: 512 KiB held past the end of a file of a few bytes.
        assert _allocated(path) < 64 * 1024
        # And the segment is still the log's, written without a reservation.
        log.append(entries(1, 101, size=100))
        assert log.entries(1, 101) == entries(1, 101, size=100)
    with Log.open(tmp_path / "wal", LogOptions(segment_size_bytes=SEGMENT)) as log:
        assert log.last_index() == 100
        # Reopening reserves the rest of the last segment: refused, and given back too.
        assert _allocated(log.segment_paths()[-1]) < os.path.getsize(path) + 64 * 1024


def test_preallocate_gives_back_what_a_failed_call_took(
    tmp_path: Path, disk_full_halfway: list[int]
) -> None:
    path = tmp_path / "seg"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * 100)
        assert prealloc.preallocate(fd, 100, SEGMENT) is False
        assert os.fstat(fd).st_size == 100  # nothing written is lost
        assert _allocated(str(path)) < 64 * 1024
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 100
