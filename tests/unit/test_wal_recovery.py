"""Opening a log after a crash: torn tails are cut off and reported, corruption is refused."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from raftlet.consensus.core.types import Entry
from raftlet.consensus.log import Log, LogCorruptionError, LogOptions
from raftlet.consensus.log.segment import HEADER_SIZE, encode_header, scan_segment, segment_name
from tests.unit.wal_helpers import entries, entry, segment_image

SMALL = LogOptions(segment_size_bytes=700)


def contents(log: Log) -> list[Entry]:
    return log.entries(log.first_index(), log.last_index() + 1)


def record_offsets(path: str) -> list[int]:
    with open(path, "rb") as f:
        data = f.read()
    return [r.offset for r in scan_segment(data, path, is_last=False).records]


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def build(directory: Path, batches: list[list[Entry]], options: LogOptions = SMALL) -> list[str]:
    with Log.open(directory, options) as log:
        for b in batches:
            log.append(b)
        return log.segment_paths()


def test_torn_last_record_at_every_byte_offset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    batches = [entries(1, 3), entries(3, 4, size=20), entries(4, 7, term=2, size=30)]
    original = tmp_path / "original"
    paths = build(original, batches, LogOptions())
    assert len(paths) == 1
    name = os.path.basename(paths[0])
    size = os.path.getsize(paths[0])
    last = record_offsets(paths[0])[-1]
    before = [e for b in batches[:-1] for e in b]
    for cut in range(last, size):
        crashed = tmp_path / f"cut{cut}"
        shutil.copytree(original, crashed)
        os.truncate(crashed / name, cut)
        caplog.clear()
        with (
            caplog.at_level(logging.WARNING, logger="raftlet.consensus.log"),
            Log.open(crashed) as log,
        ):
            assert contents(log) == before, cut
            log.append(entries(4, 6, term=3))
        if cut > last:
            assert f"{crashed / name}: offset {last}" in caplog.text
            assert "torn" in caplog.text
        else:
            assert caplog.text == ""  # nothing torn: the cut fell on a record boundary
        with Log.open(crashed) as log:
            assert contents(log) == [*before, *entries(4, 6, term=3)]
        shutil.rmtree(crashed)


def test_bad_crc_on_the_final_record_is_truncated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    paths = build(tmp_path, [entries(1, 3), entries(3, 5)], LogOptions())
    last = record_offsets(paths[-1])[-1]
    total = os.path.getsize(paths[-1])
    flip_byte(paths[-1], total - 1)
    with (
        caplog.at_level(logging.WARNING, logger="raftlet.consensus.log"),
        Log.open(tmp_path) as log,
    ):
        assert log.last_index() == 2
    assert f"{paths[-1]}: offset {last}" in caplog.text
    size = os.path.getsize(paths[-1])
    assert size == last
    # Kept, as every cut is: a crash's torn write and a disk's damage to a synced record
    # look the same (a reviewer found a synced, applied record cut with no trace).
    aside = Path(f"{paths[-1]}.cut-at-{last}")
    assert f"cut are kept in {aside}" in caplog.text
    assert aside.stat().st_size == total - last


def test_bit_flip_in_an_earlier_record_of_the_last_segment(tmp_path: Path) -> None:
    paths = build(tmp_path, [entries(1, 3), entries(3, 5), entries(5, 7)], LogOptions())
    second = record_offsets(paths[-1])[1]
    flip_byte(paths[-1], second + 12)
    size = os.path.getsize(paths[-1])
    with pytest.raises(LogCorruptionError) as exc:
        Log.open(tmp_path)
    assert exc.value.path == paths[-1]
    assert exc.value.offset == second
    assert f"{paths[-1]}: offset {second}" in str(exc.value)
    assert os.path.getsize(paths[-1]) == size  # nothing was cut off


def _big(first: int, last: int) -> list[Entry]:
    """One append big enough to be written as several records (of up to 1 MiB each)."""
    return [entry(i, data=bytes([i % 251]) * 40_000) for i in range(first, last)]


def test_damage_inside_the_last_group_written_is_a_torn_group(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A group is one write and one fdatasync: a crash before the sync returned may leave
    any of its pages unwritten, its first record damaged and later ones intact. None of it
    was acknowledged, so the log is cut before it -- it was refused as corruption, and the
    replica needed a tablet copy (every replica, after a power cut of the whole cluster)."""
    paths = build(tmp_path, [entries(1, 4), _big(4, 64)], LogOptions())
    offsets = record_offsets(paths[-1])
    first_of_group = offsets[1]
    assert len(offsets) >= 3  # the big append is several records of one group
    flip_byte(paths[-1], first_of_group + 4096)
    with (
        caplog.at_level(logging.WARNING, logger="raftlet.consensus.log"),
        Log.open(tmp_path) as log,
    ):
        assert log.last_index() == 3
        log.append(entries(4, 6))  # the log goes on from there
    assert "in the last group written" in caplog.text
    aside = Path(f"{paths[-1]}.cut-at-{first_of_group}")
    assert f"cut are kept in {aside}" in caplog.text
    assert aside.stat().st_size > 2_000_000  # the whole group, kept should it be damage
    with Log.open(tmp_path) as log:
        assert [e.index for e in contents(log)] == [1, 2, 3, 4, 5]


def test_damage_to_a_group_synced_before_the_last_is_corruption(tmp_path: Path) -> None:
    """Written after the damaged group's sync, the next group says so: that damage is not a
    crash's, and the acknowledged entries after it are not cut off in silence."""
    paths = build(tmp_path, [entries(1, 4), _big(4, 64), entries(64, 66)], LogOptions())
    first_of_group = record_offsets(paths[-1])[1]
    flip_byte(paths[-1], first_of_group + 4096)
    with pytest.raises(LogCorruptionError, match="yet a valid record follows") as exc:
        Log.open(tmp_path)
    assert exc.value.offset == first_of_group


def test_damage_before_records_that_do_not_say_where_they_were_synced_is_corruption(
    tmp_path: Path,
) -> None:
    """Records of an older version carry no synced_end: they are taken as written later."""
    path = tmp_path / segment_name(1)
    path.write_bytes(segment_image([entries(1, 4), _big(4, 64)]))
    first_of_group = record_offsets(str(path))[1]
    flip_byte(str(path), first_of_group + 4096)
    with pytest.raises(LogCorruptionError, match="yet a valid record follows"):
        Log.open(tmp_path)


def test_bit_flip_in_an_older_segment(tmp_path: Path) -> None:
    paths = build(tmp_path, [[entry(i, data=b"z" * 60)] for i in range(1, 30)])
    assert len(paths) >= 3
    victim = paths[1]
    last = record_offsets(victim)[-1]
    flip_byte(victim, os.path.getsize(victim) - 1)  # the last record of a non-last segment
    with pytest.raises(LogCorruptionError) as exc:
        Log.open(tmp_path, SMALL)
    assert (exc.value.path, exc.value.offset) == (victim, last)


def test_truncated_older_segment_is_corruption(tmp_path: Path) -> None:
    paths = build(tmp_path, [[entry(i, data=b"z" * 60)] for i in range(1, 30)])
    os.truncate(paths[0], os.path.getsize(paths[0]) - 3)
    with pytest.raises(LogCorruptionError) as exc:
        Log.open(tmp_path, SMALL)
    assert exc.value.path == paths[0]


def test_bad_header_is_corruption(tmp_path: Path) -> None:
    paths = build(tmp_path, [entries(1, 3)])
    flip_byte(paths[0], 2)
    with pytest.raises(LogCorruptionError, match="bad magic") as exc:
        Log.open(tmp_path)
    assert (exc.value.path, exc.value.offset) == (paths[0], 0)


def test_missing_middle_segment_is_corruption(tmp_path: Path) -> None:
    paths = build(tmp_path, [[entry(i, data=b"z" * 60)] for i in range(1, 30)])
    os.unlink(paths[1])
    with pytest.raises(LogCorruptionError, match="segment 2 is missing") as exc:
        Log.open(tmp_path, SMALL)
    assert exc.value.path == paths[2]


def test_gap_in_indexes_is_corruption_naming_file_and_offset(tmp_path: Path) -> None:
    image = segment_image([entries(1, 3), entries(4, 6)])
    path = tmp_path / segment_name(1)
    path.write_bytes(image)
    second = record_offsets(str(path))[1]
    with pytest.raises(LogCorruptionError, match="gap") as exc:
        Log.open(tmp_path)
    assert (exc.value.path, exc.value.offset) == (str(path), second)


def test_term_going_back_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / segment_name(1)
    path.write_bytes(segment_image([entries(1, 3, term=2), entries(3, 4, term=1)]))
    with pytest.raises(LogCorruptionError, match="term goes back"):
        Log.open(tmp_path)


def test_half_written_new_segment_is_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    paths = build(tmp_path, [[entry(i, data=b"z" * 60)] for i in range(1, 20)])
    n = len(paths)
    crashed = tmp_path / segment_name(n + 1)
    crashed.write_bytes(encode_header(n + 1)[: HEADER_SIZE - 5])
    with (
        caplog.at_level(logging.WARNING, logger="raftlet.consensus.log"),
        Log.open(tmp_path, SMALL) as log,
    ):
        assert log.last_index() == 19
        log.append(entries(20, 22))
    assert f"{crashed}: offset 0" in caplog.text
    with Log.open(tmp_path, SMALL) as log:
        assert log.last_index() == 21


def test_torn_tail_then_more_appends_then_reopen(tmp_path: Path) -> None:
    paths = build(tmp_path, [entries(1, 4), entries(4, 8, size=50)], LogOptions())
    os.truncate(paths[-1], os.path.getsize(paths[-1]) - 7)
    with Log.open(tmp_path) as log:
        assert log.last_index() == 3
        log.append(entries(4, 6, term=2))
    with Log.open(tmp_path) as log:
        assert [e.term for e in contents(log)] == [1, 1, 1, 2, 2]


def test_a_second_cut_at_the_same_offset_keeps_the_first(tmp_path: Path) -> None:
    """Opened for writing, the second cut's file replaced the first's bytes."""
    from raftlet.consensus.log import log as log_module

    base = str(tmp_path / "wal-0000000000000001.seg.cut-at-1134")
    assert log_module._keep_aside(base, b"first") == base
    assert log_module._keep_aside(base, b"second") == f"{base}.1"
    assert Path(base).read_bytes() == b"first"
    assert Path(f"{base}.1").read_bytes() == b"second"
