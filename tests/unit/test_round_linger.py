"""A leader's writes that linger for more before their round goes (``TabletReplica._linger``):
after a round ends with fewer writes waiting than rounds carried lately, they wait -- until
enough have come, or the linger runs out -- and a linger that runs out lowers what rounds
are expected to carry.  The replica's clock is the test's: how long the last round took
(which bounds a linger) is what the test says; a linger's end is real time."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlet.tserver.errors import ServiceUnavailable
from raftlet.tserver.tablet_replica import ReplicaOptions, TabletReplica
from tests.unit.consensus_cluster import FAST, wait_for
from tests.unit.store_helpers import CommitHook
from tests.unit.test_tablet_replica import (
    Call,
    Tablet,
    _held_commits,
    _round_sizes,
    send,
    write,
)

# Longer than any test waits: a linger that must not run out is bounded by the round's
# time on the test's clock instead.
LONG_S = 600.0


class Clock:
    """The replica's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class Lingering:
    leader: TabletReplica
    sizes: list[int]
    hook: CommitHook
    go: threading.Semaphore
    clock: Clock
    waiting: list[Call]


def _tablet(tmp_path: Path, linger_s: float) -> Tablet:
    return Tablet(tmp_path, options=ReplicaOptions(consensus=FAST, round_linger_s=linger_s))


@pytest.fixture
def tablet(tmp_path: Path) -> Iterator[Tablet]:
    t = _tablet(tmp_path, LONG_S)
    yield t
    t.close()


def _a_round_of_three_then_one_waiting(
    tablet: Tablet, monkeypatch: pytest.MonkeyPatch, round_s: float
) -> Lingering:
    """A round of one write (key 1) and three waiting for it (keys 2-4), which go as the
    next round; while that round's commit is held, ``round_s`` passes on the leader's clock
    and one write (key 5) comes and waits.  Returns with that round's commit held."""
    leader = tablet.leader()
    clock = Clock()
    leader.clock = clock
    sizes = _round_sizes(leader, monkeypatch)
    tablet.cut_off(leader.server_id)  # the first round stays out while the three come
    first = send(leader, write([1], "c1", 1))
    wait_for(lambda: sizes == [1], what="the first round out")
    three = [send(leader, write([k], "c1", k)) for k in (2, 3, 4)]
    wait_for(lambda: leader.waiting_writes == 3, what="three writes waiting")
    hook, go = _held_commits(leader)
    tablet.transport.heal()
    tablet.wait_for(lambda: hook.commits == 1, what="the first round's commit")
    go.release()
    # Three waited, more than the one a round carried: they go at once, as before.
    wait_for(lambda: sizes == [1, 3], what="the three as the next round")
    wait_for(lambda: hook.commits == 2, what="that round's commit")
    assert all(not c.result().row_errors for c in [first, *three])
    clock.now += round_s
    waiting = [send(leader, write([5], "c1", 5))]
    wait_for(lambda: leader.waiting_writes == 1, what="the next write waiting")
    return Lingering(leader, sizes, hook, go, clock, waiting)


def _answered_and_applied_everywhere(tablet: Tablet, s: Lingering, last_key: int) -> None:
    s.go.release(10)  # no commit waits from here on
    assert all(not c.result().row_errors for c in s.waiting)
    tablet.wait_keys_everywhere(list(range(1, last_key + 1)))


def test_a_round_that_ends_with_fewer_writes_waiting_than_the_last_carried_waits_for_more(
    tablet: Tablet, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = _a_round_of_three_then_one_waiting(tablet, monkeypatch, round_s=LONG_S)
    s.go.release()  # the round of three ends: one write waits, and lingers
    wait_for(lambda: s.leader.lingering, what="the write lingering")
    assert s.sizes == [1, 3]
    assert s.leader.waiting_writes == 1
    s.waiting.append(send(s.leader, write([6], "c1", 6)))
    wait_for(lambda: s.leader.waiting_writes == 2, what="a second one waiting with it")
    assert s.sizes == [1, 3]
    assert s.leader.lingering
    # The third is as many as the last round carried: the three go together, at once.
    s.waiting.append(send(s.leader, write([7], "c1", 7)))
    wait_for(lambda: s.sizes == [1, 3, 3], what="the three as one round")
    assert not s.leader.lingering
    _answered_and_applied_everywhere(tablet, s, 7)


def test_a_linger_that_runs_out_lets_the_writes_go_and_lowers_what_rounds_should_carry(
    tablet: Tablet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The round of three took 20 ms on the leader's clock: the linger lasts no longer.
    s = _a_round_of_three_then_one_waiting(tablet, monkeypatch, round_s=0.02)
    s.go.release()
    wait_for(lambda: s.sizes == [1, 3, 1], what="the lone write gone when its linger ran out")
    wait_for(lambda: s.hook.commits == 3, what="its round's commit")
    assert not s.waiting[0].result().row_errors
    s.go.release()
    wait_for(
        lambda: s.leader.store.applied_index() >= s.waiting[0].result().op_index,
        what="that round applied",
    )
    # A round of one is what is expected now.  The next round (key 6) stays out, as long
    # on the leader's clock as any linger may last; the write that waits for it (key 7)
    # goes as soon as it ends.
    tablet.cut_off(s.leader.server_id)
    s.waiting.append(send(s.leader, write([6], "c1", 6)))
    wait_for(lambda: s.sizes == [1, 3, 1, 1], what="the round of key 6 out")
    s.clock.now += LONG_S
    s.waiting.append(send(s.leader, write([7], "c1", 7)))
    wait_for(lambda: s.leader.waiting_writes == 1, what="key 7 waiting for that round")
    tablet.transport.heal()
    tablet.wait_for(lambda: s.hook.commits == 4, what="the round of key 6's commit")
    s.go.release()
    wait_for(lambda: s.sizes == [1, 3, 1, 1, 1], what="key 7 gone at once")
    _answered_and_applied_everywhere(tablet, s, 7)


def test_with_no_linger_the_next_round_goes_as_soon_as_the_last_is_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tablet = _tablet(tmp_path, 0.0)
    try:
        s = _a_round_of_three_then_one_waiting(tablet, monkeypatch, round_s=LONG_S)
        s.go.release()
        wait_for(lambda: s.sizes == [1, 3, 1], what="the lone write gone at once")
        assert not s.leader.lingering
        s.go.release(10)
        assert not s.waiting[0].result().row_errors
    finally:
        tablet.close()


def test_a_stop_answers_the_writes_lingering(
    tablet: Tablet, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = _a_round_of_three_then_one_waiting(tablet, monkeypatch, round_s=LONG_S)
    s.go.release()
    wait_for(lambda: s.leader.lingering, what="the write lingering")
    s.go.release(10)  # the stop flushes the store: nothing of it may wait
    tablet.stop(s.leader.server_id)
    with pytest.raises(ServiceUnavailable):
        s.waiting[0].result()
    assert not s.leader.lingering
