"""Is a recorded history linearizable? Register keys by search, unique inserts by set algebra.

**Registers.** Each key of the register workload is a register whose value starts as None (no
row). A history is linearizable if some total order of its operations, consistent with real
time (an op that returned before another was called comes first), is a legal sequential run
of the register in which every acknowledged (``OK``) operation appears. Keys are independent
(Herlihy & Wing's locality; Horn & Kroening's P-compositionality), so ``check_registers``
checks each key alone, which is what keeps the search tractable.

The search is Wing & Gong's, with Lowe's memoisation ("Testing for linearizability", 2017):
the calls and returns of one key sit in a doubly linked list in time order; a call ahead of
every remaining return is *minimal* and may be linearized next (it is lifted out of the list
with its return); reaching a return whose op is still unlinearized means the last choice was
wrong, so the search backtracks. A configuration is the set of linearized ops (int bitsets)
and the register's value; one already explored leads nowhere new and is skipped. Two sound
shortcuts (``_search``) keep it to seconds for 20,000 ops of 16 clients: a legal read is
taken at once, and an INFO op whose value nothing left observes is never taken. A search
that runs out of its time or of its memory cap gives the verdict UNKNOWN.

What the outcomes mean here:

- ``FAIL`` ops certainly did not take effect and are dropped (a failed CAS included: whether
  it was refused or found another value, it changed nothing; dropping it is the lenient
  reading). Reads that are not ``OK`` saw nothing and are dropped too.
- ``INFO`` writes and CASes may take effect at any moment after their call, or never: they
  have no return in the list (their return is at +infinity) and the search succeeds once
  every ``OK`` op is linearized, whether or not they were.
- Two ops overlap unless one's ``return_ns`` is strictly before the other's ``call_ns``: at
  equal times the call is ordered before the return. Clocks of different client threads
  disagree by a little; the lenient choice cannot report a violation that is only an artefact
  of a tie.

A violation comes with a counter-example: a short failing prefix in call order (the ops
called before the point the search could not get past), cut from the front, then shrunk by
removing ops while the rest still fails, so a stale read is reported as the two or three ops
that make it one rather than as twenty thousand. Every cut keeps the ops that set the values
the kept ops observe, so the counter-example fails for the reason the whole history does.

**Unique inserts** are checked against the keys present after the run: an acknowledged
insert must be there, a definitely failed one must not, and nothing else may be.

The module does no I/O: histories come in as ``Op`` lists, verdicts go out as dataclasses.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from raftlet.chaos.history import Op, OpKind, Outcome

__all__ = [
    "REGISTER_KINDS",
    "CheckResult",
    "InsertVerdict",
    "KeyVerdict",
    "check_register",
    "check_registers",
    "check_unique_inserts",
]

REGISTER_KINDS = frozenset({OpKind.WRITE, OpKind.READ, OpKind.CAS})

# The search looks at the clock once per this many steps (a power of two, tested with a
# mask): a step is well under a microsecond, so the deadline is kept to about a millisecond.
_CLOCK_EVERY = 256
# A search that has cached this many configurations gives up (UNKNOWN) rather than take the
# checker's memory past a gigabyte or so (a configuration costs 100-300 bytes).
_MAX_CONFIGURATIONS = 4_000_000

_WRITE, _READ, _CAS = 0, 1, 2


class CheckResult(StrEnum):
    LINEARIZABLE = "linearizable"
    NOT_LINEARIZABLE = "not linearizable"
    # The search ran out of its time budget or its memory cap: no verdict either way.
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class KeyVerdict:
    """The verdict on one register key.

    ``ops_checked`` counts the ops that carry information (after dropping ``FAIL`` ops and
    reads that are not ``OK``). ``counterexample`` is empty unless the key is not
    linearizable; then it is a small failing sub-history in call order, with times relative
    to its first call.
    """

    key: int
    result: CheckResult
    ops_checked: int
    elapsed_s: float
    counterexample: list[Op] = field(default_factory=list)

    def describe(self) -> str:
        head = (
            f"key {self.key}: {self.result.value} "
            f"({self.ops_checked} ops checked in {self.elapsed_s:.3f} s)"
        )
        if self.result is CheckResult.UNKNOWN:
            return (
                head + "\n  the search ran out of its time (or memory) budget; it decided nothing"
            )
        if not self.counterexample:
            return head
        lines = [head, f"  a failing sub-history of {len(self.counterexample)} ops (ms):"]
        lines += [f"    {op.describe()}" for op in self.counterexample]
        return "\n".join(lines)


@dataclass(frozen=True)
class InsertVerdict:
    """What became of the unique inserts (each key is attempted at most once).

    ``lost``: acknowledged but missing. ``failed_but_present``: reported as certainly not
    applied, yet there. ``phantom``: present but never attempted. ``info_present`` counts the
    indeterminate inserts that did take effect: any number is legal, it only says how often
    an unknown outcome was in fact a success.
    """

    lost: list[int]
    failed_but_present: list[int]
    phantom: list[int]
    ok_count: int
    fail_count: int
    info_count: int
    info_present: int

    @property
    def ok(self) -> bool:
        return not (self.lost or self.failed_but_present or self.phantom)

    def describe(self, limit: int = 20) -> str:
        """A summary line, then for each kind of violation its count and up to ``limit``
        ids."""
        lines = [
            f"inserts: {self.ok_count} ok, {self.fail_count} fail, {self.info_count} info "
            f"({self.info_present} of those present): {'ok' if self.ok else 'VIOLATED'}"
        ]
        for name, keys in (
            ("lost (acknowledged, missing)", self.lost),
            ("failed but present", self.failed_but_present),
            ("phantom (never attempted)", self.phantom),
        ):
            if keys:
                lines.append(f"  {name}: {len(keys)}: {_abbreviate(keys, limit)}")
        return "\n".join(lines)


def check_registers(ops: Iterable[Op], budget_s_per_key: float) -> dict[int, KeyVerdict]:
    """Check every key's register ops on its own (other kinds are ignored), in key order.

    Each key gets its own budget so that one hard key cannot starve the others of a verdict.
    """
    by_key: dict[int, list[Op]] = {}
    for op in ops:
        if op.kind in REGISTER_KINDS:
            by_key.setdefault(op.key, []).append(op)
    return {
        key: check_register(key_ops, budget_s_per_key, key=key)
        for key, key_ops in sorted(by_key.items())
    }


def check_register(ops: Sequence[Op], budget_s: float, *, key: int | None = None) -> KeyVerdict:
    """Decide whether one key's history is linearizable, within ``budget_s`` seconds.

    The budget covers the search and, on a violation, the shrinking of the counter-example
    (which then gets whatever time is left). ``key`` names the key of an empty history; it is
    otherwise taken from the ops, which must all be of one key.
    """
    started = time.monotonic()
    deadline = started + budget_s
    key = _the_key(ops, key)
    relevant = _relevant(ops)
    decision = _decide(relevant, deadline)
    counterexample: list[Op] = []
    if decision.linearizable is False:
        counterexample = _counterexample(relevant, decision.frontier_ns, deadline)
    return KeyVerdict(
        key=key,
        result=_RESULTS[decision.linearizable],
        ops_checked=len(relevant),
        elapsed_s=time.monotonic() - started,
        counterexample=counterexample,
    )


def check_unique_inserts(ops: Iterable[Op], present: Collection[int]) -> InsertVerdict:
    """Compare the insert attempts with the keys found after the cluster healed and converged.

    Only ``INSERT`` ops are considered. A key attempted twice breaks the workload's promise
    of unique keys, which would make "lost" and "failed but present" ambiguous: ValueError.
    """
    outcomes: dict[int, Outcome] = {}
    repeated: set[int] = set()
    for op in ops:
        if op.kind is OpKind.INSERT:
            if op.key in outcomes:
                repeated.add(op.key)
            outcomes[op.key] = op.outcome
    if repeated:
        raise ValueError(f"keys inserted more than once: {_abbreviate(sorted(repeated))}")
    present_set = set(present)
    by_outcome: dict[Outcome, set[int]] = {outcome: set() for outcome in Outcome}
    for k, outcome in outcomes.items():
        by_outcome[outcome].add(k)
    return InsertVerdict(
        lost=sorted(by_outcome[Outcome.OK] - present_set),
        failed_but_present=sorted(by_outcome[Outcome.FAIL] & present_set),
        phantom=sorted(present_set - outcomes.keys()),
        ok_count=len(by_outcome[Outcome.OK]),
        fail_count=len(by_outcome[Outcome.FAIL]),
        info_count=len(by_outcome[Outcome.INFO]),
        info_present=len(by_outcome[Outcome.INFO] & present_set),
    )


_RESULTS = {
    True: CheckResult.LINEARIZABLE,
    False: CheckResult.NOT_LINEARIZABLE,
    None: CheckResult.UNKNOWN,
}


def _the_key(ops: Sequence[Op], key: int | None) -> int:
    keys = {op.key for op in ops}
    if key is not None:
        keys.add(key)
    if len(keys) != 1:
        raise ValueError(f"check_register checks one key, got {sorted(keys) or 'none'}")
    return keys.pop()


def _relevant(ops: Sequence[Op]) -> list[Op]:
    """The ops that say something about the register, in call order."""
    kept = []
    for op in ops:
        if op.kind not in REGISTER_KINDS:
            raise ValueError(f"not a register op: {op.describe()}")
        if op.outcome is Outcome.FAIL or (op.kind is OpKind.READ and op.outcome is not Outcome.OK):
            continue
        if op.outcome is Outcome.OK and op.return_ns < op.call_ns:
            raise ValueError(f"returned before its call: {op.describe()}")
        kept.append(op)
    kept.sort(key=lambda op: (op.call_ns, op.id))
    return kept


class _Decision(NamedTuple):
    linearizable: bool | None
    # When a search found a violation: the time of the furthest entry it reached. Nothing
    # called later mattered to it, so the ops called by then are a good failing prefix.
    frontier_ns: int | None = None


def _linearizable(ops: Sequence[Op], deadline: float) -> bool | None:
    """True, False, or None if out of time or memory. ``ops`` are relevant, in call order."""
    return _decide(ops, deadline).linearizable


def _decide(ops: Sequence[Op], deadline: float) -> _Decision:
    if _observes_unwritten_value(ops):
        return _Decision(False)
    return _search(_without_inert_indeterminate(ops), deadline)


def _observes_unwritten_value(ops: Sequence[Op]) -> bool:
    """An acknowledged read or CAS saw a value no op ever wrote: a violation found without
    searching, which matters when many indeterminate ops would make the search long."""
    written = {None}
    for op in ops:
        if op.kind is not OpKind.READ:
            written.add(_new_value(op))
    return any(_observed_value(op) not in written for op in ops if op.outcome is Outcome.OK)


def _without_inert_indeterminate(ops: Sequence[Op]) -> list[Op]:
    """Drop the INFO ops that cannot matter: a CAS setting the value it expects, and writes
    and CASes whose new value no op observes (reads, or expects in a CAS).

    Sound both ways: an INFO op may never take effect, so a linearization without it is one
    with it; and one with it stays legal without it, since no kept op saw its value (the
    argument of ``_Shrinking``). It matters because every pending INFO op is a branch at
    every step of the search, and a run with many timeouts has many of them.
    """
    live = [op for op in ops if op.outcome is Outcome.OK or _changes_value(op)]
    observed = {_observed_value(op) for op in live if op.kind is not OpKind.WRITE}
    return [op for op in live if op.outcome is Outcome.OK or _new_value(op) in observed]


def _new_value(op: Op) -> Any:
    return op.value[1] if op.kind is OpKind.CAS else op.value


def _observed_value(op: Op) -> Any:
    return op.value[0] if op.kind is OpKind.CAS else op.value


def _changes_value(op: Op) -> bool:
    # A CAS that sets the value it expects changes nothing: it only observes, as a read does.
    return op.kind is OpKind.WRITE or (op.kind is OpKind.CAS and op.value[0] != op.value[1])


@dataclass
class _Tables:
    """One key's ops as the search indexes them: parallel lists by op number (call order)."""

    kinds: list[int]
    # Values are numbered (None is 0) so that the register's state is a small int.
    new_value: list[int]  # what a write or a changing CAS sets; -1 otherwise
    observed: list[int]  # what a read returned or a CAS expected; -1 for a write
    required: list[bool]  # OK: must be linearized; INFO: may never take effect
    # An OK op's rank among OK ops, an INFO op's among INFO ops: its bit in the bitsets.
    bit: list[int]
    # Per value number: how many ops observe it. The search keeps this for the ops not yet
    # linearized: an INFO op whose value nothing left observes is not worth taking.
    observers: list[int]


def _tables(ops: Sequence[Op]) -> _Tables:
    numbers: dict[Any, int] = {None: 0}
    tables = _Tables([], [], [], [], [], [])
    ranks = {Outcome.OK: 0, Outcome.INFO: 0}
    for op in ops:
        changes = _changes_value(op)
        if op.kind is OpKind.WRITE:
            tables.kinds.append(_WRITE)
        else:
            tables.kinds.append(_CAS if changes else _READ)
        tables.new_value.append(numbers.setdefault(_new_value(op), len(numbers)) if changes else -1)
        if op.kind is OpKind.WRITE:
            tables.observed.append(-1)
        else:
            tables.observed.append(numbers.setdefault(_observed_value(op), len(numbers)))
        tables.required.append(op.outcome is Outcome.OK)
        tables.bit.append(ranks[op.outcome])
        ranks[op.outcome] += 1
    tables.observers = [0] * len(numbers)
    for value in tables.observed:
        if value >= 0:
            tables.observers[value] += 1
    return tables


def _time_ordered_entries(ops: Sequence[Op]) -> list[tuple[int, int]]:
    """(time, entry) in time order: entry ``i`` is op i's call, ``n + i`` its return (OK ops
    only). At equal times calls sort before returns, so ops that touch at one instant overlap.
    """
    n = len(ops)
    events = [(op.call_ns, 0, i) for i, op in enumerate(ops)]
    events += [(op.return_ns, 1, n + i) for i, op in enumerate(ops) if op.outcome is Outcome.OK]
    events.sort()
    return [(at, entry) for at, _, entry in events]


def _search(ops: Sequence[Op], deadline: float) -> _Decision:
    """Wing & Gong's search with Lowe's cache, iterative, over one key's relevant ops.

    A configuration is (the linearized OK ops, the linearized INFO ops, the state). The OK
    ops are linearized roughly in call order, so their set is kept as ``base`` (every OK op
    ranked below it is linearized) and a small ``window`` bitset above it: a cache entry is a
    few dozen bytes rather than one bit per op of the key.

    Two refinements of the plain search, both losing nothing:

    - An op that only observes (a read, or a CAS that sets what it expects) and is legal now
      is linearized at once and never reconsidered: in any successful continuation it can be
      moved to the front, since it is minimal (nothing unlinearized returned before its call)
      and changes nothing for the ops it passes. So when the search backs out of such an op
      it keeps backing out, and if the configuration after it is known to fail, so is the
      one before. Otherwise every subset of the concurrent reads of one value would be a
      configuration of its own.
    - An INFO op whose value no unlinearized op observes is not taken: dropping it from any
      successful continuation leaves one (the argument of ``_Shrinking``). Otherwise an
      indeterminate write would stay a branch at every step until the end of the history.

    One long function on purpose: this loop is the checker's whole cost, and locals, ints
    and parallel lists are what make CPython fast enough for 20,000-op keys.
    """
    t = _tables(ops)
    kinds, new_value, observed, required, bit = t.kinds, t.new_value, t.observed, t.required, t.bit
    pending_observers = t.observers
    n = len(ops)
    remaining = sum(required)
    if not remaining:
        return _Decision(True)
    timeline = _time_ordered_entries(ops)
    head, end = 2 * n, 2 * n + 1
    nxt = [end] * (2 * n + 2)
    prv = [head] * (2 * n + 2)
    position = [0] * (2 * n + 2)
    previous = head
    for place, (_, entry) in enumerate(timeline):
        nxt[previous] = entry
        prv[entry] = previous
        position[entry] = place
        previous = entry
    prv[end] = previous
    position[end] = len(timeline)

    state = window = base = info = 0
    cache: set[tuple[int, int, int, int]] = set()
    stack: list[tuple[int, int, int, int, int]] = []
    furthest = 0
    entry = nxt[head]
    steps = 0
    clock_mask = _CLOCK_EVERY - 1
    monotonic = time.monotonic
    while remaining:
        steps += 1
        if not steps & clock_mask and (monotonic() > deadline or len(cache) > _MAX_CONFIGURATIONS):
            return _Decision(None)
        if entry < n:
            kind = kinds[entry]
            if kind == _WRITE:
                new_state = new_value[entry]
            elif state != observed[entry]:
                entry = nxt[entry]
                continue
            elif kind == _CAS:
                new_state = new_value[entry]
            else:
                new_state = state
            if required[entry]:
                new_info = info
                offset = bit[entry] - base
                new_window = window | (1 << offset)
                new_base = base
                if not offset:
                    ones = (~new_window & (new_window + 1)).bit_length() - 1
                    new_window >>= ones
                    new_base += ones
            elif pending_observers[new_state]:
                new_window, new_base = window, base
                new_info = info | (1 << bit[entry])
            else:
                entry = nxt[entry]
                continue
            configuration = (new_window, new_base, new_info, new_state)
            if configuration not in cache:
                cache.add(configuration)
                stack.append((entry, state, window, base, info))
                state, window, base, info = new_state, new_window, new_base, new_info
                if kind != _WRITE:
                    pending_observers[observed[entry]] -= 1
                if position[entry] > furthest:
                    furthest = position[entry]
                # Lift the call, and the return of an op that has one, out of the list.
                before, after = prv[entry], nxt[entry]
                nxt[before] = after
                prv[after] = before
                if required[entry]:
                    remaining -= 1
                    ret = n + entry
                    before, after = prv[ret], nxt[ret]
                    nxt[before] = after
                    prv[after] = before
                entry = nxt[head]
                continue
            if kind != _READ:
                entry = nxt[entry]
                continue
        # A return whose op is not linearized yet, the end of the list, or a read that leads
        # where the search failed before: undo the latest choice (and any reads taken after
        # it) and try the next minimal call after it.
        if position[entry] > furthest:
            furthest = position[entry]
        while True:
            if not stack:
                frontier = timeline[furthest][0] if furthest < len(timeline) else None
                return _Decision(False, frontier)
            entry, state, window, base, info = stack.pop()
            if kinds[entry] != _WRITE:
                pending_observers[observed[entry]] += 1
            # Unlift in the reverse order of the lift, so the saved neighbours are right.
            if required[entry]:
                remaining += 1
                ret = n + entry
                nxt[prv[ret]] = ret
                prv[nxt[ret]] = ret
            nxt[prv[entry]] = entry
            prv[nxt[entry]] = entry
            if kinds[entry] != _READ:
                break
        entry = nxt[entry]
    return _Decision(True)


def _counterexample(ops: list[Op], frontier_ns: int | None, deadline: float) -> list[Op]:
    """A small failing sub-history of the failing ``ops`` (in call order), times relative.

    Cut the end (the ops called by the search's frontier, or else the shortest failing
    prefix), then the start (the latest failing suffix of that), then remove chunks down to
    single ops while what is left still fails. Best effort within the deadline: when it
    passes, the smallest failing history found so far is the answer. Every candidate is
    closed under "the ops that set a value some kept op observes" (see ``_Shrinking``), so
    what remains convicts the whole history.
    """
    shrinking = _Shrinking(ops, deadline)
    failing = shrinking.shrink(shrinking.latest_failing_start(shrinking.prefix(frontier_ns)))
    origin = ops[failing[0]].call_ns
    return [
        dataclasses.replace(
            ops[i], call_ns=ops[i].call_ns - origin, return_ns=ops[i].return_ns - origin
        )
        for i in failing
    ]


class _Shrinking:
    """Sub-histories of one failing history ``ops``, as sorted lists of indexes into it.

    A sub-history fails for a reason of the whole history only if no op it keeps observes a
    value that a removed op sets. Take a linearization of the whole and drop the removed ops:
    each kept read or CAS saw the value of the last op before it that changed the register;
    that op set a value the kept op observes, so it is kept, and still comes last before it.
    Every kept op sees what it saw and the order stays legal: if the whole were linearizable,
    the part would be. So each candidate gets back the setters of what it observes (``closed``):
    a stale read of 1 keeps the write of 1, rather than shrinking to a read of a value nobody
    wrote, and a prefix does not fail merely for cutting off the write a running read saw.
    """

    def __init__(self, ops: list[Op], deadline: float) -> None:
        self._ops = ops
        self._deadline = deadline
        self._setters: dict[Any, list[int]] = {}
        for i, op in enumerate(ops):
            if _changes_value(op):
                self._setters.setdefault(_new_value(op), []).append(i)

    def out_of_time(self) -> bool:
        return time.monotonic() >= self._deadline

    def closed(self, indexes: Iterable[int]) -> list[int]:
        kept = set(indexes)
        todo = list(kept)
        while todo:
            op = self._ops[todo.pop()]
            if op.kind is OpKind.WRITE:
                continue
            for setter in self._setters.get(_observed_value(op), ()):
                if setter not in kept:
                    kept.add(setter)
                    todo.append(setter)
        return sorted(kept)

    def fails(self, indexes: list[int]) -> bool:
        if not indexes:
            return False
        return _linearizable([self._ops[i] for i in indexes], self._deadline) is False

    def prefix(self, frontier_ns: int | None) -> list[int]:
        """The ops called by the frontier of the search that failed, if they fail too.

        They nearly always do: the search never looked past the frontier, so it would have
        gone the same way without the later ops, except where those kept an INFO op worth
        taking. One search of that prefix is much cheaper than bisecting, where every prefix
        past the violation costs a whole failing search.
        """
        if frontier_ns is not None:
            called = self.closed(i for i, op in enumerate(self._ops) if op.call_ns <= frontier_ns)
            if self.fails(called):
                return called
        return self.shortest_failing_prefix()

    def shortest_failing_prefix(self) -> list[int]:
        """Bisect on prefix length, keeping ``hi`` a prefix known to fail.

        Failing is not monotone in the prefix, so this finds a prefix that fails while the
        one an op shorter was not shown to: short, and certainly failing.
        """
        lo, hi = 0, len(self._ops)
        while hi - lo > 1 and not self.out_of_time():
            mid = (lo + hi) // 2
            if self.fails(self.closed(range(mid))):
                hi = mid
            else:
                lo = mid
        return self.closed(range(hi))

    def latest_failing_start(self, failing: list[int]) -> list[int]:
        """The same bisection from the other end: drop the longest head that can go."""
        lo, hi = 0, len(failing)
        while hi - lo > 1 and not self.out_of_time():
            mid = (lo + hi) // 2
            if self.fails(self.closed(failing[mid:])):
                lo = mid
            else:
                hi = mid
        return self.closed(failing[lo:])

    def shrink(self, failing: list[int]) -> list[int]:
        """Remove chunks, halving the chunk down to single ops, while the rest still fails.

        Ends when no single op can go (or at the deadline): the result is 1-minimal. An op
        that saw a value nobody sets fails on its own, and is the answer at once: removing
        ops one at a time cannot always get down to it, as two CASes that expect each
        other's values keep each other in (a read of a value never written once shrank to
        the read and both CASes).
        """
        for i in failing:
            op = self._ops[i]
            seen = None if op.kind is OpKind.WRITE else _observed_value(op)
            if seen is not None and seen not in self._setters and self.fails([i]):
                return [i]
        chunk = max(1, len(failing) // 2)
        while True:
            removed_any = False
            i = 0
            while i < len(failing) and not self.out_of_time():
                candidate = self.closed(failing[:i] + failing[i + chunk :])
                if len(candidate) < len(failing) and self.fails(candidate):
                    failing = candidate
                    removed_any = True
                else:
                    i += chunk
            if self.out_of_time() or (chunk == 1 and not removed_any):
                return failing
            chunk = max(1, chunk // 2)


def _abbreviate(keys: Sequence[int], limit: int = 20) -> str:
    shown = ", ".join(str(k) for k in keys[:limit])
    return shown + (f", … and {len(keys) - limit} more" if len(keys) > limit else "")
