"""The one-pass record readers (``decode_entries`` for reads, ``scan_record`` for indexing on
open) give exactly what ``decode_batch`` gives: the same entries, or the same ValueError."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raftlet.consensus.log.codec import decode_batch, decode_entries, entries_from_pb, scan_record
from raftlet.proto.consensus_pb2 import CONFIG_CHANGE, ENTRY_UNKNOWN, NO_OP, NORMAL, EntryBatchPB

_TYPES = [NORMAL, NO_OP, ENTRY_UNKNOWN, CONFIG_CHANGE, 77]


def _verdict(read: object, payload: bytes) -> object:
    try:
        if read is decode_entries:
            return decode_entries(payload)
        if read is scan_record:
            return scan_record(payload)
        batch = decode_batch(payload)
        if read == "entries":
            return entries_from_pb(batch)
        return batch.entries[0].index, tuple(e.term for e in batch.entries)
    except ValueError as e:
        return f"ValueError: {e}"


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    """Mostly well-formed batches, some with a gap, a term going back, an index or term of
    0 or an unknown type; and some bytes that are no EntryBatchPB at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=40))
    batch = EntryBatchPB()
    index = draw(st.integers(0, 3))
    term = draw(st.integers(0, 3))
    for _ in range(draw(st.integers(0, 6))):
        e = batch.entries.add()
        e.index = index
        e.term = term
        e.type = draw(st.sampled_from(_TYPES)) if draw(st.integers(0, 5)) == 0 else NORMAL  # type: ignore[assignment]  # 77: unknown on purpose
        e.payload = draw(st.binary(max_size=4))
        index += draw(st.sampled_from([1, 1, 1, 1, 2, 0]))
        term = max(0, term + draw(st.sampled_from([0, 0, 0, 1, -1])))
    return batch.SerializeToString()


@settings(max_examples=500, deadline=None)
@given(payloads())
def test_decode_entries_is_decode_batch_then_entries_from_pb(payload: bytes) -> None:
    assert _verdict(decode_entries, payload) == _verdict("entries", payload)


@settings(max_examples=500, deadline=None)
@given(payloads())
def test_scan_record_is_decode_batch_then_its_first_index_and_terms(payload: bytes) -> None:
    assert _verdict(scan_record, payload) == _verdict("scan", payload)
