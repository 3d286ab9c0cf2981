"""The durable Raft log of one tablet replica: segment files, group commit, reads, GC.

Threads and locks:

- ``_lock`` guards the in-memory index, the cache, the segment list and the group-commit
  queue.  It is held only for bookkeeping, never across I/O or a callback.
- The appender takes every batch queued since its last sync, writes them, issues one
  fdatasync, and then calls each batch's callback in order.  It is a turn on a worker pool
  (``consensus.workers``) that lasts while the log has work: a server's logs share one pool
  of appender threads, so an idle log holds no thread and a busy server hands a thread from
  one log to the next without waking another.  A log opened on its own gets a pool of one.
- ``_read_lock`` serializes reads of old entries from segment files against GC (which
  closes and deletes those files).  Lock order: ``_read_lock`` before ``_lock``.

A batch is visible to reads (``last_index``, ``term``, ``entries``) as soon as
``append_async`` returns: the index and the cache are updated at once, including the
truncation of a replaced suffix.  Durability is reported only through the callback.

Opening takes an exclusive ``flock`` on ``wal.lock`` (one ``Log`` per directory) and
verifies every segment.  A torn write -- in the *last* segment, a record whose header or
payload is incomplete, or whose CRC fails, with no intact record after it (a byte-by-byte
search, cheap because only positions that start like an ``EntryBatchPB`` are CRC-checked)
but those of its own group, which say they were written before it was durable
(``synced_end``) -- is cut off and logged with a warning naming the file and offset; a last
segment shorter than its header (a crash while rolling over) is removed the same way.
Everything else raises ``LogCorruptionError`` naming the file and byte offset, and nothing
is changed on disk: a bad record in an earlier segment, a bad record with an intact one
after it written once it was durable (or by a version that did not say), a zero or
over-64-MiB length, an intact CRC over a payload that does not parse or
is not contiguous, a bad header or sequence, a missing segment, a gap between records, a
term going back.  The log then continues appending to the last segment.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence

from raftlet.consensus.core.storage import limit_size
from raftlet.consensus.core.types import Entry
from raftlet.consensus.log.cache import LogCache
from raftlet.consensus.log.codec import (
    MAX_ENTRY_BYTES,
    NO_OP,
    NORMAL,
    TARGET_RECORD_BYTES,
    batch_size,
    decode_entries,
    encode_record,
    split_records,
)
from raftlet.consensus.log.errors import (
    LogClosedError,
    LogCorruptionError,
    LogEntryCompactedError,
    LogError,
    LogFailedError,
)
from raftlet.consensus.log.index import LogIndex, Rec
from raftlet.consensus.log.options import LogObserver, LogOptions, NullLogObserver
from raftlet.consensus.log.segment import (
    HEADER_SIZE,
    SegmentWriter,
    fsync_dir,
    parse_segment_name,
    read_record,
    scan_segment,
    unused_path,
)
from raftlet.consensus.workers import WorkerPool

__all__ = ["AppendCallback", "Log", "write_log_start"]

logger = logging.getLogger(__name__)

AppendCallback = Callable[[BaseException | None], None]

LOCK_FILE = "wal.lock"
_NONE = 1 << 62  # "no index": larger than any real one
# A synced group's callbacks wait for the next group's write only if that write is small.
_DEFER_COMPLETION_BYTES = 256 << 10
# Contiguous batches of a group share a record up to this size: one frame, one CRC and
# one index slot for many small entries.  Kept well below TARGET_RECORD_BYTES because a
# read from disk decodes a whole record, however few of its entries it wants.
_PACK_RECORD_BYTES = 64 << 10


# A queued batch: (entries, callback, approximate bytes, perf_counter at enqueue).
# A plain tuple because building it is on every producer's path, where a class instance
# costs a microsecond more under the GIL.
_Batch = tuple[Sequence[Entry], AppendCallback, int, float]


class _Group:
    """What the appender took from the queue in one go, and how writing it went."""

    __slots__ = ("batches", "entries", "error", "nbytes", "placed", "sync_us", "write_us")

    def __init__(self, batches: list[_Batch]) -> None:
        self.batches = batches
        self.entries = sum(len(b[0]) for b in batches)
        self.nbytes = sum(b[2] for b in batches)
        self.placed: list[Rec] = []
        self.error: BaseException | None = None
        self.write_us = 0.0
        self.sync_us = 0.0


class Log:
    """Use ``Log.open(directory, options)``; close it (or use it as a context manager)."""

    def __init__(
        self,
        directory: str,
        options: LogOptions,
        observer: LogObserver,
        index: LogIndex,
        segments: dict[int, str],
        writer: SegmentWriter,
        lock_fd: int,
        appenders: WorkerPool | None = None,
    ) -> None:
        self.directory = directory
        # Wakes an injected sleep when the options change or the log closes (the property
        # below), so that lowering --log_inject_latency_ms takes effect on the sync under
        # way, not after it. Its own lock: the sleeper must not hold ``_lock``.
        self._latency_wake = threading.Condition(threading.Lock())
        self._options = options
        self._observer = observer
        self._lock_fd = lock_fd
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)  # producers wait for queue space
        self._read_lock = threading.Lock()
        self._index = index
        self._cache = LogCache(options.cache_size_bytes, index.last + 1)
        self._segments = segments  # sequence -> path, oldest first; the last is active
        self._read_fds: dict[int, int] = {}
        self._writer = writer  # the appender's alone once it runs
        # Group-commit queue.  _queue_min_first is the lowest first index of a queued batch:
        # entries from there on have no record on disk yet, so the cache must keep them.
        self._queue: list[_Batch] = []
        self._queued_bytes = 0
        self._queue_min_first = _NONE
        self._unwritten_from = _NONE
        self._appender_idle = True  # no turn is queued or running
        # perf_counter() when the appender began writing the group it has not finished
        # syncing yet, 0.0 between groups (``stalled_for``).
        self._busy_since = 0.0
        self._producers_waiting = 0
        self._closing = False
        self._failure: BaseException | None = None
        self._rng = random.Random()
        self._own_appenders = appenders is None
        name = f"log-appender:{os.path.basename(directory)}"
        self._appenders = appenders or WorkerPool(name, min_threads=1, max_threads=1)
        self._turns = self._appenders.mailbox(name, self._take_turn)
        self._appender_ident: int | None = None  # the thread taking the turn, while it runs

    @property
    def options(self) -> LogOptions:
        return self._options

    @options.setter
    def options(self, options: LogOptions) -> None:
        """Replace the options; the appender reads them at every sync (one assignment takes
        effect), and an injected sleep under way re-reads its length at once."""
        with self._latency_wake:
            self._options = options
            self._latency_wake.notify_all()

    # --- opening ----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        options: LogOptions | None = None,
        observer: LogObserver | None = None,
        appenders: WorkerPool | None = None,
    ) -> Log:
        """Open (or create) the log in ``directory``, verifying every segment.

        A torn record at the very end is cut off with a warning; any other damage raises
        LogCorruptionError.  Only one Log may have a directory open at a time.
        ``appenders``: the pool whose threads write and sync (the server's, shared by its
        logs); by default the log gets one thread of its own.
        """
        path = os.fspath(directory)
        opts = options or LogOptions()
        os.makedirs(path, exist_ok=True)
        lock_fd = _lock_directory(path)
        try:
            index, segments, writer = _recover(path, opts)
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(
            path, opts, observer or NullLogObserver(), index, segments, writer, lock_fd, appenders
        )

    # --- appends ----------------------------------------------------------------------

    def append_async(self, entries: Sequence[Entry], callback: AppendCallback) -> None:
        """Queue ``entries`` to be made durable; ``callback(None)`` once they are.

        ``entries[0].index`` may be at or below the last index: the suffix from there is
        replaced (at once in memory, on disk by this later record winning on replay).
        Blocks while the group-commit queue is full.  The callback runs on the appender
        thread, after every batch queued before it, with None or the error; it must be
        quick and must not call ``append``.  An empty batch is a barrier: its callback runs
        once everything queued before it is durable.
        """
        if len(entries) == 1:
            # batch_size() of one entry, inline: this is every single-entry producer's path.
            e0 = entries[0]
            nbytes = len(e0.data) + 24
            if (
                e0.index < 1
                or e0.term < 1
                or (e0.type is not NORMAL and e0.type is not NO_OP)
                or nbytes > MAX_ENTRY_BYTES
            ):
                batch_size(entries)  # raises, saying why
        else:
            nbytes = batch_size(entries) if entries else 0
        batch = (entries, callback, nbytes, time.perf_counter())
        with self._lock:
            queued = self._queued_bytes
            if (
                self._failure is not None
                or self._closing
                or (queued and queued + nbytes > self.options.group_commit_queue_size_bytes)
            ):
                self._wait_for_space(nbytes, threading.get_ident() == self._appender_ident)
            if entries:
                e0 = entries[0]
                first = e0.index
                idx = self._index
                cache = self._cache
                if first == idx.next and e0.term >= idx.last_term and len(entries) == 1:
                    # The hot path (one entry after the last), without the general
                    # truncating appends.
                    idx.append_one(e0.term)
                    if cache.hi == first:
                        cache.append_one(e0)
                    else:
                        cache.append(entries)
                else:
                    if first != idx.next or e0.term < idx.last_term:
                        self._check_position(entries)  # raises unless a legal overwrite
                    idx.append(first, [e.term for e in entries])
                    cache.append(entries)
                if first < self._queue_min_first:
                    self._queue_min_first = first
                if first < self._unwritten_from:
                    self._unwritten_from = first
            self._queue.append(batch)
            self._queued_bytes += nbytes
            wake = self._appender_idle
            self._appender_idle = False
        if wake:
            self._turns.post(None)

    def append(self, entries: Sequence[Entry], timeout: float | None = None) -> None:
        """``append_async`` and wait until durable; raises what the callback would get."""
        if threading.get_ident() == self._appender_ident:
            raise RuntimeError("append() from a log callback would wait for itself")
        done = threading.Lock()
        done.acquire()
        result: list[BaseException | None] = []

        def callback(error: BaseException | None) -> None:
            result.append(error)
            done.release()

        self.append_async(entries, callback)
        if not done.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError(f"append not durable within {timeout} s")
        if result[0] is not None:
            raise result[0]

    def _wait_for_space(self, nbytes: int, from_appender: bool) -> None:
        """With ``_lock`` held: return once the batch may be queued, or raise."""
        told = False
        while True:
            if self._failure is not None:
                raise LogFailedError(f"log {self.directory} has failed") from self._failure
            if self._closing:
                raise LogClosedError(f"log {self.directory} is closed")
            # An empty queue admits any batch, or a huge one could never get in; a callback
            # (on the appender thread) is admitted too, as nobody else would drain the queue.
            if (
                self._queued_bytes == 0
                or self._queued_bytes + nbytes <= self.options.group_commit_queue_size_bytes
                or from_appender
            ):
                return
            if not told:
                told = True
                queued = self._queued_bytes
                self._lock.release()
                try:
                    self._observer.producer_blocked(queued)
                except Exception:
                    logger.exception("log %s: observer raised", self.directory)
                finally:
                    self._lock.acquire()
                continue
            self._producers_waiting += 1
            try:
                self._space.wait()
            finally:
                self._producers_waiting -= 1

    def _check_position(self, entries: Sequence[Entry]) -> None:
        first = entries[0].index
        idx = self._index
        if not len(idx):
            if first != idx.first:
                raise ValueError(f"append at {first} to an empty log that starts at {idx.first}")
            return
        if first < idx.first:
            raise ValueError(f"append at {first} would replace compacted entries (< {idx.first})")
        if first > idx.last + 1:
            raise ValueError(f"append at {first} leaves a gap after {idx.last}")
        if first > idx.first and entries[0].term < idx.term(first - 1):
            raise ValueError(
                f"term goes back from {idx.term(first - 1)} to {entries[0].term} at {first}"
            )

    def stalled_for(self) -> float:
        """Seconds the oldest write not yet durable has waited: in the appender's write or
        sync, or queued for an appender (on a hung disk, the server's appender threads may
        all be stuck in other logs' writes).  0.0 when nothing waits.  Lock-free, for a
        check on every tick; the injected latency counts, as it stands for the disk's."""
        now = time.perf_counter()
        since = self._busy_since
        queue = self._queue  # replaced, never shrunk, by the appender: q[0] stays valid
        if queue:
            queued = queue[0][3]
            since = min(since, queued) if since else queued
        return now - since if since else 0.0

    # --- the appender thread ----------------------------------------------------------

    def _take_turn(self, _wakes: list[None]) -> None:
        self._appender_ident = threading.get_ident()
        try:
            self._run()
        finally:
            self._appender_ident = None

    def _run(self) -> None:
        """Write, sync and complete groups until nothing is queued (the log is idle)."""
        # The callbacks of a synced group run only after the next group is written: a
        # callback wakes a producer, and every woken producer competes for the GIL, so the
        # appender would otherwise wait behind all of them after its write and again after
        # its sync.  Written first, the next group's sync overlaps the woken producers.
        synced: _Group | None = None
        while True:
            with self._lock:
                if not self._queue and synced is None:
                    self._appender_idle = True
                    return
                batches = self._queue
                self._queue = []
                self._queued_bytes = 0
                self._queue_min_first = _NONE
                if self._producers_waiting:
                    self._space.notify_all()
            group = _Group(batches) if batches else None
            if synced is not None and (group is None or group.nbytes > _DEFER_COMPLETION_BYTES):
                # Nothing to write, or so much that the wait would show: complete first.
                self._complete(synced)
                synced = None
            if group is not None:
                self._busy_since = time.perf_counter()
                self._write_group(group)
            if synced is not None:
                self._complete(synced)
            if group is not None:
                self._sync_group(group)
                self._busy_since = 0.0
            synced = group

    def _write_group(self, group: _Group) -> None:
        group.error = self._failure  # after a failure, even a barrier must not report success
        if group.error is None and group.nbytes:
            try:
                t0 = time.perf_counter()
                self._write(group)
                group.write_us = (time.perf_counter() - t0) * 1e6
            except Exception as exc:  # OSError, or a bug: either way the log must stop
                group.error = exc

    def _sync_group(self, group: _Group) -> None:
        if not group.nbytes:
            return
        if group.error is None:
            try:
                t0 = time.perf_counter()
                if self.options.fsync:
                    self._writer.sync()
                self._inject_latency()
                group.sync_us = (time.perf_counter() - t0) * 1e6
            except Exception as exc:
                group.error = exc
        with self._lock:
            if group.error is None:
                self._publish(group.placed)
                return
            if self._failure is None:
                logger.error(
                    "log %s: write or sync failed, no more appends: %r", self.directory, group.error
                )
                self._failure = group.error
                self._space.notify_all()  # blocked producers must see the failure

    def _complete(self, group: _Group) -> None:
        """Report a synced group and run its callbacks, in queue order."""
        outcome: BaseException | None = None
        if group.error is not None:
            outcome = LogFailedError(f"log {self.directory}: {group.error}")
            outcome.__cause__ = group.error
        elif group.nbytes:
            try:
                self._observer.group_synced(
                    len(group.batches), group.entries, group.nbytes, group.write_us, group.sync_us
                )
            except Exception:
                logger.exception("log %s: observer raised", self.directory)
        now = time.perf_counter()
        observer = self._observer
        for entries, callback, _, enqueued in group.batches:
            # Neither a broken observer nor a broken callback may stop the appender: later
            # batches still need their callbacks, in order.
            try:
                if outcome is None:
                    observer.batch_durable(len(entries), (now - enqueued) * 1e6)
            except Exception:
                logger.exception("log %s: observer raised", self.directory)
            try:
                callback(outcome)
            except Exception:
                logger.exception("log %s: append callback raised", self.directory)

    def _write(self, group: _Group) -> None:
        """Write the group's records, rolling over segments as they fill up."""
        w = self._writer
        limit = self.options.segment_size_bytes
        chunks: list[bytes] = []
        pending = 0
        # The previous group was synced before this one is written: every record says how
        # far, so that reopening tells a group torn by a crash from damage to synced ones
        # (``segment.scan_segment``).
        synced = w.size
        for run in _pack_records(group.batches, limit):
            head, payload = encode_record(run, synced)
            n = len(head) + len(payload)
            total = w.size + pending
            # A record never straddles segments; one bigger than a whole segment gets
            # a segment to itself rather than an error.
            if total > HEADER_SIZE and total + n > limit:
                if chunks:
                    w.write(b"".join(chunks))
                    chunks = []
                    pending = 0
                w = self._roll()
                synced = w.size  # the new segment's header, synced as it was made
                head, payload = encode_record(run, synced)
                n = len(head) + len(payload)
            # Indexed (and so readable from disk) only once _publish runs, after the sync.
            group.placed.append(Rec(run[0].index, len(run), w.sequence, w.size + pending, n))
            chunks += (head, payload)
            pending += n
        if chunks:
            w.write(b"".join(chunks))

    def _roll(self) -> SegmentWriter:
        old = self._writer
        if self.options.fsync:
            old.sync()
        old.release_unused()
        old.close()
        new = SegmentWriter.create(
            self.directory,
            old.sequence + 1,
            sync=self.options.fsync,
            reserve_bytes=self.options.reserved_segment_bytes(),
        )
        with self._lock:
            self._writer = new
            self._segments[new.sequence] = new.path
        return new

    def _inject_latency(self) -> None:
        """Sleep ``inject_latency_ms`` plus a random share of the jitter after a sync.

        Interruptible: the sleep waits on ``_latency_wake`` and re-reads the options each
        time it is woken, so a lower latency (a reset to 0 after a chaos fault) ends a sleep
        already under way as soon as the new total has passed, and ``close`` ends it at once.
        The jitter's share is drawn once per sleep, so a change mid-sleep moves the end by
        exactly the change."""
        opts = self._options
        if not (opts.inject_latency_ms or opts.inject_latency_jitter_ms):
            return
        share = self._rng.random()
        start = time.monotonic()
        with self._latency_wake:
            while not self._closing:
                opts = self._options
                total_ms = opts.inject_latency_ms + share * opts.inject_latency_jitter_ms
                remaining = start + total_ms / 1000.0 - time.monotonic()
                if remaining <= 0:
                    return
                self._latency_wake.wait(remaining)

    def _publish(self, placed: list[Rec]) -> None:
        """With ``_lock`` held, after the sync: the group's records are on disk.

        Only now are they indexed, so neither a read from disk nor GC ever relies on a
        record that a crash could still take away.
        """
        add = self._index.add_record
        for rec in placed:
            add(rec)
        self._unwritten_from = self._queue_min_first
        self._cache.evict(min(self._unwritten_from, self._index.last + 1))

    # --- reads ------------------------------------------------------------------------

    def first_index(self) -> int:
        with self._lock:
            return self._index.first

    def last_index(self) -> int:
        """Last accepted index (0 when empty); accepted is not necessarily durable yet."""
        with self._lock:
            return self._index.last

    def term(self, index: int) -> int:
        with self._lock:
            idx = self._index
            if index > idx.last:
                raise IndexError(f"index {index} beyond last index {idx.last}")
            if index < idx.first:
                if index == 0 == idx.first - 1:
                    return 0
                raise LogEntryCompactedError(f"index {index} below first index {idx.first}")
            return idx.term(index)

    def entries(self, lo: int, hi: int, max_size: int | None = None) -> list[Entry]:
        """Entries with lo <= index < hi; at most ``max_size`` bytes after the first."""
        with self._read_lock:
            with self._lock:
                idx = self._index
                if lo > hi or hi > idx.last + 1:
                    raise IndexError(f"entries [{lo}, {hi}) out of range, last is {idx.last}")
                if lo == hi:
                    return []
                if lo < idx.first:
                    raise LogEntryCompactedError(f"index {lo} below first index {idx.first}")
                split = max(lo, self._cache.lo)
                cached = self._cache.range(split, hi) if split < hi else []
                plan = self._plan_disk_read(lo, min(hi, split))
            out: list[Entry] = []
            size = 0
            for path, fd_seq, rec_first, offset, frame_size, start, end in plan:
                # A decoded record's entries are contiguous from its first index.
                wanted = self._read_entries(path, fd_seq, rec_first, offset, frame_size)[
                    start - rec_first : end - rec_first + 1
                ]
                if max_size is None:
                    out += wanted
                    continue
                for e in wanted:
                    out.append(e)
                    size += e.size()
                    if len(out) > 1 and size > max_size:
                        return limit_size(out, max_size)
        out.extend(cached)
        return limit_size(out, max_size)

    def _plan_disk_read(self, lo: int, hi: int) -> list[tuple[str, int, int, int, int, int, int]]:
        """With ``_lock`` held: which records hold [lo, hi), as
        (path, seq, rec first, offset, frame size, first wanted, last wanted)."""
        idx = self._index
        plan: list[tuple[str, int, int, int, int, int, int]] = []
        if lo >= hi:
            return plan
        k, _ = idx.locate(lo)
        i = lo
        while i < hi:
            rec = idx.rec_at(k)
            end = min(idx.live_end(k), hi - 1)
            if not rec.first <= i <= end:
                raise AssertionError(f"entry {i} is neither cached nor on disk")
            plan.append(
                (self._segments[rec.seq], rec.seq, rec.first, rec.offset, rec.frame_size, i, end)
            )
            i = end + 1
            k += 1
        return plan

    def _read_entries(
        self, path: str, seq: int, first: int, offset: int, frame_size: int
    ) -> list[Entry]:
        """With ``_read_lock`` held: decode one record back from its segment."""
        fd = self._read_fds.get(seq)
        if fd is None:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            self._read_fds[seq] = fd
        payload = read_record(fd, path, offset, frame_size)
        try:
            entries = decode_entries(payload)
        except ValueError as exc:
            raise LogCorruptionError(path, offset, str(exc)) from None
        if entries[0].index != first:
            raise LogCorruptionError(
                path, offset, f"record starts at {entries[0].index}, index says {first}"
            )
        return entries

    # --- garbage collection -------------------------------------------------------------

    def gc(self, up_to_index: int) -> int:
        """Delete the oldest segments whose live entries are all <= ``up_to_index``.

        Never the active segment, nor the one holding the newest durable entry (so a
        reopened log still knows where it starts).  Returns how many were deleted.
        """
        with self._read_lock:
            with self._lock:
                idx = self._index
                doomed: list[int] = []
                keep_from = 0
                for seq in list(self._segments)[:-1]:
                    k = idx.first_rec_after_segment(seq)
                    # The log may only start at a durable record no queued batch replaces.
                    if k >= idx.rec_count() or idx.rec_at(k).first >= self._unwritten_from:
                        break
                    if idx.rec_at(k).first - 1 > up_to_index:
                        break
                    doomed.append(seq)
                    keep_from = k
                if not doomed:
                    return 0
                idx.drop_prefix(keep_from)
                self._cache.drop_below(idx.first)
                paths = [self._segments.pop(seq) for seq in doomed]
            for seq in doomed:
                fd = self._read_fds.pop(seq, None)
                if fd is not None:
                    os.close(fd)
        # Oldest first: a crash part-way leaves a contiguous run of newer segments.
        for path in paths:
            os.unlink(path)
        if self.options.fsync:
            fsync_dir(self.directory)
        return len(doomed)

    def check_present(self) -> None:
        """Fail the log (``LogFailedError``) if a segment is gone from its directory. The
        active one -- deleted by hand, with the directory, say: records written since would
        be acknowledged as durable, and lost to every restart. An older one: its entries
        could no longer be sent to a follower that needs them, nor replayed at the next
        open (review r34a: found only when a returning follower needed them). (Called from
        the thread that also runs ``gc``; a segment it rolls away from keeps its name.)"""
        with self._lock:
            if self._failure is not None:
                return
            writer = self._writer
            older = list(self._segments.values())[:-1]
        if writer.still_at_path():
            missing = [p for p in older if not os.path.exists(p)]
            with self._lock:  # a tail cut meanwhile removes its segments on purpose
                missing = [p for p in missing if p in self._segments.values()]
            if not missing:
                return
            lost = FileNotFoundError(
                errno.ENOENT, "deleted while the log held entries in it", missing[0]
            )
        else:
            lost = FileNotFoundError(
                errno.ENOENT, "deleted or replaced while the log was writing it", writer.path
            )
        with self._lock:
            if self._failure is None:
                logger.error("log %s: no more appends: %s", self.directory, lost)
                self._failure = lost
                self._space.notify_all()
        raise LogFailedError(f"log {self.directory}: {lost}") from lost

    def retention_cap_index(self, max_segments: int) -> int:
        """The first index of the newest ``max_segments`` segments: GC up to it keeps that
        many (0 when the log has no more than that)."""
        with self._lock:
            seqs = list(self._segments)
            if max_segments <= 0 or len(seqs) <= max_segments:
                return 0
            k = self._index.first_rec_after_segment(seqs[-max_segments - 1])
            if k >= self._index.rec_count():
                return 0
            return self._index.rec_at(k).first

    # --- status and shutdown ----------------------------------------------------------

    def segment_paths(self) -> list[str]:
        with self._lock:
            return list(self._segments.values())

    def segment_count(self) -> int:
        """Segments on disk, the active one included."""
        with self._lock:
            return len(self._segments)

    @property
    def failure(self) -> BaseException | None:
        """The I/O error that failed the log, if one did."""
        return self._failure

    def close(self) -> None:
        """Finish every queued batch (callbacks included), then release the directory.
        Producers still blocked on a full queue get LogClosedError."""
        if threading.get_ident() == self._appender_ident:
            raise RuntimeError("close() from a log callback would wait for itself")
        with self._lock:
            already = self._closing
            self._closing = True
            self._space.notify_all()
        with self._latency_wake:
            self._latency_wake.notify_all()  # an injected sleep ends now: nobody needs it
        self._turns.close(timeout=None)  # what was queued is written, synced and reported
        if self._own_appenders:
            self._appenders.stop()
        if already:
            return
        with self._read_lock:
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
        try:
            self._writer.close()
        finally:
            os.close(self._lock_fd)  # the lock goes with the log, whatever else failed

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_log_start(directory: str | os.PathLike[str], entry: Entry, options: LogOptions) -> None:
    """Create, in the new (empty or absent) ``directory``, a log whose first entry is
    ``entry``, durably.  A replica installed from a tablet copy at (index, term) starts its
    log so: with a stand-in for the entry it already holds the state of, whose term is what
    the leader's next append is checked against (``consensus.core.Raft.restore``)."""
    path = os.fspath(directory)
    os.makedirs(path, exist_ok=True)
    if any(parse_segment_name(name) is not None for name in os.listdir(path)):
        raise LogError(f"log {path} already has segments")
    writer = SegmentWriter.create(
        path, 1, sync=options.fsync, reserve_bytes=options.reserved_segment_bytes()
    )
    try:
        head, payload = encode_record([entry])
        writer.write(head + payload)
        if options.fsync:
            writer.sync()
    finally:
        writer.close()
    if options.fsync:
        fsync_dir(path)


def _lock_directory(directory: str) -> int:
    fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LogError(f"log {directory} is already open") from None
    return fd


def _recover(directory: str, options: LogOptions) -> tuple[LogIndex, dict[int, str], SegmentWriter]:
    """Replay every segment into a fresh index; cut off a torn tail; open the active one."""
    _expire_cut_bytes(directory, time.time())
    found = sorted(
        (seq, name)
        for name in os.listdir(directory)
        if (seq := parse_segment_name(name)) is not None
    )
    for (a, _), (b, name) in itertools.pairwise(found):
        if b != a + 1:
            raise LogCorruptionError(
                os.path.join(directory, name), 0, f"segment {a + 1} is missing before it"
            )
    index = LogIndex()
    segments: dict[int, str] = {}
    writer: SegmentWriter | None = None
    next_seq = 1
    for pos, (seq, name) in enumerate(found):
        path = os.path.join(directory, name)
        is_last = pos == len(found) - 1
        with open(path, "rb") as f:
            data = f.read()
        scan = scan_segment(data, path, is_last=is_last, expected_sequence=seq)
        if scan.header_torn:
            logger.warning(
                "%s: offset 0: removing the last segment, left incomplete by a crash (%s)",
                path,
                scan.torn_reason,
            )
            os.unlink(path)
            if options.fsync:
                fsync_dir(directory)
            next_seq = seq
            break
        for r in scan.records:
            first = r.first_index
            if len(index):
                if first > index.last + 1:
                    raise LogCorruptionError(
                        path, r.offset, f"gap: record starts at {first}, log ends at {index.last}"
                    )
                if first > index.first and r.terms[0] < index.term(first - 1):
                    raise LogCorruptionError(
                        path,
                        r.offset,
                        f"term goes back from {index.term(first - 1)} to {r.terms[0]} at {first}",
                    )
            index.append(first, r.terms)
            index.add_record(Rec(first, len(r.terms), seq, r.offset, r.frame_size))
        segments[seq] = path
        next_seq = seq + 1
        if scan.torn_offset is not None:
            kept = ""
            if scan.torn_offset < len(data):
                # Cut as what a crash tore; should it have been damage to a synced group (a
                # disk's, not a crash's: the same bytes), they are still there to look at.
                aside = _keep_aside(f"{path}.cut-at-{scan.torn_offset}", data[scan.torn_offset :])
                kept = f"; the {len(data) - scan.torn_offset} bytes cut are kept in {aside}"
            logger.warning(
                "%s: offset %d: truncating a torn record at the end of the log (%s)%s",
                path,
                scan.torn_offset,
                scan.torn_reason,
                kept,
            )
        if is_last:
            writer = SegmentWriter.reopen(
                path,
                seq,
                scan.valid_end,
                sync=options.fsync,
                reserve_bytes=options.reserved_segment_bytes(),
            )
    if writer is None:
        writer = SegmentWriter.create(
            directory, next_seq, sync=options.fsync, reserve_bytes=options.reserved_segment_bytes()
        )
        segments[writer.sequence] = writer.path
    return index, segments, writer


# How long the bytes a cut kept aside stay: evidence for whoever looks into the warning
# that named them, not for ever (each up to a segment, carried into every tablet copy).
CUT_BYTES_KEPT_S = 30 * 86400.0


def _expire_cut_bytes(directory: str, now: float) -> None:
    """Remove the ``.cut-at-`` files of ``directory`` older than ``CUT_BYTES_KEPT_S``."""
    for name in os.listdir(directory):
        if ".cut-at-" not in name:
            continue
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            if now - os.stat(path).st_mtime > CUT_BYTES_KEPT_S:
                os.unlink(path)
                days = CUT_BYTES_KEPT_S // 86400
                logger.info("%s: removed, kept %d days since its cut", path, days)


def _keep_aside(path: str, data: bytes) -> str:
    """``data`` in a file of its own at ``path`` (or, if that is taken by an earlier cut,
    ``path.1``, ``path.2`` ...), durably, before the log cuts it off; the path used."""
    path = unused_path(path)
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(os.path.dirname(path))
    return path


def _pack_records(batches: list[_Batch], segment_bytes: int) -> list[Sequence[Entry]]:
    """The records a group is written as.  Contiguous small batches share one; a batch
    that replaces a suffix starts a new one (on replay, the later record wins); a large
    batch is cut on its own.  No record is larger than a segment (unless one entry is):
    a follower catching up takes a whole backlog in one append, and as one record it
    would sit in the active segment, which log GC never deletes, until the next append
    -- holding entries every voter has for as long as the tablet is idle."""
    pack = min(_PACK_RECORD_BYTES, segment_bytes)
    split = min(TARGET_RECORD_BYTES, segment_bytes)
    runs: list[Sequence[Entry]] = []
    run: list[Entry] = []
    run_bytes = 0
    next_index = -1
    for entries, _, nbytes, _ in batches:
        if not entries:
            continue
        if run and (entries[0].index != next_index or run_bytes + nbytes > pack):
            runs.append(run)
            run = []
            run_bytes = 0
        if nbytes > pack:
            runs.extend(split_records(entries, split))
        else:
            run += entries
            run_bytes += nbytes
        next_index = entries[-1].index + 1
    if run:
        runs.append(run)
    return runs
