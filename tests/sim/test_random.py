"""Random fault schedules drawn by hypothesis: seeds and fault parameters.

Every schedule runs for STEPS ticks with crashes, partitions (including bridges),
drops, duplicates, long delays, asynchronous persistence, log GC (with a retention cap
that makes lagging voters need tablet copies), proposing to whoever
leads at random times; the invariants are checked after every event, and at the
end the healed cluster must converge with every committed entry applied
everywhere.  ``derandomize`` makes the 500 examples the same on every run (no
example database, no flakiness); ``make sim SEEDS=...`` explores new seeds.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.sim.scenarios import RandomParams, run_random

STEPS = 150
EXAMPLES = 500

params = st.builds(
    RandomParams,
    nodes=st.sampled_from([3, 5]),
    steps=st.just(STEPS),
    drop=st.sampled_from([0.0, 0.01, 0.05, 0.1, 0.2]),
    dup=st.sampled_from([0.0, 0.02, 0.1]),
    long_delay=st.sampled_from([0.0, 0.01, 0.05]),
    max_delay=st.integers(1, 12),
    persist_delay=st.sampled_from([0, 0, 2, 5, 12]),
    partition_rate=st.sampled_from([0.0, 0.02, 0.05, 0.1]),
    crash_rate=st.sampled_from([0.0, 0.01, 0.03, 0.06]),
    propose_rate=st.sampled_from([0.1, 0.3, 0.6, 1.0]),
    transfer_rate=st.sampled_from([0.0, 0.0, 0.02]),
    pre_vote=st.booleans(),
    check_quorum=st.booleans(),
    max_inflight=st.sampled_from([1, 2, 8, 256]),
    max_msg_bytes=st.sampled_from([1, 64, 1 << 20]),
    broadcast_commit=st.booleans(),
    # A log GC retention cap (0: none): lagging voters catch up through tablet copies.
    retention=st.sampled_from([0, 0, 3, 10]),
).filter(
    # Every schedule injects faults of some kind.
    lambda p: bool(p.drop or p.dup or p.long_delay or p.partition_rate or p.crash_rate)
)


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    # No shrinking: the seed drives the whole schedule, so a "smaller" example is
    # just another random run, and shrinking a failure took minutes.  The failure
    # message already names the exact command that replays it.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**32 - 1), p=params)
def test_random_schedules(seed: int, p: RandomParams) -> None:
    # A failure's message carries the exact `python -m tests.sim.run ...` replay.
    run_random(seed, p)
