"""The leader lease (``LeaderReadMode.LEASE``): reads served at the commit index with no quorum
round while the lease holds; the lease measured on the driver's clock (a fake one here) from
the send time of a heartbeat round a majority acknowledged; none before the leader is ready,
none after a stall, none past its computed end -- and reads then fall back to ReadIndex."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from raftlet.consensus.core import Message, MessageType, Role
from raftlet.consensus.raft_consensus import (
    ConsensusOptions,
    LeaderNotReady,
    LeaderReadMode,
    NoAnsweringFollower,
)
from raftlet.consensus.ticker import ManualTicker
from raftlet.consensus.transport import InMemoryTransport
from tests.unit.consensus_cluster import FAST, Cluster, Replica

LEASE = dataclasses.replace(FAST, leader_read_mode=LeaderReadMode.LEASE)
DURATION = LEASE.lease_duration_s()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FilteringTransport(InMemoryTransport):
    """Drops the messages ``drop`` picks (as a lost network message: no answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.drop: Callable[[Message], bool] = lambda _m: False

    def send(self, message: Message, on_response: Callable[[Message | None], None]) -> None:
        if self.drop(message):
            on_response(None)
            return
        super().send(message, on_response)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def cluster(tmp_path: Path, clock: FakeClock) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path,
        options=LEASE,
        ticker=ManualTicker(),
        clock=clock,
        transport=FilteringTransport(),
    )
    yield c
    c.close()


def _leased_leader(cluster: Cluster) -> Replica:
    leader = cluster.wait_leader()
    cluster.wait_for(lambda: leader.consensus.lease_remaining_s() > 0, what="a lease")
    return leader


def _cut_off(cluster: Cluster, leader: Replica) -> None:
    cluster.transport.isolate(leader.node_id)
    cluster.wait_for(cluster.transport.idle, what="nothing in flight")


def test_the_lease_duration_keeps_the_stated_bound() -> None:
    default = ConsensusOptions(tick_interval_s=0.1, election_ticks=10, heartbeat_ticks=3)
    assert default.lease_duration_s() == pytest.approx(0.7 * 0.9 - 0.1)
    assert LEASE.lease_duration_s() == pytest.approx(9 * 0.02 * 0.9 - 0.02)
    with pytest.raises(ValueError, match="no lease"):
        dataclasses.replace(
            default, leader_read_mode=LeaderReadMode.LEASE, election_ticks=4
        ).validate()
    with pytest.raises(ValueError, match="check-quorum"):
        dataclasses.replace(LEASE, check_quorum=False).validate()


def test_lease_reads_are_served_with_no_quorum_round_until_the_computed_end(
    cluster: Cluster, clock: FakeClock
) -> None:
    """The clock stands still while the lease is granted, so it ends exactly at that time
    plus the duration.  Cut off from every follower, the leader still serves before then
    (no round is needed), and from then on needs a round, which it cannot get."""
    leader = _leased_leader(cluster)
    granted_at = clock.now
    commit = leader.consensus.commit_index()
    _cut_off(cluster, leader)
    before = leader.consensus.metrics.read_index_reads.value()
    clock.now = granted_at + DURATION - 1e-6
    assert [leader.consensus.read_index(timeout_s=0.01) for _ in range(50)] == [commit] * 50
    assert leader.consensus.metrics.lease_reads.value() >= 50
    assert leader.consensus.metrics.read_index_reads.value() == before
    clock.now = granted_at + DURATION
    assert leader.consensus.lease_remaining_s() == 0
    with pytest.raises(LeaderNotReady, match="no quorum confirmed"):
        leader.consensus.read_index(timeout_s=0.2)
    assert leader.consensus.metrics.read_index_reads.value() == before + 1


def test_heartbeats_renew_the_lease_without_reads(cluster: Cluster, clock: FakeClock) -> None:
    leader = _leased_leader(cluster)
    clock.now += 10 * DURATION
    assert leader.consensus.lease_remaining_s() == 0
    cluster.wait_for(lambda: leader.consensus.lease_remaining_s() > 0, what="a renewed lease")
    assert leader.consensus.lease_remaining_s() == pytest.approx(DURATION)


def test_a_stall_ends_the_lease_and_a_round_sent_after_it_grants_a_new_one(
    cluster: Cluster, clock: FakeClock
) -> None:
    leader = _leased_leader(cluster)
    assert cluster.ticker is not None
    _cut_off(cluster, leader)
    cluster.ticker.report_stall(0.05)  # shorter than an election timeout
    assert leader.consensus.lease_remaining_s() == 0  # although the clock has not moved
    with pytest.raises(LeaderNotReady):
        leader.consensus.read_index(timeout_s=0.2)
    cluster.transport.heal()
    cluster.wait_for(lambda: leader.consensus.lease_remaining_s() > 0, what="a new lease")
    assert leader.consensus.metrics.stalls.value() == 1


def test_a_leader_cut_off_when_it_wakes_from_a_long_stall_steps_down_in_two_heartbeats(
    cluster: Cluster,
) -> None:
    leader = _leased_leader(cluster)
    ticker = cluster.ticker
    assert ticker is not None
    _cut_off(cluster, leader)
    ticker.report_stall((LEASE.election_ticks + 1) * LEASE.tick_interval_s)
    ticks = 0

    def stepped_down() -> bool:
        nonlocal ticks
        ticks += 1
        return leader.consensus.snapshot.role is not Role.LEADER

    cluster.wait_for(stepped_down, what="the stalled leader to step down")
    # One poll ticks once; the worker may step a tick late, but never a timeout late.
    assert ticks <= 2 * LEASE.heartbeat_ticks + 3


def test_no_lease_before_the_leader_has_committed_its_no_op(
    cluster: Cluster, clock: FakeClock
) -> None:
    """b takes over (a transfer), but its appends are lost: its heartbeats are answered and
    its rounds confirmed, yet it may not lease-read until its NO_OP commits."""
    old = _leased_leader(cluster)
    new = next(r for r in cluster.replicas.values() if r is not old)
    transport = cluster.transport
    assert isinstance(transport, FilteringTransport)
    heartbeats = [0]

    def drop(m: Message) -> bool:
        if m.src == new.node_id and m.type is MessageType.HEARTBEAT:
            heartbeats[0] += 1
        return m.type is MessageType.APPEND and m.src == new.node_id

    transport.drop = drop

    def handed_over() -> bool:
        # The lease needed one follower's answer: b's may not have come yet, and a step-down
        # to a follower not heard from is refused.
        try:
            old.consensus.step_down(new.node_id)
        except NoAnsweringFollower:
            return False
        return True

    cluster.wait_for(handed_over, what="b heard from and asked to take over")
    cluster.wait_for(lambda: new.consensus.snapshot.role is Role.LEADER, what="b leads")
    assert old.consensus.lease_remaining_s() == 0
    rounds = new.consensus.metrics.read_index_reads.value()
    # Heartbeats go and are answered, a few rounds of them.  Ticked one per poll, not in a
    # burst: ticks given faster than the replicas' threads deliver heartbeats would let a
    # follower's election timeout run out on a loaded machine, and b lose its term.
    first = heartbeats[0]
    cluster.wait_for(
        lambda: heartbeats[0] >= first + 3 * (len(cluster.ids) - 1) and transport.idle(),
        what="three rounds of b's heartbeats answered",
    )
    assert new.consensus.snapshot.role is Role.LEADER
    assert not new.consensus.snapshot.leader_ready
    assert new.consensus.lease_remaining_s() == 0
    with pytest.raises(LeaderNotReady):
        new.consensus.read_index(timeout_s=0.01)
    transport.drop = lambda _m: False
    cluster.wait_for(lambda: new.consensus.lease_remaining_s() > 0, what="b's lease")
    assert new.consensus.read_index(timeout_s=0.01) == new.consensus.commit_index()
    assert new.consensus.metrics.read_index_reads.value() == rounds + 1


def test_read_index_mode_never_leases(tmp_path: Path, clock: FakeClock) -> None:
    cluster = Cluster(tmp_path, ticker=ManualTicker(), clock=clock)
    try:
        leader = cluster.wait_leader()
        for _ in range(3):
            assert leader.consensus.read_index(timeout_s=10) >= 1
        assert leader.consensus.lease_remaining_s() == 0
        assert leader.consensus.metrics.lease_reads.value() == 0
        assert leader.consensus.metrics.read_index_reads.value() == 3
    finally:
        cluster.close()
