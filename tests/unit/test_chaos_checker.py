"""The linearizability checker on hand-made histories, on histories simulated to be
linearizable by construction (and then corrupted), and the unique-insert check."""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from raftlet.chaos.checker import (
    CheckResult,
    check_register,
    check_registers,
    check_unique_inserts,
)
from raftlet.chaos.history import Op, OpKind, Outcome

OK, FAIL, INFO = Outcome.OK, Outcome.FAIL, Outcome.INFO
W, R, CAS, INS = OpKind.WRITE, OpKind.READ, OpKind.CAS, OpKind.INSERT

BUDGET_S = 10.0

_ids = itertools.count(1000)


def op(
    kind: OpKind,
    value: Any,
    call: int,
    ret: int,
    outcome: Outcome = OK,
    *,
    key: int = 1,
    process: int = 0,
    op_id: int | None = None,
) -> Op:
    return Op(
        id=next(_ids) if op_id is None else op_id,
        process=process,
        kind=kind,
        key=key,
        value=value,
        call_ns=call,
        return_ns=ret,
        outcome=outcome,
    )


def verdict_of(*ops: Op, budget_s: float = BUDGET_S) -> CheckResult:
    return check_register(ops, budget_s, key=1).result


def ids(ops: list[Op]) -> set[int]:
    return {o.id for o in ops}


# --- hand-made register histories -----------------------------------------------------------


def test_a_legal_concurrent_history() -> None:
    history = [
        op(W, 1, 0, 10, process=0),
        op(R, None, 1, 3, process=1),  # before the write took effect
        op(R, 1, 5, 15, process=1),
        op(W, 2, 12, 30, process=0),
        op(R, 1, 16, 20, process=2),  # w2 may not have taken effect yet
        op(R, 2, 21, 25, process=2),
        op(CAS, (2, 3), 31, 40, process=1),
        op(R, 3, 41, 42, process=0),
    ]
    verdict = check_register(history, BUDGET_S)
    assert verdict.result is CheckResult.LINEARIZABLE
    assert verdict.ops_checked == len(history)
    assert verdict.counterexample == []
    assert verdict.key == 1


def test_an_empty_history_is_linearizable() -> None:
    verdict = check_register([], BUDGET_S, key=9)
    assert (verdict.key, verdict.result) == (9, CheckResult.LINEARIZABLE)


def test_a_stale_read_is_reported_with_the_write_and_the_read() -> None:
    write = op(W, 1, 0, 10)
    stale = op(R, None, 20, 30)
    verdict = check_register([write, stale], BUDGET_S)
    assert verdict.result is CheckResult.NOT_LINEARIZABLE
    assert ids(verdict.counterexample) == {write.id, stale.id}
    # Times are relative to the counter-example's first call.
    assert [(o.call_ns, o.return_ns) for o in verdict.counterexample] == [(0, 10), (20, 30)]
    text = verdict.describe()
    assert "not linearizable" in text
    assert f"#{stale.id}" in text
    assert f"#{write.id}" in text


def test_the_counterexample_of_a_stale_read_in_a_long_history_is_just_its_ops() -> None:
    noise_before = [op(W, 100 + i, 10 * i, 10 * i + 5) for i in range(20)]
    noise_before += [op(R, 100 + i, 10 * i + 6, 10 * i + 8) for i in range(20)]
    w1 = op(W, 1, 300, 310)
    w2 = op(W, 2, 320, 330)
    stale = op(R, 1, 340, 350)
    noise_after = [op(W, 200 + i, 400 + 10 * i, 405 + 10 * i) for i in range(20)]
    noise_after += [op(R, 200 + i, 406 + 10 * i, 408 + 10 * i) for i in range(20)]
    verdict = check_register([*noise_before, w1, w2, stale, *noise_after], BUDGET_S)
    assert verdict.result is CheckResult.NOT_LINEARIZABLE
    assert ids(verdict.counterexample) == {w1.id, w2.id, stale.id}
    assert [o.id for o in verdict.counterexample] == [w1.id, w2.id, stale.id]


def test_a_lost_acknowledged_write() -> None:
    assert (
        verdict_of(
            op(W, 1, 0, 10),
            op(W, 2, 20, 30),  # acknowledged ...
            op(R, 1, 40, 50),  # ... yet never seen
            op(R, 1, 60, 70),
        )
        is CheckResult.NOT_LINEARIZABLE
    )


def test_a_duplicate_apply_brings_an_old_value_back() -> None:
    w1 = op(W, 1, 0, 10)
    w2 = op(W, 2, 20, 30)
    r2 = op(R, 2, 40, 50)
    r1 = op(R, 1, 60, 70)  # w1 applied again after w2
    verdict = check_register([w1, w2, r2, r1], BUDGET_S)
    assert verdict.result is CheckResult.NOT_LINEARIZABLE
    # r2 is not needed: w2 had completed before r1 began anyway.
    assert ids(verdict.counterexample) == {w1.id, w2.id, r1.id}


def test_reading_a_failed_write_is_a_violation() -> None:
    failed = op(W, 1, 0, 10, FAIL)
    read = op(R, 1, 20, 30)
    verdict = check_register([failed, read], BUDGET_S)
    assert verdict.result is CheckResult.NOT_LINEARIZABLE
    assert verdict.ops_checked == 1  # the failed write says nothing
    assert ids(verdict.counterexample) == {read.id}


def test_an_indeterminate_write_may_take_effect_or_not_at_any_time_after_its_call() -> None:
    info = op(W, 1, 0, 10, INFO)
    assert verdict_of(info, op(R, 1, 20, 30)) is CheckResult.LINEARIZABLE
    assert verdict_of(info, op(R, None, 20, 30)) is CheckResult.LINEARIZABLE
    # Its return time means nothing: it may land long after the client gave up.
    assert verdict_of(info, op(R, None, 100, 110), op(R, 1, 200, 210)) is CheckResult.LINEARIZABLE
    # But not before its call, and at most once.
    assert verdict_of(op(R, 1, 0, 5), op(W, 1, 10, 20, INFO)) is CheckResult.NOT_LINEARIZABLE
    assert (
        verdict_of(info, op(R, 1, 20, 30), op(W, 2, 40, 50), op(R, 1, 60, 70))
        is CheckResult.NOT_LINEARIZABLE
    )


def test_indeterminate_and_failed_reads_carry_no_information() -> None:
    assert (
        verdict_of(op(W, 1, 0, 10), op(R, 7, 20, 30, INFO), op(R, 8, 40, 50, FAIL))
        is CheckResult.LINEARIZABLE
    )


def test_the_register_starts_empty() -> None:
    assert verdict_of(op(R, None, 0, 10)) is CheckResult.LINEARIZABLE
    assert verdict_of(op(R, None, 0, 10), op(W, 1, 5, 20)) is CheckResult.LINEARIZABLE
    assert verdict_of(op(R, 1, 0, 10)) is CheckResult.NOT_LINEARIZABLE


def test_compare_and_set() -> None:
    w = op(W, 1, 0, 10)
    assert verdict_of(w, op(CAS, (1, 2), 20, 30), op(R, 2, 40, 50)) is CheckResult.LINEARIZABLE
    # An acknowledged CAS must have found its expected value.
    assert verdict_of(w, op(CAS, (5, 6), 20, 30)) is CheckResult.NOT_LINEARIZABLE
    assert verdict_of(op(CAS, (None, 1), 0, 10), op(R, 1, 20, 30)) is CheckResult.LINEARIZABLE
    # A failed CAS changed nothing.
    assert verdict_of(w, op(CAS, (1, 3), 20, 30, FAIL), op(R, 1, 40, 50)) is (
        CheckResult.LINEARIZABLE
    )
    assert verdict_of(w, op(CAS, (1, 3), 20, 30, FAIL), op(R, 3, 40, 50)) is (
        CheckResult.NOT_LINEARIZABLE
    )
    # An indeterminate CAS took effect or not.
    info = op(CAS, (1, 3), 20, 30, INFO)
    assert verdict_of(w, info, op(R, 3, 40, 50)) is CheckResult.LINEARIZABLE
    assert verdict_of(w, info, op(R, 1, 40, 50)) is CheckResult.LINEARIZABLE
    # ... but only where its expected value held.
    assert verdict_of(w, op(W, 2, 12, 15), info, op(R, 3, 40, 50)) is CheckResult.NOT_LINEARIZABLE


def test_two_compare_and_sets_cannot_both_succeed_from_one_value() -> None:
    assert (
        verdict_of(
            op(W, 0, 0, 1),
            op(CAS, (0, 1), 10, 20, process=1),
            op(CAS, (0, 2), 10, 20, process=2),
        )
        is CheckResult.NOT_LINEARIZABLE
    )


def test_an_overlapping_read_may_see_either_value() -> None:
    w1, w2 = op(W, 1, 0, 10), op(W, 2, 20, 40)
    assert verdict_of(w1, w2, op(R, 1, 25, 35)) is CheckResult.LINEARIZABLE
    assert verdict_of(w1, w2, op(R, 2, 25, 35)) is CheckResult.LINEARIZABLE
    # Once a read saw the new value, a later read cannot see the old one.
    assert verdict_of(w1, w2, op(R, 2, 22, 24), op(R, 1, 26, 30)) is CheckResult.NOT_LINEARIZABLE


def test_ops_that_touch_at_one_instant_overlap() -> None:
    w = op(W, 1, 0, 10)
    assert verdict_of(w, op(R, None, 10, 20)) is CheckResult.LINEARIZABLE
    assert verdict_of(w, op(R, None, 11, 20)) is CheckResult.NOT_LINEARIZABLE


def test_a_hard_history_runs_out_of_its_budget() -> None:
    # Twenty indeterminate writes pending at once, read back one by one, then 1 again: not
    # linearizable, but proving it means ruling out every subset of the writes.
    writes = [op(W, v, 0, 1, INFO, process=v) for v in range(1, 21)]
    reads = [op(R, v, 10 * v, 10 * v + 5) for v in range(1, 21)]
    history = [*writes, *reads, op(R, 1, 500, 505)]
    started = time.monotonic()
    verdict = check_register(history, 0.05)
    assert verdict.result is CheckResult.UNKNOWN
    assert verdict.counterexample == []
    assert time.monotonic() - started < 5
    assert "budget" in verdict.describe()


def test_one_key_per_check() -> None:
    with pytest.raises(ValueError, match="one key"):
        check_register([op(W, 1, 0, 1, key=1), op(W, 1, 0, 1, key=2)], BUDGET_S)
    with pytest.raises(ValueError, match="one key"):
        check_register([], BUDGET_S)


def test_check_registers_partitions_by_key_and_ignores_inserts() -> None:
    history = [
        op(W, 1, 0, 10, key=1),
        op(R, 1, 20, 30, key=1),
        op(W, 1, 0, 10, key=2),
        op(R, None, 20, 30, key=2),
        op(INS, 5, 0, 10, key=3),
    ]
    verdicts = check_registers(history, BUDGET_S)
    assert list(verdicts) == [1, 2]
    assert verdicts[1].result is CheckResult.LINEARIZABLE
    assert verdicts[2].result is CheckResult.NOT_LINEARIZABLE
    assert all(o.key == 2 for o in verdicts[2].counterexample)


# --- simulated histories --------------------------------------------------------------------


@dataclass
class _SimulatedOp:
    op_id: int
    kind: OpKind
    value: Any
    call: int
    indeterminate: bool
    applied: bool = False
    succeeded: bool = True


def simulated_history(rng: random.Random, processes: int, n_ops: int, info_rate: float) -> list[Op]:
    """A register run by ``processes`` clients, linearizable by construction: each op takes
    effect at one instant between its call and its return. An indeterminate write or CAS
    takes effect then, later (after its client gave up), or never."""
    register: Any = None
    values = itertools.count(1)
    in_flight: dict[int, _SimulatedOp] = {}
    limbo: list[_SimulatedOp] = []
    ops: list[Op] = []
    started = 0

    def apply(p: _SimulatedOp) -> None:
        nonlocal register
        p.applied = True
        if p.kind is W:
            register = p.value
        elif p.kind is R:
            p.value = register
        elif register == p.value[0]:
            register = p.value[1]
        else:
            p.succeeded = False

    for t in itertools.count(1):
        if started >= n_ops and not in_flight:
            return ops
        if limbo and rng.random() < 0.05:
            apply(limbo.pop(rng.randrange(len(limbo))))
        process = rng.randrange(processes)
        pending = in_flight.get(process)
        if pending is None:
            if started < n_ops:
                started += 1
                in_flight[process] = _start(rng, started, t, register, values, info_rate)
        elif not pending.applied and not (pending.indeterminate and rng.random() < 0.5):
            apply(pending)
        else:
            del in_flight[process]
            if pending.indeterminate and not pending.applied and rng.random() < 0.5:
                limbo.append(pending)
            ops.append(_finish(pending, process, t))
    raise AssertionError("unreachable")


def _start(
    rng: random.Random,
    op_id: int,
    t: int,
    register: Any,
    values: itertools.count[int],
    info_rate: float,
) -> _SimulatedOp:
    kind = rng.choice([W, R, R, CAS])
    value: Any = None
    if kind is W:
        value = next(values)
    elif kind is CAS:
        expected = register if rng.random() < 0.7 else rng.choice([None, 1, 2])
        value = (expected, next(values))
    return _SimulatedOp(op_id, kind, value, t, indeterminate=rng.random() < info_rate)


def _finish(p: _SimulatedOp, process: int, t: int) -> Op:
    if p.indeterminate:
        outcome = INFO
    elif p.succeeded:
        outcome = OK
    else:
        outcome = FAIL
    return Op(p.op_id, process, p.kind, 1, p.value, p.call, t, outcome)


@settings(max_examples=150, deadline=None)
@given(
    rng=st.randoms(use_true_random=False),
    processes=st.integers(1, 6),
    n_ops=st.integers(0, 60),
    info_rate=st.sampled_from([0.0, 0.1, 0.4]),
)
def test_simulated_histories_are_linearizable(
    rng: random.Random, processes: int, n_ops: int, info_rate: float
) -> None:
    history = simulated_history(rng, processes, n_ops, info_rate)
    assert verdict_of(*history) is CheckResult.LINEARIZABLE


def test_a_read_of_a_value_never_written_shrinks_to_it_past_cases_that_hold_each_other() -> None:
    """Two indeterminate CASes that expect each other's values keep each other in every
    sub-history, so removing one op at a time stopped at the read and both of them (the
    property test below found it)."""
    a = op(CAS, (2, 1), 2, 3, INFO, process=1)
    bad = op(R, -1, 5, 9, process=1)
    b = op(CAS, (1, 2), 6, 7, INFO)
    verdict = check_register([a, bad, b, op(R, None, 10, 13, process=1)], BUDGET_S)
    assert verdict.result is CheckResult.NOT_LINEARIZABLE
    assert [o.id for o in verdict.counterexample] == [bad.id]


@settings(max_examples=100, deadline=None)
@given(
    rng=st.randoms(use_true_random=False),
    processes=st.integers(1, 6),
    n_ops=st.integers(1, 60),
    info_rate=st.sampled_from([0.0, 0.1, 0.4]),
)
def test_a_read_of_a_value_never_written_is_caught(
    rng: random.Random, processes: int, n_ops: int, info_rate: float
) -> None:
    history = simulated_history(rng, processes, n_ops, info_rate)
    reads = [i for i, o in enumerate(history) if o.kind is R and o.outcome is OK]
    assume(reads)
    i = rng.choice(reads)
    history[i] = Op(**{**vars(history[i]), "value": -1})
    verdict = check_register(history, BUDGET_S)
    assert verdict.result is CheckResult.NOT_LINEARIZABLE
    assert [o.id for o in verdict.counterexample] == [history[i].id]


@settings(max_examples=100, deadline=None)
@given(
    rng=st.randoms(use_true_random=False),
    processes=st.integers(1, 6),
    n_ops=st.integers(1, 60),
    info_rate=st.sampled_from([0.0, 0.1, 0.4]),
)
def test_a_read_from_the_future_is_caught(
    rng: random.Random, processes: int, n_ops: int, info_rate: float
) -> None:
    # Unlike a value never written, this one passes the checker's quick test for unwritten
    # values, so only the search can find it.
    history = simulated_history(rng, processes, n_ops, info_rate)
    pairs = [
        (i, o.value if o.kind is W else o.value[1])
        for r in history
        if r.kind is R and r.outcome is OK
        for i in [history.index(r)]
        for o in history
        if o.kind in (W, CAS) and o.outcome is not FAIL and o.call_ns > r.return_ns
    ]
    assume(pairs)
    i, future = rng.choice(pairs)
    history[i] = Op(**{**vars(history[i]), "value": future})
    verdict = check_register(history, BUDGET_S)
    assert verdict.result is CheckResult.NOT_LINEARIZABLE
    assert history[i].id in ids(verdict.counterexample)


def brute_force_linearizable(ops: list[Op]) -> bool:
    """The definition, by exhaustive search without any of the checker's shortcuts: some
    order of all OK ops and any of the INFO ones respects real time and the register."""
    ops = [o for o in ops if o.outcome is not FAIL and not (o.kind is R and o.outcome is not OK)]

    def minimal(o: Op, placed: frozenset[int]) -> bool:
        return not any(
            p.outcome is OK and p.id not in placed and p.return_ns < o.call_ns for p in ops
        )

    def step(state: Any, o: Op) -> tuple[bool, Any]:
        if o.kind is W:
            return True, o.value
        if o.kind is R:
            return state == o.value, state
        return state == o.value[0], o.value[1]

    def extend(placed: frozenset[int], state: Any) -> bool:
        if all(o.id in placed for o in ops if o.outcome is OK):
            return True
        for o in ops:
            if o.id not in placed and minimal(o, placed):
                legal, after = step(state, o)
                if legal and extend(placed | {o.id}, after):
                    return True
        return False

    return extend(frozenset(), None)


@st.composite
def small_histories(draw: st.DrawFn) -> list[Op]:
    values = st.sampled_from([None, 1, 2, 3])
    history = []
    for op_id in range(draw(st.integers(0, 7))):
        kind = draw(st.sampled_from([W, W, R, R, CAS]))
        value = (draw(values), draw(values)) if kind is CAS else draw(values)
        call = draw(st.integers(0, 10))
        ret = call + draw(st.integers(0, 6))
        outcome = draw(st.sampled_from([OK, OK, OK, INFO, FAIL]))
        history.append(op(kind, value, call, ret, outcome, op_id=op_id, process=op_id))
    return history


@settings(max_examples=600, deadline=None)
@given(history=small_histories())
def test_the_checker_agrees_with_brute_force(history: list[Op]) -> None:
    # Small values and times make ties, repeated values, CASes that set what they expect,
    # and violations common; the counter-example must itself be a violation.
    verdict = check_register(history, BUDGET_S, key=1)
    expected = brute_force_linearizable(history)
    assert verdict.result is (
        CheckResult.LINEARIZABLE if expected else CheckResult.NOT_LINEARIZABLE
    )
    if not expected:
        assert verdict.counterexample
        assert not brute_force_linearizable(verdict.counterexample)


@pytest.mark.parametrize(("n_ops", "processes"), [(5000, 8), (20000, 16)])
def test_a_long_concurrent_history_checks_quickly(n_ops: int, processes: int) -> None:
    # About 0.05 s and 0.6 s on a laptop core; the budget is only there to catch a blow-up.
    history = simulated_history(random.Random(7), processes, n_ops, info_rate=0.05)
    assert len(history) == n_ops
    verdict = check_register(history, 30.0)
    assert verdict.result is CheckResult.LINEARIZABLE, verdict.describe()


def test_a_violation_deep_in_a_long_history_is_found_and_cut_down_to_its_ops() -> None:
    history = simulated_history(random.Random(7), processes=8, n_ops=5000, info_rate=0.05)
    reads = [i for i, o in enumerate(history) if o.kind is R and o.outcome is OK]
    i = reads[len(reads) * 3 // 4]
    future = next(
        o for o in history if o.kind is W and o.outcome is OK and o.call_ns > history[i].return_ns
    )
    history[i] = Op(**{**vars(history[i]), "value": future.value})
    verdict = check_register(history, 30.0)
    assert verdict.result is CheckResult.NOT_LINEARIZABLE
    assert ids(verdict.counterexample) == {history[i].id, future.id}


# --- unique inserts -------------------------------------------------------------------------


def inserts(*outcomes: tuple[int, Outcome]) -> list[Op]:
    return [op(INS, 0, 0, 1, outcome, key=key) for key, outcome in outcomes]


def test_inserts_all_accounted_for() -> None:
    history = inserts((1, OK), (2, OK), (3, FAIL), (4, INFO), (5, INFO))
    verdict = check_unique_inserts([*history, op(W, 1, 0, 1, key=99)], present={1, 2, 4})
    assert verdict.ok
    assert (verdict.ok_count, verdict.fail_count, verdict.info_count) == (2, 1, 2)
    assert verdict.info_present == 1
    assert (verdict.lost, verdict.failed_but_present, verdict.phantom) == ([], [], [])
    assert "VIOLATED" not in verdict.describe()


def test_an_acknowledged_insert_that_is_missing_is_lost() -> None:
    verdict = check_unique_inserts(inserts((1, OK), (2, OK), (3, OK)), present=[1])
    assert not verdict.ok
    assert verdict.lost == [2, 3]
    assert "lost" in verdict.describe()


def test_a_failed_insert_that_took_effect() -> None:
    verdict = check_unique_inserts(inserts((1, OK), (2, FAIL)), present=[1, 2])
    assert not verdict.ok
    assert verdict.failed_but_present == [2]


def test_a_row_nobody_inserted_is_a_phantom() -> None:
    verdict = check_unique_inserts(inserts((1, OK)), present=[1, 77])
    assert not verdict.ok
    assert verdict.phantom == [77]


def test_a_key_inserted_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="more than once"):
        check_unique_inserts(inserts((1, OK), (1, INFO)), present=[1])
