"""Membership changes on the simulated cluster (tests/sim/scenarios.py; each failure
message carries its replay command)."""

from __future__ import annotations

import pytest

from tests.sim import scenarios as sc


@pytest.mark.parametrize("seed", range(12))
def test_membership_changes_under_faults(seed: int) -> None:
    """Random adds, promotions and removals (leaders too) under partitions, crashes and loss:
    safety holds throughout and the final group converges."""
    stats = sc.scenario_membership(seed)
    assert stats.extra["changes"] > 0


@pytest.mark.parametrize("seed", range(5))
def test_move_a_replica_while_a_follower_is_cut_off(seed: int) -> None:
    """Add, promote, remove the leader, one at a time; the removed leader steps down."""
    sc.scenario_move_under_partition(seed)
