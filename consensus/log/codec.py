"""Log entries to and from their on-disk form: ``EntryPB`` inside an ``EntryBatchPB``.

The appender packs the contiguous entries of a group of batches into records of up to 64 KiB
(``log._PACK_RECORD_BYTES``: a read from disk decodes a whole record); one larger entry gets
a record to itself, and ``TARGET_RECORD_BYTES`` (1 MiB) is where large batches are cut.  A
record's payload is one serialized ``EntryBatchPB``.  Entry types map one to one: NORMAL, NO_OP
and CONFIG (``CONFIG_CHANGE`` on disk).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NoReturn

import crc32c
from google.protobuf.message import DecodeError

from raftlet.consensus.core.types import Entry, EntryType
from raftlet.consensus.log.index import Rec
from raftlet.proto import consensus_pb2 as pb

__all__ = [
    "FRAME",
    "MAX_ENTRY_BYTES",
    "MAX_RECORD_BYTES",
    "TARGET_RECORD_BYTES",
    "batch_size",
    "check_batch",
    "decode_batch",
    "decode_entries",
    "encode_record",
    "entries_from_pb",
    "frame_records",
    "scan_record",
    "split_records",
]

# length (u32 LE) | crc32c(payload) (u32 LE) | payload
FRAME = struct.Struct("<II")
# Above this a length field is taken as damage, not as a record.
MAX_RECORD_BYTES = 64 << 20
# Batches are cut into records of about this size, so a follower catching up reads back
# bounded records, and one giant batch does not make one giant segment.
TARGET_RECORD_BYTES = 1 << 20

# No entry may be so large that its record could look like damage when read back.
MAX_ENTRY_BYTES = MAX_RECORD_BYTES - 64

NORMAL = EntryType.NORMAL
NO_OP = EntryType.NO_OP
_NORMAL_FIELD = bytes((0x18, pb.NORMAL))
_TYPE_FIELD = {
    EntryType.NO_OP: bytes((0x18, pb.NO_OP)),
    EntryType.CONFIG: bytes((0x18, pb.CONFIG_CHANGE)),
}
_FROM_PB = {
    pb.NORMAL: EntryType.NORMAL,
    pb.NO_OP: EntryType.NO_OP,
    pb.CONFIG_CHANGE: EntryType.CONFIG,
}


def check_batch(entries: Sequence[tuple[int, int]]) -> str | None:
    """Why ``(index, term)`` pairs cannot be one batch of a Raft log, or None if they can."""
    prev_index, prev_term = -1, 0
    for index, term in entries:
        if index < 1 or term < 1:
            return f"entry ({index}, {term}): index and term must be >= 1"
        if prev_index >= 0 and index != prev_index + 1:
            return f"entries not contiguous: {prev_index} then {index}"
        if term < prev_term:
            return f"term goes back from {prev_term} to {term} at index {index}"
        prev_index, prev_term = index, term
    return None


def batch_size(entries: Sequence[Entry]) -> int:
    """Check that ``entries`` are a piece of a Raft log that fits in records, and return
    their approximate size, which is what the group-commit queue counts.

    Only this cheap pass runs on the producer's thread; cutting into records and encoding
    are the appender's job, so a producer holds the GIL briefly and its work overlaps the
    appender's fdatasync.  Raises ValueError saying what is wrong.
    """
    first = entries[0]
    if first.index < 1 or first.term < 1:
        raise ValueError(f"entry ({first.index}, {first.term}): index and term must be >= 1")
    nbytes = 0
    prev_index = first.index - 1
    prev_term = first.term
    for e in entries:
        index = e.index
        term = e.term
        if index != prev_index + 1:
            raise ValueError(f"entries not contiguous: {prev_index} then {index}")
        if term < prev_term:
            raise ValueError(f"term goes back from {prev_term} to {term} at index {index}")
        if e.type is not NORMAL and e.type not in _TYPE_FIELD:
            raise ValueError(f"entry {index} has unsupported type {e.type!r}")
        prev_index = index
        prev_term = term
        size = len(e.data) + 24  # Entry.size()
        if size > MAX_ENTRY_BYTES:
            raise ValueError(f"entry {index} too large for a log record ({size} bytes)")
        nbytes += size
    return nbytes


def split_records(
    entries: Sequence[Entry], limit: int = TARGET_RECORD_BYTES
) -> list[Sequence[Entry]]:
    """Cut checked, contiguous entries into records of at most ``limit`` bytes (a single
    larger entry gets a record of its own)."""
    out: list[Sequence[Entry]] = []
    start = 0
    size = 0
    for k, e in enumerate(entries):
        n = len(e.data) + 24
        if k > start and size + n > limit:
            out.append(entries[start:k])
            start = k
            size = 0
        size += n
    out.append(entries[start:] if start else entries)
    return out


def encode_record(entries: Sequence[Entry], synced_end: int = 0) -> tuple[bytes, bytes]:
    """(frame header, payload) of one record holding ``entries`` (checked already), which
    its segment's writer had made durable up to byte ``synced_end`` (0: not said).

    Each entry is one element of EntryBatchPB.entries: tag 1 (length delimited), then an
    EntryPB with term (1), index (2), type (3), payload (4); ``synced_end`` follows as field
    2.  Written by hand because it is the appender's per-entry cost and this is a third
    cheaper than building protobuf objects; the reader parses it with the generated code,
    and a test holds the two equal.
    """
    parts: list[bytes] = []
    for e in entries:
        data = e.data
        vt = _varint(e.term)
        vi = _varint(e.index)
        vl = _varint(len(data))
        body = len(vt) + len(vi) + len(vl) + len(data) + 5
        tf = _NORMAL_FIELD if e.type is NORMAL else _TYPE_FIELD[e.type]
        parts += (b"\x0a", _varint(body), b"\x08", vt, b"\x10", vi, tf, b"\x22", vl, data)
    if synced_end:
        parts += (b"\x10", _varint(synced_end))
    payload = b"".join(parts)
    return FRAME.pack(len(payload), crc32c.crc32c(payload)), payload


def frame_records(entries: Sequence[Entry]) -> list[tuple[Rec, bytes]]:
    """Every record of a batch with its framed bytes, as if written at offset 0 of
    segment 0: what the appender would write for this batch alone."""
    batch_size(entries)
    out: list[tuple[Rec, bytes]] = []
    for piece in split_records(entries):
        head, payload = encode_record(piece)
        frame = head + payload
        out.append((Rec(piece[0].index, len(piece), 0, 0, len(frame)), frame))
    return out


_SMALL = [bytes((i,)) for i in range(0x80)]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if n < 0x200000:
        return bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, n >> 14))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def decode_batch(payload: bytes | memoryview) -> pb.EntryBatchPB:
    """Parse and check a record payload whose CRC already matched; ValueError says why not."""
    batch = _parse(payload)
    for e in batch.entries:
        if e.type not in _FROM_PB:
            raise ValueError(f"entry {e.index} has unsupported type {e.type}")
    reason = check_batch([(e.index, e.term) for e in batch.entries])
    if reason is not None:
        raise ValueError(reason)
    return batch


def entries_from_pb(batch: pb.EntryBatchPB) -> list[Entry]:
    return [
        Entry(term=e.term, index=e.index, type=_FROM_PB[e.type], data=e.payload)
        for e in batch.entries
    ]


# Reading a record back and indexing one on open are per-entry costs of every restart, so
# the two functions below read each field of each entry once and check whole columns at a
# time; on any doubt they leave the verdict, and its words, to ``decode_batch``.


def decode_entries(payload: bytes | memoryview) -> list[Entry]:
    """``entries_from_pb(decode_batch(payload))``, in one pass over the entries."""
    batch = _parse(payload)
    try:
        out = [Entry(e.term, e.index, _FROM_PB[e.type], e.payload) for e in batch.entries]
    except KeyError:
        _refuse(payload)
    first = out[0].index
    terms = [e.term for e in out]
    if (
        first < 1
        or terms[0] < 1
        or [e.index for e in out] != list(range(first, first + len(out)))
        or terms != sorted(terms)
    ):
        _refuse(payload)
    return out


def scan_record(payload: bytes | memoryview) -> tuple[int, tuple[int, ...]]:
    """The first index and the terms of a record's entries, checked as ``decode_batch``
    checks them, without building the entries."""
    batch = _parse(payload)
    es = list(batch.entries)
    indexes = [e.index for e in es]
    terms = [e.term for e in es]
    first = indexes[0]
    if (
        not {e.type for e in es} <= _FROM_PB.keys()
        or first < 1
        or terms[0] < 1
        or indexes != list(range(first, first + len(es)))
        or terms != sorted(terms)
    ):
        _refuse(payload)
    return first, tuple(terms)


def _refuse(payload: bytes | memoryview) -> NoReturn:
    """Raise the ValueError ``decode_batch`` raises for a payload a fast check refused."""
    decode_batch(payload)
    raise AssertionError("a record the fast check refused passed decode_batch")


def _parse(payload: bytes | memoryview) -> pb.EntryBatchPB:
    try:
        batch = pb.EntryBatchPB.FromString(bytes(payload))
    except DecodeError as exc:
        raise ValueError(f"payload is not an EntryBatchPB ({exc})") from None
    if not batch.entries:
        raise ValueError("record holds no entries")
    return batch
