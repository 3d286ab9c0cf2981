"""SimCluster: N RawNodes, each with a simulated driver, on a simulated network
and clock.  Every random choice (message fate, persistence latency, each node's
election-timeout seed, tick order) comes from one ``random.Random(seed)``, so a
seed and the same sequence of calls replay a run exactly.

The driver per node does what a real one must (see ``consensus.core.Ready``):
send ``messages`` at once; make ``hard_state`` + ``entries`` durable in ready
order, optionally after a random delay so several readies are in flight; only
then send ``persisted_messages`` and call ``on_persisted``; apply
``committed_entries`` and call ``on_applied``.  Durable means written into the
node's ``MemoryStorage`` or its flushed state machine (``SimNode.flushed``), which is all
that survives ``crash``.

Log GC, as the real server does it (tserver/log_gc.py): every ``gc_interval`` ticks a node
flushes its state machine (a restart resumes from there) and compacts its log below
``min(all_replicated, applied)``; with a ``retention`` cap K it compacts below
``applied - K`` even past all_replicated, so a lagging or restarted follower may need a
copy of the tablet: the driver carries out the core's SNAPSHOT messages (``tablet_copy.py``).
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from raftlet.consensus.core import (
    Config,
    ConfigChange,
    ConfState,
    Entry,
    EntryType,
    Membership,
    MemoryStorage,
    Message,
    MessageType,
    ProposalDropped,
    RawNode,
    Ready,
    Role,
    SoftState,
)
from tests.sim.invariants import InvariantChecker, InvariantViolation
from tests.sim.network import NetConfig, Network
from tests.sim.tablet_copy import CopyMsg, TabletCopy

__all__ = ["TICK_MS", "LivenessFailure", "SimCluster", "SimConfig", "SimNode"]

# Simulated milliseconds per tick: message and disk latencies are finer than ticks.
TICK_MS = 10


class LivenessFailure(AssertionError):
    """Something that should have happened within a bound did not."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    nodes: int = 3
    election_tick: int = 10
    heartbeat_tick: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    max_inflight_msgs: int = 256
    max_size_per_msg: int = 1 << 20
    broadcast_commit: bool = True
    net: NetConfig = field(default_factory=NetConfig)
    # Upper bound of the random latency of one write to "disk", in ms; 0 makes
    # persistence synchronous (the ready is durable before the next one is taken).
    persist_delay: int = 0
    # Ticks between log GC passes (0: never compact).
    gc_interval: int = 5
    # 0: GC keeps every entry some voter lacks.  K > 0: a retention cap, keeping only the
    # last K applied entries even if a voter lacks older ones (it then needs a copy).
    retention: int = 0
    # Tablet copy: bytes per chunk; ticks without a chunk before the follower asks for the
    # missing ones again; ticks without news before either side gives a session up.
    chunk_bytes: int = 64
    copy_retry: int = 3
    copy_timeout: int = 20
    # How many of the nodes (the first ones) form the group at the start; the others run
    # outside it until a membership change adds them.  None: all of them.
    voters: int | None = None


@dataclass(slots=True)
class SimNode:
    id: str
    storage: MemoryStorage = field(default_factory=MemoryStorage)
    raw: RawNode | None = None
    # Bumped by every crash and restart: lets late events of a dead incarnation be
    # recognised and ignored.
    incarnation: int = 0
    # The state machine: (index, term, data) of every applied entry, no-ops included.
    applied: list[tuple[int, int, bytes]] = field(default_factory=list)
    # The state machine as last flushed (durable): a restart starts from it, so log GC
    # may discard what it holds.  A copy of a leader's state is installed durably here too.
    flushed: tuple[tuple[int, int, bytes], ...] = ()
    # Readies handed out whose persistence has not completed, oldest first.
    pending: deque[Ready] = field(default_factory=deque)
    last_persist_due: int = 0
    # (min, max) ms of this node's disk writes, overriding SimConfig.persist_delay
    # (a slow disk on one node; it survives crashes, being the hardware's).
    disk_latency: tuple[int, int] | None = None
    # The membership last persisted (``Ready.conf_state``): a restart starts from it.
    conf: ConfState | None = None
    # The membership the core last reported (``Ready.conf_state``, or its conf_state() at
    # the start), persisted or not: what the checker compares with the node's log.
    conf_out: ConfState | None = None

    @property
    def alive(self) -> bool:
        return self.raw is not None

    def node(self) -> RawNode:
        if self.raw is None:
            raise RuntimeError(f"{self.id} is down")
        return self.raw


class SimCluster:
    def __init__(self, seed: int, config: SimConfig | None = None, replay: str = "") -> None:
        self.seed = seed
        self.config = config or SimConfig()
        self.rng = random.Random(seed)
        self.ids = tuple(f"n{i}" for i in range(1, self.config.nodes + 1))
        self.net = Network(self.ids, self.rng, self.config.net)
        self.checker = InvariantChecker(replay or f"(seed {seed})")
        self.now = 0
        self.ticks = 0
        self.crashes = 0
        self.compactions = 0
        self.nodes = {i: SimNode(i) for i in self.ids}
        self.copies = TabletCopy(self)
        # Persistence completions: (due ms, seq, node id, incarnation).
        self._disk: list[tuple[int, int, str, int]] = []
        self._seq = 0
        # Called with every message as it is delivered (tests count traffic with it).
        self.observers: list[Callable[[Message], None]] = []
        self.copy_observers: list[Callable[[CopyMsg], None]] = []
        for sn in self.nodes.values():
            self._start(sn)

    @property
    def replay(self) -> str:
        return self.checker.replay

    # --- node lifecycle -------------------------------------------------------------------

    def _start(self, sn: SimNode) -> None:
        c = self.config
        voters = self.ids[: c.voters] if c.voters is not None else self.ids
        learners: tuple[str, ...] = ()
        config_index = 0
        committed = None
        if sn.conf is not None:
            voters, learners = sn.conf.membership.voters, sn.conf.membership.learners
            config_index = sn.conf.index
            committed = (sn.conf.committed_index, sn.conf.committed)
        cfg = Config(
            id=sn.id,
            voters=voters,
            learners=learners,
            config_index=config_index,
            committed_config=committed,
            peers=frozenset(self.ids),
            election_tick=c.election_tick,
            heartbeat_tick=c.heartbeat_tick,
            pre_vote=c.pre_vote,
            check_quorum=c.check_quorum,
            max_inflight_msgs=c.max_inflight_msgs,
            max_size_per_msg=c.max_size_per_msg,
            broadcast_commit=c.broadcast_commit,
            # The flushed state machine: the log from there on is what a restart applies.
            applied=sn.flushed[-1][0] if sn.flushed else 0,
            seed=self.rng.getrandbits(32),
        )
        sn.incarnation += 1
        sn.raw = RawNode(cfg, sn.storage)
        sn.conf_out = sn.raw.conf_state()
        sn.applied = list(sn.flushed)
        self.checker.observe_config(
            sn.id, sn.incarnation, (config_index, cfg.membership()), committed
        )
        self._observe(sn)  # the restarted state, before it applies anything
        self.checker.observe_state(sn.id, sn.incarnation, sn.applied)
        self._after(sn)

    def crash(self, node: str) -> None:
        """Lose everything not yet durable: unpersisted readies, volatile state,
        the state machine, and messages in flight to or from the node."""
        sn = self.nodes[node]
        if not sn.alive:
            return
        sn.raw = None
        sn.incarnation += 1
        sn.pending.clear()
        sn.last_persist_due = 0
        sn.applied = []
        self.net.drop_node(node)
        self.checker.observe_crash(node)
        self.crashes += 1
        self.copies.on_crash(node)

    def restart(self, node: str) -> None:
        """A new RawNode from the durable storage, with an empty state machine."""
        sn = self.nodes[node]
        if not sn.alive:
            self._start(sn)

    # --- the clock ----------------------------------------------------------------------------

    def step(self, ticks: int = 1) -> None:
        """Advance ``ticks`` ticks: deliver what falls due and complete what is
        persisted within each tick, then tick every live node (in random order)."""
        for _ in range(ticks):
            end = self.now + TICK_MS
            self._run_events(end)
            self.now = end
            self.ticks += 1
            self.copies.tick()
            live = [sn for sn in self.nodes.values() if sn.raw is not None]
            self.rng.shuffle(live)
            for sn in live:
                sn.node().tick()
                self._after(sn)
            if self.config.gc_interval and self.ticks % self.config.gc_interval == 0:
                for sn in live:
                    if sn.raw is not None:
                        self._gc(sn)

    def run_until(self, predicate: Callable[[], bool], max_ticks: int, what: str = "") -> int:
        """Step until ``predicate()`` holds; returns the ticks it took.  Raises
        LivenessFailure (with the replay command) after ``max_ticks``."""
        for taken in range(max_ticks + 1):
            if predicate():
                return taken
            if taken < max_ticks:
                self.step()
        raise LivenessFailure(
            f"not reached within {max_ticks} ticks: {what or predicate}\n"
            f"  state: {self.describe()}\n  replay: {self.replay}"
        )

    def _run_events(self, end: int) -> None:
        """Deliver messages and complete disk writes due before ``end``, in time order."""
        while True:
            net_due = self.net.next_due()
            disk_due = self._disk[0][0] if self._disk else None
            if disk_due is not None and disk_due < end and (net_due is None or disk_due <= net_due):
                _, _, node, incarnation = heapq.heappop(self._disk)
                self.now = max(self.now, disk_due)
                sn = self.nodes[node]
                if sn.incarnation == incarnation and sn.raw is not None:
                    self._complete_persist(sn)
                    self._after(sn)
            elif net_due is not None and net_due < end:
                self.now = max(self.now, net_due)
                got = self.net.pop()
                if got is None:
                    continue
                msg = got[1]
                sn = self.nodes[msg.dst]
                if sn.raw is None:
                    continue
                if isinstance(msg, CopyMsg):
                    for copy_obs in self.copy_observers:
                        copy_obs(msg)
                    if sn.raw is not None:  # an observer may have crashed it
                        self.copies.deliver(msg)
                    continue
                assert isinstance(msg, Message)
                for obs in self.observers:
                    obs(msg)
                sn.raw.step(msg)
                self._after(sn)
            else:
                return

    # --- the driver ---------------------------------------------------------------------------

    def _after(self, sn: SimNode) -> None:
        """Carry out every pending ready, then check the invariants."""
        raw = sn.node()
        while raw.has_ready():
            self._handle_ready(sn, raw.ready())
        self.copies.check_leader(sn)
        self._observe(sn)

    def _observe(self, sn: SimNode) -> None:
        r = sn.node().raft
        self.checker.observe_node(
            sn.id,
            sn.incarnation,
            role=r.role,
            term=r.term,
            committed=r.log.committed,
            log=r.log.entries(r.log.first_index()),
            membership=Membership(r.voters, r.learners),
            conf=sn.conf_out,
        )

    def _gc(self, sn: SimNode) -> None:
        """Flush the state machine, then discard the log below what is still needed."""
        r = sn.node().raft
        applied = r.log.applied
        keep = min(r.all_replicated, applied)
        if self.config.retention:
            keep = max(keep, applied - self.config.retention)
        # Only the durable prefix is ever compacted: everything applied is durable
        # (the core applies nothing else) and flushed right here.
        if keep - 1 >= sn.storage.first_index():
            sn.flushed = tuple(sn.applied)
            sn.storage.compact(keep - 1)
            self.compactions += 1

    def _handle_ready(self, sn: SimNode, rd: Ready) -> None:
        raw = sn.node()
        if rd.conf_state is not None:
            sn.conf_out = rd.conf_state
        for m in rd.messages:
            if m.type is MessageType.SNAPSHOT:
                self.copies.start(sn, m.dst)  # the leader's driver copies the tablet
            else:
                self.net.send(m, self.now)
        if rd.hard_state is not None or rd.entries or rd.persisted_messages or rd.conf_state:
            lo, hi = sn.disk_latency or (0, self.config.persist_delay)
            if hi == 0 and not sn.pending:
                sn.pending.append(rd)
                self._complete_persist(sn)
            else:
                # Strictly in order: never due before the ready ahead of it.
                due = self.now + self.rng.randint(lo, hi)
                due = sn.last_persist_due = max(sn.last_persist_due, due)
                sn.pending.append(rd)
                self._seq += 1
                heapq.heappush(self._disk, (due, self._seq, sn.id, sn.incarnation))
        if rd.committed_entries:
            # Already durable locally (the core promises it), so applying them
            # need not wait for this ready's own persistence.
            for e in rd.committed_entries:
                sn.applied.append((e.index, e.term, e.data))
                self.checker.observe_applied(sn.id, sn.incarnation, e, raw.raft.term)
            raw.on_applied(rd.committed_entries[-1].index)

    def _complete_persist(self, sn: SimNode) -> None:
        rd = sn.pending.popleft()
        if rd.hard_state is not None:
            sn.storage.set_hard_state(rd.hard_state)
            self.checker.observe_persisted(sn.id, rd.hard_state)
        if rd.conf_state is not None:
            sn.conf = rd.conf_state
        if rd.entries:
            sn.storage.append(rd.entries)
        for m in rd.persisted_messages:
            self.net.send(m, self.now)
        sn.node().on_persisted(rd)

    # --- client side ------------------------------------------------------------------------

    def propose(self, node: str, *datas: bytes) -> Entry | None:
        """Propose at ``node`` (several datas: one batch); the last entry
        appended, or None if it refused (not leader, transferring...)."""
        sn = self.nodes[node]
        if sn.raw is None:
            return None
        try:
            entries = sn.raw.propose_batch(datas)
        except ProposalDropped:
            return None
        finally:
            self._after(sn)
        return entries[-1] if entries else None

    def propose_to_leader(self, *datas: bytes) -> Entry | None:
        """Propose at a node that believes it leads (a random one if several do)."""
        leaders = self.leaders()
        if not leaders:
            return None
        return self.propose(self.rng.choice(leaders), *datas)

    def change(self, node: str, change: ConfigChange) -> Entry | None:
        """Propose a membership change at ``node``; its entry, or None if refused."""
        sn = self.nodes[node]
        if sn.raw is None:
            return None
        try:
            return sn.raw.propose_config_change(change)
        except ProposalDropped:
            return None
        finally:
            self._after(sn)

    def members(self, node: str) -> tuple[str, ...]:
        """The voters and learners ``node`` uses now."""
        return self.nodes[node].node().raft.membership.members()

    def campaign(self, node: str) -> None:
        """Make ``node`` start an election now (scripted scenarios)."""
        sn = self.nodes[node]
        if sn.raw is not None:
            sn.raw.campaign()
            self._after(sn)

    def transfer(self, node: str, target: str) -> None:
        sn = self.nodes[node]
        if sn.raw is not None:
            sn.raw.transfer_leadership(target)
            self._after(sn)

    # --- observation -----------------------------------------------------------------------

    def live(self) -> list[str]:
        return [i for i, sn in self.nodes.items() if sn.alive]

    def soft(self, node: str) -> SoftState:
        return self.nodes[node].node().soft_state()

    def leaders(self) -> list[str]:
        return [i for i, sn in self.nodes.items() if sn.raw and sn.raw.raft.role is Role.LEADER]

    def leader(self, among: Iterable[str] | None = None) -> str | None:
        """The live leader of the highest term (within ``among`` if given)."""
        pool = set(among) if among is not None else None
        best: tuple[int, str] | None = None
        for i in self.leaders():
            t = self.term(i)
            if (pool is None or i in pool) and (best is None or t > best[0]):
                best = (t, i)
        return best[1] if best else None

    def stable_leader(self, among: Iterable[str] | None = None) -> str | None:
        """A leader in ``among`` (default: all live nodes) whose no-op is committed
        and whom every node of ``among`` follows in its term."""
        nodes = list(among) if among is not None else self.live()
        lead = self.leader(nodes)
        if lead is None or not self.soft(lead).leader_ready:
            return None
        term = self.term(lead)
        for i in nodes:
            sn = self.nodes[i]
            if sn.raw is None or sn.raw.raft.term != term or sn.raw.raft.lead != lead:
                return None
        return lead

    def term(self, node: str) -> int:
        return self.nodes[node].node().raft.term

    def log(self, node: str) -> list[Entry]:
        """The entries ``node`` still holds (log GC may have discarded a prefix)."""
        log = self.nodes[node].node().raft.log
        return log.entries(log.first_index())

    def committed(self, node: str) -> int:
        return self.nodes[node].node().raft.log.committed

    def applied_index(self, node: str) -> int:
        applied = self.nodes[node].applied
        return applied[-1][0] if applied else 0

    def applied_data(self, node: str) -> list[bytes]:
        """Data of the normal entries ``node`` applied, in order."""
        return [d for _, _, d in self.nodes[node].applied if d]

    def committed_data(self) -> list[bytes]:
        """Data of every normal entry known committed (applied anywhere)."""
        return [e.data for e in self.checker.committed if e.type is EntryType.NORMAL]

    def converged(self) -> bool:
        """All nodes up, one stable leader, and everyone applied all it committed."""
        if len(self.live()) != len(self.ids):
            return False
        lead = self.stable_leader()
        if lead is None:
            return False
        commit = self.committed(lead)
        return all(self.applied_index(i) == commit for i in self.ids)

    def elections(self) -> int:
        return len(self.checker.leaders)

    def describe(self) -> str:
        parts = []
        for i, sn in self.nodes.items():
            if sn.raw is None:
                parts.append(f"{i}: down")
                continue
            r = sn.raw.raft
            parts.append(
                f"{i}: {r.role.value.lower()} t{r.term} last={r.log.last_index()} "
                f"commit={r.log.committed} applied={self.applied_index(i)}"
            )
        cut = sorted("-".join(sorted(link)) for link in self.net.cut_links())
        cuts = f"; cut: {' '.join(cut)}" if cut else ""
        return f"tick {self.ticks}; " + "; ".join(parts) + cuts

    def assert_all_applied(self, datas: Iterable[bytes]) -> None:
        """Every node applied each of ``datas`` (a check for the end of a run)."""
        for i in self.ids:
            have = set(self.applied_data(i))
            missing = [d for d in datas if d not in have]
            if missing:
                raise InvariantViolation(
                    f"{i} never applied {len(missing)} committed entries, e.g. {missing[:3]}\n"
                    f"  state: {self.describe()}\n  replay: {self.replay}"
                )
