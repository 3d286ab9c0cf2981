"""Pre-vote and check-quorum, observed in simulation."""

from __future__ import annotations

import pytest

from tests.sim import scenarios as sc
from tests.sim.cluster import SimConfig

ELECTION_TICK = SimConfig().election_tick


@pytest.mark.parametrize("seed", range(5))
def test_isolated_follower_keeps_its_term_and_rejoins_quietly(seed: int) -> None:
    """Cut off for 20 election timeouts, a follower never bumps its term (its
    pre-votes fail), and on rejoin the leader and the term stay unchanged."""
    sc.scenario_prevote_isolated_follower(seed)


@pytest.mark.parametrize("seed", range(3))
def test_without_prevote_the_isolated_follower_does_bump_its_term(seed: int) -> None:
    """Control: the same cut without pre-vote drives the term up, so the test
    above is not passing by accident."""
    sc.scenario_no_prevote_isolated_follower(seed)


@pytest.mark.parametrize("seed", range(5))
def test_isolated_leader_steps_down_within_an_election_timeout_or_two(seed: int) -> None:
    """Check-quorum: the cut-off leader stops leading within 2 election timeouts
    (+1 tick), keeps its term, and the others elect a new leader."""
    stats = sc.scenario_check_quorum(seed)
    assert stats.extra["step_down_ticks"] <= 2 * ELECTION_TICK + 1
