"""RawNode: the driver-facing API of the core (etcd's RawNode).

A driver loops: feed inputs (``tick``, ``step``, ``propose``, ``campaign``), take a
``Ready`` when ``has_ready()``, carry it out in the order its docstring gives, then
acknowledge with ``on_persisted`` / ``on_applied`` (or ``advance``).  Readies may be
pipelined: a new one can be taken before the previous one is persisted, as long
as persistence happens, and is acknowledged, in the order they were taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from raftlet.consensus.core.config import Config
from raftlet.consensus.core.membership import ConfigChange, ConfState, Membership
from raftlet.consensus.core.progress import ProgressState
from raftlet.consensus.core.raft import Raft
from raftlet.consensus.core.storage import EntriesUnreadable, Storage
from raftlet.consensus.core.types import (
    Entry,
    HardState,
    Message,
    MessageType,
    Ready,
    Role,
    SoftState,
)

__all__ = ["RawNode", "Status"]

# Only the leader's outbound replication may leave before local persistence
# (thesis §10.2.1); anything else speaks for a term, vote or log we must not
# forget after a crash.
# A tuple, not a set: an enum member's hash is Python code, while `in` on a tuple
# compares identity first, in C.
_SEND_NOW = (
    MessageType.APPEND,
    MessageType.HEARTBEAT,
    MessageType.TIMEOUT_NOW,
    MessageType.SNAPSHOT,
)


@dataclass(frozen=True, slots=True)
class Status:
    id: str
    hard_state: HardState
    soft_state: SoftState
    applied: int
    last_index: int
    # follower id -> (match, next, state); empty unless leader
    progress: dict[str, tuple[int, int, ProgressState]]
    # Every voter holds every entry up to here: log GC may discard entries below it.
    all_replicated: int = 0
    first_index: int = 1
    # The membership in use and the index of its entry (0: the initial one).
    voters: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()
    config_index: int = 0
    # A follower's: the leader's commit index as its leader last said it (0: not heard).
    leader_commit: int = 0


class RawNode:
    def __init__(self, config: Config, storage: Storage) -> None:
        self.raft = Raft(config, storage)
        self._prev_hard = self.raft.hard_state()
        self._prev_soft = self.raft.soft_state()
        self._prev_confirmed = self.raft.read_round_confirmed
        self._prev_conf = self.raft.conf_state()

    # --- inputs --------------------------------------------------------------------

    def tick(self) -> None:
        self.raft.tick()

    def step(self, message: Message) -> None:
        self.raft.step(message)

    def campaign(self) -> None:
        self.raft.campaign()

    def propose(self, data: bytes, expected_term: int | None = None) -> Entry:
        return self.raft.propose([data], expected_term)[0]

    def propose_batch(
        self, datas: Sequence[bytes], expected_term: int | None = None
    ) -> list[Entry]:
        if not datas:
            return []
        return self.raft.propose(datas, expected_term)

    def transfer_leadership(self, target: str) -> None:
        self.raft.transfer_leadership(target)

    def answering_successor(self, heard_within: int) -> str:
        """See ``Raft.answering_successor``."""
        return self.raft.answering_successor(heard_within)

    def answered_within(self, voter: str, heard_within: int) -> bool:
        """See ``Raft.answered_within``."""
        return self.raft.answered_within(voter, heard_within)

    def take_read_failure(self) -> EntriesUnreadable | None:
        """The first read of the log that failed since the last call (None: none): the
        driver fails the replica on it."""
        failure, self.raft.read_failure = self.raft.read_failure, None
        return failure

    def set_promotable(self, promotable: bool) -> None:
        """Whether this node may campaign and lead (see ``Raft.set_promotable``): the
        driver's verdict on its replica's health, an input like any other."""
        self.raft.set_promotable(promotable)

    def report_snapshot(self, peer: str, ok: bool, index: int = 0) -> None:
        """The copy a SNAPSHOT message asked for reached ``peer`` at ``index`` (``ok``), or
        failed (see ``Raft.report_snapshot``)."""
        self.raft.report_snapshot(peer, ok, index)

    def restore(self, index: int, term: int, config: tuple[int, Membership] | None = None) -> bool:
        """The driver replaced the storage with a copy of the state at (``index``,
        ``term``) and membership ``config``; see ``Raft.restore``."""
        return self.raft.restore(index, term, config)

    def propose_config_change(self, change: ConfigChange) -> Entry:
        """Append a membership change (see ``Raft.propose_config_change``)."""
        return self.raft.propose_config_change(change)

    def check_config_change(self, change: ConfigChange) -> Membership:
        """What ``propose_config_change`` would make or refuse, appending nothing."""
        return self.raft.check_config_change(change)

    def conf_state(self) -> ConfState:
        return self.raft.conf_state()

    def read_index(self, token: int) -> None:
        """Start a linearizable read; its ``ReadState`` comes in a later ready (see
        ``Raft.read_index``)."""
        self.raft.read_index(token)

    def on_stall(self, ticks: int) -> None:
        """The driver noticed that this process did not run for about ``ticks`` ticks (see
        ``Raft.on_stall``)."""
        self.raft.on_stall(ticks)

    # --- outputs ---------------------------------------------------------------------

    def soft_state(self) -> SoftState:
        return self.raft.soft_state()

    def hard_state(self) -> HardState:
        return self.raft.hard_state()

    def savable(self, hard: HardState) -> HardState:
        """``hard`` as a driver may write it ahead of the entries still on their way to the
        log: its commit index no further than the durable log that agrees with ours. A
        follower's commit covers entries of this very Ready; saved beside a term change
        before they were, a crash left a log whose entries at those indexes were another
        term's, never committed, and the restarted replica applied them as committed."""
        stable = self.raft.log.stable_index()
        return hard if hard.commit <= stable else replace(hard, commit=stable)

    def has_ready(self) -> bool:
        r = self.raft
        return (
            bool(r.msgs)
            or bool(r.read_states)
            or r.read_round_confirmed != self._prev_confirmed
            or r.log.has_unstable_to_persist()
            or r.log.has_committed_to_apply()
            or r.hard_state_differs(self._prev_hard)
            or r.soft_state_differs(self._prev_soft)
            or r.conf_state_differs(self._prev_conf)
        )

    def ready(self) -> Ready:
        """Everything pending since the last call, each item handed out once."""
        r = self.raft
        # What did not change is handed on as the object the last Ready had: building the
        # three states for every Ready was most of what a Ready cost.
        prev_hard, prev_soft, prev_conf = self._prev_hard, self._prev_soft, self._prev_conf
        hard_changed = r.hard_state_differs(prev_hard)
        hard = r.hard_state() if hard_changed else prev_hard
        soft_changed = r.soft_state_differs(prev_soft)
        soft = r.soft_state() if soft_changed else prev_soft
        conf = r.conf_state() if r.conf_state_differs(prev_conf) else prev_conf
        must_sync = hard.term != prev_hard.term or hard.vote != prev_hard.vote
        entries = tuple(r.log.unstable_to_persist())
        committed = tuple(r.log.committed_to_apply())
        now: list[Message] = []
        later: list[Message] = []
        for m in r.read_messages():
            (now if m.type in _SEND_NOW else later).append(m)
        read_states, r.read_states = tuple(r.read_states), []
        ready = Ready(
            soft_state=soft,
            hard_state=hard if hard_changed else None,
            entries=entries,
            messages=tuple(now),
            persisted_messages=tuple(later),
            committed_entries=committed,
            must_sync=must_sync or bool(entries),
            read_states=read_states,
            read_round=r.read_round,
            read_round_confirmed=r.read_round_confirmed,
            soft_state_changed=soft_changed,
            conf_state=conf if conf is not prev_conf and conf != prev_conf else None,
        )
        self._prev_hard = hard
        self._prev_soft = soft
        self._prev_confirmed = r.read_round_confirmed
        self._prev_conf = conf
        return ready

    def on_persisted(self, ready: Ready) -> None:
        """``ready.hard_state`` and ``ready.entries`` are durable."""
        if ready.entries:
            last = ready.entries[-1]
            self.raft.on_persisted(last.index, last.term)

    def on_applied(self, index: int) -> None:
        """The state machine applied every entry up to ``index``."""
        self.raft.log.applied_to(index)

    def applying_budget_spent(self) -> bool:
        """Whether committed entries wait for ``on_applied`` to free room under
        ``Config.max_applying_bytes`` (then ``on_applied`` may make a Ready)."""
        log = self.raft.log
        return bool(log.max_applying_bytes) and log.applying_bytes >= log.max_applying_bytes

    def advance(self, ready: Ready) -> None:
        """``ready`` is durable, and -- without ``Config.max_applying_bytes``, whose driver
        reports it with ``on_applied`` -- its committed entries applied."""
        self.on_persisted(ready)
        if ready.committed_entries and not self.raft.log.max_applying_bytes:
            self.on_applied(ready.committed_entries[-1].index)

    def status(self) -> Status:
        r = self.raft
        progress = (
            {v: (pr.match, pr.next, pr.state) for v, pr in r.prs.items() if v != r.id}
            if r.role is Role.LEADER
            else {}
        )
        return Status(
            id=r.id,
            hard_state=r.hard_state(),
            soft_state=r.soft_state(),
            applied=r.log.applied,
            last_index=r.log.last_index(),
            progress=progress,
            all_replicated=r.all_replicated,
            first_index=r.log.first_index(),
            voters=r.voters,
            learners=r.learners,
            config_index=r.conf_state().index,
            leader_commit=r.leader_commit,
        )
