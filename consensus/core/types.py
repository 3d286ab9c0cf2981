"""Values that flow in and out of the Raft core.

Every value here is immutable (a frozen dataclass, or for ``Entry`` a named tuple): the
core hands them to the driver and the driver may pass them to other threads (the
transports' connection threads, the log appender) without copying. Indexes start at 1;
index 0 / term 0 is the empty log's sentinel.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from raftlet.consensus.core.membership import ConfState

__all__ = [
    "MAX_INDEX",
    "MAX_TERM",
    "MAX_TERM_LEAP",
    "NO_NODE",
    "Entry",
    "EntryType",
    "HardState",
    "Message",
    "MessageType",
    "ReadState",
    "Ready",
    "Role",
    "SoftState",
]

# The empty node id: "voted for nobody" / "no known leader".
NO_NODE = ""

# The largest term and index anything may carry: int63, so every value fits a signed 64-bit
# integer wherever it is stored or printed, and ``MAX_TERM + 1`` is never needed on the wire
# (a node at MAX_TERM cannot campaign: it stays where it is rather than send a term that
# does not fit).  A peer's message beyond either is malformed (``Raft.step`` drops it; the
# wire codec refuses it before it gets there).
MAX_TERM = (1 << 63) - 1
MAX_INDEX = (1 << 63) - 1
# The furthest a message's term may lie beyond the receiver's own.  Terms grow by one per
# election; 2**32 elections (one a millisecond, without a pause, for seven weeks) is more than
# any honest replica can fall behind by, so a leap beyond it is nonsense -- typically a forged
# or corrupt term meant to use up the term space in one message -- and the message is dropped.
MAX_TERM_LEAP = 1 << 32


class Role(enum.Enum):
    FOLLOWER = "FOLLOWER"
    PRE_CANDIDATE = "PRE_CANDIDATE"
    CANDIDATE = "CANDIDATE"
    LEADER = "LEADER"


class EntryType(enum.Enum):
    NORMAL = "NORMAL"
    # Appended by every new leader (paper §5.4.2, §8): committing it commits
    # every earlier entry and lets the leader serve writes ("leader ready").
    NO_OP = "NO_OP"
    # A new membership (``membership.Membership.encode``): every node uses the latest one in
    # its log, committed or not (thesis §4.1).
    CONFIG = "CONFIG"


class Entry(NamedTuple):
    """One log entry.  A named tuple rather than a frozen dataclass because it is the
    object made most often (every proposal, every entry read back or received): building
    one costs ~0.5 us against ~1.3 us for the dataclass, whose frozen ``__init__`` goes
    through ``object.__setattr__`` per field."""

    term: int
    # Shadows tuple.index(), which nothing calls on an entry.
    index: int  # type: ignore[assignment]
    type: EntryType = EntryType.NORMAL
    data: bytes = b""

    def size(self) -> int:
        """Approximate wire size, used for the per-message byte cap."""
        return len(self.data) + 24


class MessageType(enum.Enum):
    APPEND = "APPEND"
    APPEND_RESPONSE = "APPEND_RESPONSE"
    HEARTBEAT = "HEARTBEAT"
    HEARTBEAT_RESPONSE = "HEARTBEAT_RESPONSE"
    VOTE = "VOTE"
    VOTE_RESPONSE = "VOTE_RESPONSE"
    PRE_VOTE = "PRE_VOTE"
    PRE_VOTE_RESPONSE = "PRE_VOTE_RESPONSE"
    # Leadership transfer: the leader tells the chosen follower to campaign now.
    TIMEOUT_NOW = "TIMEOUT_NOW"
    # The leader cannot catch a follower up from its log (log GC discarded what it needs):
    # the follower needs a copy of the leader's state at ``index`` or later (tablet copy).
    # Addressed to the follower, but carried out by the leader's driver, which copies the
    # state and reports the outcome with ``report_snapshot``; no core receives it.
    SNAPSHOT = "SNAPSHOT"


@dataclass(frozen=True, slots=True)
class Message:
    """One Raft message.  Field meaning depends on ``type``:

    - APPEND: ``index``/``log_term`` are the previous entry (prevLogIndex/Term),
      ``entries`` follow it, ``commit`` is the leader's commit index.
    - APPEND_RESPONSE: accepted → ``index`` is the last index now matching the
      leader.  Rejected → ``index`` echoes the APPEND's prev index, ``reject_hint``
      is the follower's guess of the last index that may match and ``log_term`` the
      term of its entry there (fast backtracking, §5.3 "optimization").
    - HEARTBEAT: ``commit`` is min(leader commit, follower's match index); ``context``
      the leader's latest read round (ReadIndex), which the response echoes.
    - HEARTBEAT: ``leader_commit`` is the leader's commit index itself (``commit`` is
      capped at the follower's match): a follower whose log ends below it is catching up.
    - APPEND / HEARTBEAT: ``all_replicated`` is an index every voter holds every entry up
      to (the leader's minimum match, Kudu's all_replicated_index): below it a replica may
      discard its log (log GC), as nobody will ever need those entries from it.
    - APPEND / HEARTBEAT: ``transferee`` is the voter the leader is handing leadership to
      (NO_NODE: none).  A follower that heard it from its leader honours that voter's
      ``transfer`` vote -- and its first message as the next term's leader -- despite the
      leader lease; nothing else vouches for a transfer.
    - SNAPSHOT: ``index`` is the least index the copy must hold (the leader's first log
      index: the next APPEND's previous entry, whose term the copy then supplies; the
      entries after it are sent from the log).
    - VOTE / PRE_VOTE: ``index``/``log_term`` are the candidate's last entry.
      A PRE_VOTE's ``term`` is the term the candidate *would* campaign in.
    - *_RESPONSE: ``reject`` says whether the request was refused.
    """

    type: MessageType
    src: str
    dst: str
    term: int
    log_term: int = 0
    index: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    # VOTE sent because the leader asked (TIMEOUT_NOW): voters must not ignore it
    # for having heard from a leader recently (the check-quorum "lease").
    transfer: bool = False
    # HEARTBEAT / HEARTBEAT_RESPONSE: the read round being confirmed (0: none).
    context: int = 0
    # APPEND / HEARTBEAT: the leader's transfer target, announced to every follower.
    transferee: str = NO_NODE
    # APPEND / HEARTBEAT: every voter holds every entry up to this index (log GC's bound).
    all_replicated: int = 0
    # HEARTBEAT: sent by the heartbeat timer with no read or transfer waiting on it, so a
    # transport may hold it a moment to send it with other tablets' (never on the wire).
    routine: bool = False
    # HEARTBEAT: the leader's commit index, uncapped (readiness: is this follower behind?).
    leader_commit: int = 0


@dataclass(frozen=True, slots=True)
class ReadState:
    """The outcome of a ``read_index`` request ``token``: ``ok`` with ``index``, the commit
    index a quorum confirmed this leader still held after the request arrived -- a read
    served once ``index`` is applied is linearizable; or not ``ok`` (leadership lost)."""

    token: int
    index: int
    ok: bool = True


@dataclass(frozen=True, slots=True)
class HardState:
    """State that must be durable before dependent messages leave (Figure 2)."""

    term: int = 0
    vote: str = NO_NODE
    commit: int = 0


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state the driver publishes (e.g. as its lock-free snapshot)."""

    role: Role = Role.FOLLOWER
    term: int = 0
    leader_id: str = NO_NODE
    # True once this leader's NO_OP of ``term`` is committed: its commit index is
    # then current (thesis §6.4), so it may serve reads and accept writes.
    # Always False off-leader.
    leader_ready: bool = False
    # True while a leadership transfer is in progress: proposals are refused.
    transferring: bool = False


@dataclass(frozen=True, slots=True)
class Ready:
    """Everything the driver must do, gathered since the previous ``ready()``.

    Ordering rules (the driver must keep them):
    1. Persist ``hard_state`` and ``conf_state`` (if not None), then append ``entries`` durably, in
       the order readies were handed out.  ``entries[0].index`` may be at or
       below an index handed out before: the log's suffix from there is replaced.
    2. ``messages`` may be sent at once, even before step 1 completes (the
       leader's appends and heartbeats, thesis §10.2.1).
    3. ``persisted_messages`` may only be sent once step 1 is durable for this
       and every earlier ready (votes, append acknowledgements) -- also when this
       ready itself persists nothing: it must queue behind earlier writes still
       in flight.
    Every input (``step``, ``tick``, ``propose``, ``campaign``, a transfer) may
    produce output; take a ready after each, not only after ticks.
    4. Apply ``committed_entries`` in order; they are durable locally already.
    5. Tell the core: ``on_persisted(ready)`` after step 1, ``on_applied(index)``
       after step 4 (``advance(ready)`` does both, for synchronous drivers).
    """

    soft_state: SoftState
    hard_state: HardState | None = None
    entries: tuple[Entry, ...] = ()
    messages: tuple[Message, ...] = ()
    persisted_messages: tuple[Message, ...] = ()
    committed_entries: tuple[Entry, ...] = ()
    # True when term or vote changed or entries are appended: an fsync is needed
    # before persisted_messages go out.  A commit-only change need not be synced.
    must_sync: bool = False
    # Outcomes of read_index requests, in the order they were made.
    read_states: tuple[ReadState, ...] = ()
    # The latest read round whose heartbeats were created (in this ready's ``messages`` if it
    # grew since the last ready), and the highest round a majority acknowledged in this
    # leadership (0s off-leader before any round).  A driver that notes the time before a
    # round's heartbeats leave may hold a lease from when a quorum confirmed it.
    read_round: int = 0
    read_round_confirmed: int = 0
    # The soft state (role, leader, lease) changed since the last ready; ``is_empty`` says
    # whether anything at all is in it.
    soft_state_changed: bool = field(default=False)
    # The membership changed (a CONFIG entry appended, truncated or committed): persist it
    # with ``hard_state``, before ``entries``, so a restart never uses an older membership
    # than the log it finds (see ``Config.config_index``).
    conf_state: ConfState | None = None

    def is_empty(self) -> bool:
        return not (
            self.hard_state is not None
            or self.entries
            or self.messages
            or self.persisted_messages
            or self.committed_entries
            or self.soft_state_changed
            or self.conf_state is not None
        )
