"""Segment files: format, the verifying reader, and the writer.

A segment is ``header | record*``.

- header (24 bytes): magic ``b"RLTWAL\\r\\n"`` | version (u32 LE) | sequence (u64 LE) |
  crc32c of the preceding 20 bytes (u32 LE).  The sequence must match the file name.
- record: ``length (u32 LE) | crc32c(payload) (u32 LE) | payload``, payload a serialized
  ``EntryBatchPB`` with at least one entry, and how far the segment was durable when it was
  written (``synced_end``).

Records are only ever appended; a batch that rewrites a suffix of the log is just a later
record whose first index is at or below the last one (replay lets it win).

``scan_segment`` is pure (bytes in, records out) so the fuzz tests can drive it directly.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import crc32c
from google.protobuf.message import DecodeError

from raftlet.consensus.log.codec import FRAME, MAX_RECORD_BYTES, scan_record
from raftlet.consensus.log.errors import LogCorruptionError, LogNewerFormat, newer_release
from raftlet.consensus.log.prealloc import preallocate, release_unused
from raftlet.proto import consensus_pb2 as pb

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "VERSION",
    "ScannedRecord",
    "SegmentScan",
    "SegmentWriter",
    "encode_header",
    "parse_segment_name",
    "read_record",
    "replace_durably",
    "scan_segment",
    "segment_name",
    "unused_path",
]

MAGIC = b"RLTWAL\r\n"  # \r\n: a text-mode copy that mangles line ends is caught at once
VERSION = 1
_HEADER = struct.Struct("<8sIQ")
_HEADER_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _HEADER_CRC.size
_NAME = re.compile(r"^wal-(\d{16})\.seg$")
# Every record we write starts with the EntryBatchPB tag of field 1 (entries, length
# delimited): a cheap filter before paying for a CRC while searching for a valid record.
_BATCH_TAG = 0x0A
_ENTRY_TERM_TAG = 0x08


def segment_name(sequence: int) -> str:
    # Zero-padded so names sort as sequence numbers do.
    return f"wal-{sequence:016d}.seg"


def parse_segment_name(name: str) -> int | None:
    m = _NAME.match(name)
    return int(m.group(1)) if m else None


def encode_header(sequence: int) -> bytes:
    head = _HEADER.pack(MAGIC, VERSION, sequence)
    return head + _HEADER_CRC.pack(crc32c.crc32c(head))


@dataclass(frozen=True, slots=True)
class ScannedRecord:
    offset: int  # of the frame (its length field)
    length: int  # of the payload
    first_index: int
    terms: tuple[int, ...]  # of the entries, in index order

    @property
    def frame_size(self) -> int:
        return FRAME.size + self.length


@dataclass(frozen=True, slots=True)
class SegmentScan:
    """What a segment holds.  ``torn_offset`` is set when the last segment ended in a torn
    record: everything from there on must be cut off (``valid_end == torn_offset``).
    ``header_torn`` means the file is too short even for its header (a crash while the
    segment was being created), so it holds nothing."""

    sequence: int
    records: list[ScannedRecord]
    valid_end: int
    torn_offset: int | None = None
    torn_reason: str = ""
    header_torn: bool = False


def scan_segment(
    data: bytes, path: str, *, is_last: bool, expected_sequence: int | None = None
) -> SegmentScan:
    """Verify every record of a segment image.

    A bad record in the last segment is a torn write (reported in the result) when no valid
    record after it was written once it was durable: none at all, or only records of its own
    group, whose ``synced_end`` lies at or before it -- a group's pages may reach the disk
    in any order when a crash cuts its sync short. Any other damage raises
    LogCorruptionError naming ``path`` and the offset.
    """
    if len(data) < HEADER_SIZE:
        if is_last:
            return SegmentScan(
                sequence=expected_sequence or 0,
                records=[],
                valid_end=0,
                torn_offset=0,
                torn_reason=f"header incomplete ({len(data)} of {HEADER_SIZE} bytes)",
                header_torn=True,
            )
        raise LogCorruptionError(path, 0, f"header incomplete ({len(data)} bytes)")
    magic, version, sequence = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise LogCorruptionError(path, 0, f"bad magic {magic!r}")
    (header_crc,) = _HEADER_CRC.unpack_from(data, _HEADER.size)
    if crc32c.crc32c(data[: _HEADER.size]) != header_crc:
        raise LogCorruptionError(path, 0, "header checksum mismatch")
    if version > VERSION:
        raise LogNewerFormat(path, 8, newer_release(version, VERSION))
    if version != VERSION:
        raise LogCorruptionError(path, 8, f"unsupported segment version {version}")
    if expected_sequence is not None and sequence != expected_sequence:
        raise LogCorruptionError(
            path, 12, f"header says sequence {sequence}, file name says {expected_sequence}"
        )

    records: list[ScannedRecord] = []
    off = HEADER_SIZE
    end = len(data)
    while off < end:
        reason = _frame_problem(data, off)
        if reason is not None:
            if not is_last:
                raise LogCorruptionError(path, off, reason)
            after = find_valid_record(data, off + 1)
            if after is not None:
                synced_after = _synced_past(data, off, after)
                if synced_after is not None:
                    raise LogCorruptionError(
                        path, off, f"{reason}, yet a valid record follows at offset {synced_after}"
                    )
                # Every record after it belongs to its group, which a crash tore before its
                # sync returned: its pages reach the disk in any order, and none of it was
                # acknowledged.
                reason += f", in the last group written (intact records of it follow at {after})"
            return SegmentScan(sequence, records, off, off, reason)
        length, _ = FRAME.unpack_from(data, off)
        payload = data[off + FRAME.size : off + FRAME.size + length]
        try:
            first, terms = scan_record(payload)
        except ValueError as exc:
            # The CRC matched, so this is what was written: a bug or a foreign file, never a
            # torn write; refuse to guess.
            raise LogCorruptionError(path, off, str(exc)) from None
        records.append(ScannedRecord(off, length, first, terms))
        off += FRAME.size + length
    return SegmentScan(sequence, records, off)


def _synced_past(data: bytes, bad: int, after: int) -> int | None:
    """The offset of the first intact record from ``after`` on that was written once the
    record at ``bad`` was durable -- the damage then is corruption of a synced group --
    or None if every one says it was written before (they are ``bad``'s own group, which
    a crash tore). A record that does not say (an older version's) counts as later."""
    off: int | None = after
    while off is not None:
        length, _ = FRAME.unpack_from(data, off)
        payload = data[off + FRAME.size : off + FRAME.size + length]
        try:
            synced_end = pb.EntryBatchPB.FromString(payload).synced_end
        except DecodeError:
            return off  # intact by its CRC, yet not ours: refuse to guess
        if synced_end == 0 or synced_end > bad:
            return off
        nxt = off + FRAME.size + length
        off = nxt if _frame_problem(data, nxt) is None else find_valid_record(data, nxt)
    return None


def _frame_problem(data: bytes, off: int) -> str | None:
    """Why the frame at ``off`` is not a whole, intact record (None if it is)."""
    if len(data) - off < FRAME.size:
        return f"record header incomplete ({len(data) - off} bytes)"
    length, crc = FRAME.unpack_from(data, off)
    if length == 0 or length > MAX_RECORD_BYTES:
        return f"impossible record length {length}"
    if off + FRAME.size + length > len(data):
        return f"record payload incomplete ({len(data) - off - FRAME.size} of {length} bytes)"
    if crc32c.crc32c(data[off + FRAME.size : off + FRAME.size + length]) != crc:
        return "record checksum mismatch"
    return None


def find_valid_record(data: bytes, start: int) -> int | None:
    """Offset of the first position at or after ``start`` where an intact record begins.

    Only positions whose payload starts like an EntryBatchPB we write are CRC-checked,
    which keeps this cheap on garbage and on zero-filled tails.
    """
    tag = bytes([_BATCH_TAG])
    pos = data.find(tag, start + FRAME.size)
    while pos != -1:
        off = pos - FRAME.size
        if _looks_like_batch(data, pos) and _frame_problem(data, off) is None:
            return off
        pos = data.find(tag, pos + 1)
    return None


def _looks_like_batch(data: bytes, pos: int) -> bool:
    # tag 0x0A, varint length of the first EntryPB, then its term tag 0x08 (term >= 1).
    i = pos + 1
    for _ in range(5):
        if i >= len(data):
            return False
        b = data[i]
        i += 1
        if not b & 0x80:
            return i < len(data) and data[i] == _ENTRY_TERM_TAG
    return False


def read_record(fd: int, path: str, offset: int, frame_size: int) -> bytes:
    """The payload of the record at ``offset``, re-verified (the disk may have changed)."""
    buf = os.pread(fd, frame_size, offset)
    if len(buf) < frame_size:
        raise LogCorruptionError(path, offset, f"short read ({len(buf)} of {frame_size} bytes)")
    length, crc = FRAME.unpack_from(buf, 0)
    if length != frame_size - FRAME.size:
        raise LogCorruptionError(path, offset, f"record length {length} changed on disk")
    payload = buf[FRAME.size :]
    if crc32c.crc32c(payload) != crc:
        raise LogCorruptionError(path, offset, "record checksum mismatch on read")
    return payload


class SegmentWriter:
    """The write end of the active segment; used only by the appender thread (and by open)."""

    def __init__(self, path: str, sequence: int, fd: int, size: int) -> None:
        self.path = path
        self.sequence = sequence
        self.size = size
        self._fd = fd
        st = os.fstat(fd)
        self._file_id = (st.st_dev, st.st_ino)

    def still_at_path(self) -> bool:
        """Whether ``path`` still names the file being written: one deleted or replaced by
        hand takes every later record where no reopening of the log looks."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self._file_id

    @classmethod
    def create(
        cls, directory: str, sequence: int, *, sync: bool, reserve_bytes: int = 0
    ) -> SegmentWriter:
        """A new segment; ``reserve_bytes``: disk space to reserve for it (``prealloc``)."""
        path = os.path.join(directory, segment_name(sequence))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            preallocate(fd, 0, reserve_bytes)
            writer = cls(path, sequence, fd, 0)
            writer.write(encode_header(sequence))
            if sync:
                os.fdatasync(fd)
                fsync_dir(directory)  # the new name must survive a crash too
        except BaseException:
            os.close(fd)
            raise
        return writer

    @classmethod
    def reopen(
        cls, path: str, sequence: int, valid_end: int, *, sync: bool, reserve_bytes: int = 0
    ) -> SegmentWriter:
        """Continue the last segment after its last intact record, cutting off a torn tail;
        reserve disk space up to ``reserve_bytes`` in all."""
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_size != valid_end:
                os.ftruncate(fd, valid_end)
                if sync:
                    os.fsync(fd)  # the size is metadata: fdatasync alone may not keep it
            elif sync:
                # What a killed process wrote may be in the page cache only, and the next
                # group's records will say it was durable (``encode_record``'s synced_end).
                os.fdatasync(fd)
            preallocate(fd, valid_end, reserve_bytes - valid_end)
            os.lseek(fd, valid_end, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, sequence, fd, valid_end)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self.size += len(data)

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def release_unused(self) -> None:
        """Give back the reserved space this segment did not use (it is full)."""
        release_unused(self._fd, self.size)

    def close(self) -> None:
        # Idempotent: a roll that closed this segment and then failed to create the next
        # leaves it as the log's writer, which the log's close closes again -- and a
        # descriptor number closed twice may by then be another file's or socket's.
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unused_path(path: str | os.PathLike[str]) -> str:
    """``path``, or if it is taken ``path.1``, ``path.2`` ...: the first that is not (kept
    evidence never overwrites evidence kept before)."""
    base = os.fspath(path)
    n = 0
    while os.path.exists(candidate := base if n == 0 else f"{base}.{n}"):
        n += 1
    return candidate


def replace_durably(path: Path, text: str) -> None:
    """Replace the file at ``path`` with ``text`` (UTF-8) so that a crash leaves the old
    file or the new one, never a torn one: a temporary file, fsync, rename, fsync of the
    directory. Returns once it is on disk."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        # ENOSPC from a write names no file: say which.
        raise OSError(e.errno, f"writing {path}: {e.strerror or e}") from e
    fsync_dir(path.parent)
