"""``tserver.leader_handover``: what a stopping server asks of the tablets it leads, how long
it waits, and what it says happened."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

import pytest

from raftlet.consensus.core import Role
from raftlet.tserver.leader_handover import hand_over_leaderships


@dataclass(frozen=True)
class Snap:
    role: Role
    term: int
    transferring: bool = False
    leader_id: str = ""


class FakeConsensus:
    """A replica whose snapshot moves on to ``after`` once it was asked to hand over and
    looked at ``polls`` more times."""

    def __init__(self, group_id: str, successor: str, after: Snap, polls: int = 1) -> None:
        self.group_id = group_id
        self._successor = successor
        self._snap = Snap(Role.LEADER, 3)
        self._after = after
        self._polls = polls
        self._asked = False

    @property
    def snapshot(self) -> Snap:
        if self._asked:
            if self._polls <= 0:
                self._snap = self._after
            self._polls -= 1
        return self._snap

    def hand_over(self, _why: str = "stopping") -> str:
        self._asked = True
        if self._successor:
            self._snap = replace(self._snap, transferring=True)
        return self._successor


def _run(*replicas: FakeConsensus, wait_s: float = 3.0) -> int:
    return asyncio.run(hand_over_leaderships(replicas, wait_s))  # type: ignore[arg-type]


def test_a_tablet_its_successor_took_over_is_said_handed(caplog: pytest.LogCaptureFixture) -> None:
    taken = FakeConsensus("kv-p0", "ts2", Snap(Role.FOLLOWER, 4, leader_id="ts2"), polls=3)
    with caplog.at_level(logging.INFO, logger="raftlet.tserver.leader_handover"):
        assert _run(taken) == 1
    assert "handed leadership of 1 tablet(s) over before stopping: kv-p0" in caplog.text
    assert "no follower took over" not in caplog.text


def test_a_leader_that_lost_its_quorum_meanwhile_is_not_said_handed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It steps down in its own term: its successor never campaigned (it was paused)."""
    lost = FakeConsensus("kv-p1", "ts1", Snap(Role.FOLLOWER, 3))
    with caplog.at_level(logging.INFO, logger="raftlet.tserver.leader_handover"):
        assert _run(lost) == 0
    assert "handed leadership" not in caplog.text
    assert "no follower took over kv-p1" in caplog.text


def test_no_answering_follower_means_no_wait_and_a_transfer_that_hangs_is_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    alone = FakeConsensus("kv-p2", "", Snap(Role.LEADER, 3))
    stuck = FakeConsensus("kv-p3", "ts2", Snap(Role.LEADER, 3, transferring=True), polls=0)
    with caplog.at_level(logging.INFO, logger="raftlet.tserver.leader_handover"):
        assert _run(alone, stuck, wait_s=0.05) == 0
    assert "no follower took over kv-p3:" in caplog.text  # kv-p2 was never asked
