"""The store verifier waits at least as long as its last pass took: with a short interval
(--store_verify_interval_s=0.001 once) passes ran back to back, kept every CPU busy on an
idle server and slowed writes 6x."""

from __future__ import annotations

from dataclasses import dataclass, field

from raftlet.tserver.store_verifier import StoreVerifier


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0


@dataclass
class _SlowStore:
    """A quick_check that takes ``seconds`` on the test's clock."""

    clock: _Clock
    seconds: float
    checks: int = 0

    def quick_check(self, max_problems: int = 5) -> list[str]:
        self.checks += 1
        self.clock.now += self.seconds
        return []


@dataclass
class _Replica:
    tablet_id: str
    store: _SlowStore
    damage: list[str] = field(default_factory=list)

    def store_damaged(self, reason: str) -> None:
        self.damage.append(reason)


class _Stop:
    """The verifier's stop event: records each wait and stops it after ``passes`` waits."""

    def __init__(self, passes: int) -> None:
        self.waits: list[float] = []
        self._passes = passes

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return len(self.waits) > self._passes

    def is_set(self) -> bool:
        return False

    def set(self) -> None:
        pass


def test_the_next_pass_waits_at_least_as_long_as_the_last_one_took() -> None:
    clock = _Clock()
    replicas = [_Replica(f"t{i}", _SlowStore(clock, 2.0)) for i in range(3)]  # 6 s a pass
    verifier = StoreVerifier(lambda: replicas, interval_s=1.0, clock=lambda: clock.now)
    stop = _Stop(passes=3)
    verifier._stop = stop  # type: ignore[assignment]
    verifier._run()  # on this thread: the fake stop event ends it after three passes
    assert [r.store.checks for r in replicas] == [3, 3, 3]
    assert stop.waits == [1.0, 6.0, 6.0, 6.0]


def test_a_quick_pass_waits_the_interval() -> None:
    clock = _Clock()
    replicas = [_Replica("t", _SlowStore(clock, 0.25))]
    verifier = StoreVerifier(lambda: replicas, interval_s=60.0, clock=lambda: clock.now)
    stop = _Stop(passes=2)
    verifier._stop = stop  # type: ignore[assignment]
    verifier._run()
    assert stop.waits == [60.0, 60.0, 60.0]
