"""MIT 6.824 lab 2 tests, in spirit, on the simulated cluster (tests/sim/scenarios.py
holds the scenarios; each failure message carries its replay command)."""

from __future__ import annotations

import pytest

from tests.sim import scenarios as sc

SEEDS = range(5)


@pytest.mark.parametrize("seed", SEEDS)
def test_initial_election(seed: int) -> None:
    """Exactly one leader; with no faults its term stays put."""
    sc.scenario_initial_election(seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_reelection(seed: int) -> None:
    """A new leader when the leader is cut off; the old one rejoins as follower;
    no leader without a quorum; a leader again once quorum returns."""
    sc.scenario_reelection(seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_no_commit_without_quorum(seed: int) -> None:
    """3 of 5 disconnected: proposals do not commit; reconnected: they do."""
    sc.scenario_no_quorum(seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_rejoin_of_partitioned_leader(seed: int) -> None:
    """The old leader's uncommitted entries are discarded and it follows the new one."""
    sc.scenario_rejoin(seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_fast_backup(seed: int) -> None:
    """60 conflicting uncommitted entries are repaired in a few round trips."""
    stats = sc.scenario_fast_backup(seed)
    assert 0 < stats.extra["rejections"] <= 6


@pytest.mark.parametrize("seed", SEEDS)
def test_figure8(seed: int) -> None:
    """The paper's Figure 8, scripted: an entry of an earlier term on a majority
    is not committed by counting, so a later leader may and does overwrite it."""
    sc.scenario_figure8(seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_followers_acknowledge_only_durable_entries(seed: int) -> None:
    """Followers with slow disks crash before storing X: X was never committed."""
    sc.scenario_durable_ack(seed)


@pytest.mark.parametrize("seed", range(4))
def test_figure8_unreliable(seed: int) -> None:
    """Leaders crash at random on a lossy, reordering network with slow disks:
    everything committed survives and is applied everywhere in the end."""
    stats = sc.scenario_figure8_unreliable(seed)
    assert stats.crashes >= 5, stats
    assert stats.elections >= 5, stats


@pytest.mark.parametrize("seed", range(3))
def test_churn(seed: int) -> None:
    """Nodes crash and restart at random under load; once healed, every
    committed proposal is applied on every node."""
    stats = sc.scenario_churn(seed)
    assert stats.crashes >= 10, stats
    assert stats.commits >= 50, stats


@pytest.mark.parametrize("seed", SEEDS)
def test_unreliable_agreement(seed: int) -> None:
    """Drops, duplicates and reordering: concurrent clients' values all commit."""
    stats = sc.scenario_unreliable_agreement(seed)
    assert stats.dropped > 0, stats
    assert stats.duplicated > 0, stats
