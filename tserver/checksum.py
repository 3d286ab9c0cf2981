"""Replica checksums at one log index (``raftlet cluster ksck --checksum``; Kudu's checksum
scan).

Replicas apply the same entries in the same order, so their rows are equal at every index
-- unless something went wrong underneath (a flipped bit in a store file, a bug). To compare
them while writes go on, the leader replicates a *checksum point*: an entry without rows
(``WriteOperationPB.checksum_point``). Every replica checksums its rows right after it
applies that entry: its apply thread -- the store's only writer -- opens a read transaction
right then, between two applies, so each checksum is of exactly the state at that index,
however far the replicas are apart in time, and the rows are read under it on a thread of
its own while the replica goes on applying (a daemon: a server that stops does not wait for
it, and it ends early once its replica stops). What it costs: the reading (about a second
per 30-60 MB of store file, the process's CPU shared with the writes), and while the read
transaction lasts SQLite cannot start its WAL file over (it grows); an operator's check,
not something to run in a loop. (Read in the apply thread, a checksum held a tablet's
writes for as long: 14 s for 320,000 rows of 1 KB, review r33a.)

A replica keeps the results of its last few points in memory. One that applied a point
while replaying its log after a restart took no checksum there and says so.

The checksum: BLAKE2b (128 bits) over every row, in primary-key order, of the values as the
store holds them -- so two replicas differ exactly when some row differs.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from raftlet.consensus.core.types import Entry, EntryType
from raftlet.proto import tablet_pb2
from raftlet.tserver.store import StoreError, TabletStore, damage_in

__all__ = [
    "CHECKSUM_MARKER",
    "STOPPED",
    "ChecksumResult",
    "RecentChecksums",
    "checksum_rows",
    "is_checksum_point",
    "pin_checksum",
    "split_after_checksum_points",
]

# The whole payload of a checksum point. A write always carries rows, so its payload never
# equals this: telling a point from a write is one bytes comparison, no decoding.
CHECKSUM_MARKER = tablet_pb2.WriteOperationPB(checksum_point=True).SerializeToString()

_FETCH_ROWS = 1000
_KEPT = 16
STOPPED = "the replica stopped while its rows were read"


def is_checksum_point(entry: Entry) -> bool:
    return entry.type is EntryType.NORMAL and entry.data == CHECKSUM_MARKER


def split_after_checksum_points(entries: list[Entry]) -> list[list[Entry]]:
    """``entries`` cut right after each checksum point; ``[entries]`` itself (no copy: it
    is every apply batch) when there is none."""
    ends = [i + 1 for i, entry in enumerate(entries) if is_checksum_point(entry)]
    if not ends:
        return [entries]
    starts = [0, *ends]
    if ends[-1] < len(entries):
        ends.append(len(entries))
    return [entries[lo:hi] for lo, hi in zip(starts, ends, strict=False)]


@dataclass(frozen=True, slots=True)
class ChecksumResult:
    index: int
    rows: int
    checksum: str  # hex; "" when ``failure`` says why there is none
    failure: str = ""


def pin_checksum(
    store: TabletStore,
    index: int,
    on_damage: Callable[[str], None] | None = None,
    stopped: Callable[[], bool] = lambda: False,
) -> Callable[[], ChecksumResult]:
    """Pin the rows of ``store``, which must have applied exactly ``index`` (the caller is
    its only writer), in a read transaction now; returns the checksum of them, to be called
    once, on any thread, while the store goes on. A store that cannot be read gives a result
    whose ``failure`` says why: that is what the check is for; ``on_damage`` hears it too
    when the file is damaged. Once ``stopped()`` the reading ends, its result a failure."""

    def failed(e: StoreError, rows: int = 0) -> ChecksumResult:
        damage = damage_in(e)
        if damage is not None and on_damage is not None:
            on_damage(damage)
        return ChecksumResult(index, rows, "", str(e))

    held = contextlib.ExitStack()
    try:
        cursor = held.enter_context(store.open_scan())
    except StoreError as e:
        result = failed(e)
        return lambda: result
    if cursor.applied_index != index:
        held.close()
        wrong = ChecksumResult(
            index, 0, "", f"the store is at index {cursor.applied_index}, not {index}"
        )
        return lambda: wrong

    def read() -> ChecksumResult:
        digest = hashlib.blake2b(digest_size=16)
        rows = 0
        with held:
            try:
                while batch := cursor.fetch(_FETCH_ROWS):
                    if stopped():
                        return ChecksumResult(index, rows, "", STOPPED)
                    for row in batch:
                        digest.update(repr(row).encode())
                        digest.update(b"\n")
                    rows += len(batch)
            except StoreError as e:
                return failed(e, rows)
        return ChecksumResult(index, rows, digest.hexdigest())

    return read


def checksum_rows(
    store: TabletStore, index: int, on_damage: Callable[[str], None] | None = None
) -> ChecksumResult:
    """``pin_checksum``'s checksum, read at once on this thread."""
    return pin_checksum(store, index, on_damage)()


class RecentChecksums:
    """The results of a replica's last checksum points, and a wait for one."""

    def __init__(self, kept: int = _KEPT) -> None:
        self._kept = kept
        self._results: OrderedDict[int, ChecksumResult] = OrderedDict()
        self._reading: set[int] = set()
        self._cond = threading.Condition()

    def begin(self, index: int) -> None:
        """The checksum at ``index`` is being read (``record`` ends it)."""
        with self._cond:
            self._reading.add(index)

    def reading(self, index: int) -> bool:
        with self._cond:
            return index in self._reading

    def record(self, result: ChecksumResult) -> None:
        with self._cond:
            self._reading.discard(result.index)
            self._results[result.index] = result
            while len(self._results) > self._kept:
                self._results.popitem(last=False)
            self._cond.notify_all()

    def wait(self, index: int, timeout_s: float) -> ChecksumResult | None:
        """The result at ``index``, waiting up to ``timeout_s`` for it; None if none came."""
        with self._cond:
            self._cond.wait_for(lambda: index in self._results, timeout_s)
            return self._results.get(index)
