"""Liveness with a stable majority and no faults: bounds, asserted over many seeds."""

from __future__ import annotations

import pytest

from tests.sim import scenarios as sc
from tests.sim.cluster import SimConfig

ELECTION_TICK = SimConfig().election_tick


@pytest.mark.parametrize("nodes", [3, 5])
def test_first_leader_within_five_election_timeouts(nodes: int) -> None:
    # The scenario raises (with a replay command) past 5 election timeouts.
    took = [sc.scenario_first_leader(seed, nodes).extra["first_leader_ticks"] for seed in range(60)]
    assert max(took) <= 5 * ELECTION_TICK
    # Randomized timeouts make split votes rare: most elections finish within
    # the first timeout (10..19 ticks) plus a round trip.
    assert sorted(took)[len(took) // 2] < 2 * ELECTION_TICK


@pytest.mark.parametrize("nodes", [3, 5])
@pytest.mark.parametrize("seed", range(10))
def test_proposals_commit_within_bounded_ticks(nodes: int, seed: int) -> None:
    """Each proposal commits at the leader within 3 ticks and is applied on
    every node within 5 (the scenario asserts both)."""
    stats = sc.scenario_liveness(seed, nodes)
    assert stats.extra["worst_commit_ticks"] <= 3
    assert stats.extra["first_leader_ticks"] <= 5 * ELECTION_TICK
    assert stats.elections == 1  # nothing disturbed the first leader
