"""Shared helpers for the WAL tests: entries, segment images, a recording observer."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from raftlet.consensus.core.types import Entry, EntryType
from raftlet.consensus.log.codec import frame_records
from raftlet.consensus.log.segment import encode_header


def entry(index: int, term: int = 1, data: bytes | None = None) -> Entry:
    return Entry(term=term, index=index, data=b"e%d" % index if data is None else data)


def entries(lo: int, hi: int, term: int = 1, size: int = 0) -> list[Entry]:
    """Entries lo .. hi-1, each with a payload of ``size`` bytes (or a short tag)."""
    return [
        Entry(term=term, index=i, data=(b"%d:" % i).ljust(size, b"x") if size else b"e%d" % i)
        for i in range(lo, hi)
    ]


def no_op(index: int, term: int) -> Entry:
    return Entry(term=term, index=index, type=EntryType.NO_OP)


def segment_image(batches: Sequence[Sequence[Entry]], sequence: int = 1) -> bytes:
    """A segment file's bytes holding one record per batch."""
    out = bytearray(encode_header(sequence))
    for batch in batches:
        for _, frame in frame_records(batch):
            out += frame
    return bytes(out)


class RecordingObserver:
    """Counts what the log reports; can stall the appender after a group is synced."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.groups: list[tuple[int, int, int]] = []  # (batches, entries, nbytes)
        self.batches = 0
        self.blocked = 0
        self.latencies_us: list[float] = []
        self._stall = threading.Event()
        self._stall.set()
        self.stalled = threading.Event()

    def stall(self) -> None:
        """The next group_synced call blocks until ``release``."""
        self._stall.clear()
        self.stalled.clear()

    def release(self) -> None:
        self._stall.set()

    def batch_durable(self, entries: int, latency_us: float) -> None:
        with self.cond:
            self.batches += 1
            self.latencies_us.append(latency_us)
            self.cond.notify_all()

    def group_synced(
        self, batches: int, entries: int, nbytes: int, write_us: float, sync_us: float
    ) -> None:
        with self.cond:
            self.groups.append((batches, entries, nbytes))
            self.cond.notify_all()
        if not self._stall.is_set():
            self.stalled.set()
            assert self._stall.wait(timeout=30), "test never released the appender"

    def producer_blocked(self, queued_bytes: int) -> None:
        with self.cond:
            self.blocked += 1
            self.cond.notify_all()
