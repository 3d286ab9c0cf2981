"""The nemesis on a fake cluster: which links each partition cuts, that every fault is undone,
and that a seed fixes the schedule."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from raftlet.chaos.nemesis import (
    ALL_FAULTS,
    Nemesis,
    NemesisOptions,
    bridge_cuts,
    draw_bridge,
    halves_cuts,
    isolate_cuts,
)
from tests.waiting import wait_for

SERVERS = ["ts1", "ts2", "ts3"]


class FakeCluster:
    """Records what the nemesis did; ``whole()`` says whether every fault was undone."""

    backend = "fake"

    def __init__(self, servers: list[str], fail_on: str | None = None) -> None:
        self.servers = servers
        self.dead: set[str] = set()
        self.paused: set[str] = set()
        self.cuts: set[tuple[str, str]] = set()
        self.flags: dict[tuple[str, str], str] = {}
        self.actions: list[str] = []
        self.fail_on = fail_on
        self.lock = threading.Lock()

    def _do(self, action: str) -> None:
        if self.fail_on and action.startswith(self.fail_on):
            raise RuntimeError(f"{action} refused")
        self.actions.append(action)

    def server_ids(self) -> list[str]:
        return list(self.servers)

    def alive(self, sid: str) -> bool:
        return sid not in self.dead

    def kill(self, sid: str) -> None:
        self._do(f"kill {sid}")
        self.dead.add(sid)

    def start(self, sid: str) -> None:
        self._do(f"start {sid}")
        self.dead.discard(sid)

    def pause(self, sid: str) -> None:
        self._do(f"pause {sid}")
        self.paused.add(sid)

    def resume(self, sid: str) -> None:
        self._do(f"resume {sid}")
        self.paused.discard(sid)

    def cut(self, src: str, dst: str) -> None:
        self._do(f"cut {src}>{dst}")
        self.cuts.add((src, dst))

    def heal_network(self) -> None:
        self._do("heal")
        self.cuts.clear()

    def set_flag(self, sid: str, name: str, value: str) -> None:
        self._do(f"flag {sid} {name}={value}")
        self.flags[(sid, name)] = value

    def leaders(self) -> dict[str, str]:
        return {"t0": "ts2"}

    def log_tail(self, sid: str, n: int = 30) -> str:
        return ""

    @property
    def config_path(self) -> Path:
        return Path("/nonexistent")

    def whole(self) -> bool:
        latency = {v for (_, name), v in self.flags.items() if name == "log_inject_latency_ms"}
        return not (self.dead or self.paused or self.cuts) and latency <= {"0"}


def test_isolating_a_server_cuts_both_directions_to_every_other() -> None:
    assert isolate_cuts("ts1", SERVERS) == {
        ("ts1", "ts2"), ("ts2", "ts1"), ("ts1", "ts3"), ("ts3", "ts1"),
    }  # fmt: skip


def test_halves_cut_only_links_between_the_groups() -> None:
    cuts = halves_cuts((["a", "b"], ["c", "d", "e"]))
    assert len(cuts) == 2 * 2 * 3
    assert ("a", "b") not in cuts
    assert ("c", "d") not in cuts
    assert ("a", "c") in cuts
    assert ("e", "b") in cuts


def test_a_bridge_talks_to_both_groups_which_cannot_talk_to_each_other() -> None:
    cuts = bridge_cuts("c", ["a", "b", "c"], ["c", "d", "e"])
    assert not any("c" in link for link in cuts)
    assert ("a", "d") in cuts
    assert ("e", "b") in cuts
    assert cuts == halves_cuts((["a", "b"], ["d", "e"]))


@pytest.mark.parametrize("n_servers", range(3, 10))
def test_every_drawn_bridge_cuts_some_link_and_the_seed_fixes_it(n_servers: int) -> None:
    servers = [f"ts{i + 1}" for i in range(n_servers)]
    for seed in range(300):
        a, b, bridge = draw_bridge(random.Random(seed), servers)
        assert sorted(a + b) == sorted(servers)
        cuts = bridge_cuts(bridge, [*a, bridge], b)
        assert cuts, (seed, a, b, bridge)
        assert not any(bridge in link for link in cuts)
        assert draw_bridge(random.Random(seed), servers) == (a, b, bridge)


def test_unknown_fault_kinds_are_refused_with_the_list() -> None:
    with pytest.raises(ValueError, match=r"unknown fault kinds.*kill"):
        NemesisOptions(faults=("kill", "flood"))
    with pytest.raises(ValueError, match="at least one"):
        NemesisOptions(faults=())


def _run(cluster: FakeCluster, seed: int, faults: tuple[str, ...], n: int) -> Nemesis:
    nemesis = Nemesis(
        cluster, NemesisOptions(faults=faults, seed=seed, hold_s=(0, 0.001), quiet_s=(0, 0.001))
    )
    nemesis.start()
    try:
        wait_for(lambda: len(nemesis.events) >= n, timeout=20, what=f"{n} faults")
    finally:
        nemesis.stop()
    return nemesis


def test_every_fault_kind_runs_and_the_cluster_is_whole_after_stop() -> None:
    cluster = FakeCluster(SERVERS)
    nemesis = _run(cluster, seed=3, faults=ALL_FAULTS, n=60)
    assert set(nemesis.counts()) == set(ALL_FAULTS)
    assert cluster.whole(), cluster.actions[-10:]
    assert all(e.end_s is not None and not e.error for e in nemesis.events)
    assert all(e.end_s >= e.start_s for e in nemesis.events if e.end_s is not None)


def test_every_bridge_partition_the_nemesis_starts_cuts_links() -> None:
    cluster = FakeCluster(SERVERS)
    nemesis = _run(cluster, seed=4, faults=("partition-bridge",), n=60)
    assert all(not e.error for e in nemesis.events)
    # Each fault is its cuts, then the heal that undoes it: a heal right after a heal (or
    # first) is a fault that cut nothing.
    previous = "heal"
    for action in cluster.actions:
        assert not (action == previous == "heal"), cluster.actions
        previous = "heal" if action == "heal" else "cut"
    assert cluster.actions[0] != "heal"


def test_targeted_faults_prefer_the_leader() -> None:
    cluster = FakeCluster(SERVERS)
    nemesis = _run(cluster, seed=5, faults=("kill", "pause", "partition-leader"), n=10)
    assert {t for e in nemesis.events for t in e.targets} == {"ts2"}


def test_the_seed_fixes_the_schedule() -> None:
    kinds = []
    for _ in range(2):
        nemesis = _run(FakeCluster(SERVERS), seed=11, faults=ALL_FAULTS, n=15)
        kinds.append([(e.kind, e.detail) for e in nemesis.events[:15]])
    assert kinds[0] == kinds[1]
    other = _run(FakeCluster(SERVERS), seed=12, faults=ALL_FAULTS, n=15)
    assert [(e.kind, e.detail) for e in other.events[:15]] != kinds[0]


def test_a_fault_that_cannot_start_is_logged_and_the_run_goes_on() -> None:
    cluster = FakeCluster(SERVERS, fail_on="pause")
    nemesis = _run(cluster, seed=2, faults=("pause", "kill"), n=12)
    failed = [e for e in nemesis.events if e.error]
    assert failed
    assert all(e.kind == "pause" and "refused" in e.error for e in failed)
    assert any(e.kind == "kill" and not e.error for e in nemesis.events)
    assert cluster.whole()
