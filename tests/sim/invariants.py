"""Raft's safety properties (paper Figure 3), checked after every simulated event.

The checker never reads a RawNode: the cluster reports what it observes
(``observe_*``), so a test can feed it fabricated states and prove that each check
really fires (tests/sim/test_invariants.py).  Everything it remembers is history
("ever seen"), which is what makes cross-time properties checkable:

- election safety: at most one leader per term, over the whole run;
- log matching: an (index, term) pair names one entry with one predecessor term,
  in every log at every moment (by induction, equal (index, term) then means equal
  prefixes);
- leader completeness: a leader holds every entry committed in a term <= its own;
- state-machine safety: every node applies one and the same sequence, in every
  incarnation, with no hole: each entry applied directly follows the last one, or the
  state the node started from (a flushed state machine after a restart, a leader's copy
  after an install), which must itself be a prefix of that sequence;
- logs may start late (log GC, or the stand-in entry of an installed copy): the first
  entry of such a log is only an anchor -- it must name a committed entry (its index and
  term); only entries after it are checked as log entries;
- per incarnation, commit index and term never decrease;
- durable term never decreases, and a durable vote never changes within a term.

Membership (thesis §4.1; consensus/core/membership.py), from what the cluster reports --
the membership a node starts from (``observe_config``: the initial one, a restart's
persisted one, an installed copy's) and, after every event, the one it uses and the
``ConfState`` it hands its driver:

- a node uses the membership of the latest CONFIG entry in its log above the one it
  started from, or, with none there, the one it started from (a restart falls back to
  its persisted committed membership when the log no longer holds the entry of the
  persisted latest one, and when a later cut removes that entry); the ``ConfState`` it
  reports names that same membership at that same index;
- one server at a time: each CONFIG entry is one ``ConfigChange`` from the membership
  before it (add a learner, promote a learner, remove a member -- so at most one voter
  comes or goes); every CONFIG entry of a log but the latest is committed (at or below
  the highest commit index any node reported); and a leader appends one only after it
  committed an entry of its own term;
- the committed membership a node reports (and persists) is the initial one or one that
  some log held committed at that index, and no node uses a membership older than a
  committed CONFIG entry at or below the start of its log (which it has passed).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from raftlet.consensus.core import (
    NO_NODE,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Membership,
    Role,
)

__all__ = ["InvariantChecker", "InvariantViolation"]


class InvariantViolation(AssertionError):
    """A safety property failed; the message says how to replay the run."""


@dataclass(slots=True)
class _View:
    incarnation: int
    role: Role
    term: int
    committed: int
    log: list[Entry] = field(default_factory=list)
    first: int = 1  # index of log[0]
    applied: int = 0
    # Membership (None until the cluster reports one): the (index of its entry, membership)
    # the node started from; after a restart, the one to fall back to if the log does not
    # hold (or later loses) base's entry, and whether that was decided yet; the CONFIG
    # entries its log holds above base, oldest first.
    base: tuple[int, Membership] | None = None
    floor: tuple[int, Membership] | None = None
    unresolved: bool = False
    configs: list[tuple[int, Membership]] = field(default_factory=list)
    # How many of ``configs`` were recorded as committed; whether base was.
    recorded: int = 0
    base_recorded: bool = False
    conf: ConfState | None = None  # the last ConfState checked


class InvariantChecker:
    def __init__(self, replay: str = "") -> None:
        # The command that replays this run; part of every failure message.
        self.replay = replay
        self.leaders: dict[int, str] = {}
        # (index, term) -> (type, data, term of index - 1): see the module docstring.
        self._entry_at: dict[tuple[int, int], tuple[EntryType, bytes, int]] = {}
        # The one applied sequence; committed[i] has index i + 1.
        self.committed: list[Entry] = []
        # _commit_bound[i] is a term in which committed[i] was known to be committed
        # (the applier's term), lowered so the list never decreases: an entry
        # committed by term T makes every earlier entry committed by T as well.
        self._commit_bound: list[int] = []
        self._views: dict[str, _View] = {}
        self._durable: dict[str, HardState] = {}
        # Membership: every node's initial one; index -> membership of every CONFIG entry
        # seen committed in some log (and their indexes, sorted); the highest commit index
        # any node reported.
        self._initial: set[Membership] = set()
        self._started: set[str] = set()
        self._committed_configs: dict[int, Membership] = {}
        self._committed_config_indexes: list[int] = []
        self._max_commit = 0
        self.checks = 0

    def fail(self, what: str) -> NoReturn:
        raise InvariantViolation(f"invariant violated: {what}\n  replay: {self.replay}")

    # --- observations -------------------------------------------------------------------

    def observe_node(
        self,
        node: str,
        incarnation: int,
        *,
        role: Role,
        term: int,
        committed: int,
        log: Sequence[Entry],
        membership: Membership | None = None,
        conf: ConfState | None = None,
    ) -> None:
        """The node's volatile state right after an event; ``log`` is durable + unstable,
        from the first entry log GC (or an installed copy) left; ``membership`` the one it
        uses for votes and quorums, ``conf`` the ConfState it last handed its driver."""
        self.checks += 1
        view = self._views.get(node)
        if view is None or view.incarnation != incarnation:
            view = _View(incarnation, role, term, committed)
            self._views[node] = view
        else:
            if term < view.term:
                self.fail(f"{node}: term went back from {view.term} to {term}")
            if committed < view.committed:
                self.fail(f"{node}: commit index went back from {view.committed} to {committed}")
        view.role, view.term, view.committed = role, term, committed
        if committed > self._max_commit:
            self._max_commit = committed
        if role is Role.LEADER:
            first = self.leaders.setdefault(term, node)
            if first != node:
                self.fail(f"two leaders in term {term}: {first} and {node}")
        if view.unresolved:
            self._resolve_restart(view, log)
        self._check_log(node, view, log)
        self._check_committed_prefix(node, view)
        if role is Role.LEADER:
            self._check_leader_complete(node, view)
        if view.base is not None:
            self._check_membership(node, view, membership, conf)

    def observe_config(
        self,
        node: str,
        incarnation: int,
        config: tuple[int, Membership],
        committed: tuple[int, Membership] | None = None,
    ) -> None:
        """``node`` starts from membership ``config`` (the index of its CONFIG entry, 0: the
        initial membership, in no entry): at a start, before its first ``observe_node``, or
        just after it installed a copy that carried ``config``.  At a restart,
        ``committed`` is the membership it persisted as committed: the node falls back to it
        (and the CONFIG entries its log holds above it) if its log does not hold
        ``config``'s entry (thesis §4.1; ``consensus.core.Config``)."""
        self.checks += 1
        view = self._views.get(node)
        if view is None or view.incarnation != incarnation:
            view = _View(incarnation, Role.FOLLOWER, 0, 0)
            self._views[node] = view
            if node not in self._started and config[0] == 0:
                self._initial.add(config[1])
        self._started.add(node)
        if committed is not None:
            self._check_known_committed(node, committed, "persisted as committed")
        view.base = config
        view.floor = committed if committed is not None and committed[0] < config[0] else None
        view.unresolved = view.floor is not None
        view.configs = []
        view.recorded = 0
        view.base_recorded = config[0] == 0

    def observe_crash(self, node: str) -> None:
        # A crashed node is no one's leader any more and its volatile state is gone.
        self._views.pop(node, None)

    def observe_persisted(self, node: str, hard_state: HardState) -> None:
        self.checks += 1
        prev = self._durable.get(node)
        if prev is not None:
            if hard_state.term < prev.term:
                self.fail(f"{node}: durable term went back from {prev.term} to {hard_state.term}")
            if (
                hard_state.term == prev.term
                and prev.vote != NO_NODE
                and hard_state.vote != prev.vote
            ):
                self.fail(
                    f"{node}: durable vote in term {prev.term} changed "
                    f"from {prev.vote!r} to {hard_state.vote!r}"
                )
        self._durable[node] = hard_state

    def observe_applied(self, node: str, incarnation: int, entry: Entry, term: int) -> None:
        """``node`` (currently in ``term``) applied ``entry`` to its state machine."""
        self.checks += 1
        view = self._views.get(node)
        if view is None or view.incarnation != incarnation:
            self.fail(f"{node}: applied {entry} in an incarnation never observed")
        if entry.index != view.applied + 1:
            self.fail(f"{node}: applied index {entry.index} after {view.applied} (a hole)")
        view.applied = entry.index
        self._record(node, entry, term)

    def observe_state(
        self, node: str, incarnation: int, state: Sequence[tuple[int, int, bytes]]
    ) -> None:
        """``node``'s state machine was replaced by ``state`` -- (index, term, data) of each
        entry in it: a flushed one at a restart, or a leader's copy it installed.  It must be
        a prefix of the one applied sequence, without a hole; what the node applies next
        must follow it."""
        self.checks += 1
        view = self._views.get(node)
        if view is None or view.incarnation != incarnation:
            self.fail(f"{node}: state installed in an incarnation never observed")
        for pos, (index, term, data) in enumerate(state):
            if index != pos + 1:
                self.fail(f"{node}: state machine holds index {index} at position {pos + 1}")
            if index > len(self.committed):
                self.fail(f"{node}: state machine holds index {index}, never applied anywhere")
            c = self.committed[index - 1]
            if (c.term, c.data) != (term, data):
                self.fail(
                    f"state machines diverge at index {index}: {node}'s installed state has "
                    f"(term {term}, {data!r}), but {c} was applied"
                )
        view.applied = len(state)

    def _record(self, node: str, entry: Entry, term: int) -> None:
        """``entry`` was applied (by ``node``, in ``term``): it is the sequence's next, or
        must equal the one already there."""
        i = entry.index - 1
        if i < len(self.committed):
            if not _same(self.committed[i], entry):
                self.fail(
                    f"state machines diverge at index {entry.index}: {node} applied {entry}, "
                    f"another node applied {self.committed[i]}"
                )
            self._lower_bound(i, term)
            return
        self.committed.append(entry)
        self._commit_bound.append(term)
        self._lower_bound(i, term)
        # Leaders elected before this commit became known must hold it too.
        for other, v in self._views.items():
            if v.role is Role.LEADER:
                self._check_leader_complete(other, v)

    # --- checks -----------------------------------------------------------------------------

    def _check_log(self, node: str, view: _View, log: Sequence[Entry]) -> None:
        old, first = view.log, log[0].index if log else 1
        # Where the new log's first entry sits in the old one (GC moves it forward).
        shift = first - view.first
        if old and 0 <= shift <= len(old):
            n = min(len(old) - shift, len(log))
            # List equality is C-speed when the entries are the same objects, which
            # they are unless the log changed; only the changed suffix is examined.
            same = old[shift : shift + n] == log[:n]
            start = n if same else _first_difference(old[shift:], log)
        else:
            start = 0
        prev_term = log[start - 1].term if start > 0 else 0
        self._cut_configs(node, view, log, first, start)
        for pos in range(start, len(log)):
            e = log[pos]
            if e.index != first + pos:
                self.fail(f"{node}: log position {first + pos} holds index {e.index}")
            if pos == 0 and first > 1:
                # A compacted log's first entry (maybe a copy's stand-in): only its index
                # and term mean anything, and they must be a committed entry's.
                self._check_anchor(node, e)
                prev_term = e.term
                continue
            if e.term < prev_term:
                self.fail(f"{node}: term goes down in the log at {e.index}: {prev_term}, {e.term}")
            key = (e.index, e.term)
            this = (e.type, e.data, prev_term)
            seen = self._entry_at.setdefault(key, this)
            if seen != this:
                self.fail(
                    f"log matching: {node} has {_show(this)} at ({e.index}, term {e.term}), "
                    f"but another log had {_show(seen)} there"
                )
            prev_term = e.term
            if e.type is EntryType.CONFIG:
                self._add_config(node, view, e, log, first)
        view.log = list(log)
        view.first = first

    # --- membership ---------------------------------------------------------------------

    def _resolve_restart(self, view: _View, log: Sequence[Entry]) -> None:
        """A restart's membership: the persisted latest one if the log holds its entry, else
        the persisted committed one (the CONFIG entries above it are then found in the log)."""
        view.unresolved = False
        assert view.base is not None
        if not _has_config(log, log[0].index if log else 1, *view.base):
            self._fall_back(view)

    def _fall_back(self, view: _View) -> None:
        assert view.floor is not None
        view.base, view.floor = view.floor, None
        view.configs = []
        view.recorded = 0
        view.base_recorded = view.base[0] == 0

    def _cut_configs(
        self, node: str, view: _View, log: Sequence[Entry], first: int, start: int
    ) -> None:
        """The log changed from position ``start`` on: the CONFIG entries there are gone (an
        uncommitted change undone).  A restart's membership whose entry went with them
        falls back to the committed one, and to the CONFIG entries the log holds above it."""
        cut = first + start
        configs = view.configs
        if configs and configs[-1][0] >= cut:
            while configs and configs[-1][0] >= cut:
                configs.pop()
            view.recorded = min(view.recorded, len(configs))
        if view.floor is None or view.base is None or view.base[0] < cut:
            return
        if _has_config(log, first, *view.base):
            return
        self._fall_back(view)
        assert view.base is not None
        for pos in range(max(1 if first > 1 else 0, view.base[0] + 1 - first), start):
            if log[pos].type is EntryType.CONFIG:
                self._add_config(node, view, log[pos], log, first)

    def _add_config(
        self, node: str, view: _View, e: Entry, log: Sequence[Entry], first: int
    ) -> None:
        """CONFIG entry ``e`` is new in ``node``'s log (past its first entry)."""
        last = view.configs[-1] if view.configs else view.base
        last_index = last[0] if last is not None else 0
        if e.index <= last_index:
            # At or below the membership the node knows (a copy's, which may lie past the
            # copy's own index): an older one, which must not take it back.
            return
        try:
            membership = Membership.decode(e.data)
        except ValueError as why:
            self.fail(
                f"{node}: the CONFIG entry at ({e.index}, term {e.term}) is no membership: {why}"
            )
        if last is not None:
            why = _not_one_change(last[1], membership)
            if why is not None:
                self.fail(
                    f"{node}: the CONFIG entry at ({e.index}, term {e.term}), "
                    f"{_describe(membership)}, is no single change of the membership before "
                    f"it ({_describe(last[1])}, index {last_index}): {why}"
                )
            if last_index > self._max_commit:
                self.fail(
                    f"two membership changes uncommitted at once: {node}'s log has CONFIG "
                    f"entries at {last_index} and {e.index}, but no node ever committed past "
                    f"{self._max_commit}"
                )
        if view.role is Role.LEADER and e.term == view.term:
            pos = view.committed - first
            own = log[pos].term if 0 <= pos < len(log) else view.term
            if own != view.term:
                self.fail(
                    f"{node}, leader of term {view.term}, appended a membership change at "
                    f"{e.index} before it committed an entry of its term (its commit index "
                    f"{view.committed} holds term {own})"
                )
        view.configs.append((e.index, membership))

    def _check_membership(
        self, node: str, view: _View, membership: Membership | None, conf: ConfState | None
    ) -> None:
        base = view.base
        assert base is not None
        configs = view.configs
        # Record what became committed: CONFIG entries of the log, and the membership the node
        # started from once its commit index passes it (its log holding that entry).
        while view.recorded < len(configs) and configs[view.recorded][0] <= view.committed:
            self._record_config(node, *configs[view.recorded])
            view.recorded += 1
        if not view.base_recorded and base[0] <= view.committed:
            view.base_recorded = True
            pos = base[0] - view.first
            if (pos > 0 or (pos == 0 and view.first == 1)) and pos < len(view.log):
                e = view.log[pos]
                if e.type is not EntryType.CONFIG or e.data != base[1].encode():
                    self.fail(
                        f"{node} started from {_describe(base[1])} at index {base[0]}, but its "
                        f"log holds {e} there, committed"
                    )
                self._record_config(node, *base)
        latest = configs[-1] if configs else base
        if membership is not None and membership != latest[1]:
            self.fail(
                f"{node} uses {_describe(membership)}, but the latest membership it knows is "
                f"{_describe(latest[1])} (index {latest[0]})"
            )
        if conf is not None:
            if conf.index != latest[0] or conf.membership != latest[1]:
                self.fail(
                    f"{node} reports {_describe(conf.membership)} at index {conf.index} as its "
                    f"membership, but the latest it knows is {_describe(latest[1])} at index "
                    f"{latest[0]}"
                )
            if conf is not view.conf:
                view.conf = conf
                if conf.committed_index > conf.index:
                    self.fail(f"{node} reports a committed membership past its latest: {conf}")
                committed = (conf.committed_index, conf.committed)
                self._check_known_committed(node, committed, "reports as committed")
        if latest[0] < view.first:
            # Its log starts past its membership's entry: no committed change may lie between.
            indexes = self._committed_config_indexes
            i = bisect.bisect_right(indexes, view.first)
            if i and indexes[i - 1] > latest[0]:
                passed = indexes[i - 1]
                self.fail(
                    f"{node} uses {_describe(latest[1])} (index {latest[0]}), but its log starts "
                    f"at {view.first}, past the committed membership change at {passed} "
                    f"({_describe(self._committed_configs[passed])})"
                )

    def _record_config(self, node: str, index: int, membership: Membership) -> None:
        seen = self._committed_configs.get(index)
        if seen is None:
            self._committed_configs[index] = membership
            bisect.insort(self._committed_config_indexes, index)
        elif seen != membership:
            self.fail(
                f"{node} committed {_describe(membership)} at index {index}, but "
                f"{_describe(seen)} was committed there"
            )

    def _check_known_committed(self, node: str, config: tuple[int, Membership], what: str) -> None:
        index, membership = config
        if index == 0:
            if membership not in self._initial:
                self.fail(
                    f"{node} {what} the initial membership {_describe(membership)}, which no "
                    f"node started with"
                )
        elif self._committed_configs.get(index) != membership:
            self.fail(
                f"{node} {what} {_describe(membership)} (index {index}), which no log held "
                f"committed there"
            )

    def _check_anchor(self, node: str, e: Entry) -> None:
        # Log GC discards only what was applied, and a copy is of applied state: the
        # entry a log starts at was applied somewhere already.
        if e.index > len(self.committed):
            self.fail(f"{node}: log starts at {e.index}, past everything ever applied")
        c = self.committed[e.index - 1]
        if c.term != e.term:
            self.fail(f"{node}: log starts at ({e.index}, term {e.term}), but {c} was applied")

    def _holds(self, view: _View, c: Entry) -> bool:
        """Whether ``view``'s log agrees with committed entry ``c`` (True below its first
        entry: discarded, and its anchor was checked to be committed)."""
        pos = c.index - view.first
        if pos < 0:
            return True
        if pos >= len(view.log):
            return False
        if pos == 0 and view.first > 1:
            return view.log[0].term == c.term  # the anchor: a copy's stand-in, perhaps
        return _same(view.log[pos], c)

    def _entry(self, view: _View, index: int) -> Entry | None:
        pos = index - view.first
        return view.log[pos] if 0 <= pos < len(view.log) else None

    def _check_committed_prefix(self, node: str, view: _View) -> None:
        # A node's committed prefix is the one applied sequence; log matching makes
        # checking the last shared index enough.
        i = min(view.committed, len(self.committed), view.first + len(view.log) - 1)
        if i and not self._holds(view, self.committed[i - 1]):
            self.fail(
                f"{node}: committed entry at {i} is {self._entry(view, i)}, "
                f"but {self.committed[i - 1]} was applied"
            )

    def _check_leader_complete(self, node: str, view: _View) -> None:
        # Committed entries whose commit term is <= the leader's term.
        i = bisect.bisect_right(self._commit_bound, view.term)
        if i == 0:
            return
        if not self._holds(view, self.committed[i - 1]):
            have = self._entry(view, i)
            self.fail(
                f"leader completeness: {node}, leader of term {view.term}, has {have} at "
                f"index {i}, but {self.committed[i - 1]} was committed by term "
                f"{self._commit_bound[i - 1]}"
            )

    def _lower_bound(self, i: int, term: int) -> None:
        while i >= 0 and self._commit_bound[i] > term:
            self._commit_bound[i] = term
            i -= 1


def _same(a: Entry, b: Entry) -> bool:
    return a.index == b.index and a.term == b.term and a.type == b.type and a.data == b.data


def _has_config(log: Sequence[Entry], first: int, index: int, membership: Membership) -> bool:
    """Whether ``log`` (starting at ``first``) holds the CONFIG entry of ``membership`` at
    ``index``; an entry below the log (discarded: committed) or the initial membership
    counts as held, as in the core's recovery."""
    pos = index - first
    if index == 0 or pos < 0:
        return True
    if pos >= len(log):
        return False
    e = log[pos]
    return e.type is EntryType.CONFIG and e.data == membership.encode()


def _not_one_change(old: Membership, new: Membership) -> str | None:
    """Why ``new`` is not one ``ConfigChange`` of ``old`` (add a learner, promote a learner,
    remove a member), or None."""
    ov, ol, nv, nl = set(old.voters), set(old.learners), set(new.voters), set(new.learners)
    if nv == ov and nl > ol and len(nl - ol) == 1 and not (nl - ol) & ov:
        return None  # a learner added
    if len(nv - ov) == 1 and nv > ov and nv - ov == ol - nl and nl < ol:
        return None  # a learner promoted
    gone = (ov | ol) - (nv | nl)
    if len(gone) == 1 and nv <= ov and nl <= ol and (ov | ol) - gone == nv | nl and nv:
        return None  # a member removed
    return (
        f"voters {sorted(ov)} -> {sorted(nv)}, learners {sorted(ol)} -> {sorted(nl)}: not one "
        f"learner added, one learner promoted, or one member removed"
    )


def _describe(m: Membership) -> str:
    learners = f"; learners {', '.join(m.learners)}" if m.learners else ""
    return f"voters {', '.join(m.voters)}{learners}"


def _show(v: tuple[EntryType, bytes, int]) -> str:
    kind, data, prev_term = v
    return f"{kind.value} {data!r} after an entry of term {prev_term}"


def _first_difference(a: Sequence[Entry], b: Sequence[Entry]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
