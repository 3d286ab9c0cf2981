"""Tunables of one log and the observer hook that metrics plug into."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["MAX_INJECT_LATENCY_MS", "LogObserver", "LogOptions", "NullLogObserver"]

MiB = 1 << 20
# The most fault injection may add to one sync (latency and jitter each). Ten seconds is
# already far past an election timeout, so no test needs more; and an unbounded value once
# let a single SetFlag park a tablet's appender for days (time.sleep of 1e9 s) or fail its
# log outright (a sleep too long for the C clock type raises OverflowError).
MAX_INJECT_LATENCY_MS = 10_000.0


@dataclass(frozen=True, slots=True)
class LogOptions:
    # A segment is rolled over once the next record would take it past this size (a record
    # bigger than this gets a segment of its own).  Segments are the unit of prefix GC.
    segment_size_bytes: int = 8 * MiB
    # Bytes of encoded batches waiting for the appender.  A producer blocks while the queue
    # is full (back-pressure from a slow disk reaches the callers instead of memory).
    group_commit_queue_size_bytes: int = 4 * MiB
    # Decoded recent entries kept in memory, so followers that are nearly caught up and the
    # apply path are served without reading segments back.
    cache_size_bytes: int = 16 * MiB
    # Added after every fdatasync, to reproduce a slow disk (--log_inject_latency_ms).
    inject_latency_ms: float = 0.0
    inject_latency_jitter_ms: float = 0.0
    # False skips fdatasync/fsync entirely: only for tests and CPU benchmarks, never durable.
    fsync: bool = True
    # Reserve each segment's space when it is created (consensus/log/prealloc.py), so that
    # a disk filling up fails the store, which recovers, before the log, which does not.
    preallocate_segments: bool = True

    def reserved_segment_bytes(self) -> int:
        """The disk space to reserve for a new segment (0: none)."""
        return self.segment_size_bytes if self.preallocate_segments else 0

    def __post_init__(self) -> None:
        if self.segment_size_bytes <= 0:
            raise ValueError("segment_size_bytes must be positive")
        if self.group_commit_queue_size_bytes <= 0:
            raise ValueError("group_commit_queue_size_bytes must be positive")
        if self.cache_size_bytes < 0:
            raise ValueError("cache_size_bytes must be >= 0")
        for value in (self.inject_latency_ms, self.inject_latency_jitter_ms):
            # Written so that NaN fails too.
            if not 0 <= value <= MAX_INJECT_LATENCY_MS:
                raise ValueError(
                    f"injected latency must be in 0..{MAX_INJECT_LATENCY_MS:g} ms, got {value}"
                )


class LogObserver(Protocol):
    """What the log reports as it works; the metrics layer implements it.

    ``batch_durable`` and ``group_synced`` run on the appender thread, so they must be quick
    and must not block or call into the log.  ``producer_blocked`` runs on the producer's
    thread, without the log's lock.
    """

    def batch_durable(self, entries: int, latency_us: float) -> None:
        """A batch is durable: ``latency_us`` from ``append_async`` until now, i.e. what a
        writer waits (``log_append_latency_us``).  Called just before its callback."""
        ...

    def group_synced(
        self, batches: int, entries: int, nbytes: int, write_us: float, sync_us: float
    ) -> None:
        """One group commit: ``batches`` written with ``nbytes`` and made durable by one
        fdatasync taking ``sync_us``, injected latency included (``log_sync_latency_us``;
        ``entries`` feeds ``log_group_commit_entries``).  Not called for a group with
        nothing to write."""
        ...

    def producer_blocked(self, queued_bytes: int) -> None:
        """A producer found the group-commit queue full and is about to wait."""
        ...


class NullLogObserver:
    """The default: observes nothing."""

    def batch_durable(self, entries: int, latency_us: float) -> None:
        pass

    def group_synced(
        self, batches: int, entries: int, nbytes: int, write_us: float, sync_us: float
    ) -> None:
        pass

    def producer_blocked(self, queued_bytes: int) -> None:
        pass
