"""tserver/message_limits.py: the one size rule. A write that passes the leader's check
always reaches the peers -- its append, framed as the stream sends it, with the longest
names and the largest numbers there can be, is under the peers' limit -- and an append
of several entries, cut where the core cuts it, stays under the client limit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlet.cluster.placement import tablet_id
from raftlet.cluster.validate import MAX_NAME_LENGTH, MAX_PARTITIONS
from raftlet.consensus.core import Entry, EntryType, Message, MessageType
from raftlet.consensus.core.storage import limit_size
from raftlet.consensus.core.types import MAX_INDEX, MAX_TERM
from raftlet.consensus.log.codec import MAX_ENTRY_BYTES, batch_size
from raftlet.consensus.rpc.codec import encode_request
from raftlet.consensus.rpc.stream_transport import encode_item
from raftlet.proto import common_pb2, consensus_pb2, tablet_pb2
from raftlet.tserver.message_limits import (
    MAX_CLIENT_MESSAGE_BYTES,
    PEER_FRAMING_BYTES,
    MessageLimits,
    chunks_by_size,
)
from raftlet.tserver.tablet_replica import write_entry_payload

KiB, MiB = 1 << 10, 1 << 20
# The longest ids a config allows: what a replication message spends on names.
TABLET = tablet_id("t" * MAX_NAME_LENGTH, MAX_PARTITIONS - 1)
LEADER, FOLLOWER, TRANSFEREE = ("a" * MAX_NAME_LENGTH, "b" * MAX_NAME_LENGTH, "c" * MAX_NAME_LENGTH)
WIDEST_SEQ = 2**64 - 1  # a stream's item numbers only grow


def _append(entries: tuple[Entry, ...]) -> Message:
    """An APPEND with every number at its widest and every name at its longest."""
    return Message(
        MessageType.APPEND,
        LEADER,
        FOLLOWER,
        term=MAX_TERM,
        log_term=MAX_TERM,
        index=entries[0].index - 1,
        entries=entries,
        commit=MAX_INDEX,
        context=MAX_INDEX,
        transferee=TRANSFEREE,
    )


def _framed(message: Message) -> int:
    """The bytes ``message`` takes in a consensus stream frame."""
    return len(encode_item(WIDEST_SEQ, encode_request(message, TABLET)))


@pytest.mark.parametrize("client_bytes", [KiB, 64 * KiB, 16 * MiB])
def test_an_append_of_one_entry_that_passed_the_write_check_reaches_the_peers(
    client_bytes: int,
) -> None:
    limits = MessageLimits(client_bytes)
    # No entry payload is larger than the largest write (see the next test).
    entry = Entry(MAX_TERM, MAX_INDEX, EntryType.NORMAL, b"x" * limits.write_bytes)
    framed = _framed(_append((entry,)))
    assert framed <= limits.peer_bytes
    # And by far: the margin covers what the framing really takes many times over.
    assert framed - limits.write_bytes < 1 * KiB < PEER_FRAMING_BYTES
    batch_size([entry])  # the WAL takes it too


@pytest.mark.parametrize("client_bytes", [KiB, 64 * KiB, 16 * MiB])
@pytest.mark.parametrize("payload", [0, 1, 100])
def test_an_append_of_many_small_entries_stays_under_the_client_limit(
    client_bytes: int, payload: int
) -> None:
    """``Entry.size()`` counts 24 bytes of framing an entry can take 35 of on the wire:
    the core's batch cap of M / 2 keeps even the most undercounted append under M."""
    limits = MessageLimits(client_bytes)
    first = MAX_INDEX - 100_000
    many = [Entry(MAX_TERM, first + i, EntryType.NORMAL, b"x" * payload) for i in range(100_000)]
    entries = limit_size(many, limits.append_batch_bytes)  # what the core puts in one APPEND
    assert 1 < len(entries) < len(many)
    assert _framed(_append(tuple(entries))) <= limits.client_bytes


_request_ids = st.builds(
    common_pb2.RequestIdPB,
    client_id=st.text(max_size=40),
    seq_no=st.integers(0, 2**63 - 1),
    first_incomplete_seq_no=st.integers(0, 2**63 - 1),
    attempt_no=st.integers(0, 2**31 - 1),
)
_ops = st.lists(
    st.builds(
        tablet_pb2.RowOperationPB,
        type=st.sampled_from(list(tablet_pb2.RowOperationPB.OpType.values())),
        cells=st.lists(
            st.builds(
                tablet_pb2.CellPB,
                column=st.text(max_size=10),
                value=st.builds(tablet_pb2.ValuePB, string_value=st.text(max_size=20)),
            ),
            max_size=3,
        ),
    ),
    max_size=5,
)


@given(
    tablet=st.text(max_size=100),
    request_id=st.none() | _request_ids,
    ops=_ops,
    block=st.none() | st.tuples(st.binary(max_size=64), st.binary(max_size=64)),
)
def test_an_entry_is_never_larger_than_its_write(
    tablet: str,
    request_id: common_pb2.RequestIdPB | None,
    ops: list[tablet_pb2.RowOperationPB],
    block: tuple[bytes, bytes] | None,
) -> None:
    """The leader checks the request's size; what it replicates is the entry's payload."""
    request = tablet_pb2.WriteRequest(tablet_id=tablet, ops=ops)
    if request_id is not None:
        request.request_id.CopyFrom(request_id)
    if block is not None:
        request.row_block.rows, request.row_block.indirect = block
    assert len(write_entry_payload(request)) <= request.ByteSize()


def test_limits_follow_the_client_limit_and_stay_within_grpc_and_the_wal() -> None:
    default = MessageLimits(16 * MiB)
    assert default.write_bytes == 16 * MiB
    assert default.peer_bytes == 16 * MiB + PEER_FRAMING_BYTES
    assert default.append_batch_bytes == MiB  # the core's own default, unchanged
    assert MessageLimits(KiB).append_batch_bytes == KiB // 2
    largest = MessageLimits(MAX_CLIENT_MESSAGE_BYTES)
    assert largest.peer_bytes == 2**31 - 1  # gRPC's limits are C ints
    # The WAL refuses larger entries, whatever the flag says.
    assert largest.write_bytes + Entry(1, 1).size() == MAX_ENTRY_BYTES
    for bad in (0, MAX_CLIENT_MESSAGE_BYTES + 1):
        with pytest.raises(ValueError, match="max message bytes"):
            MessageLimits(bad)


@given(
    sizes=st.lists(st.integers(0, 300), max_size=40),
    max_bytes=st.integers(1, 1000),
)
def test_chunks_keep_order_and_hold_each_message_to_the_limit(
    sizes: list[int], max_bytes: int
) -> None:
    items = [
        consensus_pb2.ConsensusItemPB(seq=i, failed={"message": "x" * n})
        for i, n in enumerate(sizes)
    ]
    chunks = list(chunks_by_size(items, lambda item: item.ByteSize(), max_bytes))
    assert [item for chunk in chunks for item in chunk] == items
    for chunk in chunks:
        assert chunk
        if len(chunk) > 1:  # only an item too large on its own may be sent alone over it
            assert consensus_pb2.ConsensusFramePB(items=chunk).ByteSize() <= max_bytes
