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
wrong, so the search backtracks. A configuration is the set of linearized ops (an int used as
a bitset) and the register's value; one already explored leads nowhere new and is skipped.

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

A violation comes with a counter-example: the shortest failing prefix in call order, then
shrunk by removing ops while the rest still fails, so a stale read is reported as the two or
three ops that make it one rather than as twenty thousand.

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
from typing import Any

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

_WRITE, _READ, _CAS = 0, 1, 2
_KIND_CODES = {OpKind.WRITE: _WRITE, OpKind.READ: _READ, OpKind.CAS: _CAS}


class CheckResult(StrEnum):
    LINEARIZABLE = "linearizable"
    NOT_LINEARIZABLE = "not linearizable"
    # The search ran out of its time budget: no verdict either way.
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
            return head + "\n  the search ran out of its budget; a larger one may decide"
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

    def describe(self) -> str:
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
                lines.append(f"  {name}: {len(keys)}: {_abbreviate(keys)}")
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
    verdict = _linearizable(relevant, deadline)
    counterexample: list[Op] = []
    if verdict is False:
        counterexample = _counterexample(relevant, deadline)
    return KeyVerdict(
        key=key,
        result=_RESULTS[verdict],
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


def _linearizable(ops: Sequence[Op], deadline: float) -> bool | None:
    """True, False, or None if the deadline passed first. ``ops`` are relevant, in call order."""
    if _observes_unwritten_value(ops):
        return False
    return _search(_without_unobserved_indeterminate(ops), deadline)


def _observes_unwritten_value(ops: Sequence[Op]) -> bool:
    """An acknowledged read or CAS saw a value no op ever wrote: a violation found without
    searching, which matters when many indeterminate ops would make the search long."""
    written = {None}
    for op in ops:
        if op.kind is not OpKind.READ:
            written.add(_new_value(op))
    return any(_observed_value(op) not in written for op in ops if op.outcome is Outcome.OK)


def _without_unobserved_indeterminate(ops: Sequence[Op]) -> list[Op]:
    """Drop the INFO writes and CASes whose new value no op observes (reads or expects).

    Sound: in any linearization that includes such an op, nothing between it and the next
    write can depend on its value (nothing observes it, and a CAS expecting it would), so the
    op can be taken out and the rest stays legal. It matters because every pending INFO op is
    a branch at every step of the search, and a run with many timeouts has many of them.
    """
    observed = {_observed_value(op) for op in ops if op.kind is not OpKind.WRITE}
    return [op for op in ops if op.outcome is not Outcome.INFO or _new_value(op) in observed]


def _new_value(op: Op) -> Any:
    return op.value[1] if op.kind is OpKind.CAS else op.value


def _observed_value(op: Op) -> Any:
    return op.value[0] if op.kind is OpKind.CAS else op.value


def _time_ordered_entries(ops: Sequence[Op]) -> list[int]:
    """Entry numbers in time order: ``i`` is op i's call, ``n + i`` its return (OK ops only).

    At equal times calls sort before returns, so ops that touch at one instant overlap.
    """
    n = len(ops)
    events = [(op.call_ns, 0, i) for i, op in enumerate(ops)]
    events += [(op.return_ns, 1, n + i) for i, op in enumerate(ops) if op.outcome is Outcome.OK]
    events.sort()
    return [entry for _, _, entry in events]


def _search(ops: Sequence[Op], deadline: float) -> bool | None:
    """Wing & Gong's search with Lowe's cache, iterative, over one key's relevant ops.

    One long function on purpose: this loop is the checker's whole cost, and locals, int
    bitsets and parallel lists are what make CPython fast enough for 20,000-op keys.
    """
    n = len(ops)
    kinds = [_KIND_CODES[op.kind] for op in ops]
    new_values = [_new_value(op) for op in ops]
    observed = [_observed_value(op) for op in ops]
    required = [op.outcome is Outcome.OK for op in ops]
    remaining = sum(required)
    if not remaining:
        return True
    head, end = 2 * n, 2 * n + 1
    nxt = [end] * (2 * n + 2)
    prv = [head] * (2 * n + 2)
    previous = head
    for entry in _time_ordered_entries(ops):
        nxt[previous] = entry
        prv[entry] = previous
        previous = entry
    prv[end] = previous

    state: Any = None
    linearized = 0
    cache: set[tuple[int, Any]] = set()
    stack: list[tuple[int, Any]] = []
    entry = nxt[head]
    steps = 0
    clock_mask = _CLOCK_EVERY - 1
    monotonic = time.monotonic
    while remaining:
        steps += 1
        if not steps & clock_mask and monotonic() > deadline:
            return None
        if entry < n:
            kind = kinds[entry]
            if kind == _READ:
                legal = state == observed[entry]
                new_state = state
            else:
                legal = kind == _WRITE or state == observed[entry]
                new_state = new_values[entry]
            if legal:
                candidate = linearized | (1 << entry)
                configuration = (candidate, new_state)
                if configuration not in cache:
                    cache.add(configuration)
                    stack.append((entry, state))
                    state = new_state
                    linearized = candidate
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
            entry = nxt[entry]
        else:
            # A return whose op is not linearized yet (or the end of the list): undo the
            # latest choice and try the next minimal call after it.
            if not stack:
                return False
            entry, state = stack.pop()
            linearized ^= 1 << entry
            # Unlift in the reverse order of the lift, so the saved neighbours are right.
            if required[entry]:
                remaining += 1
                ret = n + entry
                nxt[prv[ret]] = ret
                prv[nxt[ret]] = ret
            nxt[prv[entry]] = entry
            prv[nxt[entry]] = entry
            entry = nxt[entry]
    return True


def _counterexample(ops: list[Op], deadline: float) -> list[Op]:
    """A small failing sub-history of the failing ``ops`` (in call order), times relative.

    Best effort within the deadline: when it passes, the smallest failing history found so
    far is the answer (at worst all of ``ops``). Every step removes only ops whose removal
    cannot turn a linearizable history into one that is not (see ``_removal_is_sound``), so
    what remains convicts the whole history: a stale read of 1 keeps the write of 1 rather
    than shrinking to a read of a value nobody wrote.
    """
    failing = _shrink(_shortest_failing_prefix(ops, deadline), deadline)
    origin = failing[0].call_ns
    return [
        dataclasses.replace(op, call_ns=op.call_ns - origin, return_ns=op.return_ns - origin)
        for op in failing
    ]


def _still_fails(kept: Sequence[Op], removed: Sequence[Op], deadline: float) -> bool:
    return (
        bool(kept) and _removal_is_sound(kept, removed) and _linearizable(kept, deadline) is False
    )


def _removal_is_sound(kept: Sequence[Op], removed: Sequence[Op]) -> bool:
    """Would ``kept`` be linearizable whenever ``kept`` plus ``removed`` is?

    Yes if no kept op observes (reads, or expects in a CAS) a value that a removed op sets.
    Take a linearization of the whole; drop the removed ops. Each kept read or CAS saw the
    value of the last op before it that changed the register; that op set a value the kept
    op observes, so it is kept, and it still comes last before it: every kept op sees what it
    saw, and the order is still legal. Removing the write a read saw is not sound: the read
    would fail for a reason the full history explains.
    """
    set_by_removed = {_new_value(op) for op in removed if _changes_value(op)}
    return not any(
        _observed_value(op) in set_by_removed for op in kept if op.kind is not OpKind.WRITE
    )


def _changes_value(op: Op) -> bool:
    # A CAS that sets the value it expects changes nothing: it only observes, as a read does.
    return op.kind is OpKind.WRITE or (op.kind is OpKind.CAS and op.value[0] != op.value[1])


def _shortest_failing_prefix(ops: list[Op], deadline: float) -> list[Op]:
    """Bisect on prefix length, keeping ``hi`` a prefix known to fail.

    Failing is not monotone in the prefix, so this finds a prefix that fails while the one an
    op shorter was not shown to: short, and certainly failing, which is all the shrinking
    needs.
    """
    lo, hi = 0, len(ops)
    while hi - lo > 1 and time.monotonic() < deadline:
        mid = (lo + hi) // 2
        if _still_fails(ops[:mid], ops[mid:], deadline):
            hi = mid
        else:
            lo = mid
    return ops[:hi]


def _shrink(ops: list[Op], deadline: float) -> list[Op]:
    """Remove chunks of ops, halving the chunk down to single ops, while the rest still fails.

    Ends when no single op can go (or at the deadline): the result is 1-minimal.
    """
    chunk = max(1, len(ops) // 2)
    while True:
        removed_any = False
        i = 0
        while i < len(ops):
            if time.monotonic() >= deadline:
                return ops
            kept = ops[:i] + ops[i + chunk :]
            if _still_fails(kept, ops[i : i + chunk], deadline):
                ops = kept
                removed_any = True
            else:
                i += chunk
        if chunk == 1 and not removed_any:
            return ops
        chunk = max(1, chunk // 2)


def _abbreviate(keys: Sequence[int], limit: int = 20) -> str:
    shown = ", ".join(str(k) for k in keys[:limit])
    return shown + (f", … ({len(keys) - limit} more)" if len(keys) > limit else "")
