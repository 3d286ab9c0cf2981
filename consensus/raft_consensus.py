"""RaftConsensus: the threaded driver around the pure core (Kudu's RaftConsensus).

Threads and the one lock
- ``_lock`` (a ProfiledLock named ``consensus``) guards the RawNode.  Every input -- a tick,
  a peer's request or answer, a proposal, a durability report -- is stepped under it, and
  the resulting Ready is carried out under it (``_process_ready_unlocked``): term/vote
  saved (fsync) before anything that depends on them, entries handed to the WAL's group
  commit (``append_async``, which BLOCKS while the WAL's bounded queue is full -- with a slow
  disk, that is exactly where the lock holder waits, as in KUDU-2727), the leader's appends
  handed to the transport, committed entries handed to the applier.
- the replica's inputs are posted to its mailbox (``consensus.workers``), which the
  server's shared worker pool runs -- one batch at a time, never two at once: the
  "worker" below is whichever pool thread runs it.
- the WAL's appender thread reports durability through a callback.  When the replica's
  mailbox is idle and the lock is free, the appender steps ``on_persisted`` itself and
  releases what had to wait for persistence (votes, append acknowledgements) -- no worker
  is woken; otherwise the report is queued for the worker.  The callback never *waits*
  for the lock: the lock holder may be blocked in ``append_async`` waiting for that very
  appender.
- messages to peers are handed to the transport under the lock (``Transport.send`` never
  blocks); peers' answers are queued to the same worker, which steps all
  that is queued -- answers and durability reports alike -- under one lock acquisition.
- a ``consensus.ticker`` (one per server, shared by its replicas) turns wall time into
  ticks; a leader's or candidate's tick is queued to the worker like any other input (at
  most one pending), a follower's only once it has been quiet for an election timeout
  (``_on_tick``).
- a peer's request (UpdateConsensus, RequestVote) is stepped on the caller's thread
  (``handle_request_async``), which returns at once; the answer goes to the caller's
  ``reply`` callback from the worker once what it acknowledges is durable,
  so no thread waits on a follower's fsync.  ``handle_request`` is the blocking form.

The lock-free leadership check (KUDU-2727)
After every Ready whose soft state changed, a frozen ``ConsensusSnapshot`` is published by
one attribute assignment.  ``check_leadership_and_bind_term`` reads that attribute once
and never touches the lock.  It is safe because the snapshot only ever describes a state
that was in force, and ``replicate(datas, bound_term)`` re-checks the term under the lock:
a write bound to a stale term is refused with TermMismatch, never appended in a later term.
With ``TermCheckMode.LOCKED`` the check takes the lock and reads the core instead (the
pre-KUDU-2727 behaviour), so both can be measured side by side.

Leader reads (``read_index``)
``LeaderReadMode.READ_INDEX`` (default): every read waits for a quorum round (the core's
ReadIndex, rounds batched).  ``LeaderReadMode.LEASE``: a read is served at the current commit
index with no round while this leader holds a lease, and falls back to ReadIndex otherwise.
The lease is measured on ``clock`` (monotonic) from quorum-acknowledged heartbeat *send*
times: every heartbeat is a new read round (``Config.heartbeat_read_rounds``); before a
ready's messages leave, the time is noted for a new round in it; when a majority has
acknowledged round r, ``lease_until = time(r) + lease_duration``.  The bound the duration
keeps, and its assumptions: ``ConsensusOptions.lease_duration_s``.  A lease is void while a
leadership transfer runs (the transferee's votes ignore the followers' lease), across any
change of term or role, and after any stall the ticker notices (``TickSource.stalls``
differs from when the lease's round was sent, or ``is_on_time()`` is false: a paused
process must not wake up holding a lease).  A stall is also stepped into the core
(``RawNode.on_stall``), which makes a leader that stalled for an election timeout recheck
its quorum on fresh answers.

Failure (docs/ARCHITECTURE.md, "Failure model")
Two ways a running replica fails, both made known to the core as ``set_promotable(False)``
-- a leader hands over to a caught-up follower or steps down at once, and nobody campaigns
-- and both refuse writes and reads with ``ReplicaFailed``:
- its log fails (a WAL write or fdatasync; the appender reports it): for good, until the
  replica is reopened, since a failed fdatasync cannot be trusted to be retried.
- its applier fails (``apply_failed``, from the tablet: the store cannot take committed
  entries): until the tablet calls ``apply_recovered``.  The log is still sound, but the
  replica stops stepping peers' requests and answers meanwhile, as if it were down: a
  change of term would have to be saved to a disk that may be full, and a follower that
  cannot apply gains nothing by accepting more entries.  The leader catches it up later.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from raftlet.consensus.core import (
    NO_NODE,
    Config,
    ConfigChange,
    ConfigChangeRefused,
    EntriesUnreadable,
    Entry,
    Membership,
    Message,
    MessageType,
    NotLeaderError,
    ProposalDropped,
    RawNode,
    Ready,
    Role,
    SoftState,
)
from raftlet.consensus.log.raft_storage import LogStorage
from raftlet.consensus.modes import LeaderReadMode, TermCheckMode
from raftlet.consensus.ticker import Ticker, TickSource
from raftlet.consensus.transport import Transport
from raftlet.consensus.workers import WorkerPool
from raftlet.metrics.counter import StripedCounter
from raftlet.metrics.profiled_lock import ProfiledLock

__all__ = [
    "ConsensusMetrics",
    "ConsensusOptions",
    "ConsensusSnapshot",
    "LeaderNotReady",
    "LeaderReadMode",
    "NoAnsweringFollower",
    "RaftConsensus",
    "ReplicaFailed",
    "TermCheckMode",
    "describe_error",
    "out_of_space",
]

logger = logging.getLogger(__name__)

_RESPONSES = frozenset(
    {
        MessageType.APPEND_RESPONSE,
        MessageType.HEARTBEAT_RESPONSE,
        MessageType.VOTE_RESPONSE,
        MessageType.PRE_VOTE_RESPONSE,
    }
)
_TICK = object()
# Posted to the worker when the log failed where no reply list was at hand: the tablet is
# told (``on_log_failed``) once the worker has released the lock.
_REPORT_FAILURE = object()
# What _process_ready_unlocked says about the answer to a request it was asked to hold.
_HELD = object()  # handed to reply once durable
_NO_ANSWER = object()  # the core answered nothing
# Where the answer to a peer's request goes: called exactly once, with the answer, or None
# when there is none to give (dropped, replica stopping or failed).  Called without the
# consensus lock held, from the thread that made the answer durable or the caller's.
Reply = Callable[[Message | None], None]
# Publish the status that status pages read every this many ticks.
_STATUS_PUBLISH_TICKS = 10


@dataclass(frozen=True, slots=True)
class _Durable:
    """The WAL made ``ready`` durable (or failed with ``error``)."""

    ready: Ready
    later: list[Message]
    # The held-back answer to a peer's request and where it goes once it may leave.
    answer: Message | None
    reply: Reply | None
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class _Stall:
    """The ticker saw this process stop for ``ticks`` ticks' worth of time."""

    ticks: int


class NoAnsweringFollower(ProposalDropped):
    """A step-down found no voter that answers, or the one it named has not answered: none
    would take leadership now (UNAVAILABLE, retried: a follower may come back)."""


class LeaderNotReady(ProposalDropped):
    """The leader has not committed its NO_OP yet, or is handing leadership over: retry
    the same server shortly (UNAVAILABLE)."""


class ReplicaFailed(ProposalDropped):
    """The replica failed (its log, or its applier): it serves nothing until it recovers
    or is reopened.  The message starts with "tablet failed: " and says why."""


class _ReadWaiter:
    """One ``read_index`` call waiting for its ReadState."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.index = 0
        self.ok = False

    def finish(self, index: int, *, ok: bool) -> None:
        self.index, self.ok = index, ok
        self.done.set()


@dataclass(frozen=True, slots=True)
class ConsensusSnapshot:
    """What a write needs to know about leadership, immutable so it can be read lock-free."""

    term: int
    role: Role
    leader_id: str
    leader_ready: bool
    transferring: bool

    @classmethod
    def of(cls, soft: SoftState) -> ConsensusSnapshot:
        return cls(soft.term, soft.role, soft.leader_id, soft.leader_ready, soft.transferring)

    def bind_term(self) -> int:
        """The term a write may bind to, or the error that tells the client where to go."""
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.leader_id, self.term)
        if not self.leader_ready:
            raise LeaderNotReady(f"leader of term {self.term} has not committed its no-op yet")
        if self.transferring:
            raise LeaderNotReady(f"leader of term {self.term} is handing leadership over")
        return self.term


@dataclass(frozen=True, slots=True)
class ConsensusOptions:
    tick_interval_s: float = 0.1
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    max_inflight_msgs: int = 64
    max_size_per_msg: int = 1 << 20
    # A follower far behind (a learner back from a pause) was sent 64 messages of up to
    # 1 MiB each as answers came, each read from the log and encoded under the consensus
    # lock (~65 ms a MiB): seconds without heartbeats.  Now 2 MiB and one message.
    max_inflight_bytes: int = 2 << 20
    # Committed entries handed to the applier and not yet applied, at most (by entry bytes):
    # a follower back from an outage was handed its whole backlog at once, and held it in
    # memory while its store applied it (review r31a: 93 -> 459 MiB for 225,000 entries).
    max_applying_bytes: int = 16 << 20
    # See consensus.core.Config: off, a moved commit index waits for the next append or
    # heartbeat instead of costing every follower a message of its own.
    broadcast_commit: bool = False
    term_check_mode: TermCheckMode = TermCheckMode.LOCKFREE
    # How long a peer's request may wait for its answer to become durable.
    request_timeout_s: float = 10.0
    seed: int | None = None
    leader_read_mode: LeaderReadMode = LeaderReadMode.READ_INDEX
    # The fraction by which any two servers' clocks may disagree about a length of time.
    lease_clock_drift: float = 0.1
    # A log write not durable after this long (a hung or failing disk) makes the replica
    # give up leadership and stop campaigning until its log writes again; 0: never.
    log_stall_s: float = 5.0
    # A replica that starts counts all but one tick of an election timeout as passed (as
    # etcd's initial election tick advance): it knows no leader yet, and a new or restarted
    # cluster otherwise sat out a whole timeout before its first vote.  A leader's message
    # still resets the count, and pre-vote keeps an early campaign from disrupting one.
    boot_tick_advance: bool = True

    def lease_duration_s(self) -> float:
        """How long after the send time of a heartbeat round a majority acknowledged this
        leader may serve reads without a quorum round:

            L = (election_ticks - heartbeat_ticks) * tick_interval_s
            lease = L * (1 - lease_clock_drift) - tick_interval_s

        The bound.  A follower that steps a heartbeat of round r (sent after time(r)) resets
        its election count; until it counts ``election_ticks`` more ticks it neither votes
        for another candidate nor campaigns (``Raft.step``'s check-quorum lease, the
        ``transfer`` vote aside).  Its ticks never come faster than wall time, and at most
        ``heartbeat_ticks`` at once (``consensus.ticker``), and every tick counted before the
        heartbeat is stepped before it (``handle_request_async``), so that takes at least L
        of the follower's time.  A new leader needs a vote from a majority, which shares a
        member with the majority that acknowledged r: none can exist before time(r) + L on
        that member's clock, which is later than time(r) + L * (1 - drift) on ours if the
        two clocks' rates differ by at most ``drift``.  One tick less again covers the tick
        grid's phase and the time between reading the clock and reading the commit index.

        Assumptions: every server uses the same Raft timings and check-quorum; a follower
        that restarts (it forgets when it last heard a leader and may vote at once) takes
        longer than a lease to come back -- a restart here takes seconds, a lease well under
        one; a transfer's TIMEOUT_NOW reaches its target before any later heartbeat (the
        stream transport keeps order).  The default drift, 0.1, is far above what clock
        rates do (NTP slews at most 500 ppm), and leaves room for scheduling noise: with the
        default timings (100 ms ticks, 10/3) L = 700 ms and the lease is 530 ms."""
        interval = self.tick_interval_s
        span = (self.election_ticks - self.heartbeat_ticks) * interval
        return span * (1.0 - self.lease_clock_drift) - interval

    def validate(self) -> None:
        if not 0.0 <= self.lease_clock_drift < 1.0:
            raise ValueError(f"lease clock drift must be in [0, 1), got {self.lease_clock_drift}")
        if self.leader_read_mode is LeaderReadMode.LEASE:
            if not self.check_quorum:
                raise ValueError("a leader lease needs check-quorum (followers keep it)")
            if self.lease_duration_s() <= 0:
                raise ValueError(
                    f"these Raft timings leave no lease: (election_ticks - heartbeat_ticks) "
                    f"* (1 - drift) must exceed one tick ({self.election_ticks}, "
                    f"{self.heartbeat_ticks}, {self.lease_clock_drift})"
                )


@dataclass
class ConsensusMetrics:
    """Counters the driver feeds; the tablet server passes registry-owned ones."""

    term_checks: dict[TermCheckMode, StripedCounter] = field(
        default_factory=lambda: {m: StripedCounter() for m in TermCheckMode}
    )
    # Acquisitions of the consensus lock made by the term check (zero in lockfree mode).
    term_check_lock_acquisitions: StripedCounter = field(default_factory=StripedCounter)
    leader_elections: StripedCounter = field(default_factory=StripedCounter)
    # Leader reads served by the lease, and by a quorum round (ReadIndex).
    lease_reads: StripedCounter = field(default_factory=StripedCounter)
    read_index_reads: StripedCounter = field(default_factory=StripedCounter)
    # Stalls of the process the ticker reported to this replica.
    stalls: StripedCounter = field(default_factory=StripedCounter)


class RaftConsensus:
    def __init__(
        self,
        *,
        group_id: str,
        node_id: str,
        storage: LogStorage,
        transport: Transport,
        apply_committed: Callable[[Sequence[Entry]], None],
        applied_index: int = 0,
        options: ConsensusOptions | None = None,
        lock: ProfiledLock | None = None,
        metrics: ConsensusMetrics | None = None,
        ticker: TickSource | None = None,
        workers: WorkerPool | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_log_failed: Callable[[str], None] | None = None,
        on_snapshot_needed: Callable[[str, int], None] | None = None,
        peers: Iterable[str] = (),
        on_membership: Callable[[Membership], None] | None = None,
        on_peer_heard: Callable[[str], None] | None = None,
        on_peer_asked: Callable[[str], None] | None = None,
    ) -> None:
        """``on_log_failed(reason)``: called once, outside the lock, when the log fails (the
        tablet fails the calls waiting on this replica).  ``on_snapshot_needed(peer,
        term)``: this leader cannot catch ``peer`` up from its log and wants it to copy the
        tablet; called under the lock, so it must only hand the work on.  Its outcome comes
        back through ``report_snapshot``.  Without it, every such request fails at once.
        ``peers``: every server that may speak for the group beyond its members
        (``Config.peers``: the cluster's servers).  ``on_membership(m)``: called under the
        lock, once ``m`` is durable in the metadata, whenever the membership in use changes;
        it must only take note.  ``on_peer_heard(server)``: called with the sender of every
        request and answer before it is stepped, from the thread that received it (not under
        the lock); it may block briefly (``tserver.servers_heard`` writes a peer down the
        first time it is heard from).  ``on_peer_asked(server)``: called with the
        destination of every message sent, under the lock, so it must only take note."""
        self.group_id = group_id
        self.node_id = node_id
        self.options = opts = options or ConsensusOptions()
        opts.validate()
        self._lease_mode = opts.leader_read_mode is LeaderReadMode.LEASE
        self._lease_duration_s = opts.lease_duration_s()
        self._clock = clock
        self._storage = storage
        self._on_membership = on_membership
        self._on_peer_heard = on_peer_heard
        self._on_peer_asked = on_peer_asked
        self._transport = transport
        self._apply_committed = apply_committed
        self._on_log_failed = on_log_failed
        self._on_snapshot_needed = on_snapshot_needed
        self._lock = lock or ProfiledLock("consensus")
        self.metrics = metrics or ConsensusMetrics()
        meta = storage.metadata.state
        config = Config(
            id=node_id,
            voters=meta.voters,
            learners=meta.learners,
            config_index=meta.config_index,
            committed_config=meta.committed_membership(),
            peers=frozenset(peers),
            election_tick=opts.election_ticks,
            heartbeat_tick=opts.heartbeat_ticks,
            pre_vote=opts.pre_vote,
            check_quorum=opts.check_quorum,
            max_inflight_msgs=opts.max_inflight_msgs,
            max_size_per_msg=opts.max_size_per_msg,
            max_inflight_bytes=opts.max_inflight_bytes,
            max_applying_bytes=opts.max_applying_bytes,
            broadcast_commit=opts.broadcast_commit,
            heartbeat_read_rounds=self._lease_mode,
            applied=applied_index,
            seed=opts.seed,
        )
        self._node = RawNode(config, storage)
        # The membership in use (the core's, once durable), read without the lock.
        self._membership: Membership = self._node.raft.membership
        self._snapshot = ConsensusSnapshot.of(self._node.soft_state())
        # The last leader this replica knew since it opened ("" if none; read unlocked).
        self._last_leader = self._snapshot.leader_id
        initial = storage.initial_state()
        self._saved_commit = initial.commit
        self._saved_vote = (initial.term, initial.vote)
        # Read without the lock by status pages and gauges; an int assignment is atomic.
        self._commit_seen = self._saved_commit
        self._last_election = 0.0  # wall-clock time this replica last saw a new leader
        # The log's failure (for good), and the applier's (until apply_recovered).
        self._failure: BaseException | None = None
        self._apply_failure: BaseException | None = None
        # Seconds the log's oldest pending write had waited when it was found stalled
        # (``_check_log_stall_unlocked``); 0.0 while it writes.
        self._log_stalled_s = 0.0
        self._stopping = threading.Event()
        # Linearizable reads waiting for a quorum's confirmation, by the core's token.
        self._reads: dict[int, _ReadWaiter] = {}
        self._read_token = 0
        # The lease (LEASE mode), under _lock: the term it is for, the rounds sent in it as
        # (round, clock before its heartbeats left, ticker stalls then), the last round
        # seen in a ready, and the lease's end with the stall count it was granted under.
        self._lease_term = -1
        self._round_times: deque[tuple[int, float, int]] = deque()
        self._round_seen = 0
        self._lease_until = 0.0
        self._lease_stalls = 0
        # The server's pool runs every replica's mailbox; a replica on its own gets one.
        self._own_workers = workers is None
        self._workers = workers or WorkerPool(f"raft-worker:{group_id}", min_threads=1)
        self._inbox = self._workers.mailbox(f"raft:{group_id}", self._handle_inputs)
        # The server's ticker drives all its replicas; a replica on its own gets its own.
        self._own_ticker = ticker is None
        self._ticker = ticker or Ticker(opts.tick_interval_s, name=f"raft-timer:{group_id}")
        self._unregister_tick: Callable[[], None] | None = None
        self._tick_queued = False
        # Ticks that passed and were not yet stepped (see _on_tick); under _tick_lock.
        self._tick_lock = threading.Lock()
        self._pending_ticks = 0
        # Ticks since the last peer message this replica stepped (see _on_tick).
        self._quiet_ticks = 0
        self._ticks = 0
        self._started = False
        # What status pages read, never taking the lock: refreshed by the worker every
        # _STATUS_PUBLISH_TICKS ticks, swapped in by one assignment.
        self._published_status: dict[str, object] = {}

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Start ticking.  Committed entries above the applied index are handed to the
        applier as soon as they are known (the first Ready may already hold some)."""
        self._started = True
        if self.options.boot_tick_advance:
            with self._tick_lock:
                # Short of the shortest randomized timeout: the next ticks decide.
                advance = self.options.election_ticks - 1
                self._pending_ticks += advance
                self._quiet_ticks += advance
        self._unregister_tick = self._ticker.register(self._on_tick, self._on_stall)
        if self._own_ticker:
            self._ticker.start()
        with self._lock:
            self._process_ready_unlocked()
            self._published_status = self._status_unlocked()

    def stop(self) -> None:
        """Stop ticking and sending; save the commit index.  Pending proposals are not
        failed here: the tablet fails its own in-flight operations."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._unregister_tick is not None:
            self._unregister_tick()
        if self._own_ticker:
            self._ticker.stop()
        if self._started:
            barrier = threading.Event()
            try:
                self._storage.append_async([], lambda _err: barrier.set())
                barrier.wait(timeout=10)
            except Exception:  # a failed or closed log has nothing left to flush
                pass
            self._inbox.close(timeout=10)
        if self._own_workers:
            self._workers.stop()
        with self._lock:
            self._save_commit_unlocked()  # the one save of a commit move: see there
            self._finish_reads_unlocked()

    # --- the write path ----------------------------------------------------------------

    @property
    def snapshot(self) -> ConsensusSnapshot:
        return self._snapshot

    @property
    def knew_leader(self) -> bool:
        """Whether this replica has known a leader of its group since it opened: one that
        never has may have been removed from the group while it was down (it campaigns,
        and nobody answers)."""
        return bool(self._last_leader)

    @property
    def membership(self) -> Membership:
        """The group's membership as this replica uses it (lock-free; the latest in its
        log, committed or not)."""
        return self._membership

    @property
    def voters(self) -> tuple[str, ...]:
        return self._membership.voters

    def change_config(
        self, change: ConfigChange, cas_config_index: int | None = None
    ) -> tuple[Entry, Membership]:
        """On the leader: append the membership change and start replicating it; returns
        its entry (which commits later) and the membership it makes.  Raises
        NotLeaderError, ConfigChangeRefused (another change is not committed yet; or the
        membership is no longer that of entry ``cas_config_index``, when given, ...)."""
        self._raise_if_failed()
        with self._lock:
            self._step_ticks_unlocked()
            now = self._node.raft.conf_state().index
            if cas_config_index is not None and now != cas_config_index:
                raise ConfigChangeRefused(
                    f"the group changed since (its membership is now that of entry {now}, "
                    f"not {cas_config_index}): decide the change again on what it is now"
                )
            entry = self._node.propose_config_change(change)
            membership = self._node.raft.membership
            self._process_ready_unlocked()
        return entry, membership

    def check_config_change(self, change: ConfigChange) -> Membership:
        """On the leader: the membership ``change`` would make, or the refusal
        ``change_config`` would raise now; nothing is appended."""
        self._raise_if_failed()
        with self._lock:
            # The ticks counted so far first: they date the peers' last answers.
            self._step_ticks_unlocked()
            self._process_ready_unlocked()
            return self._node.check_config_change(change)

    def check_leadership_and_bind_term(self) -> int:
        """The term a write binds to; raises NotLeaderError / LeaderNotReady / ReplicaFailed.

        Lockfree mode reads the published snapshot once.  Locked mode takes the consensus
        lock and asks the core, as Kudu did before KUDU-2727."""
        self._raise_if_failed()
        mode = self.options.term_check_mode
        self.metrics.term_checks[mode].increment()
        if mode is TermCheckMode.LOCKFREE:
            return self._snapshot.bind_term()
        self.metrics.term_check_lock_acquisitions.increment()
        with self._lock:
            snapshot = ConsensusSnapshot.of(self._node.soft_state())
        return snapshot.bind_term()

    def _raise_if_failed(self) -> None:
        why = self.failure_reason()
        if why is not None:
            raise ReplicaFailed(f"tablet failed: {why}")

    def replicate(
        self,
        datas: Sequence[bytes],
        bound_term: int,
        on_proposed: Callable[[list[Entry]], None] | None = None,
    ) -> list[Entry]:
        """Append ``datas`` as entries of ``bound_term`` and start replicating them.

        ``on_proposed(entries)`` runs under the lock before anything is sent, so what it
        records about the entries is there before they can commit and be applied.  Raises
        TermMismatch if leadership moved since the term was bound, NotLeaderError if this
        replica no longer leads.  Under the lock this may wait for room in the WAL's queue.
        """
        self._raise_if_failed()
        with self._lock:
            self._step_ticks_unlocked()
            entries = self._node.propose_batch(datas, expected_term=bound_term)
            if on_proposed is not None:
                on_proposed(entries)
            self._process_ready_unlocked()
        return entries

    def read_index(self, timeout_s: float) -> int:
        """The index a linearizable read must see (ReadIndex, thesis §6.4): the commit
        index when the call arrived, once a quorum has confirmed after that moment that
        this replica still leads -- or, in LEASE mode while the lease holds, the commit
        index now, with no round. Serve the read once the store has applied it. Raises
        NotLeaderError (not the leader, or it lost leadership meanwhile), LeaderNotReady
        (its commit index is not current yet, or no quorum answered within ``timeout_s``:
        a replica cut off from the others never serves a read), ReplicaFailed."""
        self._raise_if_failed()
        if self._lease_mode:
            with self._lock:
                self._step_ticks_unlocked()
                if self._lease_holds_unlocked():
                    self.metrics.lease_reads.increment()
                    return self._node.hard_state().commit
        self.metrics.read_index_reads.increment()
        waiter = _ReadWaiter()
        with self._lock:
            if self._stopping.is_set():
                raise NotLeaderError(NO_NODE, self._snapshot.term)
            self._step_ticks_unlocked()
            self._read_token += 1
            token = self._read_token
            try:
                self._node.read_index(token)
            except NotLeaderError:
                raise
            except ProposalDropped as e:
                raise LeaderNotReady(str(e)) from None
            self._reads[token] = waiter
            self._process_ready_unlocked()
        if not waiter.done.wait(timeout_s):
            with self._lock:
                self._reads.pop(token, None)
            raise LeaderNotReady(
                f"replica {self.group_id}: no quorum confirmed its leadership within "
                f"{timeout_s:.3g} s"
            )
        if not waiter.ok:
            snap = self._snapshot
            raise NotLeaderError(snap.leader_id, snap.term)
        return waiter.index

    def _lease_holds_unlocked(self) -> bool:
        """Whether this leader may serve a read at its commit index with no quorum round
        (see the module docstring).  Caller holds ``_lock``."""
        soft = self._node.soft_state()
        return (
            soft.role is Role.LEADER
            and soft.leader_ready
            and not soft.transferring
            and soft.term == self._lease_term
            and self._ticker.stalls == self._lease_stalls
            and self._ticker.is_on_time()
            and self._clock() < self._lease_until
        )

    def lease_remaining_s(self) -> float:
        """How much of the lease is left now (0 without one); for tests and status."""
        with self._lock:
            if not self._lease_holds_unlocked():
                return 0.0
            return max(0.0, self._lease_until - self._clock())

    def on_applied(self, index: int) -> None:
        """The applier applied every committed entry up to ``index``; committed entries
        that waited for room under ``max_applying_bytes`` are handed over now."""
        with self._lock:
            spent = self._node.applying_budget_spent()
            self._node.on_applied(index)
            if spent and self._failure is None and not self._stopping.is_set():
                self._process_ready_unlocked()

    def step_down(self, new_leader: str = NO_NODE) -> str:
        """Hand leadership to ``new_leader``, or to the most caught-up follower, if it was
        heard from within the last ``2 * heartbeat_ticks + 1`` ticks.

        ``ValueError`` (the request cannot succeed as it stands, however often it is asked:
        INVALID_ARGUMENT to a client) when ``new_leader`` is no other voter, or when the
        group has no other voter at all; ``NoAnsweringFollower`` (UNAVAILABLE, retried)
        when ``new_leader``, or without it every follower, has not answered within that
        window. A leader whose worker was held up
        steps the ticks it missed before the answers queued behind them, and may say so
        of followers that did answer: the client's retry then finds them heard from."""
        with self._lock:
            self._step_ticks_unlocked()
            status = self._node.status()
            if status.soft_state.role is not Role.LEADER:
                raise NotLeaderError(status.soft_state.leader_id, status.soft_state.term)
            target = new_leader
            if not target:
                voters = [v for v in status.progress if v in status.voters]
                if not voters:
                    # Not ProposalDropped: that is UNAVAILABLE, which clients retry until
                    # their deadline, and a group of one has no follower however long it waits.
                    raise ValueError(
                        f"{self.group_id} has no other voter, so no follower to hand "
                        "leadership to: add a replica first (`raftlet tablet add-replica "
                        f"{self.group_id} SERVER`)"
                    )
                # The most caught-up voter heard from lately: one paused or dead would not
                # take leadership, and writes wait while a transfer to it runs out (an idle
                # tablet's followers all match, and the first of them was picked, review
                # r32c). Never a learner.
                target = self._answering_successor_unlocked()
                if not target:
                    raise NoAnsweringFollower(
                        f"{self.group_id}: no other voter answered within the last "
                        f"{self._answer_window_ticks} ticks, so none could take "
                        "leadership now"
                    )
            if target not in self.voters or target == self.node_id:
                raise ValueError(f"{target!r} is not another voter of {self.group_id}")
            if new_leader and not self._node.answered_within(target, self._answer_window_ticks):
                # A transfer to it would run out, unheard, while writes wait on it: the
                # call said leadership moved, and nothing did (review r33b).
                raise NoAnsweringFollower(
                    f"{self.group_id}: {target} has not answered within the last "
                    f"{self._answer_window_ticks} ticks, so it could not take leadership now"
                )
            self._transfer_unlocked(target, "asked to step down")
        return target

    def hand_over(self, why: str = "stopping") -> str:
        """Before this server stops (or as ``why`` says): hand leadership to the most
        caught-up voter heard from within the last heartbeats, if this replica leads and
        one is.  Returns it, or NO_NODE (nothing to hand over, or no follower that would
        take it now)."""
        with self._lock:
            self._step_ticks_unlocked()
            target = self._answering_successor_unlocked()
            if not target:
                return NO_NODE
            self._transfer_unlocked(target, why)
        return target

    @property
    def _answer_window_ticks(self) -> int:
        # A follower answers every heartbeat: silent for more than two has stopped, or is
        # stopping too, and TIMEOUT_NOW would be lost on it.
        return 2 * self.options.heartbeat_ticks + 1

    def _answering_successor_unlocked(self) -> str:
        return self._node.answering_successor(self._answer_window_ticks)

    def _transfer_unlocked(self, target: str, why: str) -> None:
        logger.info(
            "%s: %s hands leadership of term %d to %s (%s)",
            self.group_id,
            self.node_id,
            self._node.soft_state().term,
            target,
            why,
        )
        self._node.transfer_leadership(target)
        self._process_ready_unlocked()

    # --- peers ---------------------------------------------------------------------------

    def handle_request(self, message: Message) -> Message | None:
        """A peer's request, answered on this thread: ``handle_request_async`` and a wait
        of at most ``request_timeout_s`` for its answer (None if there is none)."""
        done = threading.Event()
        box: list[Message | None] = []

        def reply(answer: Message | None) -> None:
            box.append(answer)
            done.set()

        self.handle_request_async(message, reply)
        if not done.wait(self.options.request_timeout_s):
            return None
        return box[0]

    def handle_request_async(self, message: Message, reply: Reply) -> None:
        """A peer's request (APPEND, HEARTBEAT, VOTE, PRE_VOTE, TIMEOUT_NOW): step it and
        return at once.  ``reply`` gets the answer once it may leave -- after what it
        acknowledges (entries, a vote) is durable -- or None if the core answered nothing.
        If the replica stops first, ``reply`` may never be called: the caller bounds its
        wait, as it would for a lost message."""
        if not self._healthy():
            reply(None)
            return
        if self._on_peer_heard is not None:
            self._on_peer_heard(message.src)
        with self._lock:
            self._step_ticks_then_unlocked(message)
            outcome = self._process_ready_unlocked(answer_to=message.src, reply=reply)
        if outcome is _NO_ANSWER:
            reply(None)
        elif isinstance(outcome, Message):
            reply(outcome)

    def _send_unlocked(self, message: Message) -> None:
        if message.type is MessageType.SNAPSHOT:
            # Not for the wire: the tablet copies its state to the peer (tablet copy).
            if self._on_snapshot_needed is not None:
                self._on_snapshot_needed(message.dst, message.term)
            else:
                self._node.report_snapshot(message.dst, False)
            return
        if self._on_peer_asked is not None:
            self._on_peer_asked(message.dst)
        # The transport never blocks, and its answer only queues: safe under the lock.  It
        # must not raise either; if a bug makes it, the message is lost (which Raft allows)
        # rather than the rest of this Ready: a half-carried-out Ready corrupts the replica.
        try:
            self._transport.send(message, self._on_answer)
        except Exception:
            logger.exception(
                "%s: sending %s to %s failed", self.group_id, message.type, message.dst
            )

    def report_snapshot(self, peer: str, ok: bool, index: int = 0) -> None:
        """How the tablet copy ``on_snapshot_needed`` asked for ended: ``ok`` with the index
        ``peer`` installed, or failed (the core asks again after ``peer``'s next heartbeat
        answer, if it still needs one)."""
        with self._lock:
            if self._stopping.is_set():
                return
            self._node.report_snapshot(peer, ok, index)
            self._process_ready_unlocked()

    def _on_tick(self, ticks: int) -> None:
        """The ticker's thread: count ``ticks`` as passed, and wake the worker to step them
        only when they may do something now.

        A leader or candidate must act on its ticks (heartbeats, check-quorum, election
        retries).  A follower's ticks only bring its election timeout closer, and every
        message it steps steps the ticks counted so far first (``_step_ticks_unlocked``,
        so they keep their order with the leader's heartbeats).  Its worker is woken only
        once the shortest election timeout has passed with no message from a peer -- and
        from then on at every call, so that its randomized timeout fires when it is due
        (waking it only every election timeout's worth would make every follower campaign
        at the same moment, and split the votes).  So a healthy follower costs no wake-up
        per tick.  Ticks beyond one call's worth are dropped while a wake-up is pending: a
        worker held up (a slow WAL holding the lock) then ticks as much as one call, not a
        burst that fires an election."""
        if self._stopping.is_set():
            return
        with self._tick_lock:
            if self._tick_queued:
                return
            self._pending_ticks += ticks
            self._quiet_ticks += ticks
            quiet = self._quiet_ticks
        role = self._snapshot.role
        if role is not Role.FOLLOWER or quiet >= self.options.election_ticks:
            self._tick_queued = True
            self._inbox.post(_TICK)

    def _on_stall(self, seconds: float) -> None:
        """The ticker's thread: this process stalled.  End the lease at once (lease reads
        also check the ticker's stall count, so none slips through before this runs), and
        let the worker step the stall into the core."""
        self._lease_until = 0.0
        self.metrics.stalls.increment()
        if not self._stopping.is_set():
            self._inbox.post(_Stall(int(seconds / self.options.tick_interval_s)))

    def _step_ticks_unlocked(self) -> None:
        """Step the ticks that passed since the last step.  Caller holds ``_lock``, before
        it steps anything else."""
        with self._tick_lock:
            ticks, self._pending_ticks = self._pending_ticks, 0
        for _ in range(ticks):
            self._tick_unlocked()

    def _step_ticks_then_unlocked(self, message: Message) -> None:
        """Step every tick counted so far, then ``message``, with no tick counted in between
        (the ticker waits on ``_tick_lock`` for the step, a few microseconds of pure core):
        a tick that passed before a leader's heartbeat is never counted after it, which the
        lease's bound relies on (``ConsensusOptions.lease_duration_s``)."""
        while True:
            self._step_ticks_unlocked()
            with self._tick_lock:
                if self._pending_ticks == 0:
                    self._quiet_ticks = 0
                    self._node.step(message)
                    return

    def _on_answer(self, answer: Message | None) -> None:
        """A peer's answer to something we sent, from any transport thread: queued for the
        worker, which steps it with whatever else is queued under one lock acquisition."""
        if answer is not None and not self._stopping.is_set():
            if self._on_peer_heard is not None:
                self._on_peer_heard(answer.src)
            self._inbox.post(answer)

    # --- status ----------------------------------------------------------------------------

    def commit_index_seen(self) -> int:
        """The commit index as of the last Ready, read without the lock (may lag a bit)."""
        return self._commit_seen

    def last_election(self) -> float:
        """Wall-clock seconds of the last change of term or leader seen (0: none)."""
        return self._last_election

    def commit_index(self) -> int:
        with self._lock:
            return self._node.hard_state().commit

    @property
    def ticker(self) -> TickSource:
        """What drives this replica's ticks (the server's, or its own)."""
        return self._ticker

    def all_replicated(self) -> int:
        """Every voter holds every entry up to this index: how far log GC may go."""
        with self._lock:
            return self._node.raft.all_replicated

    def voters_behind(self, index: int) -> list[str]:
        """On the leader, the voters known to hold less than entry ``index``; [] on any
        other replica, which does not know (for the log: who will need a tablet copy)."""
        with self._lock:
            st = self._node.status()
        return sorted(
            v for v, (match, _, _) in st.progress.items() if v in st.voters and match < index
        )

    def failed(self) -> bool:
        """Whether the log failed (set by the durability thread at any time)."""
        return self._failure is not None

    def log_failure(self) -> BaseException | None:
        """What failed the log (None: it works); lock-free."""
        return self._failure

    def failure_reason(self) -> str | None:
        """Why this replica is failed (its log, else its applier), or None; lock-free."""
        log_failure, apply_failure = self._failure, self._apply_failure
        if log_failure is not None:
            return f"the log failed: {describe_error(log_failure)}"
        if apply_failure is not None:
            return f"applying committed entries failed: {describe_error(apply_failure)}"
        return None

    def apply_failed(self, error: BaseException) -> None:
        """The tablet's applier cannot apply committed entries (its store failed): give up
        leadership at once (to a caught-up follower if there is one) and stop campaigning
        and stepping peers' messages until ``apply_recovered``."""
        with self._lock:
            if self._apply_failure is not None:
                return
            self._apply_failure = error
            self._node.set_promotable(False)
            if self._failure is None and not self._stopping.is_set():
                self._process_ready_unlocked()
            self._finish_reads_unlocked()
            self._published_status = self._status_unlocked()

    def log_failed(self, error: BaseException) -> None:
        """The log failed outside an append (``Log.check_present`` found its files gone):
        fail as a failed append does -- leadership handed over, nothing more appended --
        rather than at the next write, which a quiet tablet may not get for a long time."""
        with self._lock:
            failed = self._fail_unlocked(error)
        if failed:
            self._report_log_failure(None)

    def apply_recovered(self) -> None:
        """The applier works again and has applied everything it was given: take part in
        the group again (the leader catches this replica up)."""
        with self._lock:
            if self._apply_failure is None:
                return
            self._apply_failure = None
            if self._failure is None and not self._log_stalled_s:
                self._node.set_promotable(True)
            self._published_status = self._status_unlocked()

    def _finish_reads_unlocked(self) -> None:
        for waiter in self._reads.values():  # their answers will not come now
            waiter.finish(0, ok=False)
        self._reads.clear()

    def status(self) -> dict[str, object]:
        """The replica's Raft state, exact: takes the consensus lock (for RPCs and tests;
        status pages use ``published_status``)."""
        with self._lock:
            return self._status_unlocked()

    def published_status(self) -> dict[str, object]:
        """``status()`` without the lock: term, role and leader from the published snapshot,
        the commit index as of the last Ready, the rest (vote, applied and last index,
        peers' progress) as of the last publication, at most a second or so old."""
        snap = self._snapshot
        st = dict(self._published_status)
        st.update(
            term=snap.term,
            role=snap.role.value,
            leader=snap.leader_id,
            leader_ready=snap.leader_ready,
            commit_index=self._commit_seen,
        )
        return st

    def _status_unlocked(self) -> dict[str, object]:
        st = self._node.status()
        return {
            "term": st.hard_state.term,
            "role": st.soft_state.role.value,
            "leader": st.soft_state.leader_id,
            "leader_ready": st.soft_state.leader_ready,
            "voted_for": st.hard_state.vote,
            "commit_index": st.hard_state.commit,
            "applied_index": st.applied,
            "last_index": st.last_index,
            "first_index": st.first_index,
            "all_replicated": st.all_replicated,
            "leader_commit": st.leader_commit,
            # Whose word leader_commit is: a status published before this replica heard
            # its leader says nothing of how far behind that leader it is.
            "leader_commit_of": st.soft_state.leader_id,
            "voters": list(st.voters),
            "learners": list(st.learners),
            "config_index": st.config_index,
            "progress": {p: {"match": m, "next": n} for p, (m, n, _) in st.progress.items()},
            "leader_read_mode": self.options.leader_read_mode.value,
            "lease_reads": self.metrics.lease_reads.value(),
            "read_index_reads": self.metrics.read_index_reads.value(),
            "stalls": self.metrics.stalls.value(),
        }

    # --- carrying out Readies ---------------------------------------------------------------

    def _process_ready_unlocked(
        self, answer_to: str | None = None, reply: Reply | None = None
    ) -> Message | object:
        """Carry out every pending Ready.  Caller holds ``_lock``.

        With ``answer_to``, the first answer addressed to that peer is taken out of the
        Ready: if it must wait for the WAL it is handed to ``reply`` once durable and this
        returns ``_HELD``; if it may leave now it is returned, for the caller to answer
        outside the lock; ``_NO_ANSWER`` if the core answered nothing."""
        answer: Message | None = None
        node = self._node
        unreadable = node.take_read_failure()  # entries to send a peer
        if unreadable is not None:
            return self._log_unreadable_unlocked(unreadable)
        while node.has_ready():
            try:
                rd = node.ready()
            except EntriesUnreadable as e:  # committed entries to apply, read back
                return self._log_unreadable_unlocked(e)
            # The commit first: a reader that sees the leader ready (its term's first entry
            # committed) then sees a commit index at least that far.
            if rd.hard_state is not None:
                self._commit_seen = rd.hard_state.commit
            if rd.soft_state_changed:
                self._publish_unlocked(rd.soft_state)
            if self._lease_mode:
                self._lease_ready_unlocked(rd)  # before this ready's heartbeats leave
            hard = rd.hard_state
            conf = rd.conf_state
            if conf is not None or (
                hard is not None and (hard.term, hard.vote) != self._saved_vote
            ):
                # Only term and vote must be durable before what depends on them; entries are
                # made durable by the WAL, and the commit index rides along with these saves
                # and a clean stop only (a restart learns it again from the leader), as far
                # as the WAL has made durable (``savable``).  Saving on every append that
                # also moved the commit index cost a follower two fsyncs and a rename per
                # write.  A new membership is saved before its entry goes to the WAL (see
                # Config).
                saving = None if hard is None else node.savable(hard)
                try:
                    if conf is not None:
                        self._storage.save_conf_state(conf, saving)
                    else:
                        assert saving is not None
                        self._storage.save_hard_state(saving)
                except OSError as e:
                    # The core has moved to a term or vote that is not durable: nothing of
                    # this ready may leave.  Like a failed WAL write, it fails the replica
                    # until it is reopened (the old metadata file is intact: replaced only
                    # by rename).
                    if self._fail_unlocked(e):
                        self._inbox.post(_REPORT_FAILURE)
                    return _NO_ANSWER
                if saving is not None:
                    self._saved_vote = (saving.term, saving.vote)
                    self._saved_commit = saving.commit
                if conf is not None and conf.membership != self._membership:
                    self._membership = conf.membership
                    if self._on_membership is not None:
                        self._on_membership(conf.membership)
            for m in rd.messages:
                self._send_unlocked(m)
            later: list[Message] = []
            held_here = False
            for m in rd.persisted_messages:
                # The core holds back every response until the Ready is durable.  The hard
                # state was saved above, synchronously, so only an append response -- which
                # acknowledges log entries, perhaps still in the WAL's queue -- must wait
                # for the WAL; a vote or heartbeat response may leave now.
                needs_log = m.type is MessageType.APPEND_RESPONSE
                if (
                    answer is None
                    and answer_to is not None
                    and m.dst == answer_to
                    and (m.type in _RESPONSES)
                ):
                    answer, held_here = m, needs_log
                elif needs_log:
                    later.append(m)
                else:
                    self._send_unlocked(m)
            if rd.entries or later or held_here:
                held = answer if held_here else None
                self._storage.append_async(
                    rd.entries,
                    self._durable_callback(rd, later, held, reply if held_here else None),
                )
            if rd.committed_entries:
                self._apply_committed(rd.committed_entries)
            for read in rd.read_states:
                waiter = self._reads.pop(read.token, None)
                if waiter is not None:
                    waiter.finish(read.index, ok=read.ok)
        if answer is None:
            return _NO_ANSWER
        return _HELD if held_here else answer

    def _lease_ready_unlocked(self, rd: Ready) -> None:
        """Note the send time of a new read round in ``rd`` (its heartbeats have not left
        yet), and extend the lease by a round a majority has acknowledged."""
        soft = rd.soft_state
        eligible = soft.role is Role.LEADER and not soft.transferring
        if not eligible or soft.term != self._lease_term:
            # A new leadership (or none): nothing sent before counts.
            self._lease_until = 0.0
            self._round_times.clear()
            self._lease_term = soft.term if eligible else -1
        if eligible and rd.read_round > self._round_seen:
            self._round_times.append((rd.read_round, self._clock(), self._ticker.stalls))
        self._round_seen = rd.read_round
        sent: tuple[int, float, int] | None = None
        while self._round_times and self._round_times[0][0] <= rd.read_round_confirmed:
            sent = self._round_times.popleft()
        if sent is not None and sent[2] == self._ticker.stalls:
            until = sent[1] + self._lease_duration_s
            if until > self._lease_until or self._lease_stalls != sent[2]:
                self._lease_until, self._lease_stalls = until, sent[2]

    def _durable_callback(
        self, rd: Ready, later: list[Message], answer: Message | None, reply: Reply | None
    ) -> Callable[[BaseException | None], None]:
        # Runs on the WAL's appender thread: never wait for the consensus lock.
        def callback(error: BaseException | None) -> None:
            self._inbox.run_or_post(
                _Durable(rd, later, answer, reply, error), self._try_handle_inline
            )

        return callback

    def _publish_unlocked(self, soft: SoftState) -> None:
        old = self._snapshot
        snapshot = ConsensusSnapshot.of(soft)
        if soft.leader_id != old.leader_id or soft.term != old.term:
            self._last_election = time.time()
        last_leader = self._last_leader
        if soft.leader_id:
            self._last_leader = soft.leader_id
        # One attribute assignment: readers see the old snapshot or the new, never a mix.
        self._snapshot = snapshot
        if snapshot.role is Role.LEADER and (old.role is not Role.LEADER or old.term != soft.term):
            self.metrics.leader_elections.increment()
            logger.info("%s: %s leads term %d", self.group_id, self.node_id, soft.term)
        elif old.role is Role.LEADER and snapshot.role is not Role.LEADER:
            # A leader that stops leading says so: its log otherwise ends at "leads term N"
            # while others lead.
            logger.info(
                "%s: %s no longer leads (was leader of term %d; now %s in term %d, leader %s)",
                self.group_id,
                self.node_id,
                old.term,
                snapshot.role.name.lower(),
                soft.term,
                soft.leader_id or "unknown",
            )
        elif soft.leader_id and last_leader and soft.leader_id != last_leader:
            # A replica that knew a leader learns of another (an election between them, and
            # its first leader since it opened, are not worth a line per tablet).
            logger.info(
                "%s: leader of term %d is %s (was %s)",
                self.group_id,
                soft.term,
                soft.leader_id,
                last_leader,
            )

    def _save_commit_unlocked(self) -> None:
        """At a clean stop, the commit index reached, so that the replica reopens knowing
        it.  Otherwise consensus-meta is written only when term or vote change: a commit
        index is advisory on restart (the store's applied index is a floor, the leader's
        next append or heartbeat brings the rest), and saving it every 20 ticks meant two
        fsyncs and a rename under the consensus lock, on whichever thread stepped the tick
        -- a peer link's reader, holding up every tablet behind it (docs/benchmarks.md,
        "Consensus-meta only for term and vote")."""
        hard = self._node.savable(self._node.hard_state())  # the WAL may not have caught up
        if hard.commit > self._saved_commit and self._failure is None and not self._apply_failure:
            try:
                self._storage.save_hard_state(hard)
                self._saved_commit = hard.commit
                self._saved_vote = (hard.term, hard.vote)
            except OSError as e:
                # Not a failure of the replica: the commit index is advisory.
                logger.warning("%s: saving the commit index failed: %s", self.group_id, e)

    # --- threads ------------------------------------------------------------------------------

    def _handle_inputs(self, batch: list[object]) -> None:
        """The replica's worker: ticks, durability reports and peers' answers, in arrival
        order, everything already posted stepped under one lock acquisition."""
        with self._lock:
            replies = self._step_inputs_unlocked(batch)
        self._send_replies(replies)

    def _try_handle_inline(self, batch: list[object]) -> bool:
        """``_handle_inputs`` on the WAL's appender thread, if the lock is free: the
        durability report is stepped where it happened, with no worker to wake.  Never
        waits for the lock -- its holder may be waiting for this very appender."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            replies = self._step_inputs_unlocked(batch)
        finally:
            self._lock.release()
        self._send_replies(replies)
        return True

    def _step_inputs_unlocked(self, batch: list[object]) -> list[tuple[Reply, Message | None]]:
        replies: list[tuple[Reply, Message | None]] = []
        for done in batch:
            if done is _REPORT_FAILURE:
                replies.append((self._report_log_failure, None))
                continue
            if done is _TICK:
                self._tick_queued = False
                self._step_ticks_unlocked()
                continue
            if isinstance(done, _Stall):
                if self._healthy():
                    self._step_ticks_unlocked()
                    self._node.on_stall(done.ticks)
                continue
            if isinstance(done, Message):  # a peer's answer
                if self._healthy():
                    self._step_ticks_unlocked()
                    self._node.step(done)
                continue
            assert isinstance(done, _Durable)
            if done.error is not None:
                if self._fail_unlocked(done.error) and self._on_log_failed is not None:
                    replies.append((self._report_log_failure, None))
            elif self._failure is None:
                self._node.on_persisted(done.ready)
                for m in done.later:
                    self._send_unlocked(m)
            if done.reply is not None:
                ok = done.error is None and self._failure is None
                replies.append((done.reply, done.answer if ok else None))
        if self._failure is None:
            self._process_ready_unlocked()
        return replies

    def _healthy(self) -> bool:
        return self._failure is None and self._apply_failure is None and not self._stopping.is_set()

    def _send_replies(self, replies: list[tuple[Reply, Message | None]]) -> None:
        for reply, answer in replies:  # outside the lock: a reply may do I/O
            try:
                reply(answer)
            except Exception:
                logger.exception("%s: answering a peer failed", self.group_id)

    def _report_log_failure(self, _: Message | None) -> None:
        # Queued as a "reply" so that it runs once the lock is released.
        reason = self.failure_reason()
        if self._on_log_failed is not None and reason is not None:
            self._on_log_failed(reason)

    def _log_unreadable_unlocked(self, error: EntriesUnreadable) -> object:
        """The log holds entries it cannot read: failed, as a log found damaged at open is
        -- leadership handed over, repaired by a copy -- unless the read may work when tried
        again. Nothing of what this step made leaves now (its proposals are indeterminate,
        not failed). ``_NO_ANSWER``, for ``_process_ready_unlocked`` to return."""
        if not error.transient and self._fail_unlocked(error):
            self._inbox.post(_REPORT_FAILURE)
        return _NO_ANSWER

    def _fail_unlocked(self, error: BaseException) -> bool:
        """Fail the replica for good; True if this call did."""
        if self._failure is not None:
            return False
        logger.error(
            "%s: the log failed, the replica stops until it is reopened: %r", self.group_id, error
        )
        # Published before the failure is: whoever sees the failure (``failure_reason`` is
        # lock-free) sees this replica no longer leading.
        self._snapshot = ConsensusSnapshot(
            self._snapshot.term, Role.FOLLOWER, NO_NODE, False, False
        )
        self._failure = error
        # Hand leadership over if a follower holds our whole log, else just step down.  Only
        # the messages of what follows are carried out: nothing can be made durable now,
        # and a step-down in our own term changes nothing that would have to be.
        self._node.set_promotable(False)
        with contextlib.suppress(EntriesUnreadable):  # what could be said has been
            while self._node.has_ready():
                for m in self._node.ready().messages:
                    self._send_unlocked(m)
        self._finish_reads_unlocked()
        self._published_status = self._status_unlocked()
        return True

    def _tick_unlocked(self) -> None:
        if self._failure is not None or self._stopping.is_set():
            return
        self._ticks += 1
        if self.options.log_stall_s:
            self._check_log_stall_unlocked()
        self._node.tick()
        if self._ticks % _STATUS_PUBLISH_TICKS == 1:
            self._published_status = self._status_unlocked()

    def _check_log_stall_unlocked(self) -> None:
        """A leader whose disk hangs keeps its followers' heartbeats coming (they need no
        disk) while it can commit nothing: its tablet took no write for the three minutes a
        reviewer froze the filesystem.  So a log write not durable after ``log_stall_s``
        makes the replica not promotable -- a leader hands over to a caught-up follower
        and steps down, nobody here campaigns (a campaign must save its term, to that same
        disk) -- until the log writes again."""
        stalled = self._storage.log.stalled_for()
        limit = self.options.log_stall_s
        if self._log_stalled_s:
            if stalled >= limit:
                self._log_stalled_s = max(self._log_stalled_s, stalled)
            else:
                logger.warning(
                    "%s: the log writes again (a write waited %.1f s or more); the "
                    "replica may lead again",
                    self.group_id,
                    self._log_stalled_s,
                )
                self._log_stalled_s = 0.0
                if self._apply_failure is None:
                    self._node.set_promotable(True)
                self._published_status = self._status_unlocked()
            return
        if stalled < limit:
            return
        self._log_stalled_s = stalled
        leading = self._snapshot.role is Role.LEADER
        logger.warning(
            "%s: a write to the log has not become durable for %.1f s (a hung or failing "
            "disk?); %s, and it will not campaign until the log writes again",
            self.group_id,
            stalled,
            "giving up leadership so a replica with a working disk can lead"
            if leading
            else "this replica will not lead",
        )
        self._node.set_promotable(False)
        self._published_status = self._status_unlocked()


def out_of_space(error: BaseException) -> bool:
    """Whether ``error`` (or what it wraps, by ``__cause__`` or ``__context__``) is a disk
    out of space or quota: ENOSPC, EDQUOT, or SQLite's SQLITE_FULL."""
    seen: BaseException | None = error
    for _ in range(8):  # a short chain: never a cycle's worth
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if getattr(seen, "sqlite_errorname", None) == "SQLITE_FULL":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def describe_error(error: BaseException) -> str:
    """An error as an operator reads it: with the errno name of the OSError behind it (a
    wrapper's ``__cause__``), e.g. ``ENOSPC``."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__
    text = str(error) or type(error).__name__
    sqlite_name = _sqlite_error_name(error)
    if sqlite_name and sqlite_name not in text:
        text = f"{sqlite_name}: {text}"
    if isinstance(cause, OSError) and cause.errno is not None:
        name = errno.errorcode.get(cause.errno, str(cause.errno))
        if cause is not error and str(cause) not in text:
            text = f"{text} ({cause})"
        if name not in text:
            text = f"{name}: {text}"
    return text


def _sqlite_error_name(error: BaseException) -> str:
    """The SQLite result code's name (``SQLITE_FULL``...) behind ``error``, if any."""
    cause: BaseException | None = error
    while cause is not None:
        name = getattr(cause, "sqlite_errorname", None)
        if isinstance(name, str):
            return name
        cause = cause.__cause__
    return ""
