"""Log GC and tablet copy in the simulator: followers that fall behind the leaders' log
start catch up through chunked copies over a lossy, duplicating, reordering network.

Each scenario raises with its replay command (``python -m tests.sim.run --scenario ...
--seed ...``) on any failure; the batch tests add what one seed cannot promise (chunks
lost and duplicated somewhere)."""

from __future__ import annotations

import dataclasses
import zlib

import pytest

from raftlet.consensus.core import Message, MessageType, Role
from tests.sim.cluster import SimCluster, SimConfig
from tests.sim.scenarios import (
    SCENARIOS,
    RandomParams,
    Stats,
    elect,
    one,
    run_random,
    snap_config,
)
from tests.sim.tablet_copy import CopyKind, CopyMsg, decode_state, encode_state

SEEDS = range(12)


def _batch(name: str) -> list[Stats]:
    return [SCENARIOS[name](seed) for seed in SEEDS]


@pytest.mark.parametrize("name", ["snapshot_partition", "snapshot_restart"])
def test_a_follower_left_behind_catches_up_through_a_copy(name: str) -> None:
    # Per seed (inside the scenario): it installed a copy, every state machine is the same,
    # every invariant held after every event.  Over the batch: the copies got through loss
    # and duplication of their chunks.
    stats = _batch(name)
    assert all(s.installs > 0 for s in stats)
    assert sum(s.chunks_lost for s in stats) > 0
    assert sum(s.chunks_duplicated for s in stats) > 0
    assert all(s.compactions > 0 for s in stats)
    if name == "snapshot_restart":
        # The follower crashed during a copy to it: the leader saw that copy fail.
        assert sum(s.extra["aborted_by_crash"] for s in stats) > 0


def test_a_copy_cut_off_by_a_leader_change_is_abandoned_and_the_next_leader_copies() -> None:
    stats = _batch("snapshot_leader_change")
    assert all(s.installs > 0 for s in stats)
    assert sum(s.extra["abandoned"] for s in stats) > 0
    # The follower's partial copy from the old leader was given up, not installed.
    assert sum(s.extra["given_up"] for s in stats) > 0


def test_random_schedules_with_a_retention_cap_copy_tablets() -> None:
    total = Stats()
    for seed in range(40):
        p = dataclasses.replace(RandomParams.from_seed(seed, 150), retention=4)
        s = run_random(seed, p)
        total.copies += s.copies
        total.installs += s.installs
    assert total.copies > 0
    assert total.installs > 0


# --- the copy protocol, piece by piece ------------------------------------------------------


def test_state_images_round_trip() -> None:
    state = [(1, 1, b""), (2, 1, b"x"), (3, 2, b"\x00" * 40)]
    assert decode_state(encode_state(state)) == state
    assert decode_state(b"") == []


def _lagging(seed: int = 7) -> tuple[SimCluster, str, str]:
    """A reliable 3-node cluster whose leader compacted past follower ``f`` (crashed)."""
    config = dataclasses.replace(snap_config(), net=dataclasses.replace(snap_config().net, drop=0))
    config = dataclasses.replace(config, net=dataclasses.replace(config.net, dup=0, long_delay=0))
    c = SimCluster(seed, config)
    lead = elect(c)
    f = next(i for i in c.ids if i != lead)
    c.crash(f)
    for k in range(30):
        c.propose(lead, b"w-%d" % k)
        c.step()
    c.step(2 * c.config.gc_interval)
    assert c.nodes[lead].storage.first_index() > c.nodes[f].storage.last_index() + 1
    return c, lead, f


def _chunks(
    c: SimCluster, leader: str, follower: str, session: int = 999, index: int = 0
) -> list[CopyMsg]:
    """The chunks a copy of ``leader``'s state would be sent as, made by hand (``index``:
    claim that point instead of the real one)."""
    sn = c.nodes[leader]
    image = encode_state(sn.applied)
    size = c.config.chunk_bytes
    parts = [image[o : o + size] for o in range(0, len(image), size)]
    index = index or sn.applied[-1][0]
    return [
        CopyMsg(
            CopyKind.CHUNK,
            leader,
            follower,
            session,
            index=index,
            term=sn.applied[-1][1],
            seq=i,
            count=len(parts),
            crc=zlib.crc32(image),
            data=part,
        )
        for i, part in enumerate(parts)
    ]


def test_reassembly_is_idempotent_and_asks_for_exactly_what_is_missing() -> None:
    c, lead, f = _lagging()
    c.restart(f)
    sent: list[CopyMsg] = []
    c.net.send = lambda m, now: sent.append(m) if isinstance(m, CopyMsg) else None  # type: ignore[method-assign]
    chunks = _chunks(c, lead, f)
    assert len(chunks) > 4
    held_back = chunks[2]
    for m in reversed(chunks):  # out of order, each twice, one missing
        if m is not held_back:
            c.copies.deliver(m)
            c.copies.deliver(m)
    assert c.copies.stats["chunks_duplicate"] == len(chunks) - 1
    assert c.copies.installs_by[f] == 0
    for _ in range(c.config.copy_retry):  # the clock alone, so no session of its own starts
        c.ticks += 1
        c.copies.tick()
    needs = [m for m in sent if m.type is CopyKind.NEED]
    assert [m.missing for m in needs] == [(2,)]
    c.copies.deliver(held_back)
    assert c.copies.installs_by[f] == 1
    assert c.nodes[f].applied == c.nodes[lead].applied
    done = [m for m in sent if m.type is CopyKind.DONE]
    assert [(m.dst, m.ok, m.index) for m in done] == [(lead, True, chunks[0].index)]
    # A late duplicate of the installed session changes nothing.
    c.copies.deliver(held_back)
    assert c.copies.installs_by[f] == 1


def test_a_copy_not_past_the_commit_index_is_refused_and_leaves_no_trace() -> None:
    c = SimCluster(3, snap_config())
    lead = elect(c)
    one(c, b"x")
    f = next(i for i in c.ids if i != lead)
    c.run_until(lambda: c.applied_index(f) == c.committed(lead), 50)
    sent: list[CopyMsg] = []
    c.net.send = lambda m, now: sent.append(m) if isinstance(m, CopyMsg) else None  # type: ignore[method-assign]
    # A follower that has it all; a leader, even of a copy past its commit index.
    for target, index in ((f, 0), (lead, c.committed(lead) + 5)):
        sn = c.nodes[target]
        before = (sn.storage.all_entries(), sn.storage.first_index(), list(sn.applied))
        for m in _chunks(c, lead, target, session=500 + len(sent), index=index):
            c.copies.deliver(m)
        assert (sn.storage.all_entries(), sn.storage.first_index(), sn.applied) == before
    assert c.copies.stats["refused"] == 2
    assert c.copies.stats["installs"] == 0
    # The follower holds the copy's state already: the leader may probe from there.  The
    # leader refuses because it leads: a failure.
    assert [(m.src, m.ok) for m in sent] == [(f, True), (lead, False)]
    assert c.nodes[lead].node().raft.role is Role.LEADER


def test_a_crashed_follower_fails_the_copy_to_it_and_loses_its_partial_copy() -> None:
    c, lead, f = _lagging(11)
    # The copy starts once f answers a heartbeat; cut the first chunk's way back... by
    # crashing f as soon as any chunk arrived.
    c.copy_observers.append(lambda m: c.crash(f) if m.type is CopyKind.CHUNK else None)
    c.restart(f)
    c.run_until(lambda: not c.nodes[f].alive, 30, "a chunk reaches f")
    assert c.copies.stats["aborted_by_crash"] == 1
    assert c.copies.stats["reported_failed"] == 1
    assert not c.copies.receiving.get(f)
    c.copy_observers.clear()
    c.restart(f)
    c.run_until(lambda: c.applied_index(f) >= c.committed(lead), 100, "f catches up")
    assert c.copies.installs_by[f] == 1


def test_gc_without_a_cap_never_discards_what_a_voter_lacks() -> None:
    c = SimCluster(5, SimConfig(nodes=3))
    lead = elect(c)
    f = next(i for i in c.ids if i != lead)
    c.crash(f)
    for k in range(30):
        c.propose(lead, b"g-%d" % k)
        c.step()
    c.step(20)
    assert c.nodes[lead].storage.first_index() <= c.nodes[f].storage.last_index() + 1
    c.restart(f)
    c.run_until(c.converged, 100)
    assert c.copies.stats["sessions"] == 0
    c.step(2 * c.config.gc_interval)
    assert all(c.nodes[i].storage.first_index() > 1 for i in c.ids)


def test_a_copy_whose_entry_the_log_holds_is_not_installed_over_later_entries() -> None:
    # Raft.restore would accept it and cut the log back to the copy's index, dropping
    # entries the follower acknowledged; the driver must not install it.
    c = SimCluster(4, SimConfig(nodes=3))
    lead = elect(c)
    one(c, b"a")
    f = next(i for i in c.ids if i != lead)
    c.run_until(lambda: c.applied_index(f) == c.committed(lead), 50)
    raft = c.nodes[f].node().raft
    index = raft.log.last_index()

    def cut_after_ack(m: Message) -> None:
        # f acknowledged the new entries: cut it off before it hears they are committed.
        if m.type is MessageType.APPEND_RESPONSE and m.src == f and m.index == index + 3:
            c.net.isolate(f)

    c.observers.append(cut_after_ack)
    c.propose(lead, b"later-0", b"later-1", b"later-2")
    c.run_until(lambda: c.committed(lead) == raft.log.last_index() == index + 3, 20)
    assert raft.log.committed < index + 1
    sent: list[CopyMsg] = []
    c.net.send = lambda m, now: sent.append(m) if isinstance(m, CopyMsg) else None  # type: ignore[method-assign]
    for m in _chunks(c, lead, f, index=index + 1):
        c.copies.deliver(m)
    assert raft.log.last_index() == index + 3
    assert c.copies.stats["skipped_log_holds"] == 1
    assert [(m.type, m.ok) for m in sent] == [(CopyKind.DONE, True)]
