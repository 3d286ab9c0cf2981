"""One tablet replica on this server: its store, its Raft group, and its write path.

Threads (the replica has none of its own: its stages are mailboxes run by the server's
worker pool, ``consensus.workers``, each one batch at a time, in order; its WAL's appender
takes turns on the server's appender pool):
- service threads call ``write``/``scan``.  ``write`` admits the request (exactly-once),
  binds the term with ONE lock-free read (``check_leadership_and_bind_term``), queues the
  op for the prepare worker and RETURNS; the call is answered later.  That is all a service
  thread does for a write, so the bounded service pool drains as fast as calls arrive.
- the prepare stage takes every queued op, decodes and validates its rows
  (as Kudu's prepare phase does; a write whose every row is invalid is answered there and
  never replicated, one with a row of another tablet is refused whole: ``row_routing``),
  and replicates the rest in one ``replicate`` call per bound term:
  under the consensus lock, where it may wait for room in the WAL's group-commit queue.
  No row locks are taken: every replica applies entries serially in log order, so
  concurrent writes to one row are already ordered by the log.  While
  ``rounds_in_flight`` rounds it proposed are not applied, what it takes waits for the
  next round, and when a round ends with fewer writes waiting than rounds have carried
  lately, they wait a little longer for the rest to come (``_next_round``, "lingering").
- the apply stage applies committed entries -- one store transaction per
  batch, the applied index and request outcomes in the same transaction -- reports the
  applied index to consensus, and answers the waiting calls.  Followers apply too: their
  stores record every request's outcome, so the next leader answers a retry from there,
  and their trackers learn how far each client got (``ResultTracker.learn_applied``).

An op whose entry is replaced before it commits (this leader lost its term) is aborted
with NotLeaderError when the apply stage reaches its index: the client retries at the new
leader, and the request id keeps that retry exactly-once.

When the store cannot apply (an OSError such as ENOSPC, a StoreError), the replica is
FAILED (docs/ARCHITECTURE.md, "Failure model"): consensus gives up leadership and stops
taking part (``RaftConsensus.apply_failed``), every waiting call is failed with
UNAVAILABLE "tablet failed: ..." (its retry elsewhere is exactly-once), and the apply stage
retries with backoff, reading the committed entries it could not apply back from the log
(they are durable there).  Once everything it was given is applied, the replica serves
again (``apply_recovered``) -- no restart needed.

Membership: the replica follows its group's membership (``RaftConsensus.membership``).  A
replica whose group removed it stops serving reads (TABLET_NOT_FOUND, "no longer a member",
so the client looks the tablet up again) and writes (it never leads again); the server may
then delete it.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from raftlet.consensus.core import (
    Entry,
    EntryType,
    Membership,
    NotLeaderError,
    ProposalDropped,
    Role,
)
from raftlet.consensus.log import Log, LogFailedError, LogOptions, PersistentState
from raftlet.consensus.raft_consensus import (
    ConsensusMetrics,
    ConsensusOptions,
    RaftConsensus,
    TermCheckMode,
)
from raftlet.consensus.ticker import TickSource
from raftlet.consensus.transport import Transport
from raftlet.consensus.workers import Mailbox, WorkerPool
from raftlet.metrics import catalogue as cat
from raftlet.metrics.counter import StripedCounter
from raftlet.metrics.histogram import Histogram
from raftlet.metrics.human import utc_time
from raftlet.metrics.profiled_lock import ProfiledLock
from raftlet.metrics.registry import MetricEntity, MetricPrototype
from raftlet.proto import tablet_pb2
from raftlet.schema.predicates import Predicate, PredicateError
from raftlet.schema.row_block import RowBlockError, row_width
from raftlet.schema.row_runs import BlockOutcome, RowRun, decode_row_blocks
from raftlet.schema.rows import RowFailure, RowOp, RowOpError, check_key_size, decode_row_ops
from raftlet.schema.schema import Schema
from raftlet.tserver import deferred_answers
from raftlet.tserver.bootstrap import (
    OpenedReplica,
    open_replica,
    to_apply_entries,
    to_apply_entry,
)
from raftlet.tserver.checksum import (
    CHECKSUM_MARKER,
    ChecksumResult,
    RecentChecksums,
    is_checksum_point,
    pin_checksum,
    split_after_checksum_points,
)
from raftlet.tserver.disk_usage import files_bytes, store_bytes
from raftlet.tserver.errors import (
    DeadlineExceeded,
    InvalidRequest,
    LeadershipLost,
    ReplicaBusy,
    SchemaMismatch,
    ServiceUnavailable,
    StaleRequest,
    TabletFailed,
    UnknownTablet,
    WriteTooLarge,
    check_schema,
)
from raftlet.tserver.held_scans import HeldScans
from raftlet.tserver.log_gc import LogGc
from raftlet.tserver.result_tracker import (
    ANONYMOUS_PREFIX,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_CLIENTS,
    Admission,
    RequestKey,
    ResultTracker,
    check_client_id,
)
from raftlet.tserver.row_routing import check_rows_in_tablet
from raftlet.tserver.scan_page import fill_page_counted
from raftlet.tserver.scan_request import check_scan_request
from raftlet.tserver.store import (
    ApplyEntry,
    EntryResult,
    InvalidScan,
    ScanCursor,
    ScanDeadlineExceeded,
    StoreError,
    damage_in,
)
from raftlet.tserver.tablet_copy_install import SnapshotInfo
from raftlet.tserver.write_memory import WriteMemory

__all__ = [
    "ReplicaOptions",
    "TabletReplica",
    "WriteCallbacks",
    "failure_status",
    "write_entry_payload",
]

logger = logging.getLogger(__name__)

Respond = Callable[[tablet_pb2.WriteResponse], None]
Fail = Callable[[BaseException], None]
_anonymous = itertools.count(1)
# Retrying a failed apply: the first wait, doubled after every failed attempt up to the
# last.  Short enough that a freed disk is noticed within a couple of seconds; each attempt
# costs one failed store transaction.
_APPLY_RETRY_FIRST_S = 0.05
_APPLY_RETRY_MAX_S = 2.0
# Entries read back from the log per store transaction when catching up after a failure.
_CATCH_UP_CHUNK = 4096
# One store transaction takes at most this much of what commits at once: a follower back
# from a pause commits its whole backlog in one go, and one transaction of it all held its
# rows in memory and grew SQLite's -wal file by as much (to 40 MB after 3 minutes away).
_APPLY_MAX_ENTRIES = _CATCH_UP_CHUNK
_APPLY_MAX_BYTES = 8 * 1024 * 1024
# What a wait inside a call leaves of the caller's deadline, for the answer to reach it.
_ANSWER_MARGIN_S = 0.1
# A scan's row limit SQLite takes (a signed 64-bit integer, with one more row to spare).
_MAX_SQL_LIMIT = 2**62
# A follower applies what it holds once it is this many entries (``_hold``).
_HOLD_MAX_ENTRIES = 256
# Writes wait for a round at most this long before they go on alone (``_next_round``).
_ROUND_WAIT_MAX_S = 0.1
_NO_ROWS = (0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class WriteCallbacks:
    respond: Respond
    fail: Fail


@dataclass(frozen=True, slots=True)
class ReplicaOptions:
    consensus: ConsensusOptions = field(default_factory=ConsensusOptions)
    log: LogOptions = field(default_factory=LogOptions)
    max_batch_rows: int = 10_000
    # The largest WriteRequest, in serialized bytes: its entry must reach every peer
    # (the server passes ``tserver.message_limits.MessageLimits.write_bytes``).
    max_write_bytes: int = 16 << 20
    # Ops replicated per consensus call at most (bounds one entry batch).
    max_prepare_batch: int = 256
    # A leader replicates at most this many rounds of writes at once; writes that come
    # meanwhile wait for one to be applied and go together (``_next_round``); 0: no cap.
    rounds_in_flight: int = 1
    # When a round ends with fewer writes waiting than rounds carried lately, they wait for
    # more at most this long, and never longer than the last round took; 0: never.
    round_linger_s: float = 0.005
    # How long a leader-latest scan waits for the store to apply what is committed.
    read_wait_s: float = 5.0
    # Log GC at most this often (tserver.log_gc); 0: never.
    log_gc_interval_s: float = 10.0
    # While more commits are coming, a follower applies what has committed at most this
    # long after the first of it (fewer, larger store transactions; see ``_hold``); 0:
    # every round.
    follower_apply_delay_s: float = 0.5
    # Segments log GC keeps for a lagging voter at most (tserver.log_gc); 0: no cap.
    log_max_segments_retained: int = 64
    # A scan page's bytes when the request leaves it to the server, and at most; a page
    # ends with the row that reaches them, unless that row would take it past the cap
    # (what a response may carry: a page's rows, its columns and resume key under gRPC's
    # send limit, ``tserver.message_limits``).
    scan_page_bytes: int = 1 << 20
    scan_max_page_bytes: int = 8 << 20
    scan_page_cap_bytes: int = 16 << 20
    # The result tracker's bounds (``tserver.result_tracker``).
    result_tracker_max_clients: int = DEFAULT_MAX_CLIENTS
    result_tracker_max_bytes: int = DEFAULT_MAX_BYTES
    # Negative controls (settings.py, "unsafe switches"): each breaks a guarantee.
    unsafe_leader_reads_without_quorum: bool = False
    unsafe_ack_before_commit: bool = False


# A write's rows as the prepare stage decoded them: the valid ones and the per-row failures.
_Decoded = tuple[Sequence[RowRun | RowOp], Sequence[RowFailure]]


@dataclass(slots=True)
class _PendingWrite:
    key: RequestKey
    term: int
    request: tablet_pb2.WriteRequest
    # Set by the prepare stage; kept until apply, so the leader decodes its rows once.
    decoded: _Decoded | None = None


class _ReplicaMetrics:
    def __init__(self, entity: MetricEntity | None) -> None:
        def counter(proto: MetricPrototype, **labels: str) -> StripedCounter:
            return entity.counter(proto, **labels) if entity else StripedCounter()

        def histogram(proto: MetricPrototype) -> Histogram:
            return entity.histogram(proto) if entity else Histogram()

        self.prepare_time = histogram(cat.OP_PREPARE_RUN_TIME_US)
        self.apply_time = histogram(cat.OP_APPLY_RUN_TIME_US)
        self.write_ops = counter(cat.WRITE_OPS_TOTAL)
        self._rows_by_op = (
            counter(cat.ROWS_INSERTED_TOTAL),
            counter(cat.ROWS_UPSERTED_TOTAL),
            counter(cat.ROWS_UPDATED_TOTAL),
            counter(cat.ROWS_DELETED_TOTAL),
        )
        self.replays = counter(cat.RESULT_TRACKER_REPLAYS_TOTAL)
        self._counter = counter
        # By RowErrorPB code name; made on the first such error (only the apply thread adds).
        self._row_errors: dict[str, StripedCounter] = {}
        self.log_gc_segments = counter(cat.LOG_GC_SEGMENTS_DELETED_TOTAL)
        self.tracker_evictions = counter(cat.RESULT_TRACKER_EVICTIONS_TOTAL)
        self.scans_refused = counter(cat.SCANS_REFUSED_TOTAL)
        self.lock_contention = counter(cat.CONSENSUS_LOCK_CONTENTION_TIME_US)
        self.lock_wait = histogram(cat.CONSENSUS_LOCK_WAIT_TIME_US)
        self.consensus = ConsensusMetrics(
            term_checks={m: counter(cat.TERM_CHECKS_TOTAL, mode=m.value) for m in TermCheckMode},
            leader_elections=counter(cat.LEADER_ELECTIONS_TOTAL),
        )

    def count_row_errors(self, errors: Sequence[RowFailure]) -> None:
        """Count rows a write this replica led refused, by their code."""
        for error in errors:
            name = error.code_name
            counter = self._row_errors.get(name)
            if counter is None:
                counter = self._row_errors[name] = self._counter(
                    cat.WRITE_ROW_ERRORS_TOTAL, code=name
                )
            counter.increment()

    def count_rows(self, by_op: tuple[int, int, int, int]) -> None:
        """Count applied rows, by operation (``EntryResult.rows_by_op``)."""
        for counter, n in zip(self._rows_by_op, by_op, strict=True):
            if n:
                counter.increment(n)


class _LogMetrics:
    """Feeds the WAL's reports into the tablet's histograms (a ``LogObserver``)."""

    def __init__(self, entity: MetricEntity | None) -> None:
        def histogram(proto: MetricPrototype) -> Histogram:
            return entity.histogram(proto) if entity else Histogram()

        self._append = histogram(cat.LOG_APPEND_LATENCY_US)
        self._sync = histogram(cat.LOG_SYNC_LATENCY_US)
        self._group = histogram(cat.LOG_GROUP_COMMIT_ENTRIES)

    def batch_durable(self, entries: int, latency_us: float) -> None:
        self._append.observe(latency_us)

    def group_synced(
        self, batches: int, entries: int, nbytes: int, write_us: float, sync_us: float
    ) -> None:
        self._sync.observe(sync_us)
        self._group.observe(entries)

    def producer_blocked(self, queued_bytes: int) -> None:
        pass  # the wait shows up as consensus lock contention in the writers that queue behind


@dataclass(slots=True)
class _Answering:
    """What answering an applied batch before its commit leaves for the rest of the pass."""

    round_ended: bool = False  # the round ended before the commit (a lone writer's)
    # (writes, rows by operation: ``EntryResult.rows_by_op``) answered; None: not yet
    counts: tuple[int, tuple[int, int, int, int]] | None = None
    error: BaseException | None = None  # raised once the batch is committed


class TabletReplica:
    def __init__(
        self,
        *,
        tablet_id: str,
        table: str,
        partition: int,
        num_partitions: int,
        server_id: str,
        voters: Sequence[str],
        directory: Path,
        schema: Schema,
        transport: Transport,
        options: ReplicaOptions | None = None,
        metrics: MetricEntity | None = None,
        ticker: TickSource | None = None,
        workers: WorkerPool | None = None,
        log_appenders: WorkerPool | None = None,
        learners: Sequence[str] = (),
        peers: Sequence[str] = (),
        request_copy: Callable[[str, str, int], None] | None = None,
        write_memory: WriteMemory | None = None,
        create: bool = True,
        on_peer_heard: Callable[[str], None] | None = None,
        on_peer_asked: Callable[[str], None] | None = None,
    ) -> None:
        """``voters`` and ``learners``: the membership a fresh directory starts with (the
        metadata's, once it exists, stands); with ``create`` False a directory without a
        replica is refused instead.  ``peers``: every server of the cluster.
        ``request_copy(tablet_id, peer, term)``: this replica leads and ``peer`` needs a
        copy of the tablet (``tserver.tablet_copier``); it must only hand the work on.
        ``write_memory``: the server's budget for admitted writes, shared by its replicas.
        ``on_peer_heard(server)``: a peer's message reached this replica
        (``tserver.servers_heard``, ``tserver.peer_contact``); ``on_peer_asked(server)``:
        this replica sent a peer a message (``tserver.peer_contact``)."""
        if not 0 <= partition < num_partitions:
            raise ValueError(f"partition {partition} is not one of {num_partitions}")
        self.tablet_id = tablet_id
        self.table = table
        self.partition = partition
        self.num_partitions = num_partitions
        self.server_id = server_id
        self.schema = schema
        self.options = opts = options or ReplicaOptions()
        self._metrics = _ReplicaMetrics(metrics)
        self.directory = directory
        self._write_memory = write_memory
        self._opened: OpenedReplica = open_replica(
            directory,
            schema,
            voters,
            opts.log,
            _LogMetrics(metrics),
            log_appenders,
            learners,
            create=create,
            tablet_id=tablet_id,
        )
        self.store = self._opened.store
        self.lock = ProfiledLock(
            "consensus",
            contention_counter=self._metrics.lock_contention,
            wait_histogram=self._metrics.lock_wait,
        )
        try:
            self.consensus = RaftConsensus(
                group_id=tablet_id,
                node_id=server_id,
                storage=self._opened.storage,
                transport=transport,
                apply_committed=self._on_committed,
                applied_index=self.store.applied_index(),
                options=opts.consensus,
                lock=self.lock,
                metrics=self._metrics.consensus,
                ticker=ticker,
                workers=workers,
                on_log_failed=self._on_log_failed,
                on_snapshot_needed=(
                    (lambda peer, term: request_copy(tablet_id, peer, term))
                    if request_copy is not None
                    else None
                ),
                peers=peers,
                on_membership=self._on_membership,
                on_peer_heard=on_peer_heard,
                on_peer_asked=on_peer_asked,
            )
        except BaseException:
            # The files are open: a replica that cannot start must not keep them.
            self._opened.close()
            raise
        self.tracker = ResultTracker(
            max_clients=opts.result_tracker_max_clients,
            max_bytes=opts.result_tracker_max_bytes,
            on_evict=self._metrics.tracker_evictions.increment,
        )
        # The server's pool runs every replica's stages; a replica on its own gets one.
        self._own_workers = workers is None
        self._workers = workers or WorkerPool(f"replica:{tablet_id}", min_threads=1)
        # None: a nudge to release the writes waiting for a round (``_next_round``).
        self._prepare_q: Mailbox[_PendingWrite | None] = self._workers.mailbox(
            f"prepare:{tablet_id}", self._prepare_batch, max_batch=opts.max_prepare_batch
        )
        self._apply_q = self._workers.mailbox(f"apply:{tablet_id}", self._apply_held)
        # index -> (term, key) of entries this replica proposed and has not applied yet.
        self._proposed: dict[int, tuple[int, RequestKey, _Decoded | None]] = {}
        self._proposed_lock = threading.Lock()
        # Under _proposed_lock: the last index of each round proposed and not yet applied,
        # and the writes waiting for one of them to be applied (``_next_round``).
        self._rounds: collections.deque[int] = collections.deque()
        self._waiting: list[_PendingWrite] = []
        self._waiting_since = 0.0
        # Lingering (``_next_round``): the writes a round should carry -- the most a round
        # carried since a linger last ran out -- when the last round went, and until when
        # the writes waiting wait for more (0: they do not).
        self._round_target = 0
        self._round_went = 0.0
        self._linger_until = 0.0
        # What rounds, their waits and a follower's holds are timed with (a test may set its
        # own); a linger's end is on the worker pool's timer, in real time.
        self.clock: Callable[[], float] = time.monotonic
        self._applied_index = self.store.applied_index()
        self._applied_cond = threading.Condition()
        # Checksum points at or below this were applied by the replay: none was taken.
        self._applied_at_open = self._applied_index
        self._checksums = RecentChecksums()
        self._log_gc = (
            LogGc(
                tablet_id,
                self._opened.storage.log,
                self.store,
                self.consensus.all_replicated,
                interval_s=opts.log_gc_interval_s,
                max_segments=opts.log_max_segments_retained,
                on_collected=self._metrics.log_gc_segments.increment,
                voters_behind=self.consensus.voters_behind,
            )
            if opts.log_gc_interval_s > 0
            else None
        )
        # Scans read from one state across their pages (closed when idle too long).
        self._scans = HeldScans()
        self._unregister_tick: Callable[[], None] | None = None
        # The store's failure while applying, until a retry succeeds (apply stage only).
        self._apply_error: BaseException | None = None
        # The highest committed index handed to the apply stage: what a retry must reach.
        self._given_up_to = self._applied_index
        self._retry_wait_s = _APPLY_RETRY_FIRST_S
        self._retry_due = False
        # Set (once) by the store verifier: the file is damaged, and no retry will mend it.
        self._store_damage: str | None = None
        self._stopped = False
        # A follower's committed entries waiting to be applied together, since when.
        self._held: list[Entry] = []
        self._held_since = 0.0
        self._holding = False  # the last commit learned was held (``_hold``), not posted
        self._reads_waiting = 0  # reads in _wait_applied: nothing is held meanwhile

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def opened(self) -> OpenedReplica:
        """What opening the replica's files found: entries replayed, seconds per step."""
        return self._opened

    def start(self) -> None:
        self.consensus.start()
        self._unregister_tick = self.consensus.ticker.register(self._on_tick)

    def _on_tick(self, _ticks: int) -> None:
        # On the ticker's thread: only a clock read, and when due a nudge to the apply
        # stage: log GC's turn, or what a follower holds once it may hold it no longer.
        # Not whatever it holds: the ticker calls once a heartbeat's worth of ticks (300 ms
        # by default), which cut every longer --follower_apply_delay_ms short
        # (docs/benchmarks.md, "Holds the ticker cut short").
        if self._hold_ended() or (self._log_gc is not None and self._log_gc.due()):
            self._apply_q.post(None)
        if self._scans.due():  # one abandoned: its read transaction ends
            self._scans.expire()
        # Writes that waited this long for a round that does not apply (leadership lost,
        # no quorum, the store failing) go on alone: replicate refuses them if this replica
        # no longer leads, else they make a round of their own.
        if self._waiting and self.clock() - self._waiting_since >= _ROUND_WAIT_MAX_S:
            self._prepare_q.post(None)
        # Writes it proposed and no longer leads for: answered by the apply stage
        # (``_answer_undecided``).
        if self._proposed and self.consensus.snapshot.role is not Role.LEADER:
            self._apply_q.post(None)

    def stop(self) -> None:
        """Stop replicating; fail what is in flight; flush and close the files."""
        if self._stopped:
            return
        self._stopped = True
        if self._unregister_tick is not None:
            self._unregister_tick()
        self._prepare_q.close(timeout=30)
        self.consensus.stop()
        self._apply_q.post(None)  # held entries into the store before it closes
        self._apply_q.close(timeout=30)
        self._scans.close()
        if self._own_workers:
            self._workers.stop()
        with self._proposed_lock:
            self._proposed.clear()
            self._rounds.clear()
            self._waiting = []
            self._linger_until = 0.0
        # Proposed, waiting for a round or still queued: nothing more will answer them
        # here.  A retry elsewhere with the same request id is exactly-once.
        self.tracker.abort_all(ServiceUnavailable("the tablet server is shutting down"))
        self._opened.close()

    # --- writes ------------------------------------------------------------------------------

    def write(self, request: tablet_pb2.WriteRequest, callbacks: WriteCallbacks) -> None:
        """Admit, bind the term, validate and queue; the answer comes through ``callbacks``
        (from the apply thread, or at once for replays and rejected batches).  Raises for
        errors that answer the call now (NotLeaderError, LeaderNotReady, InvalidRequest…)."""
        self._check_serving()
        n = self._row_count(request)
        if n == 0:
            raise InvalidRequest("a write needs at least one row operation")
        if n > self.options.max_batch_rows:
            raise InvalidRequest(
                f"{n} row operations exceed --max_batch_rows={self.options.max_batch_rows}"
            )
        size = request.ByteSize()  # bounds its entry's payload: the request less its tablet id
        if size > self.options.max_write_bytes:
            raise WriteTooLarge(size, self.options.max_write_bytes)
        term = self.consensus.check_leadership_and_bind_term()
        rid = request.request_id
        if rid.client_id:
            key: RequestKey = (rid.client_id, rid.seq_no)
            if rid.seq_no < 0 or rid.first_incomplete_seq_no < 0:
                raise InvalidRequest("request ids are non-negative")
            check_client_id(rid.client_id)
        else:
            key = (f"{ANONYMOUS_PREFIX}{next(_anonymous)}", 0)
        memory = self._write_memory
        if memory is not None:  # refused before anything of it is kept
            charge = memory.take(size)
            callbacks = _giving_back(callbacks, memory, charge)
        try:
            admission, done = self.tracker.admit(
                key, rid.first_incomplete_seq_no, callbacks.respond, callbacks.fail
            )
            if admission is Admission.STALE:
                raise _stale(key, self.tracker.first_incomplete(rid.client_id))
        except BaseException:  # not admitted: nothing will answer through the callbacks
            if memory is not None:
                memory.give(charge)
            raise
        if admission is Admission.COMPLETED:
            assert done is not None
            self._metrics.replays.increment()
            callbacks.respond(done)
            return
        if admission is Admission.ATTACHED:
            self._metrics.replays.increment()
            return
        try:
            # A first attempt cannot have been applied before, so only retries pay for the
            # store lookup (apply refuses a duplicate request id in any case) -- and the
            # requests this replica learned were applied, whose responses it did not keep.
            if rid.client_id and (rid.attempt_no > 0 or admission is Admission.APPLIED):
                record = self.store.lookup_request(rid.client_id, rid.seq_no)
                if record is not None:  # applied before a restart or under another leader
                    self._metrics.replays.increment()
                    self.tracker.complete(
                        key, _response(record.index, record.term, record.row_errors)
                    )
                    return
                # A retry the tracker cannot judge (it forgot the client, or this server
                # restarted): below the bound the store keeps, it is a late copy.
                bound = self.store.request_bound(rid.client_id)
                if rid.seq_no < bound:
                    self.tracker.abort(key, _stale(key, bound))
                    return
        except BaseException as exc:
            self.tracker.abort(key, exc)
            return
        if not self._prepare_q.post(_PendingWrite(key, term, request)):
            self.tracker.abort(key, ServiceUnavailable("the tablet server is shutting down"))

    def is_member(self) -> bool:
        """Whether this replica is a voter or learner of its group (as far as it knows)."""
        return self.has_member(self.server_id)

    def has_member(self, server_id: str) -> bool:
        """Whether ``server_id`` is a voter or learner of the group, as this replica knows it
        (the latest membership in its log, committed or not)."""
        return server_id in self.consensus.membership.members()

    def _on_membership(self, membership: Membership) -> None:
        # Under the consensus lock: only say it.
        logger.info(
            "tablet %s on %s: voters %s, learners %s%s",
            self.tablet_id,
            self.server_id,
            ",".join(membership.voters),
            ",".join(membership.learners) or "-",
            "" if self.server_id in membership.members() else " (this replica was removed)",
        )

    def _check_serving(self) -> None:
        if self._stopped:
            raise ServiceUnavailable(f"tablet {self.tablet_id} is not serving")
        if not self.is_member():
            raise UnknownTablet(self.tablet_id, "this replica is no longer a member of its group")
        why = self.failure_reason()
        if why is not None:
            raise TabletFailed(why)

    def _prepare_batch(self, items: list[_PendingWrite | None]) -> None:
        ops = [op for op in items if op is not None]
        ops = self._next_round(ops, nudged=len(ops) < len(items))
        for lo in range(0, len(ops), self.options.max_prepare_batch):
            self._prepare_round(ops[lo : lo + self.options.max_prepare_batch])

    def _next_round(self, ops: list[_PendingWrite], *, nudged: bool) -> list[_PendingWrite]:
        """The writes to replicate now: ``ops`` and those that waited -- or none, while
        ``rounds_in_flight`` rounds are proposed and not applied, or while the writes
        waiting linger for more; ``ops`` then wait too.

        Every round costs each of the three servers a pass through its stages whatever it
        carries, and rounds in flight together share the CPU: when writes keep coming,
        one round at a time, carrying all that came while the last was out, takes fewer
        passes per write than a round for each handful (docs/benchmarks.md).  A writer
        alone never waits: with no round out and none lingering, its write goes at once.
        ``nudged``: the apply stage (a round applied), the linger's timer or the ticker
        (they waited too long) asks for them.
        """
        limit = self.options.rounds_in_flight
        if not limit:
            return ops  # nothing ever waits
        with self._proposed_lock:
            now = self.clock()
            if len(self._rounds) >= limit:
                # A nudge from a linger that ended meanwhile, or a stray one, lets nothing
                # go past a round that is out; only the ticker's, after a long wait, does.
                hold = not nudged or now - self._waiting_since < _ROUND_WAIT_MAX_S
            else:
                hold = (
                    not nudged
                    and now < self._linger_until
                    and len(self._waiting) + len(ops) < self._round_target
                )
            if hold:
                if ops:
                    if not self._waiting:
                        self._waiting_since = now
                    self._waiting.extend(ops)
                return []
            lingered, self._linger_until = self._linger_until, 0.0
            if self._waiting:
                ops = self._waiting + ops
                self._waiting = []
            if ops:
                # A linger that ran out shows what rounds carry now; else they carry more.
                short = lingered and len(ops) < self._round_target
                self._round_target = len(ops) if short else max(self._round_target, len(ops))
                self._round_went = now
            return ops

    def _linger(self) -> bool:
        """After a round ended (under ``_proposed_lock``, writes waiting): whether they wait
        for more before going as the next round -- and if so until when.

        Writers answered together by a round come back to their tablets apart, through the
        client and the network; the round that goes at once carries the first few, and the
        rest wait for the one after.  With one tablet that round is soon full again; with
        several, each tablet's rounds get a share of writers that come at random, and they
        stay small (docs/benchmarks.md, "Rounds that wait for their writers").  So the
        writes wait while fewer are here than rounds carried lately -- at most
        ``round_linger_s``, and never longer than the last round took, so at low load a
        write waits at most about one more round.  A linger that runs out resets what
        rounds are expected to carry.
        """
        linger = self.options.round_linger_s
        if not linger or len(self._waiting) >= self._round_target:
            return False
        now = self.clock()
        linger = min(linger, now - self._round_went)
        if linger <= 0:
            return False
        until = self._linger_until = now + linger
        self._workers.timers.call_later(linger, lambda: self._linger_ended(until))
        return True

    def _linger_ended(self, until: float) -> None:
        # On the pool's timer thread: a nudge, unless that linger is over already.
        if self._linger_until == until:
            self._prepare_q.post(None)

    def _prepare_round(self, ops: list[_PendingWrite]) -> None:
        # The row blocks of the batch decoded together, as apply does for a follower's.
        has_block = [op.request.HasField("row_block") for op in ops]
        blocks = [op.request.row_block for op, b in zip(ops, has_block, strict=True) if b]
        outcomes = iter(decode_row_blocks(self.schema, [(b.rows, b.indirect) for b in blocks]))
        datas = [
            self._encode(op, next(outcomes) if b else None)
            for op, b in zip(ops, has_block, strict=True)
        ]
        valid = [(op, data) for op, data in zip(ops, datas, strict=True) if data is not None]
        for _, group_iter in itertools.groupby(valid, key=lambda pair: pair[0].term):
            self._replicate(list(group_iter))

    def _row_count(self, request: tablet_pb2.WriteRequest) -> int:
        """How many rows ``request`` writes, in whichever of the two forms it gives them."""
        if not request.HasField("row_block"):
            return len(request.ops)
        if request.ops:
            raise InvalidRequest("a write gives its rows as ops or as a row_block, not both")
        width = row_width(self.schema)
        size = len(request.row_block.rows)
        if size % width:
            raise InvalidRequest(
                f"row block of {size} bytes is not a whole number of {width}-byte rows "
                f"of table {self.table!r}"
            )
        return size // width

    def _refuse_long_keys(self, ops: Sequence[RowRun | RowOp]) -> None:
        """Refuse the whole write (``InvalidRequest``) if an INSERT or UPSERT of it has a
        key over ``MAX_KEY_BYTES``: a row error would put the row in the log, to be judged
        again by each replica's decoder, and one of another version judges it otherwise
        (the decoders of committed entries check no key size: ``schema.rows`` rule 3)."""
        if self.schema.fixed_key_bytes is not None:
            return  # 8 bytes a key column: under the limit with any number of columns
        for op in ops:
            if isinstance(op, RowRun):
                k = op.num_keys
                keyed = [(p[:k], i) for p, i in zip(op.params, op.row_indexes, strict=True)]
            else:
                keyed = [(op.key, op.row_index)]
            for key, index in keyed:
                try:
                    check_key_size(self.schema, op.type, key)
                except RowOpError as e:
                    raise InvalidRequest(f"row {index}: {e.message}") from None

    def _encode(self, op: _PendingWrite, block: BlockOutcome | None) -> bytes | None:
        """The entry payload of ``op``, or None if it was answered here: every row invalid
        (nothing to apply), a row of another tablet, or the request could not be decoded.
        ``block``: what decoding its row block gave (None: it has none)."""
        request = op.request
        try:
            fingerprint = request.schema_fingerprint
            if fingerprint and fingerprint != self.schema.fingerprint:
                raise SchemaMismatch("the write", self.table, self.schema)
            if block is not None:
                if isinstance(block, RowBlockError):
                    raise InvalidRequest(f"malformed row block: {block}")
                runs, row_errors = block
                rows = sum(map(len, runs)) + len(row_errors)
                op.decoded = (runs, row_errors)
            else:
                good, row_errors = decode_row_ops(self.schema, request.ops, key_limit=False)
                rows = len(request.ops)
                op.decoded = (good, row_errors)
            self._refuse_long_keys(op.decoded[0])
            check_rows_in_tablet(
                self.schema, self.table, self.partition, self.num_partitions, op.decoded[0]
            )
            if len(row_errors) == rows:  # answer without replicating
                self.tracker.complete(op.key, _response(0, op.term, row_errors))
                return None
            return write_entry_payload(request)
        except Exception as exc:
            self.tracker.abort(op.key, exc)
            return None

    def _replicate(self, pairs: list[tuple[_PendingWrite, bytes]]) -> None:
        ops = [op for op, _ in pairs]
        start = time.perf_counter()

        displaced: list[tuple[int, RequestKey]] = []

        def remember(entries: list[Entry]) -> None:
            # Under the consensus lock, before the entries are sent: apply can find them.
            with self._proposed_lock:
                proposed = self._proposed
                for op, entry in zip(ops, entries, strict=True):
                    if entry.index > self._applied_index:
                        old = proposed.get(entry.index)
                        if old is not None and old[0] != entry.term:
                            # Proposed under a term this replica lost, its entry truncated
                            # since: it can never be applied, and overwritten unanswered its
                            # writer (and its charge of the server's memory) waited for good.
                            displaced.append((entry.term, old[1]))
                        proposed[entry.index] = (entry.term, op.key, op.decoded)
                if self.options.rounds_in_flight and entries[-1].index > self._applied_index:
                    self._rounds.append(entries[-1].index)

        try:
            try:
                entries = self.consensus.replicate(
                    [data for _, data in pairs], ops[0].term, remember
                )
            finally:
                for term, key in displaced:  # outside the consensus lock
                    self.tracker.abort(key, NotLeaderError(self.server_id, term))
            if self.options.unsafe_ack_before_commit:
                for op, entry in zip(ops, entries, strict=True):
                    self.tracker.complete(op.key, _response(entry.index, entry.term, ()))
        except (ProposalDropped, ServiceUnavailable) as exc:
            for op in ops:
                self.tracker.abort(op.key, exc)
            return
        except Exception as exc:  # the log failed, or a bug: fail the calls, keep serving
            logger.exception("%s: replicate failed", self.tablet_id)
            for op in ops:
                self.tracker.abort(op.key, exc)
            return
        finally:
            self._metrics.prepare_time.observe((time.perf_counter() - start) * 1e6)

    # --- applying --------------------------------------------------------------------------

    def _on_committed(self, entries: Sequence[Entry]) -> None:
        # Called under the consensus lock: hand over and return at once.  Every committed
        # entry goes through ``_held``, in commit order; the apply stage is woken only when
        # they are to be applied now, so a follower holding them (``_hold``) costs no pass.
        with self._applied_cond:  # see _wait_applied
            held = self._held
            held.extend(entries)
            self._holding = self._hold(held)
            if self._holding:
                return
        self._apply_q.post(None)

    def store_damaged(self, reason: str) -> None:
        """The store file was found damaged -- by the verifier (``tserver.store_verifier``),
        a read or a checksum: fail for good, in the apply stage (the store's only writer),
        which it is nudged to run."""
        if self._store_damage is None:
            self._store_damage = reason
            self._apply_q.post(None)

    def _apply_held(self, _nudges: list[None]) -> None:
        # The apply stage's mailbox carries nudges only (the entries wait in ``_held``):
        # whoever posted -- a commit not held, the ticker, a read, a retry, stop -- wants
        # what is held applied now.
        with self._applied_cond:  # see _wait_applied
            # In this order, for ``applying_index``'s unlocked reads.
            if self._held:
                self._given_up_to = max(self._given_up_to, self._held[-1].index)
            entries, self._held = self._held, []
            self._held_since = 0.0
            self._holding = False
        if self._store_damage is not None and self._apply_error is None:
            # As a failed apply, minus the retry: the committed entries wait in the log.
            self._on_apply_failed(StoreError(f"the store file is damaged ({self._store_damage})"))
            return
        if self._apply_error is None:
            if entries and not self._apply_pieces(entries):
                self._schedule_retry()
        elif self._retry_due:  # the retry timer's nudge
            self._retry_due = False
            self._catch_up()
        # Otherwise failed, and not yet time to retry: the entries are in the log.
        if self._proposed:
            self._answer_undecided()
        if self._log_gc is not None and self._apply_error is None:
            try:
                self._log_gc.maybe_collect()
            except LogFailedError as exc:  # its files are gone: as a failed append
                self.consensus.log_failed(exc)
            except StoreError as exc:  # gone (a copy mends it) or unwritable (a retry may)
                self._on_apply_failed(exc)
                self._schedule_retry()
            except OSError as exc:
                # Nothing is lost by keeping the log: say so and try again next time.
                logger.warning("%s: log GC failed: %r", self.tablet_id, exc)

    @property
    def lingering(self) -> bool:
        """Writes are waiting for more to go with them (``_linger``)."""
        return bool(self._linger_until)

    @property
    def waiting_writes(self) -> int:
        """Writes this leader holds for its next round (``_next_round``)."""
        return len(self._waiting)

    @property
    def held_entries(self) -> int:
        """Committed entries this follower holds back for a larger apply (``_hold``)."""
        return len(self._held)

    def applying_index(self) -> int:
        """The index up to which committed entries are on their way into the store: held
        back on purpose (``_hold``) or in the pass the apply stage runs now; 0 when the
        replica failed.  Not lag, which ``cluster status`` counts from here.

        Entries that pile up beyond what a hold allows -- the stage is slow, or stuck in a
        long transaction -- are not counted, so a stuck apply shows.  Unlocked: read in the
        reverse of the order ``_apply_held`` writes them (the index it takes up to, the held
        list, the flag), so a racing read never misses entries moving from held to taken
        and can only under-state the lag."""
        if self._apply_error is not None or self._store_damage is not None:
            return 0
        holding = self._holding
        held = self._held
        top = self._given_up_to
        if holding and held:
            top = max(top, held[-1].index)
        return top

    def _hold_ended(self) -> bool:
        """Whether what this follower holds is to be applied now that no new commit came
        to end the hold (``_hold``, asked again): its time is up, the replica leads now, or
        no more commits are on their way.  True once, for the caller to nudge the stage."""
        with self._applied_cond:
            if not self._holding or self._hold(self._held):
                return False
            self._holding = False
            return True

    def _hold(self, entries: list[Entry]) -> bool:
        """Whether a follower keeps ``entries`` (committed, under ``_applied_cond``) for a
        later, larger apply.

        A round's apply -- decoding its entries, one store transaction -- costs more than
        the entries in it, and was most of a follower's CPU per round; a follower answers
        no writer, so while more commits are on their way (its log goes on past what has
        committed) it applies at most ``follower_apply_delay_s`` after the first entry it
        holds, or at 256 entries.  Never with nothing more to come (a follower at rest
        applies what it learns at once), never on a leader (its writers wait), nor while
        a read waits for an index (``_wait_applied``).  A read, a retry and stop each have
        what is held applied at once (they post to the apply stage); the ticker asks again
        (``_hold_ended``), so a hold no commit comes to end ends at the first tick after its
        time is up."""
        delay = self.options.follower_apply_delay_s
        if (
            delay <= 0
            or self._reads_waiting
            or self._stopped
            or len(entries) >= _HOLD_MAX_ENTRIES
            or self._apply_error is not None
            or self._store_damage is not None
            or self.consensus.snapshot.role is Role.LEADER
            or self.consensus_log().last_index() <= entries[-1].index
        ):
            return False
        now = self.clock()
        if not self._held_since:
            self._held_since = now
        return now - self._held_since < delay

    def _apply_pieces(self, entries: list[Entry]) -> bool:
        """Apply ``entries``; False (and the replica FAILED) if the store failed."""
        # A checksum point ends a piece: the rows are pinned between two applies, and read
        # on a thread of their own while the applies go on.
        for piece in split_after_checksum_points(entries):
            point = piece[-1].index if is_checksum_point(piece[-1]) else None
            if point is not None:
                # Before the apply: a wait for it that runs out in between must not find the
                # point applied and no checksum begun, and call it no point at all.
                self._checksums.begin(point)
            for chunk in _bounded_transactions(piece):
                if not self._apply(chunk):
                    if point is not None:
                        failed = "the replica failed before it applied the checksum point"
                        self._checksums.record(ChecksumResult(point, 0, "", failed))
                    return False
            if point is not None:
                self._start_checksum(point)
        return True

    def _start_checksum(self, index: int) -> None:
        read = pin_checksum(
            self.store, index, on_damage=self.store_damaged, stopped=lambda: self._stopped
        )

        def run() -> None:
            try:
                result = read()
            except Exception as e:  # recorded, so that nobody waits for it in vain
                logger.exception("%s: the checksum at index %d failed", self.tablet_id, index)
                result = ChecksumResult(index, 0, "", f"the checksum failed: {e!r}")
            self._checksums.record(result)

        try:
            threading.Thread(target=run, name=f"checksum-{self.tablet_id}", daemon=True).start()
        except RuntimeError:  # no thread to be had: read it here, as it used to be
            run()

    def _catch_up(self) -> None:
        """Retry after a failure: apply what was handed over and not applied, read back
        from the log, then serve again."""
        if self._store_damage is not None:
            return  # damage found by the verifier: nothing to retry
        while self.store.applied_index() < self._given_up_to:
            lo = self.store.applied_index() + 1
            hi = min(self._given_up_to + 1, lo + _CATCH_UP_CHUNK)
            try:
                chunk = self._opened.storage.entries(lo, hi)
            except Exception as exc:  # the log cannot give them back: stay failed
                logger.error(
                    "%s: reading entries %d-%d back failed: %r", self.tablet_id, lo, hi, exc
                )
                self._schedule_retry()
                return
            if not chunk or not self._apply_pieces(chunk):
                self._schedule_retry()
                return
        try:
            self.store.flush()  # what failed may have been log GC's checkpoint, not an apply
        except (StoreError, OSError) as exc:  # an fsync's OSError too: escaped, no retry came
            self._on_apply_failed(exc)
            self._schedule_retry()
            return
        error, self._apply_error = self._apply_error, None
        self._retry_wait_s = _APPLY_RETRY_FIRST_S
        self.consensus.apply_recovered()
        logger.warning(
            "%s: the store applies again (applied index %d) after %r; the replica serves again",
            self.tablet_id,
            self.store.applied_index(),
            error,
        )

    def _on_apply_failed(self, exc: BaseException) -> None:
        damage = damage_in(exc)
        if damage is not None and self._store_damage is None:
            # Not a full disk that may pass: no retry mends it, a copy does.
            self._store_damage = damage
        if self._apply_error is not None:
            logger.debug("%s: applying still fails: %r", self.tablet_id, exc)
            return
        self._apply_error = exc
        # The store rolled the batch back; its entries stay in the log for the retry.
        logger.error(
            "%s: applying committed entries failed, the replica is FAILED and %s: %r",
            self.tablet_id,
            "waits for a copy of the tablet (the store file is damaged)"
            if self._store_damage is not None
            else "retries with backoff",
            exc,
        )
        self.consensus.apply_failed(exc)
        why = self.failure_reason() or repr(exc)
        # Nothing will answer them here for a while: their retries go to the new leader,
        # under the same request ids (exactly-once).
        self.tracker.abort_all(TabletFailed(why))
        with self._applied_cond:
            self._applied_cond.notify_all()

    def _on_log_failed(self, reason: str) -> None:
        # No retry for a log (see RaftConsensus): what waits here would wait for good.
        self.tracker.abort_all(TabletFailed(reason))
        with self._applied_cond:
            self._applied_cond.notify_all()

    def _schedule_retry(self) -> None:
        if self._stopped:
            return
        wait = self._retry_wait_s
        self._retry_wait_s = min(2 * wait, _APPLY_RETRY_MAX_S)
        self._workers.timers.call_later(wait, self._retry_now)

    def _retry_now(self) -> None:
        # The pool's timer thread: hand the retry to the apply stage, which runs one at a
        # time -- unless the replica stopped meanwhile (its timer is the server's: it runs).
        if self._stopped:
            return
        self._retry_due = True
        self._apply_q.post(None)

    def _apply(self, entries: list[Entry]) -> bool:
        start = time.perf_counter()
        with self._proposed_lock:
            ours = [self._proposed.get(e.index) for e in entries]
        # The rows of our own entries were decoded when they were prepared: not again here.
        # The others' (a follower's every entry) are decoded together: for one-row writes
        # a block's fixed decoding cost is most of the work.
        own = [m if m and m[0] == e.term else None for e, m in zip(entries, ours, strict=True)]
        pairs = list(zip(entries, own, strict=True))
        # Whatever fails from here to the commit fails the replica: the entries have left
        # ``_held``, so an error let through to the mailbox would skip them for good -- a
        # replica RUNNING with committed writes missing.  An entry that does not decode
        # (a bug, or a forged append) fails it as a store that cannot apply does.
        try:
            others = iter(to_apply_entries([e for e, m in pairs if m is None], self.schema))
            batch = [
                next(others) if m is None else to_apply_entry(e, self.schema, m[2])
                for e, m in pairs
            ]
        except Exception as exc:
            first, last = entries[0].index, entries[-1].index
            self._on_apply_failed(StoreError(f"entries {first}-{last} do not decode: {exc!r}"))
            return False
        answering = _Answering()
        try:
            results = self.store.apply_batch(
                batch, before_commit=lambda r: self._answer(entries, batch, r, answering)
            )
        except Exception as exc:
            self._on_apply_failed(exc)
            return False
        if answering.counts is None:  # replayed entries only: the store had nothing to commit
            self._answer(entries, batch, results, answering)
        self._metrics.apply_time.observe((time.perf_counter() - start) * 1e6)
        writes, rows = answering.counts or (0, _NO_ROWS)
        if writes:
            self._metrics.write_ops.increment(writes)
            self._metrics.count_rows(rows)
        self.consensus.on_applied(entries[-1].index)
        # A read counts itself waiting before it looks at the store, which holds this apply
        # by now: either the read finds it there, or it is counted here and woken.
        if self._reads_waiting:
            with self._applied_cond:
                self._applied_cond.notify_all()
        if not answering.round_ended:
            # The round ends with its commit: the writes that waited for it and those its
            # answers brought in meanwhile go as one round, where they would have been two.
            with self._proposed_lock:
                self._end_rounds(entries[-1].index)
                release = (
                    bool(self._waiting)
                    and len(self._rounds) < self.options.rounds_in_flight
                    and not self._linger()
                )
            if release:
                self._prepare_q.post(None)  # the next round: what waited for this one
        if answering.error is not None:
            raise answering.error
        return True

    def _answer(
        self,
        entries: list[Entry],
        batch: list[ApplyEntry],
        results: list[EntryResult],
        answering: _Answering,
    ) -> None:
        """Answer an applied batch's writers, between its last statement and its commit:
        the results are final once the statements ran (the entries are committed in the
        log), so the writers need not wait for the commit's page writes.  A read still
        waits for the commit: it waits for the store's applied index, which moves only
        then."""
        with self._proposed_lock:
            proposed = [self._proposed.pop(e.index, None) for e in entries]
            self._applied_index = entries[-1].index
            if not self._waiting and sum(p is not None for p in proposed) <= 1:
                # A lone writer: its next write goes at once, nothing to gather.
                self._end_rounds(entries[-1].index)
                answering.round_ended = True
        try:
            with deferred_answers.together():  # a round's answers: one frame per connection
                answering.counts = self._complete_applied(entries, batch, results, proposed)
        except BaseException as exc:  # a bug here, not the store's failure: raised after it
            answering.error = exc
            answering.counts = (0, _NO_ROWS)

    def _answer_undecided(self) -> None:
        """Once this replica no longer leads, answer the writes it proposed that are not
        applied yet (the apply stage, after what was committed): UNAVAILABLE, their outcome
        unknown -- the next leader may commit them or not, and a retry with the same request
        id is applied at most once. Waiting for their entries instead held them, and their
        charge of the server's memory, for as long as the group had no majority: one such
        tablet kept every other tablet on its server from writing."""
        snap = self.consensus.snapshot
        if snap.role is Role.LEADER:
            return
        # Those committed are decided, though the apply stage may not have them yet (a
        # Ready hands committed entries over a budget's worth at a time): they are applied
        # and answered in turn. Answered "stopped leading before the write was committed",
        # a write committed behind two large batches was told its fate was unknown.
        committed = self.consensus.commit_index_seen()
        with self._proposed_lock:
            # Not those of a term it leads in now (it may have been elected since the read).
            undecided = [
                i
                for i, (term, _, _) in self._proposed.items()
                if term <= snap.term and i > committed
            ]
            keys = [self._proposed.pop(i)[1] for i in undecided]
            if undecided:
                top = max(undecided)
                self._rounds = collections.deque(i for i in self._rounds if i > top)
        if keys:
            error = LeadershipLost(
                f"tablet {self.tablet_id}: this replica stopped leading (term {snap.term}) "
                "before the write was committed; the next leader may still commit it -- a "
                "retry with the same request id is applied at most once",
                leader_id=snap.leader_id,
            )
            for key in keys:
                self.tracker.abort(key, error)

    def _drop_replaced(self, entry: Entry) -> list[RequestKey]:
        """Forget the entries this replica proposed after ``entry``'s index under a term
        older than ``entry``'s, and return their requests: ``entry`` replaced one of ours,
        so the log that commits it has none of those (an entry of our old term could only
        follow ours there). A quiet tablet never applies anything at their indexes, and
        they waited unanswered -- holding their charge of the server's memory -- until
        writes reached them, or for good if this replica led again and proposed there."""
        with self._proposed_lock:
            dead = [
                index
                for index, (term, _, _) in self._proposed.items()
                if index > entry.index and term < entry.term
            ]
            return [self._proposed.pop(index)[1] for index in dead]

    def _end_rounds(self, last: int) -> None:
        """The rounds up to index ``last`` are done (under ``_proposed_lock``)."""
        while self._rounds and self._rounds[0] <= last:
            self._rounds.popleft()

    def _complete_applied(
        self,
        entries: list[Entry],
        batch: list[ApplyEntry],
        results: list[EntryResult],
        proposed: list[tuple[int, RequestKey, _Decoded | None] | None],
    ) -> tuple[int, tuple[int, int, int, int]]:
        """Answer and remember the requests of an applied batch; its writes and rows (by
        operation)."""
        writes = 0
        rows = _NO_ROWS
        # Requests another replica proposed (a follower's every one): their clients wait
        # elsewhere, so only how far each client got is learned, in one go.
        learned: list[tuple[RequestKey, int]] = []
        outcomes: list[tuple[int, int, Sequence[RowFailure]]] = []  # learned's, in step
        for entry, applied, result, mine in zip(entries, batch, results, proposed, strict=True):
            if mine is not None and mine[0] != entry.term:
                # Our entry at this index was replaced: this leader lost its term, and with
                # it every later entry it proposed then (``_drop_replaced``).
                error = NotLeaderError(self.consensus.snapshot.leader_id, entry.term)
                self.tracker.abort(mine[1], error)
                for dead in self._drop_replaced(entry):
                    self.tracker.abort(dead, error)
                mine = None
            if entry.type is not EntryType.NORMAL or result.skipped:
                continue
            if entry.data == CHECKSUM_MARKER:
                continue
            key = applied.request if applied.request is not None else (mine[1] if mine else None)
            if result.stale_below:
                # A late copy of a request its client had its answer to: nothing applied.
                if mine is not None and key is not None:
                    self.tracker.abort(key, _stale(key, result.stale_below))
                continue
            if result.duplicate_of:
                # A retry proposed again: answer with the original entry's outcome.
                index, term = result.duplicate_of, result.duplicate_term
            else:
                index, term = entry.index, entry.term
                writes += 1
                if result.rows_applied:
                    r = result.rows_by_op
                    rows = (rows[0] + r[0], rows[1] + r[1], rows[2] + r[2], rows[3] + r[3])
                if result.row_errors and mine is not None:
                    self._metrics.count_row_errors(result.row_errors)
            if key is None:
                continue
            first_incomplete = applied.first_incomplete_seq_no
            if mine is None:
                learned.append((key, first_incomplete))
                outcomes.append((index, term, result.row_errors))
                continue
            self.tracker.complete(key, _response(index, term, result.row_errors), first_incomplete)
        if learned:
            # Rarely any: a retry admitted here while another leader's entry was on its way.
            for key in self.tracker.learn_applied(learned):
                # The first outcome of a request stands (a batch may hold it twice).
                pos = next(i for i, (k, _) in enumerate(learned) if k == key)
                index, term, row_errors = outcomes[pos]
                self.tracker.complete(key, _response(index, term, row_errors), learned[pos][1])
        return writes, rows

    # --- checksums (raftlet cluster ksck --checksum) -----------------------------------------

    def place_checksum_point(self, timeout_s: float) -> ChecksumResult:
        """On the leader: replicate a checksum point, and return this replica's checksum
        there once it has applied it (``tserver.checksum``)."""
        self._check_serving()
        term = self.consensus.check_leadership_and_bind_term()
        (entry,) = self.consensus.replicate([CHECKSUM_MARKER], term)
        return self.checksum_at(entry.index, timeout_s)

    def checksum_at(self, index: int, timeout_s: float) -> ChecksumResult:
        """This replica's checksum at checksum point ``index``, waiting up to ``timeout_s``
        for it to apply the point.  A FAILED replica answers so, at once or once it fails
        (a failed one applies nothing: waiting out the timeout told the caller nothing)."""
        self._check_serving()
        if index <= self._applied_at_open:
            raise InvalidRequest(
                f"tablet {self.tablet_id}: index {index} was applied before this replica last "
                "started, so it took no checksum there; take a new checksum point"
            )
        result = self._checksums.wait(index, timeout_s)
        if result is not None:
            return result
        self._check_serving()
        if self._checksums.reading(index):
            raise ServiceUnavailable(
                f"tablet {self.tablet_id}: the checksum at index {index} is still being read "
                f"after {timeout_s:g} s (a large tablet: ask with a longer timeout)"
            )
        applied = self.store.applied_index()
        if applied >= index:
            raise InvalidRequest(
                f"tablet {self.tablet_id}: no checksum point at index {index} on this replica "
                "(not a checksum point, replaced by a new leader, or too old to be kept)"
            )
        raise ServiceUnavailable(
            f"tablet {self.tablet_id}: index {index} not applied on this replica after "
            f"{timeout_s:g} s (applied {applied})"
        )

    # --- reads ---------------------------------------------------------------------------------

    def scan(
        self, request: tablet_pb2.ScanRequest, deadline: float | None = None
    ) -> tablet_pb2.ScanResponse:
        """One page.  ``deadline`` (``time.monotonic()``): the caller's, which a wait for
        an index ends before, so the caller hears why rather than its deadline passing.
        A page of a scan this replica holds open (``tserver.held_scans``) comes from the
        read its first page made; any other from a new read, held open if rows are left."""
        self._check_serving()
        check_scan_request(request)
        check_schema(request.schema_fingerprint, "the scan", self.table, self.schema)
        shape = _scan_shape(request)
        taken = self._scans.take(request.scanner_id, shape) if request.scanner_id else None
        if taken is None:
            self._await_read(request, deadline)
        max_rows = request.batch_size_rows or None
        if request.limit:
            max_rows = min(max_rows or request.limit, request.limit)
        max_bytes = min(
            request.batch_size_bytes or self.options.scan_page_bytes,
            self.options.scan_max_page_bytes,
        )
        # Stopped when the caller gives up, with time left to say so.
        until = None if deadline is None else deadline - _ANSWER_MARGIN_S
        if taken is not None:
            scope, cursor = taken.scope, taken.cursor
        else:
            try:
                scope, cursor = self._open_scan(request, until)
            except InvalidScan as exc:  # the projection or the resume key
                raise InvalidRequest(str(exc)) from exc
            except ScanDeadlineExceeded as exc:
                raise self._page_late() from exc
            except StoreError as exc:
                raise self._read_failed(exc) from exc
        cursor.deadline = until
        scanner_id = None
        try:
            page, rows = fill_page_counted(
                cursor,
                request.row_format,
                max_rows,
                max_bytes,
                self.options.scan_page_cap_bytes,
            )
            # A scan whose limit this page reaches asks for no other (its has_more only
            # says the tablet holds more): nothing to hold.
            if page.has_more and not (request.limit and rows >= request.limit):
                scanner_id = self._scans.hold(scope, cursor, shape, taken)
                # A scan's first page with no place for its read: its later pages would each
                # be read anew, and could show a batch written meanwhile half. Refused as
                # busy before any row is sent, the client tries again a little later. (A
                # later page the replica holds no read for -- another replica's, or closed
                # -- is read anew, as every page once was.)
                if scanner_id is None and not request.HasField("resume_key"):
                    self._check_serving()  # stopped meanwhile: no scan is held, say so
                    self._metrics.scans_refused.increment()
                    raise ReplicaBusy(
                        f"tablet {self.tablet_id}: {self._scans.max_open} scans of it are "
                        "open; try again shortly"
                    )
        except ScanDeadlineExceeded as exc:
            raise self._page_late() from exc
        except StoreError as exc:
            raise self._read_failed(exc) from exc
        finally:
            if scanner_id is None:
                _end_scan(scope)
                if taken is not None:
                    taken.end()
        if scanner_id is not None:
            page.scanner_id = scanner_id
        return page

    def release_scan(self, scanner_id: bytes) -> None:
        """Close the scan held under ``scanner_id`` (its page was not sent)."""
        self._scans.release(scanner_id)

    def scans_held(self) -> int:
        """How many scans this replica holds open between pages."""
        return len(self._scans)

    def _page_late(self) -> DeadlineExceeded:
        return DeadlineExceeded(
            f"tablet {self.tablet_id}: the scan page was not done by the call's deadline "
            "(a smaller page, fewer IN values or a longer timeout may help)"
        )

    def _open_scan(
        self, request: tablet_pb2.ScanRequest, until: float | None
    ) -> tuple[AbstractContextManager[ScanCursor], ScanCursor]:
        """A new read of the store for ``request``, open until the scan ends or its hold;
        its SQLite work interrupted past ``until``."""
        try:
            predicates = [Predicate.from_pb(self.schema, p) for p in request.predicates]
        except (PredicateError, ValueError) as exc:
            raise InvalidRequest(str(exc)) from exc
        scope = self.store.open_scan(
            list(request.projection) or None,
            predicates,
            # Present, even empty (a key that encodes as nothing), continues a scan.
            resume_key=request.resume_key if request.HasField("resume_key") else None,
            # The rows the whole scan may take, and one more: whether there are more.
            limit=request.limit + 1 if 0 < request.limit < _MAX_SQL_LIMIT else None,
            deadline=until,
        )
        return scope, scope.__enter__()

    def _read_failed(self, exc: StoreError) -> Exception:
        """What a store error met by a read becomes: damage found as if by the verifier
        (FAILED, leadership handed over, a copy from the leader, and the client reads from
        another replica), or the error itself."""
        damage = damage_in(exc)
        if damage is None:
            return exc
        self.store_damaged(damage)
        return TabletFailed(f"the store file is damaged ({damage})")

    def _await_read(self, request: tablet_pb2.ScanRequest, deadline: float | None) -> None:
        """What a new read waits for, by its read mode: a quorum's word that this replica
        leads and the index it confirmed applied, or a follower's freshness."""
        wanted = request.min_applied_index
        if request.read_mode == tablet_pb2.READ_LEADER_LATEST:
            # Linearizable: fail fast off-leader, then confirm leadership with a quorum
            # after the read arrived (ReadIndex; or the lease, if on) and wait until that
            # index is applied.
            self.consensus.check_leadership_and_bind_term()
            index = 0
            if not self.options.unsafe_leader_reads_without_quorum:
                index = self.consensus.read_index(self.options.read_wait_s)
                if wanted > index:
                    # Every write acknowledged before the read came is committed by now:
                    # an index past that is no write of this tablet the caller saw.
                    raise InvalidRequest(
                        f"tablet {self.tablet_id}: index {wanted} is past what it has "
                        f"committed ({index}), so no write to it acknowledged yet; a Raft "
                        "index belongs to one tablet"
                    )
            self._wait_applied(max(index, wanted), deadline)
        else:
            # A follower read only from a replica that has known a leader since it opened:
            # one removed from its group while its server was down never does (it
            # campaigns, and nobody answers), and served its stale rows for good.  (One
            # that knew a leader and lost it -- cut off, an election -- still serves what
            # it has: follower reads are stale by contract.)  UNAVAILABLE: the client tries
            # another replica.
            if not self.consensus.knew_leader:
                raise ServiceUnavailable(
                    f"tablet {self.tablet_id}: this replica has known no leader since it "
                    "opened (just started, or no longer a member of its group); try another "
                    "replica"
                )
            if wanted:
                # Bounded staleness: whatever this replica has applied, once that includes
                # the index asked for (a write the client saw acknowledged, say).
                self._wait_applied(wanted, deadline)

    def _wait_applied(self, index: int, deadline: float | None = None) -> None:
        """Wait up to ``read_wait_s`` -- less if the caller's ``deadline`` comes first --
        until the store has applied ``index``: leader-latest reads see everything committed
        before the read arrived, bounded-staleness reads the index they ask for.
        UNAVAILABLE after that, so the client tries elsewhere."""
        wait_s = self.options.read_wait_s
        if deadline is not None:
            wait_s = max(0.0, min(wait_s, deadline - time.monotonic() - _ANSWER_MARGIN_S))
        with self._applied_cond:
            # Under the lock the apply stage holds entries with: held before this, they
            # are nudged out now; after, the stage sees this read waiting and holds none.
            self._reads_waiting += 1
            try:
                if self._held:
                    self._apply_q.post(None)
                applied = self._applied_cond.wait_for(
                    lambda: self.store.applied_index() >= index or self._apply_error is not None,
                    wait_s,
                )
            finally:
                self._reads_waiting -= 1
        if not applied:
            waited = (
                f"after {wait_s * 1000:.0f} ms"
                if wait_s > 0
                else "with no time left before the call's deadline"
            )
            committed = self.consensus.commit_index_seen()
            # A follower's commit index trails its leader's, so past it is only a hint: but a
            # bound from another tablet's write (review r32c) waited out every replica.
            hint = (
                f"; it is past what this replica knows committed ({committed}): if it came "
                "from another tablet's write it never comes here (a Raft index belongs to "
                "one tablet); else try another replica"
                if index > committed
                else "; try another replica"
            )
            raise ServiceUnavailable(
                f"tablet {self.tablet_id}: index {index} not yet applied on this replica "
                f"(applied {self.store.applied_index()}) {waited}{hint}"
            )
        self._check_serving()

    # --- tablet copy ---------------------------------------------------------------------------

    def copy_snapshot(self, dest: Path) -> SnapshotInfo:
        """Snapshot the store into ``dest`` for a tablet copy, with this leader's term and
        its latest committed membership. Only a leader serves one
        (``tserver.tablet_copy_source``); the snapshot's entry is still in its log, so
        appends can go on from it.

        A leader that has not committed its no-op yet serves one too: the store holds only
        committed entries, which every later leader holds as well (Raft's InstallSnapshot
        asks no more than the sender's leadership). Refusing it had deadlocked a group: a
        new leader whose no-op needed the acknowledgement of a follower the log could no
        longer catch up, while that follower waited for the leader to be ready to copy from
        it, until the old leader came back."""
        snap = self.consensus.snapshot
        if snap.role is not Role.LEADER:
            raise NotLeaderError(snap.leader_id, snap.term)
        index, term = self.store.snapshot(dest)
        first = self.consensus_log().first_index()
        if index < first:
            raise ServiceUnavailable(
                f"the store snapshot ends at {index}, before the log's first entry {first}"
            )
        config_index, membership = self.persistent_state().committed_membership()
        return SnapshotInfo(
            index, term, snap.term, membership.voters, membership.learners, config_index
        )

    def report_copy(self, peer: str, ok: bool, index: int) -> None:
        self.consensus.report_snapshot(peer, ok, index)

    def needs_repair(self) -> bool:
        """Whether only a tablet copy can mend this replica: its store was found damaged, or
        its log failed (a failed apply, by contrast, is retried until the disk recovers)."""
        return self._store_damage is not None or self.consensus.failed()

    def persistent_state(self) -> PersistentState:
        """Term, vote, voters and saved commit index, as last made durable."""
        return self._opened.storage.metadata.state

    # --- status --------------------------------------------------------------------------------

    def consensus_log(self) -> Log:
        return self._opened.storage.log

    def commit_index_cached(self) -> int:
        return self.consensus.commit_index_seen()

    def status(self) -> dict[str, object]:
        """The replica's state, its Raft part exact (takes the consensus lock)."""
        st = self.consensus.status()
        st.update(self._status_extras())
        return st

    def published_status(self) -> dict[str, object]:
        """What status pages show, read without ever taking the consensus lock: the Raft
        part from what the driver published (see ``RaftConsensus.published_status``)."""
        st = self.consensus.published_status()
        st.update(self._status_extras())
        st.update(
            applied_index=self.store.applied_index(),
            first_index=self._opened.storage.log.first_index(),
            last_index=self._opened.storage.log.last_index(),
        )
        return st

    def ready_status(self) -> dict[str, object]:
        """What ``/readyz`` judges (``tserver.readiness``): the Raft part as published --
        its last index of the same publication as its leader's commit -- and whether it is
        FAILED. No file is looked at: a probe must not wait behind a slow disk."""
        return {
            **self.consensus.published_status(),
            "tablet_id": self.tablet_id,
            **failure_status(self.failure_reason()),
        }

    def failure_reason(self) -> str | None:
        """Why this replica is FAILED (its log, or its store while applying), or None."""
        return self.consensus.failure_reason()

    def _status_extras(self) -> dict[str, object]:
        segments = self._opened.storage.log.segment_paths()
        return {
            "log_bytes": files_bytes(segments),
            "log_segments": len(segments),
            "store_bytes": store_bytes(self.store.path),
            "last_election": utc_time(self.consensus.last_election()),
            "tablet_id": self.tablet_id,
            "table": self.table,
            "partition": self.partition,
            "store_applied_index": self.store.applied_index(),
            **failure_status(self.failure_reason()),
            "tracked_clients": self.tracker.clients(),
            "request_records_expired": self.store.requests_expired,
        }


def failure_status(reason: str | None) -> dict[str, object]:
    """The status fields that say whether a replica is FAILED, and why."""
    return {
        "state": "FAILED" if reason is not None else "RUNNING",
        "failed": reason is not None,
        "failure": reason or "",
    }


def _scan_shape(request: tablet_pb2.ScanRequest) -> tuple[object, ...]:
    """What a held scan was opened for: a page asking for another under its id is read anew."""
    return (
        tuple(request.projection),
        tuple(p.SerializeToString(deterministic=True) for p in request.predicates),
        request.read_mode,
        request.row_format,
    )


def _end_scan(scope: AbstractContextManager[ScanCursor]) -> None:
    """End a scan's read (its transaction, its connection back to the pool)."""
    scope.__exit__(None, None, None)


def write_entry_payload(request: tablet_pb2.WriteRequest) -> bytes:
    """The payload of the log entry that carries ``request``: its request id, rows and
    schema fingerprint (checked against the leader's already: the followers check it
    against theirs), so never larger than the request (the size check in ``write`` counts
    on that)."""
    payload = tablet_pb2.WriteOperationPB(
        ops=request.ops, schema_fingerprint=request.schema_fingerprint
    )
    if request.HasField("request_id"):  # an anonymous write's entry carries none either
        payload.request_id.CopyFrom(request.request_id)
    if request.HasField("row_block"):
        payload.row_block.CopyFrom(request.row_block)
    return payload.SerializeToString()


def _giving_back(callbacks: WriteCallbacks, memory: WriteMemory, charge: int) -> WriteCallbacks:
    """``callbacks`` that give a write's charge back to the server's budget as it is
    answered (the result tracker answers each waiter once, by one of the two)."""

    def respond(response: tablet_pb2.WriteResponse) -> None:
        memory.give(charge)
        callbacks.respond(response)

    def fail(exc: BaseException) -> None:
        memory.give(charge)
        callbacks.fail(exc)

    return WriteCallbacks(respond, fail)


def _stale(key: RequestKey, first_incomplete: int) -> StaleRequest:
    client_id, seq_no = key
    return StaleRequest(
        f"request {seq_no} of client {client_id} is below its first incomplete request "
        f"{first_incomplete}, below which it said it retries nothing"
    )


def _response(index: int, term: int, row_errors: Sequence[RowFailure]) -> tablet_pb2.WriteResponse:
    response = tablet_pb2.WriteResponse(op_index=index, op_term=term)
    response.row_errors.extend(e.to_pb() for e in row_errors)
    return response


def _bounded_transactions(entries: list[Entry]) -> list[list[Entry]]:
    """``entries`` in runs of at most ``_APPLY_MAX_ENTRIES`` entries and, past one entry,
    ``_APPLY_MAX_BYTES`` of payload; ``[entries]`` itself when it fits (nearly always)."""
    if len(entries) <= _APPLY_MAX_ENTRIES and (
        sum(len(e.data) for e in entries) <= _APPLY_MAX_BYTES
    ):
        return [entries]
    runs: list[list[Entry]] = []
    run: list[Entry] = []
    size = 0
    for entry in entries:
        n = len(entry.data)
        if run and (len(run) >= _APPLY_MAX_ENTRIES or size + n > _APPLY_MAX_BYTES):
            runs.append(run)
            run, size = [], 0
        run.append(entry)
        size += n
    runs.append(run)
    return runs
