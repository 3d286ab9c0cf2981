"""The Raft state machine: roles, terms, elections and replication.

Rules this module keeps (paper §5, thesis §6 and §9.6, etcd-io/raft's design):
- All input arrives through ``tick()``, ``step()``, ``campaign()`` and ``propose()``;
  all output is appended to ``msgs`` or visible in the log and hard state.  No
  I/O, threads or clocks: time is a tick count, randomness one seeded generator.
- Terms only grow.  A message from a higher term makes us a follower of that term
  first (§5.1), except pre-votes, which never change anyone's term, and what the
  rules on peers' input below drop.
- A peer's input is trusted only as far as Raft lets an honest peer send it; the rest is
  dropped with no state change (``_implausible`` and ``step``): terms and indexes beyond
  int63 (``MAX_TERM``, ``MAX_INDEX``) or a term more than ``MAX_TERM_LEAP`` past ours; a
  TIMEOUT_NOW from anyone but the leader we follow in its term (never one that would raise
  our term); a second leader's APPEND or HEARTBEAT in a term whose leader we know; a
  HEARTBEAT that raises our term yet commits something (a new leader knows no follower's
  match before that follower answered it in its term).  Under the leader lease (check-quorum:
  we heard from our leader within the election timeout) a higher term is not adopted at all
  -- not from a vote request, not from a would-be leader's APPEND or HEARTBEAT -- unless
  the sender is the transferee our own leader announced (``Message.transferee``), one term
  up.  A transfer vote without that announcement is an ordinary vote.  A node at MAX_TERM
  never campaigns (there is no next term to ask for).
- A node the driver marks not promotable (``set_promotable(False)``: its replica failed,
  say) never campaigns -- not on its timeout, not on a TIMEOUT_NOW -- and gives up
  leadership at once: to a follower whose log matches its own, through TIMEOUT_NOW, if
  there is one, else by plain step-down.  Why it is not promotable is the driver's
  business: the core only takes the flag as an input.
- A follower that needs entries log GC discarded gets a copy of the state instead
  (etcd's MsgSnap): the leader emits SNAPSHOT and sends it nothing until the driver reports
  the copy (``report_snapshot``); a follower's driver that installed one calls ``restore``.
- One vote per term (§5.2), granted only to a log at least as up to date as ours
  (§5.4.1).  ``vote`` and ``term`` reach the hard state the driver persists
  before any vote or response leaves (see ``Ready``).
- A leader never overwrites its log, appends a NO_OP when elected, and commits
  only entries of its own term by counting replicas (§5.4.2, Figure 8).  It counts
  itself only for entries it has persisted (``on_persisted``).
- A read (``read_index``, thesis §6.4) is released at the commit index the leader held
  when it arrived, and only after a majority answered a heartbeat sent after that moment
  (heartbeats carry the latest read round; an answer confirms every read of its round or
  earlier); losing leadership fails the waiting reads.
- Reads batch their quorum rounds: at most one round started for reads is outstanding.  A
  read that arrives while one is takes the *next* round number, which is broadcast when
  the outstanding round is confirmed, or with the next heartbeat tick (so a lost round
  delays reads by a heartbeat, never forever).  A round's number is created after every
  read it confirms arrived, so no read is confirmed by a heartbeat sent before it.
- Membership (``membership``; thesis §4.1): voters and learners.  A node uses the latest
  CONFIG entry in its log, committed or not, and falls back to the previous one when a cut
  removes it.  A leader appends one change at a time (add a learner, promote one, remove a
  member), and only once it committed an entry of its own term and every earlier change --
  and, if the change alters the voters, only if those it heard from within an election
  timeout (in ticks; none from before a stall) are a majority of the new voters: a change
  that leaves no majority answering could never be undone (etcd's strict reconfiguration).
  Learners get appends and heartbeats but never vote, campaign, or count toward a commit, a
  check-quorum, a read round or ``all_replicated``.  Messages from strangers are dropped:
  neither members nor the driver's ``Config.peers`` (every server of the cluster: a node
  whose log lags behind the change that added a server must still hear it as leader or
  candidate, thesis §4.1), except the leader we follow in its term (a leader our log
  removed still commits that change and hands over).  A leader that is not a voter
  replicates without counting itself until the entry removing it is committed, then hands
  over and steps down.
- ``read_round_confirmed`` is the highest round a majority acknowledged in this
  leadership; a driver that timed when each round's heartbeats left can hold a leader
  lease from it (``Config.heartbeat_read_rounds`` makes every heartbeat a new round, so
  the lease renews without reads).  No clock here: the timing is the driver's.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from raftlet.consensus.core.config import Config
from raftlet.consensus.core.errors import (
    ConfigChangeDeferred,
    ConfigChangeRefused,
    NotLeaderError,
    ProposalDropped,
    TermMismatch,
)
from raftlet.consensus.core.membership import ConfigChange, ConfState, Membership
from raftlet.consensus.core.progress import Progress, ProgressState
from raftlet.consensus.core.quorum import VoteResult, committed_index, vote_result
from raftlet.consensus.core.raft_log import RaftLog
from raftlet.consensus.core.storage import EntriesUnreadable, Storage
from raftlet.consensus.core.types import (
    MAX_INDEX,
    MAX_TERM,
    MAX_TERM_LEAP,
    NO_NODE,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    ReadState,
    Role,
    SoftState,
)

__all__ = ["Raft"]


@dataclass(frozen=True, slots=True)
class _PendingRead:
    token: int
    index: int  # the commit index when the read arrived
    round: int  # the heartbeat round that confirms it (created after the read arrived)


# Requests of a higher term that the leader lease holds off: a would-be candidate's and a
# would-be leader's.
_LEASED = frozenset(
    {MessageType.VOTE, MessageType.PRE_VOTE, MessageType.APPEND, MessageType.HEARTBEAT}
)

_VOTE_RESPONSE = {
    MessageType.VOTE: MessageType.VOTE_RESPONSE,
    MessageType.PRE_VOTE: MessageType.PRE_VOTE_RESPONSE,
}


class Raft:
    def __init__(self, config: Config, storage: Storage) -> None:
        config.validate()
        self.config = config
        self.id = config.id
        self._rand = random.Random(config.seed)
        hard = storage.initial_state()
        self.log = RaftLog(storage, hard.commit, config.applied, config.max_applying_bytes)
        # Every CONFIG entry that may still matter, as (index, membership), oldest first: the
        # latest known committed (or the initial one, index 0), then any above the commit
        # index.  The last is the membership in use (thesis §4.1: the latest in the log,
        # committed or not); cutting the log drops those past the cut.
        self._configs = self._recover_configs(config)
        self.log.on_append = self._on_log_append
        self.membership = self._configs[-1][1]
        self.voters: tuple[str, ...] = self.membership.voters
        self.learners: tuple[str, ...] = self.membership.learners
        self._members = frozenset(self.membership.members())
        self.term = 0
        self.vote = NO_NODE
        self.lead = NO_NODE
        self.role = Role.FOLLOWER
        self.prs: dict[str, Progress] = {}
        self.votes: dict[str, bool] = {}
        self.msgs: list[Message] = []
        # ReadIndex (thesis §6.4): reads waiting for a quorum to confirm this leader, in
        # request order (so in round order), and the outcomes for the driver's next ready.
        # ``read_round`` is the latest round whose heartbeats were created; it only grows,
        # across terms too, so a round number names one broadcast.
        self.read_round = 0
        # The highest round a majority acknowledged in this leadership (see _reset).
        self.read_round_confirmed = 0
        # Per voter, the highest round it echoed in this leadership.
        self._round_acks: dict[str, int] = {}
        # Reads hold round read_round + 1, not yet broadcast (one is outstanding).
        self._round_wanted = False
        self._pending_reads: deque[_PendingRead] = deque()
        self.read_states: list[ReadState] = []
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.ticks = 0  # every tick stepped: the clock peers' answers are timed by
        self.randomized_election_timeout = config.election_tick
        # A leader's target of a leadership transfer in progress; a follower's, the target its
        # leader announced in this term (what vouches for that target's transfer vote); or
        # NO_NODE.
        self.lead_transferee = NO_NODE
        # The tick a TIMEOUT_NOW last left in: it is resent at most once a tick.
        self.timeout_now_tick = -1
        # Every voter holds every entry up to here (a leader's minimum match, or what a
        # leader said it was, never above our commit). Only grows: a committed entry a voter
        # holds is never removed from it. Log GC may discard entries below it.
        self.all_replicated = 0
        # The first read of this log that failed (``EntriesUnreadable``), for the driver.
        self.read_failure: EntriesUnreadable | None = None
        # False: never campaign, never lead (see set_promotable).
        self.promotable = True
        self.become_follower(hard.term, NO_NODE)
        self.vote = hard.vote

    # --- snapshots of state --------------------------------------------------------

    def hard_state(self) -> HardState:
        return HardState(term=self.term, vote=self.vote, commit=self.log.committed)

    def soft_state(self) -> SoftState:
        leader = self.role is Role.LEADER
        return SoftState(
            role=self.role,
            term=self.term,
            leader_id=self.lead,
            leader_ready=leader and self.log.term(self.log.committed) == self.term,
            transferring=leader and self.lead_transferee != NO_NODE,
        )

    # Whether hard_state(), soft_state() or conf_state() would differ from what a driver
    # last took, without building them: a driver asks after every input, and mostly
    # nothing changed.  Exact, but for conf_state_differs, which may say True for an
    # equal state (never False for a changed one).

    def hard_state_differs(self, hard: HardState) -> bool:
        return self.term != hard.term or self.vote != hard.vote or self.log.committed != hard.commit

    def soft_state_differs(self, soft: SoftState) -> bool:
        if self.role is not soft.role or self.term != soft.term or self.lead != soft.leader_id:
            return True
        if self.role is not Role.LEADER:
            return False  # off-leader the two flags are always False
        if (self.lead_transferee != NO_NODE) is not soft.transferring:
            return True
        # Ready in this term stays ready: the commit index only grows, and every entry
        # past this leader's NO_OP is of its term.
        return not soft.leader_ready and self.log.term(self.log.committed) == self.term

    def conf_state_differs(self, conf: ConfState) -> bool:
        configs = self._configs
        if len(configs) == 1:  # one membership: conf_state() is it, at its index, twice
            index, membership = configs[0]
            return not (
                conf.index == index == conf.committed_index
                and conf.membership is membership
                and conf.committed is membership
            )
        return self.conf_state() != conf

    def read_messages(self) -> list[Message]:
        out, self.msgs = self.msgs, []
        return out

    # --- role transitions -----------------------------------------------------------

    def _reset(self, term: int) -> None:
        # Reads waiting for this leadership fail: it is over (or never was).
        self.read_states += [ReadState(r.token, 0, ok=False) for r in self._pending_reads]
        self._pending_reads.clear()
        self._round_wanted = False
        # Every earlier round is settled: this leadership (if it is one) starts afresh.
        self.read_round_confirmed = self.read_round
        self._round_acks = {}
        if term != self.term:
            self.term = term
            self.vote = NO_NODE
        self.lead = NO_NODE
        self.leader_commit = 0  # as its leader says it, once it hears from one
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_timeout = self._rand.randrange(
            self.config.election_tick, 2 * self.config.election_tick
        )
        self.lead_transferee = NO_NODE
        self.votes = {}
        last = self.log.last_index()
        self.prs = {v: self._new_progress(last + 1) for v in self.membership.members()}

    def _new_progress(self, next_index: int) -> Progress:
        c = self.config
        return Progress(0, next_index, c.max_inflight_msgs, c.max_inflight_bytes)

    def become_follower(self, term: int, lead: str) -> None:
        self._reset(term)
        self.lead = lead
        self.role = Role.FOLLOWER

    def become_pre_candidate(self) -> None:
        if self.role is Role.LEADER:
            raise AssertionError("a leader cannot become a pre-candidate")
        # Unlike a candidate, a pre-candidate keeps its term and vote (thesis §9.6).
        self.votes = {}
        self.lead = NO_NODE
        self.role = Role.PRE_CANDIDATE

    def become_candidate(self) -> None:
        if self.role is Role.LEADER:
            raise AssertionError("a leader cannot become a candidate")
        self._reset(self.term + 1)
        self.vote = self.id
        self.role = Role.CANDIDATE

    def become_leader(self) -> None:
        if self.role is Role.FOLLOWER:
            raise AssertionError("a follower cannot become leader without an election")
        self._reset(self.term)
        self.lead = self.id
        self.role = Role.LEADER
        for pr in self.prs.values():
            pr.recent_active = True
        # Its own progress moves only as its entries become durable; everything
        # already durable locally counts now.
        self.prs[self.id].match = self.log.stable_index()
        self.prs[self.id].become_replicate()
        self.log.append([Entry(self.term, self.log.last_index() + 1, EntryType.NO_OP)])

    # --- inputs --------------------------------------------------------------------------

    def tick(self) -> None:
        self.ticks += 1
        if self.role is Role.LEADER:
            self._tick_heartbeat()
        else:
            self._tick_election()

    def _tick_election(self) -> None:
        self.election_elapsed += 1
        if self.election_elapsed >= self.randomized_election_timeout:
            self.election_elapsed = 0
            if self.id not in self.voters or not self.promotable or self.term >= MAX_TERM:
                # A node that will not campaign (a learner, a node removed, one its driver
                # made not promotable, one out of terms) must still not hold its leader's
                # lease forever: having heard nothing for a timeout, it forgets that
                # leader, so the next one's votes and higher term reach it. (A voter kept
                # its dead leader's lease timeout after timeout, and dropped every other
                # voter's vote request: with three voters, no leader ever again.)
                self.lead = NO_NODE
            self.campaign()

    def _tick_heartbeat(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.config.election_tick:
            self.election_elapsed = 0
            if self.config.check_quorum and not self._quorum_active():
                self.become_follower(self.term, NO_NODE)
                return
            # A transfer that did not finish within an election timeout is abandoned.
            self.lead_transferee = NO_NODE
        if self.heartbeat_elapsed >= self.config.heartbeat_tick:
            self.heartbeat_elapsed = 0
            self._heartbeat()

    def _heartbeat(self) -> None:
        routine = not self._round_wanted  # no read waits on this one
        if self._round_wanted or self.config.heartbeat_read_rounds:
            # Reads waiting for a round go with this heartbeat even if the outstanding
            # round was lost; with heartbeat rounds, every heartbeat is a new round.
            self._start_read_round(routine)
        else:
            self._bcast_heartbeat(routine)

    def on_stall(self, ticks: int) -> None:
        """The driver saw this process stop for about ``ticks`` ticks (a SIGSTOP, a paused
        VM, a long GC) -- ticks it did not and will not step.

        A leader that stalled for an election timeout or more may have been deposed: its
        followers' minimum timeout passed, and the answers it counted before the stall say
        nothing about now.  So it forgets them, heartbeats at once and runs check-quorum
        ``2 * heartbeat_tick`` ticks later (at most an election timeout), stepping down
        unless a majority answered since it woke.  Not done instead: catching up the missed
        ticks.  Stepping them at once would run check-quorum on the stale answers (and
        pass), or, for several timeouts' worth, run checks with no time for any answer in
        between (and depose even a healthy leader).  Left alone, a cut-off leader would
        claim leadership for up to another election timeout after it woke.  Shorter stalls
        change nothing: no follower can have timed out, and the ordinary check runs.  With
        or without check-quorum, it forgets when it last heard each peer, which a membership
        change is checked against (``propose_config_change``)."""
        if self.role is not Role.LEADER or ticks < self.config.election_tick:
            return
        for v, pr in self.prs.items():
            if v != self.id:
                pr.heard_tick = None  # a membership change counts only answers since
        if not self.config.check_quorum:
            return
        for v, pr in self.prs.items():
            pr.recent_active = v == self.id
        grace = min(2 * self.config.heartbeat_tick, self.config.election_tick)
        self.election_elapsed = self.config.election_tick - grace
        self.heartbeat_elapsed = 0
        self._heartbeat()

    def _quorum_active(self) -> bool:
        """Whether a majority was heard from since the last check; resets the marks."""
        active = {v: True for v, pr in self.prs.items() if pr.recent_active or v == self.id}
        for v, pr in self.prs.items():
            pr.recent_active = v == self.id
        return vote_result(self.voters, active) is VoteResult.WON

    def campaign(self, transfer: bool = False) -> None:
        """Start an election: a pre-vote round first, unless disabled or asked by
        the leader to take over (``transfer``).  Only a voter campaigns."""
        if (
            self.role is Role.LEADER
            or self.term >= MAX_TERM  # no next term to campaign in
            or not self.promotable
            or self.id not in self.voters
        ):
            return
        if self.config.pre_vote and not transfer:
            self.become_pre_candidate()
            if self._poll(self.id, MessageType.PRE_VOTE_RESPONSE, True) is VoteResult.WON:
                self._campaign_for_real(transfer=False)
            else:
                self._request_votes(MessageType.PRE_VOTE, self.term + 1, transfer=False)
        else:
            self._campaign_for_real(transfer)

    def _campaign_for_real(self, transfer: bool) -> None:
        self.become_candidate()
        if self._poll(self.id, MessageType.VOTE_RESPONSE, True) is VoteResult.WON:
            self.become_leader()
            self._bcast_append()
        else:
            self._request_votes(MessageType.VOTE, self.term, transfer)

    def _request_votes(self, kind: MessageType, term: int, transfer: bool) -> None:
        for v in self.voters:
            if v != self.id:
                self._send(
                    Message(
                        kind,
                        self.id,
                        v,
                        term,
                        log_term=self.log.last_term(),
                        index=self.log.last_index(),
                        transfer=transfer,
                    )
                )

    def _poll(self, node: str, kind: MessageType, granted: bool) -> VoteResult:
        self.votes.setdefault(node, granted)
        return vote_result(self.voters, self.votes)

    def propose(self, datas: Sequence[bytes], expected_term: int | None = None) -> list[Entry]:
        """Append proposals to the leader's log and start replicating them."""
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.lead, self.term)
        if expected_term is not None and expected_term != self.term:
            raise TermMismatch(expected_term, self.term, self.lead)
        if self.lead_transferee != NO_NODE:
            raise ProposalDropped(f"leadership is being transferred to {self.lead_transferee}")
        last = self.log.last_index()
        entries = [Entry(self.term, last + 1 + i, EntryType.NORMAL, d) for i, d in enumerate(datas)]
        self.log.append(entries)
        self._bcast_append()
        return entries

    # --- membership (thesis §4.1: one server at a time) ---------------------------------

    def propose_config_change(self, change: ConfigChange) -> Entry:
        """Append a CONFIG entry with the membership ``change`` makes of the current one, and
        use it at once.  Refused (``ConfigChangeRefused``, nothing appended) while another
        change is not committed, before this leader committed an entry of its term (an
        earlier leader's change may still be uncommitted in some log), during a leadership
        transfer, when the change does not fit (see ``ConfigChange.apply``), or when it
        would leave the voters heard from within an election timeout no majority."""
        membership = self.check_config_change(change)
        entry = Entry(self.term, self.log.last_index() + 1, EntryType.CONFIG, membership.encode())
        self.log.append([entry])
        self._bcast_append()
        if self._maybe_commit():  # fewer voters may need fewer acknowledgements
            self._bcast_append(send_if_empty=self.config.broadcast_commit)
        self._leave_if_removed()
        return entry

    def check_config_change(self, change: ConfigChange) -> Membership:
        """The membership ``change`` would make, or the refusal ``propose_config_change``
        would raise now; nothing is appended.  A caller about to move leadership for a
        change asks first, so a refused change moves nothing."""
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.lead, self.term)
        if self.lead_transferee != NO_NODE:
            raise ConfigChangeDeferred(f"leadership is being transferred to {self.lead_transferee}")
        if self.log.term(self.log.committed) != self.term:
            raise ConfigChangeDeferred(
                f"the leader of term {self.term} has not committed an entry of its term yet"
            )
        pending = self._configs[-1][0]
        if pending > self.log.committed:
            raise ConfigChangeRefused(
                f"a config change is in progress: the one at index {pending} is not "
                f"committed yet (commit index {self.log.committed})"
            )
        membership = change.apply(self.membership)
        if membership.voters != self.membership.voters:
            self._refuse_unless_a_majority_answers(membership)
        return membership

    def _refuse_unless_a_majority_answers(self, membership: Membership) -> None:
        """Refuse a change of voters after which those heard from within an election timeout
        would be no majority (etcd's strict reconfiguration check): removing a healthy voter
        while another is down, or promoting a learner that does not answer, would leave a
        group that commits nothing -- not even the change that would undo it."""
        window = self.config.election_tick
        answering = set()
        for v in membership.voters:
            pr = self.prs.get(v)
            heard = pr.heard_tick if pr is not None else None
            if v == self.id or (heard is not None and self.ticks - heard <= window):
                answering.add(v)
        if vote_result(membership.voters, dict.fromkeys(answering, True)) is VoteResult.WON:
            return
        silent = sorted(set(membership.voters) - answering)
        raise ConfigChangeRefused(
            f"it would leave {len(answering)} of the new group's {len(membership.voters)} "
            f"voters answering ({', '.join(silent)} not heard from within an election "
            "timeout), no majority to commit anything, this change included; bring "
            f"{', '.join(silent)} back first, or remove a voter that is down"
        )

    def conf_state(self) -> ConfState:
        """The membership in use and the latest one committed and durable here, with the
        indexes of their entries: what a driver persists (``Ready.conf_state``)."""
        bound = min(self.log.committed, self.log.stable_index())
        k = 0
        for i, (index, _) in enumerate(self._configs):
            if index <= bound:
                k = i
        if k:
            del self._configs[:k]  # nothing before a committed entry can come back
        latest_index, latest = self._configs[-1]
        # The oldest we know, even above ``bound``: it is the initial membership or one
        # persisted as committed, which this node's own commit index (saved only with term
        # and vote) may lag. Reporting the latest instead once persisted an uncommitted
        # membership as committed, which a later leader's truncation could then not undo.
        committed_index, committed = self._configs[0]
        return ConfState(latest, latest_index, committed, committed_index)

    def _recover_configs(self, config: Config) -> list[tuple[int, Membership]]:
        """The configurations at start: the ones persisted, less those whose entry the log
        does not hold (persisted just before a crash took the entry), then the latest CONFIG
        entry the log holds above what is left, if any."""
        latest = (config.config_index, config.membership())
        known = [latest]
        if config.committed_config is not None and config.committed_config[0] < latest[0]:
            known.insert(0, config.committed_config)
        kept = [c for c in known if self._log_holds(*c)]
        if len(kept) == len(known):
            if len(known) == 2:
                # A change between the two is committed (a leader appends one only once
                # the one before it committed), though this node's commit index may not
                # say so: it is what a cut of the latest falls back to, not the older one.
                between = self._last_config_entry(known[0][0], below=known[1][0])
                if between is not None:
                    known.insert(1, between)
            return known
        floor = kept[-1][0] if kept else 0
        found = self._last_config_entry(floor)
        if found is not None:
            kept.append(found)
        return kept or [latest]

    def _log_holds(self, index: int, membership: Membership) -> bool:
        if index == 0 or index < self.log.first_index():
            return True  # the initial membership, or an entry GC discarded: committed
        if index > self.log.last_index():
            return False
        entry = self.log.storage.entries(index, index + 1)[0]
        return entry.type is EntryType.CONFIG and entry.data == membership.encode()

    def _last_config_entry(
        self, floor: int, below: int | None = None
    ) -> tuple[int, Membership] | None:
        """The last CONFIG entry of the durable log above ``floor`` (and below ``below``),
        read backwards."""
        hi = self.log.last_index() + 1 if below is None else below
        lo_bound = max(floor + 1, self.log.first_index())
        while hi > lo_bound:
            lo = max(lo_bound, hi - 1024)
            for e in reversed(self.log.storage.entries(lo, hi)):
                if e.type is EntryType.CONFIG:
                    try:
                        return e.index, Membership.decode(e.data)
                    except ValueError:
                        continue
            hi = lo
        return None

    def _on_log_append(self, entries: Sequence[Entry]) -> None:
        """Follow the CONFIG entries of the log: entries from ``entries[0].index`` on were
        replaced (an uncommitted config among them is undone), and any CONFIG entry among
        the new ones is used at once."""
        first = entries[0].index
        changed = False
        while len(self._configs) > 1 and self._configs[-1][0] >= first:
            self._configs.pop()
            changed = True
        for e in entries:
            # At or below the latest config we know: a copy's committed membership, which
            # may lie past the copy's own index, covers it already (using it would go back
            # to an older group).
            if e.type is EntryType.CONFIG and e.index > self._configs[-1][0]:
                try:
                    membership = Membership.decode(e.data)
                except ValueError:
                    continue  # no honest leader writes one; every replica skips it alike
                self._configs.append((e.index, membership))
                changed = True
        if changed:
            self._use(self._configs[-1][1])

    def _use(self, membership: Membership) -> None:
        self.membership = membership
        self.voters = membership.voters
        self.learners = membership.learners
        self._members = frozenset(membership.members())
        if self.role is not Role.LEADER:
            return
        last = self.log.last_index()
        for node in membership.members():
            if node not in self.prs:
                pr = self._new_progress(last + 1)
                pr.recent_active = True  # a newcomer is not held against check-quorum yet
                self.prs[node] = pr
        if self.lead_transferee != NO_NODE and self.lead_transferee not in self.voters:
            self.lead_transferee = NO_NODE

    def _leave_if_removed(self) -> None:
        """Once the latest membership is committed, a leader stops replicating to the
        members it removed (until then they get the entry that tells them), and steps down
        if it is no voter itself (until then it replicates, without counting itself),
        handing over if it can."""
        if self.role is not Role.LEADER or len(self.prs) == len(self._members):
            return  # the common case, on every step: nobody removed (a leader's prs hold
            # every member, and itself)
        if self._configs[-1][0] > self.log.committed:
            return
        for node in [n for n in self.prs if n not in self._members and n != self.id]:
            del self.prs[node]
        if self.id not in self.voters:
            self._hand_over()
            self.become_follower(self.term, NO_NODE)

    def read_index(self, token: int) -> None:
        """Start a linearizable read (ReadIndex, thesis §6.4): note the commit index now and
        confirm with a heartbeat round that a quorum still follows this leader; then
        ``ReadState(token, index)`` appears in ``read_states`` (or ``ok=False`` if the
        leadership ends first). Reads serve once ``index`` is applied. Raises
        ``NotLeaderError`` off-leader and ``ProposalDropped`` before this leader has committed
        an entry of its term (its commit index is not yet current).

        Batched: if no round is outstanding the read starts one; otherwise it joins the next
        round, broadcast once the outstanding one is confirmed (or at the next heartbeat)."""
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.lead, self.term)
        if self.log.term(self.log.committed) != self.term:
            raise ProposalDropped("the leader has not yet committed an entry of its term")
        if self.voters == (self.id,):
            self.read_states.append(ReadState(token, self.log.committed))
            return
        # The next round is created after this moment, whichever way it is started.
        self._pending_reads.append(_PendingRead(token, self.log.committed, self.read_round + 1))
        if self.read_round_confirmed >= self.read_round:
            self._start_read_round()
        else:
            self._round_wanted = True

    def _start_read_round(self, routine: bool = False) -> None:
        """Broadcast heartbeats of a new round; reads waiting for it now hold its number."""
        self.read_round += 1
        self._round_wanted = False
        self._bcast_heartbeat(routine)

    def _confirm_reads(self, voter: str, round_seen: int) -> None:
        """``voter`` answered a heartbeat of ``round_seen`` in this term: it followed this
        leader after every read of that round or earlier was noted."""
        if round_seen <= self._round_acks.get(voter, 0):
            return
        self._round_acks[voter] = round_seen
        acks = dict(self._round_acks)
        acks[self.id] = self.read_round
        confirmed = committed_index(self.voters, acks)
        if confirmed <= self.read_round_confirmed:
            return
        self.read_round_confirmed = confirmed
        while self._pending_reads and self._pending_reads[0].round <= confirmed:
            head = self._pending_reads.popleft()
            self.read_states.append(ReadState(head.token, head.index))
        if self._round_wanted and confirmed >= self.read_round:
            self._start_read_round()  # the reads that arrived meanwhile: their round now

    def answering_successor(self, heard_within: int) -> str:
        """The voter other than this leader with the longest log among those heard from
        within ``heard_within`` ticks: where leadership can go at once.  NO_NODE if this
        node does not lead or no other voter answers."""
        if self.role is not Role.LEADER:
            return NO_NODE
        best, best_match = NO_NODE, -1
        for v in self.voters:
            answers = v != self.id and self.answered_within(v, heard_within)
            if answers and self.prs[v].match > best_match:
                best, best_match = v, self.prs[v].match
        return best

    def answered_within(self, voter: str, heard_within: int) -> bool:
        """Whether this leader heard from ``voter`` within the last ``heard_within`` ticks."""
        pr = self.prs.get(voter)
        if self.role is not Role.LEADER or pr is None or pr.heard_tick is None:
            return False
        return self.ticks - pr.heard_tick <= heard_within

    def transfer_leadership(self, target: str) -> None:
        """Hand leadership to ``target`` (thesis §3.10): stop accepting proposals,
        bring the target up to date, then tell it to campaign at once."""
        if self.role is not Role.LEADER or target == self.id or target not in self.voters:
            return
        if self.lead_transferee == target:
            return
        self.lead_transferee = target
        self.election_elapsed = 0
        # Announce the target to every follower first: that is what lets them vote for it
        # under their leader lease when it campaigns.
        self._bcast_heartbeat()
        if self.prs[target].match == self.log.last_index():
            self._send_timeout_now(target)
        else:
            self._send_append(target)

    def _send_timeout_now(self, target: str) -> None:
        self.timeout_now_tick = self.ticks
        self._send(Message(MessageType.TIMEOUT_NOW, self.id, target, self.term))

    def set_promotable(self, promotable: bool) -> None:
        """Whether this node may campaign and lead.  Made not promotable, a leader hands
        its leadership to a follower whose log matches its own (it announces the target to
        every follower, as ``transfer_leadership`` does, and sends it TIMEOUT_NOW), and in
        any case steps down at once, in its term, so it accepts no more proposals; a
        (pre-)candidate gives up its election.  The step-down keeps term and vote, so the
        driver has nothing to persist for it."""
        self.promotable = promotable
        if promotable or self.role is Role.FOLLOWER:
            return
        if self.role is Role.LEADER:
            self._hand_over()
        self.become_follower(self.term, NO_NODE)

    def report_snapshot(self, peer: str, ok: bool, index: int = 0) -> None:
        """The driver's outcome of the copy a SNAPSHOT message asked for.  ``ok``: ``peer``
        installed the state at ``index`` -- probe from there.  Not ok: probe again after its
        next heartbeat answer, which asks for a new copy if one is still needed (the driver
        paces its attempts).  Ignored unless we lead and await a copy for ``peer``."""
        pr = self.prs.get(peer)
        if self.role is not Role.LEADER or pr is None or pr.state is not ProgressState.SNAPSHOT:
            return
        if ok and index >= pr.pending_snapshot:
            pr.snapshot_done(index)
            self._send_append(peer)
        else:
            pr.become_probe()
            pr.probe_sent = True

    def restore(self, index: int, term: int, config: tuple[int, Membership] | None = None) -> bool:
        """The driver replaced the storage with a copy of a leader's state at (``index``,
        ``term``): the storage's log now starts with that entry (a stand-in that is never
        sent, only its term is read).  Everything up to ``index`` is committed and applied.
        ``config``: the copy's membership and the index of its entry -- the leader's
        committed one, which may lie past ``index``; without it the node keeps the
        membership it had, which is only right if no change happened past what it held
        (the copy replaces the log that carried the changes: a node kept an old group of
        three while the others had grown to five, and could win an election with votes
        the five would not count). The driver persists ``config`` in the same durable step
        as the copy: a crash between the two restarts the node on the copy's log with its
        old membership (tserver.tablet_copy_install writes both into the directory it swaps
        in). Refused (False, nothing changed) on a leader, or when
        ``index`` is not past our commit index -- a copy never takes back what we hold
        committed.  The driver must check before it replaces the storage that our log
        does not already hold (``index``, ``term``): the entries after it may be
        acknowledged ones, and a copy would drop them; it then tells the leader where we
        are instead (its report of the copy)."""
        if self.role is Role.LEADER or index <= self.log.committed:
            return False
        if self.log.storage.term(index) != term:
            raise AssertionError(f"storage holds no entry ({index}, {term}) to restore")
        self.log.restore(index)
        if config is not None:
            self._configs = [config]
            self._use(config[1])
        return True

    def _hand_over(self) -> None:
        """A leader about to step down: tell a voter whose log matches ours to campaign now,
        announcing it to every follower (so their leases let it win), if there is one."""
        last = self.log.last_index()
        caught_up = [
            v for v in self.voters if v != self.id and v in self.prs and self.prs[v].match == last
        ]
        if caught_up:
            target = min(caught_up)  # deterministic: the simulator replays runs
            self.lead_transferee = target
            self._bcast_heartbeat()
            self._send_timeout_now(target)

    def on_persisted(self, index: int, term: int) -> None:
        """The batch of entries handed out ending at (index, term) is durable locally
        (``RaftLog.stable_to``: reported in the order handed out)."""
        if not self.log.stable_to(index, term):
            return
        leader = self.role is Role.LEADER
        stable = self.log.stable_index()
        if leader and self.prs[self.id].maybe_update(stable) and self._maybe_commit():
            self._bcast_append(send_if_empty=self.config.broadcast_commit)
            self._leave_if_removed()

    # --- step -------------------------------------------------------------------------

    def _in_lease(self) -> bool:
        """Whether we heard from a live leader (or are one) within the election timeout."""
        return (
            self.config.check_quorum
            and self.lead != NO_NODE
            and self.election_elapsed < self.config.election_tick
        )

    def _announced_successor(self, m: Message) -> bool:
        """Whether ``m`` (of a higher term) comes from the transfer target our leader -- or
        we, as leader -- announced in our term, campaigning in (or leading) the next one."""
        return (
            self.lead_transferee != NO_NODE
            and m.src == self.lead_transferee
            and m.term == self.term + 1
            and (m.transfer or m.type in (MessageType.APPEND, MessageType.HEARTBEAT))
        )

    def _implausible(self, m: Message) -> bool:
        """Whether no honest peer could have sent ``m``, whatever our state (see the module
        docstring).  The wire codec refuses most of it first; this keeps the core safe with
        any driver."""
        if not 0 <= m.term <= MAX_TERM or not 0 <= m.log_term <= MAX_TERM:
            return True
        if m.term > self.term + MAX_TERM_LEAP:
            return True
        return not (
            0 <= m.index <= MAX_INDEX
            and 0 <= m.commit <= MAX_INDEX
            and 0 <= m.reject_hint <= MAX_INDEX
            and 0 <= m.context <= MAX_INDEX
            and 0 <= m.all_replicated <= MAX_INDEX
        )

    def step(self, m: Message) -> None:
        if m.dst != self.id or m.src == self.id:
            return  # not for us: drop, never crash
        if (
            m.src not in self._members
            and m.src not in self.config.peers
            and not (m.src == self.lead and m.term == self.term)
        ):
            # From a stranger: dropped.  The driver's peers are heard (Config.peers), and
            # so is the leader we follow in this term once our log removed it (it still
            # commits that change, and hands over).
            return
        if m.type is MessageType.SNAPSHOT:
            return  # the leader's driver carries it out; it is no input to a core
        if self._implausible(m):
            return
        self._step(m)
        self._leave_if_removed()

    def _step(self, m: Message) -> None:
        if m.term > self.term:
            if m.type is MessageType.TIMEOUT_NOW:
                # A leader asks only a follower that acknowledged its log in its term, so
                # one from a term we never reached is not our leader's.
                return
            if m.type is MessageType.HEARTBEAT and m.commit:
                # A new leader's heartbeat commits nothing to a follower before that follower
                # answered it in the new term (its match is unknown), and answering means
                # holding the term already.
                return
            if m.type in _LEASED and self._in_lease() and not self._announced_successor(m):
                # We heard from a live leader within the timeout: a candidate that cannot
                # hear it must not depose it (thesis §6.2), and no other leader of a later
                # term can exist without a majority having lost it -- this one among them.
                # Except the transferee our leader announced.
                return
            if m.type is MessageType.PRE_VOTE or (
                m.type is MessageType.PRE_VOTE_RESPONSE and not m.reject
            ):
                pass  # pre-vote traffic never changes a term
            elif m.type in (MessageType.APPEND, MessageType.HEARTBEAT):
                self.become_follower(m.term, m.src)
            else:
                self.become_follower(m.term, NO_NODE)
        elif m.term < self.term:
            if m.type in (MessageType.APPEND, MessageType.HEARTBEAT):
                # Tell a stale leader our term so it steps down; with pre-vote and
                # check-quorum it might otherwise never learn it (etcd's rationale).
                self._send(Message(MessageType.APPEND_RESPONSE, self.id, m.src, self.term))
            elif m.type is MessageType.PRE_VOTE:
                self._send(
                    Message(MessageType.PRE_VOTE_RESPONSE, self.id, m.src, self.term, reject=True)
                )
            return
        if m.type in (MessageType.APPEND, MessageType.HEARTBEAT) and self.lead not in (
            NO_NODE,
            m.src,
        ):
            return  # a second leader in a term whose leader we know: cannot be

        if m.type in (MessageType.VOTE, MessageType.PRE_VOTE):
            self._handle_vote_request(m)
        elif self.role is Role.LEADER:
            self._step_leader(m)
        elif self.role in (Role.CANDIDATE, Role.PRE_CANDIDATE):
            self._step_candidate(m)
        else:
            self._step_follower(m)

    def _handle_vote_request(self, m: Message) -> None:
        can_vote = (
            self.vote == m.src
            or (self.vote == NO_NODE and self.lead == NO_NODE)
            or (m.type is MessageType.PRE_VOTE and m.term > self.term)
        )
        resp = _VOTE_RESPONSE[m.type]
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            # A granted pre-vote answers in the term the candidate would use.
            self._send(Message(resp, self.id, m.src, m.term))
            if m.type is MessageType.VOTE:
                self.election_elapsed = 0
                self.vote = m.src
        else:
            self._send(Message(resp, self.id, m.src, self.term, reject=True))

    def _step_leader(self, m: Message) -> None:
        pr = self.prs.get(m.src)
        if pr is None:
            return  # an answer from a peer that is no member (any more)
        pr.heard_tick = self.ticks
        if m.type is MessageType.APPEND_RESPONSE:
            pr.recent_active = True
            if m.reject:
                hint = m.reject_hint
                if m.log_term > 0:
                    # Skip every entry of a term the follower does not have.
                    hint, _ = self.log.find_conflict_by_term(hint, m.log_term)
                # Every voter holds every entry up to all_replicated, so no probe need go
                # below it -- nor can it, once log GC discarded what lies below (GC keeps
                # the entry at all_replicated, whose term the probe sends).  A learner may
                # hold nothing yet: it is probed down to what it has.
                if m.src in self.voters:
                    hint = max(hint, self.all_replicated)
                if pr.maybe_decrease_to(m.index, hint):
                    if pr.state is ProgressState.REPLICATE:
                        pr.become_probe()
                    self._send_append(m.src)
                return
            if m.index > self.log.last_index():
                return  # acknowledges entries we never sent: a confused peer
            was_paused = pr.is_paused()
            if not pr.maybe_update(m.index):
                return
            if pr.state is ProgressState.PROBE:
                pr.become_replicate()
            elif pr.state is ProgressState.SNAPSHOT:
                if pr.match < pr.pending_snapshot:
                    return  # an old answer: the copy is still needed
                # It got there without the copy (an answer that was late): replicate.
                pr.become_replicate()
            else:
                pr.inflights.free_le(m.index)
            if self._maybe_commit():
                self._bcast_append(send_if_empty=self.config.broadcast_commit)
            elif was_paused:
                self._send_append(m.src)
            while self._send_append(m.src, send_if_empty=False):
                pass
            if m.src == self.lead_transferee and pr.match == self.log.last_index():
                self._send_timeout_now(m.src)
        elif m.type is MessageType.HEARTBEAT_RESPONSE:
            pr.recent_active = True
            if m.reject and m.reject_hint < pr.match:
                # It lost entries it had acknowledged: start over from what it holds (a copy
                # of the tablet, if the log no longer reaches back there).  Its old
                # acknowledgements were counted already; fewer now only delays commits.
                pr.match = m.reject_hint
                pr.become_probe()
            pr.probe_sent = False
            if m.context:
                # A round it cannot have been sent yet confirms nothing more than the last.
                self._confirm_reads(m.src, min(m.context, self.read_round))
            # A follower back from a pause answers every heartbeat queued for it at once:
            # one APPEND a tick, not one per answer, each read from the log and encoded
            # under the consensus lock (~80 answers held a leader's lock for 14.6 s).
            if pr.match < self.log.last_index() and pr.resent_tick != self.ticks:
                pr.resent_tick = self.ticks
                if pr.state is ProgressState.REPLICATE and pr.inflights.full():
                    pr.inflights.free_first_one()
                self._send_append(m.src)
            if (
                m.src == self.lead_transferee
                and pr.match == self.log.last_index()
                and self.timeout_now_tick != self.ticks
            ):
                # The TIMEOUT_NOW of the transfer's start may have been lost: sent to a
                # server that had just restarted, it met a link still down, and the
                # transfer was abandoned while its caught-up target kept answering.
                # Another is harmless: a target that campaigned is past this term.
                self._send_timeout_now(m.src)

    def _step_candidate(self, m: Message) -> None:
        my_response = (
            MessageType.PRE_VOTE_RESPONSE
            if self.role is Role.PRE_CANDIDATE
            else MessageType.VOTE_RESPONSE
        )
        if m.type is MessageType.APPEND:
            self.become_follower(m.term, m.src)
            self.lead_transferee = m.transferee
            self._handle_append(m)
        elif m.type is MessageType.HEARTBEAT:
            self.become_follower(m.term, m.src)
            self.lead_transferee = m.transferee
            self._handle_heartbeat(m)
        elif m.type is my_response:
            result = self._poll(m.src, m.type, granted=not m.reject)
            if result is VoteResult.WON:
                if self.role is Role.PRE_CANDIDATE:
                    self._campaign_for_real(transfer=False)
                else:
                    self.become_leader()
                    self._bcast_append()
            elif result is VoteResult.LOST:
                self.become_follower(self.term, NO_NODE)

    def _step_follower(self, m: Message) -> None:
        if m.type is MessageType.APPEND:
            self.election_elapsed = 0
            self.lead = m.src
            self.lead_transferee = m.transferee
            self._handle_append(m)
        elif m.type is MessageType.HEARTBEAT:
            self.election_elapsed = 0
            self.lead = m.src
            self.lead_transferee = m.transferee
            self._handle_heartbeat(m)
        elif m.type is MessageType.TIMEOUT_NOW and m.src == self.lead:
            # Only the leader we follow in this term may hand us its leadership.
            self.campaign(transfer=True)

    def _handle_append(self, m: Message) -> None:
        if any(e.index != m.index + 1 + i for i, e in enumerate(m.entries)):
            return  # malformed: entries must directly follow the previous index
        if m.index < self.log.committed:
            self._learn_all_replicated(m.all_replicated)
            self._send(
                Message(
                    MessageType.APPEND_RESPONSE, self.id, m.src, self.term, index=self.log.committed
                )
            )
            return
        self.leader_commit = max(self.leader_commit, m.commit)  # an append's is uncapped
        last_new = self.log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if last_new is not None:
            self._learn_all_replicated(m.all_replicated)
            self._send(
                Message(MessageType.APPEND_RESPONSE, self.id, m.src, self.term, index=last_new)
            )
            return
        # Suggest the last index that may match: at most our last index, and
        # skipping all our entries of terms newer than the leader's prev term.
        hint_index, hint_term = self.log.find_conflict_by_term(
            min(m.index, self.log.last_index()), m.log_term
        )
        self._send(
            Message(
                MessageType.APPEND_RESPONSE,
                self.id,
                m.src,
                self.term,
                index=m.index,
                reject=True,
                reject_hint=hint_index,
                log_term=hint_term,
            )
        )

    def _handle_heartbeat(self, m: Message) -> None:
        self.leader_commit = max(self.leader_commit, m.leader_commit)
        last = self.log.last_index()
        self.log.commit_to(min(m.commit, last))
        self._learn_all_replicated(m.all_replicated)
        # A leader never commits past what it knows we hold; a commit beyond our log means
        # we lost entries we had acknowledged (our replica was wiped or replaced).  Say where
        # our log ends, or an idle leader would go on thinking we hold them.
        lost = m.commit > last
        self._send(
            Message(
                MessageType.HEARTBEAT_RESPONSE,
                self.id,
                m.src,
                self.term,
                context=m.context,
                reject=lost,
                reject_hint=last if lost else 0,
            )
        )

    def _learn_all_replicated(self, index: int) -> None:
        # Never above our own commit: what we discard must be committed, whatever was sent.
        self.all_replicated = max(self.all_replicated, min(index, self.log.committed))

    # --- leader helpers -----------------------------------------------------------------

    def _all_replicated_now(self) -> int:
        """The leader's all_replicated: the least match of all voters (its own included)."""
        least = min(self.prs[v].match for v in self.voters)
        self.all_replicated = max(self.all_replicated, min(least, self.log.committed))
        return self.all_replicated

    def _maybe_commit(self) -> bool:
        match = {v: pr.match for v, pr in self.prs.items()}
        return self.log.maybe_commit(committed_index(self.voters, match), self.term)

    def _bcast_append(self, send_if_empty: bool = True) -> None:
        # Voters and learners alike.
        for v in list(self.prs):
            if v != self.id:
                self._send_append(v, send_if_empty)

    def _bcast_heartbeat(self, routine: bool = False) -> None:
        all_replicated = self._all_replicated_now()
        for v in self.prs:
            if v != self.id:
                commit = min(self.prs[v].match, self.log.committed)
                self._send(
                    Message(
                        MessageType.HEARTBEAT,
                        self.id,
                        v,
                        self.term,
                        commit=commit,
                        context=self.read_round,
                        transferee=self.lead_transferee,
                        all_replicated=all_replicated,
                        routine=routine and self.lead_transferee == NO_NODE,
                        leader_commit=self.log.committed,
                    )
                )

    def _send_append(self, to: str, send_if_empty: bool = True) -> bool:
        pr = self.prs[to]
        if pr.is_paused():
            return False
        first = self.log.first_index()
        if first > 1 and pr.next <= first:
            # It needs entries (or the term of one) that log GC discarded here: only a copy
            # of the state can bring it up.  The copy must hold ``first``, whose term the
            # next APPEND's previous entry then is; nothing is sent to it meanwhile.
            pr.become_snapshot(first)
            self._send(Message(MessageType.SNAPSHOT, self.id, to, self.term, index=first))
            return True
        prev = pr.next - 1
        try:
            entries = self.log.entries(pr.next, self.config.max_size_per_msg)
            prev_term = self.log.term(prev)
        except EntriesUnreadable as e:
            if e.transient:
                return False  # sent to at its next chance: a heartbeat's answer, say
            # Nothing more goes to it from this log; the driver fails the replica, which
            # hands leadership to a voter that holds its whole log.
            if self.read_failure is None:
                self.read_failure = e
            pr.become_snapshot(max(pr.next, self.log.committed))
            return False
        if not entries and not send_if_empty:
            return False
        self._send(
            Message(
                MessageType.APPEND,
                self.id,
                to,
                self.term,
                log_term=prev_term,
                index=prev,
                entries=tuple(entries),
                commit=self.log.committed,
                transferee=self.lead_transferee,
                all_replicated=self._all_replicated_now(),
            )
        )
        if not entries:
            pr.sent_entries(None)
        elif self.config.max_inflight_bytes:
            pr.sent_entries(entries[-1].index, sum(e.size() for e in entries))
        else:
            pr.sent_entries(entries[-1].index)
        return True

    def _send(self, m: Message) -> None:
        self.msgs.append(m)
