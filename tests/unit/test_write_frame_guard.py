"""``tserver.write_frame_guard.writes_over``: a WriteStream message's writes counted from its
bytes, without parsing it, exactly up to the limit."""

from __future__ import annotations

from raftlet.proto import tablet_pb2
from raftlet.tserver.write_frame_guard import writes_over


def _frame(n: int, value: bytes = b"") -> bytes:
    items = []
    for i in range(n):
        request = tablet_pb2.WriteRequest(tablet_id="kv-p0")
        request.request_id.client_id = value.decode() if value else ""
        items.append(tablet_pb2.WriteStreamItemPB(id=i, request=request))
    return tablet_pb2.WriteStreamRequestPB(items=items).SerializeToString()


def test_a_message_at_the_limit_passes_and_one_over_is_counted_over() -> None:
    assert writes_over(_frame(40), limit=40) == 0
    assert writes_over(_frame(41), limit=40) == 41
    empty = tablet_pb2.WriteStreamRequestPB(items=[tablet_pb2.WriteStreamItemPB()] * 5000)
    assert writes_over(empty.SerializeToString(), limit=4096) == 4097


def test_values_full_of_newlines_are_walked_not_taken_for_writes() -> None:
    """0x0A starts every write, and is also a newline: a message of few writes whose values
    hold many is counted field by field."""
    data = _frame(10, value=b"\n" * 500)
    assert data.count(b"\n") > 40
    assert writes_over(data, limit=40) == 0
    assert writes_over(_frame(50, value=b"\n" * 5), limit=40) == 41


def test_bytes_that_are_no_protobuf_are_left_to_the_parser() -> None:
    assert writes_over(b"\x0a" * 100, limit=10) == 0  # lengths run past the end
    assert writes_over(b"\x0f" + b"\x0a" * 100, limit=10) == 0  # wire type 7
    assert writes_over(b"\xff" * 20 + b"\x0a" * 100, limit=10) == 0  # varint too long
