"""Message sizes: one rule for what a client may write, what a leader replicates and what
peers accept, derived from the one flag ``--max_message_bytes`` (M).

The bug this replaces: the gRPC server, the peer channels and the client all used M, so a
write of 16 MiB - 16 bytes was accepted, its entry (the write plus ~60 bytes of entry and
message framing) was refused by every peer as larger than M, and the stream broke again
on every resend: the tablet's writes all timed out until its leader was killed.

The rule (``MessageLimits``):

- **Writes** (client → leader): a ``WriteRequest`` of at most ``write_bytes`` = min(M, the
  WAL's largest entry) serialized bytes; a larger one is refused by
  ``TabletReplica.write`` with INVALID_ARGUMENT naming the limit, before it is admitted,
  let alone replicated. The entry's payload (``WriteOperationPB``: the request id and the
  rows) is the request less its tablet id, so no entry is larger than ``write_bytes``.
- **Appends** (leader → follower): an APPEND carries one entry of any size, or several
  whose ``Entry.size()`` sum to at most ``append_batch_bytes`` = min(1 MiB, M / 2) (the
  core's ``max_size_per_msg``). ``Entry.size()`` counts 24 bytes of framing per entry and
  the wire takes at most 35, so several entries take at most 35/24 of M / 2: under M.
- **Framing**: an APPEND adds to its entries its ids, terms and indexes, and the consensus
  stream its item and frame headers: well under 1 KiB with the longest names the config
  allows (``tests/unit/test_message_limits.py`` builds the worst case).
  ``PEER_FRAMING_BYTES`` (64 KiB) covers that many times over.
- **Peers**: ``peer_bytes`` = M + ``PEER_FRAMING_BYTES`` is what the gRPC server (which
  serves clients and peers on one port) receives and sends, and what the peer channels
  send and receive. So any write that passed the check replicates; the stream transport
  also cuts a frame of several items at ``peer_bytes`` and drops (with an error in the
  log) an item it could never send, rather than break the stream every tablet shares.
  Every server of a cluster must run with the same M, as with its Raft timings.
- **Scans** (server → client): a page's budget is at most M / 2 and it ends with the row
  that reaches it -- but before a row that would take it past ``scan_page_cap_bytes`` = M:
  the row, no larger than the write that put it there, begins the next page. With the
  columns and the resume key (a key is at most 16 KiB) a response stays under
  ``peer_bytes``, the limit the server sends and the client receives with.

A client request between M and ``peer_bytes`` therefore passes gRPC: a write is refused
by the check above; the other requests are small, and their fields are checked on their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from raftlet.consensus.core import Entry
from raftlet.consensus.log.codec import MAX_ENTRY_BYTES

__all__ = [
    "MAX_CLIENT_MESSAGE_BYTES",
    "PEER_FRAMING_BYTES",
    "MessageLimits",
    "chunks_by_size",
]

KiB = 1 << 10
MiB = 1 << 20
# What a replication message adds to the entries it carries, with room to spare.
PEER_FRAMING_BYTES = 64 * KiB
# gRPC's limits are C ints, and the peer limit is M plus the framing margin.
MAX_CLIENT_MESSAGE_BYTES = 2**31 - 1 - PEER_FRAMING_BYTES
# Entries per APPEND by size (the core's default): several small writes in one message.
_APPEND_BATCH_BYTES = MiB
# The WAL refuses an entry whose ``Entry.size()`` exceeds MAX_ENTRY_BYTES.
_ENTRY_SIZE_OVERHEAD = Entry(term=1, index=1).size()
# A repeated message field's element: one tag byte and a length of up to 5 varint bytes.
_ELEMENT_FRAMING = 6

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class MessageLimits:
    """Every size limit of a tablet server, from ``client_bytes`` (``--max_message_bytes``)."""

    client_bytes: int

    def __post_init__(self) -> None:
        if not 1 <= self.client_bytes <= MAX_CLIENT_MESSAGE_BYTES:
            raise ValueError(
                f"max message bytes must be in 1..{MAX_CLIENT_MESSAGE_BYTES}, "
                f"got {self.client_bytes}"
            )

    @property
    def write_bytes(self) -> int:
        """The largest ``WriteRequest`` a leader accepts (its entry is no larger)."""
        return min(self.client_bytes, MAX_ENTRY_BYTES - _ENTRY_SIZE_OVERHEAD)

    @property
    def append_batch_bytes(self) -> int:
        """The core's ``max_size_per_msg``: entry bytes of an APPEND of several entries."""
        return min(_APPEND_BATCH_BYTES, max(1, self.client_bytes // 2))

    @property
    def scan_page_cap_bytes(self) -> int:
        """The most a scan page's rows may take (``tserver.scan_page``)."""
        return self.client_bytes

    @property
    def peer_bytes(self) -> int:
        """What servers send each other and accept: gRPC server, peer channels, frames."""
        return self.client_bytes + PEER_FRAMING_BYTES


def chunks_by_size(
    items: Sequence[T], size_of: Callable[[T], int], max_bytes: int
) -> Iterator[list[T]]:
    """``items`` in order, cut into lists whose elements, as a repeated message field, take
    at most ``max_bytes``; an item larger than that on its own is a list of its own (the
    caller decides whether it may be sent)."""
    chunk: list[T] = []
    used = 0
    for item in items:
        size = size_of(item) + _ELEMENT_FRAMING
        if chunk and used + size > max_bytes:
            yield chunk
            chunk, used = [], 0
        chunk.append(item)
        used += size
    if chunk:
        yield chunk
