"""A follower back from an outage is handed its committed backlog a budget at a time
(``ConsensusOptions.max_applying_bytes``), not all at once: review r31a saw a follower
catching up 225,000 entries go from 93 to 459 MiB, its backlog held in memory."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from raftlet.consensus.core import Entry
from raftlet.tserver.tablet_replica import ReplicaOptions, TabletReplica
from tests.unit.consensus_cluster import FAST
from tests.unit.test_tablet_replica import Tablet, keys_on, send, write

CAP = 2_000
WRITES = 120


def test_a_follower_catching_up_holds_at_most_its_budget_of_committed_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[tuple[int, int]] = []  # (entries, their bytes) of each hand-out to victim
    victim = [""]
    original = TabletReplica._on_committed

    def watched(self: TabletReplica, entries: Sequence[Entry]) -> None:
        if self.server_id == victim[0]:
            handed.append((len(entries), sum(e.size() for e in entries)))
        original(self, entries)

    monkeypatch.setattr(TabletReplica, "_on_committed", watched)
    options = ReplicaOptions(consensus=dataclasses.replace(FAST, max_applying_bytes=CAP))
    tablet = Tablet(tmp_path, options=options)
    try:
        leader = tablet.leader()
        victim[0] = next(node for node in tablet.replicas if node != leader.server_id)
        tablet.stop(victim[0])
        for i in range(1, WRITES + 1):
            assert not send(leader, write([i], "w", i)).result().row_errors
        handed.clear()
        follower = tablet.open(victim[0])
        tablet.wait_for(
            lambda: keys_on(follower) == list(range(1, WRITES + 1)), what="the follower caught up"
        )
    finally:
        tablet.close()
    # Each hand-out within the budget (one entry at least), every write handed over.
    assert all(n == 1 or size <= CAP for n, size in handed), handed
    assert sum(n for n, _ in handed) >= WRITES
    assert sum(size for _, size in handed) > 3 * CAP  # so it took several turns
