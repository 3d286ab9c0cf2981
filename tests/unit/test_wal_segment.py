"""The segment format and its verifying reader, on in-memory images (no Log, no threads)."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlet.consensus.core.types import Entry, EntryType
from raftlet.consensus.log.codec import (
    FRAME,
    MAX_ENTRY_BYTES,
    batch_size,
    decode_batch,
    encode_record,
    entries_from_pb,
    frame_records,
)
from raftlet.consensus.log.errors import LogCorruptionError
from raftlet.consensus.log.segment import (
    HEADER_SIZE,
    ScannedRecord,
    SegmentScan,
    encode_header,
    parse_segment_name,
    scan_segment,
    segment_name,
)
from raftlet.proto.consensus_pb2 import CONFIG_CHANGE, NO_OP, NORMAL, EntryBatchPB
from tests.unit.wal_helpers import entries, no_op, segment_image

_PB_TYPE = {EntryType.NORMAL: NORMAL, EntryType.NO_OP: NO_OP, EntryType.CONFIG: CONFIG_CHANGE}

PATH = "/wal/wal-0000000000000001.seg"


def record_offsets(image: bytes) -> list[int]:
    scan = scan_segment(image, PATH, is_last=False)
    return [r.offset for r in scan.records]


def flip(data: bytes, offset: int, bit: int = 0) -> bytes:
    b = bytearray(data)
    b[offset] ^= 1 << bit
    return bytes(b)


def assert_records_intact(data: bytes, scan: SegmentScan) -> None:
    """Every record the reader returned is exactly what its CRC covers."""
    for r in scan.records:
        length, crc = FRAME.unpack_from(data, r.offset)
        payload = data[r.offset + FRAME.size : r.offset + FRAME.size + length]
        assert length == r.length
        assert crc32c.crc32c(payload) == crc
        batch = decode_batch(payload)
        assert batch.entries[0].index == r.first_index
        assert tuple(e.term for e in batch.entries) == r.terms
    assert scan.valid_end <= len(data)


# --- names and header ------------------------------------------------------------------


def test_segment_names_sort_by_sequence() -> None:
    names = [segment_name(s) for s in (10, 2, 1, 100, 99)]
    assert sorted(names) == [segment_name(s) for s in (1, 2, 10, 99, 100)]
    assert parse_segment_name(segment_name(12345)) == 12345
    assert parse_segment_name("wal-1.seg") is None
    assert parse_segment_name(segment_name(3) + ".tmp") is None


def test_header_round_trip() -> None:
    scan = scan_segment(encode_header(7), PATH, is_last=False, expected_sequence=7)
    assert scan == SegmentScan(sequence=7, records=[], valid_end=HEADER_SIZE)


@pytest.mark.parametrize(
    ("mutate", "offset", "reason"),
    [
        (lambda h: b"XXXXXXXX" + h[8:], 0, "bad magic"),
        (lambda h: flip(h, 12), 0, "header checksum mismatch"),
        (lambda h: flip(h, HEADER_SIZE - 1), 0, "header checksum mismatch"),
    ],
)
def test_bad_header_is_corruption_even_in_the_last_segment(
    mutate: object, offset: int, reason: str
) -> None:
    image = mutate(segment_image([entries(1, 3)]))  # type: ignore[operator]
    with pytest.raises(LogCorruptionError, match=reason) as exc:
        scan_segment(image, PATH, is_last=True)
    assert exc.value.path == PATH
    assert exc.value.offset == offset
    assert f"{PATH}: offset {offset}" in str(exc.value)


def test_sequence_must_match_the_file_name() -> None:
    with pytest.raises(LogCorruptionError, match=r"sequence 3.*says 4"):
        scan_segment(encode_header(3), PATH, is_last=True, expected_sequence=4)


def test_short_header_is_torn_only_in_the_last_segment() -> None:
    image = encode_header(1)[:10]
    scan = scan_segment(image, PATH, is_last=True)
    assert scan.header_torn
    assert scan.records == []
    with pytest.raises(LogCorruptionError, match="header incomplete"):
        scan_segment(image, PATH, is_last=False)


# --- records -----------------------------------------------------------------------------


def test_records_are_read_back_with_first_index_and_terms() -> None:
    image = segment_image([entries(1, 4), [no_op(4, 2)], entries(5, 7, term=2)])
    scan = scan_segment(image, PATH, is_last=True)
    assert [(r.first_index, r.terms) for r in scan.records] == [
        (1, (1, 1, 1)),
        (4, (2,)),
        (5, (2, 2)),
    ]
    assert scan.valid_end == len(image)
    assert scan.torn_offset is None
    assert_records_intact(image, scan)


def test_a_huge_batch_is_split_into_bounded_records() -> None:
    batch = entries(1, 40, size=100_000)
    framed = frame_records(batch)
    assert len(framed) > 1
    assert framed[0][0].first == 1
    assert all(rec.frame_size == len(frame) <= (1 << 20) + 200_000 for rec, frame in framed)
    decoded = [e for _, f in framed for e in entries_from_pb(decode_batch(f[FRAME.size :]))]
    assert decoded == batch


def test_an_entry_too_large_for_a_record_is_refused() -> None:
    with pytest.raises(ValueError, match="too large"):
        batch_size([Entry(term=1, index=1, data=b"x" * MAX_ENTRY_BYTES)])


@settings(max_examples=200)
@given(
    first=st.integers(1, 1 << 40),
    terms=st.lists(st.integers(1, 1 << 34), min_size=1, max_size=5).map(sorted),
    kinds=st.lists(st.sampled_from(EntryType), min_size=5, max_size=5),
    datas=st.lists(st.binary(max_size=300), min_size=5, max_size=5),
    synced=st.integers(0, 1 << 40),
)
def test_hand_written_encoding_is_what_protobuf_parses(
    first: int, terms: list[int], kinds: list[EntryType], datas: list[bytes], synced: int
) -> None:
    batch = [
        Entry(term=t, index=first + k, type=kinds[k], data=datas[k]) for k, t in enumerate(terms)
    ]
    head, payload = encode_record(batch, synced)
    length, crc = FRAME.unpack_from(head)
    assert (length, crc) == (len(payload), crc32c.crc32c(payload))
    assert entries_from_pb(decode_batch(payload)) == batch
    assert decode_batch(payload).synced_end == synced
    if all(datas[: len(batch)]):
        # With no field at its default, protobuf's own serialization is byte for byte ours.
        pbs = EntryBatchPB(synced_end=synced)
        for e in batch:
            pbs.entries.add(term=e.term, index=e.index, type=_PB_TYPE[e.type], payload=e.data)
        assert pbs.SerializeToString() == payload


@pytest.mark.parametrize(
    "bad",
    [
        [entries(1, 2)[0], entries(3, 4)[0]],  # gap
        [entries(2, 3, term=2)[0], entries(3, 4, term=1)[0]],  # term goes back
        entries(0, 1),  # index 0
        entries(1, 2, term=0),  # term 0
    ],
)
def test_the_encoder_refuses_what_is_not_a_log(bad: list[object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the reason varies by case
        batch_size(bad)  # type: ignore[arg-type]


def test_every_truncation_of_the_last_record_is_torn() -> None:
    image = segment_image([entries(1, 3), entries(3, 5), entries(5, 8, size=50)])
    last = record_offsets(image)[-1]
    for cut in range(last, len(image)):
        scan = scan_segment(image[:cut], PATH, is_last=True)
        assert [r.first_index for r in scan.records] == [1, 3]
        assert scan.valid_end == last
        assert scan.torn_offset == (None if cut == last else last)


def test_truncated_record_in_an_earlier_segment_is_corruption() -> None:
    image = segment_image([entries(1, 3), entries(3, 5)])
    last = record_offsets(image)[-1]
    with pytest.raises(LogCorruptionError) as exc:
        scan_segment(image[:-1], PATH, is_last=False)
    assert exc.value.offset == last


def test_bad_crc_on_the_final_record_is_torn() -> None:
    image = segment_image([entries(1, 3), entries(3, 5)])
    last = record_offsets(image)[-1]
    scan = scan_segment(flip(image, len(image) - 1), PATH, is_last=True)
    assert scan.torn_offset == last
    assert "checksum" in scan.torn_reason


def test_zero_filled_tail_is_torn() -> None:
    image = segment_image([entries(1, 3)])
    scan = scan_segment(image + bytes(4096), PATH, is_last=True)
    assert scan.torn_offset == len(image)
    assert [r.first_index for r in scan.records] == [1]


@pytest.mark.parametrize("field_offset", [0, 3, 4, 8, 20])
def test_bit_flip_in_an_earlier_record_is_corruption_naming_its_offset(field_offset: int) -> None:
    image = segment_image([entries(1, 3), entries(3, 5), entries(5, 7)])
    second = record_offsets(image)[1]
    damaged = flip(image, second + field_offset, bit=6)
    with pytest.raises(LogCorruptionError) as exc:
        scan_segment(damaged, PATH, is_last=True)
    assert exc.value.offset == second
    assert exc.value.path == PATH
    assert f"offset {second}" in str(exc.value)


def test_impossible_length_is_corruption_when_records_follow() -> None:
    image = bytearray(segment_image([entries(1, 3), entries(3, 5), entries(5, 7)]))
    second = record_offsets(bytes(image))[1]
    struct.pack_into("<I", image, second, 0)
    with pytest.raises(LogCorruptionError, match="impossible record length 0"):
        scan_segment(bytes(image), PATH, is_last=True)


def test_intact_crc_over_a_bad_payload_is_corruption_not_torn() -> None:
    payload = b"\xff\xff\xff"
    image = encode_header(1) + FRAME.pack(len(payload), crc32c.crc32c(payload)) + payload
    with pytest.raises(LogCorruptionError, match="not an EntryBatchPB") as exc:
        scan_segment(image, PATH, is_last=True)
    assert exc.value.offset == HEADER_SIZE


def test_intact_record_with_a_gap_inside_is_corruption() -> None:
    from raftlet.proto import consensus_pb2 as pb

    batch = pb.EntryBatchPB()
    batch.entries.add(term=1, index=1, type=pb.NORMAL)
    batch.entries.add(term=1, index=3, type=pb.NORMAL)
    payload = batch.SerializeToString()
    image = encode_header(1) + FRAME.pack(len(payload), crc32c.crc32c(payload)) + payload
    with pytest.raises(LogCorruptionError, match="not contiguous"):
        scan_segment(image, PATH, is_last=True)


# --- fuzzing -------------------------------------------------------------------------------

VALID = segment_image(
    [entries(1, 3), [no_op(3, 2)], entries(4, 9, term=2, size=40), entries(6, 7, term=3)]
)


def scan_or_corruption(data: bytes, is_last: bool) -> SegmentScan | None:
    error: LogCorruptionError | None = None
    try:
        scan = scan_segment(data, PATH, is_last=is_last)
    except LogCorruptionError as exc:
        error = exc
    if error is not None:
        assert error.path == PATH
        assert 0 <= error.offset <= len(data)
        return None
    assert_records_intact(data, scan)
    if scan.torn_offset is not None:
        assert is_last
        assert scan.valid_end == scan.torn_offset
    else:
        assert scan.valid_end == len(data) or scan.header_torn
    return scan


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=600), is_last=st.booleans(), with_header=st.booleans())
def test_random_bytes_never_crash_the_reader(data: bytes, is_last: bool, with_header: bool) -> None:
    scan_or_corruption((encode_header(1) if with_header else b"") + data, is_last)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(VALID) - 1), st.integers(1, 255)), min_size=1, max_size=4
    ),
    cut=st.integers(0, len(VALID)),
    is_last=st.booleans(),
)
def test_mutated_segments_yield_only_intact_records(
    edits: list[tuple[int, int]], cut: int, is_last: bool
) -> None:
    image = bytearray(VALID)
    for offset, xor in edits:
        image[offset] ^= xor
    scan = scan_or_corruption(bytes(image[:cut]), is_last)
    if scan is not None:
        # Whatever survived is a prefix of what was written, record for record.
        originals: list[ScannedRecord] = scan_segment(VALID, PATH, is_last=False).records
        assert scan.records == originals[: len(scan.records)]
