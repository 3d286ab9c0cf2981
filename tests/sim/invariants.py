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
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from raftlet.consensus.core import NO_NODE, Entry, EntryType, HardState, Role

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
    ) -> None:
        """The node's volatile state right after an event; ``log`` is durable + unstable,
        from the first entry log GC (or an installed copy) left."""
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
        if role is Role.LEADER:
            first = self.leaders.setdefault(term, node)
            if first != node:
                self.fail(f"two leaders in term {term}: {first} and {node}")
        self._check_log(node, view, log)
        self._check_committed_prefix(node, view)
        if role is Role.LEADER:
            self._check_leader_complete(node, view)

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
        view.log = list(log)
        view.first = first

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


def _show(v: tuple[EntryType, bytes, int]) -> str:
    kind, data, prev_term = v
    return f"{kind.value} {data!r} after an entry of term {prev_term}"


def _first_difference(a: Sequence[Entry], b: Sequence[Entry]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
