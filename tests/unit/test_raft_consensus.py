"""The threaded driver: elections and replication over real logs, the lock-free term
check (KUDU-2727) against the locked one, leadership transfer, failover and restart."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlet.consensus.core import Message, NotLeaderError, ProposalDropped, Role, TermMismatch
from raftlet.consensus.log import LogOptions, LogStorage, PersistentState
from raftlet.consensus.raft_consensus import (
    LeaderNotReady,
    NoAnsweringFollower,
    RaftConsensus,
    TermCheckMode,
)
from raftlet.consensus.ticker import ManualTicker
from raftlet.consensus.transport import InMemoryTransport, ResponseCallback
from tests.unit.consensus_cluster import FAST, Cluster, Replica
from tests.waiting import WAIT_S, wait_for


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    # The test is the clock: ticks pass only while it waits (Cluster.wait_for), so no test
    # races a wall-clock election timeout on a loaded machine.
    c = Cluster(tmp_path, ticker=ManualTicker())
    yield c
    c.close()


def test_elects_one_leader_and_replicates_to_every_replica(cluster: Cluster) -> None:
    leader = cluster.wait_leader()
    term = leader.consensus.check_leadership_and_bind_term()
    for i in range(20):
        leader.consensus.replicate([b"row-%d" % i], term)
    want = [b"row-%d" % i for i in range(20)]
    for r in cluster.replicas.values():
        cluster.wait_for(lambda r=r: r.data() == want, what=f"{r.node_id} applies all 20")
    followers = [r for r in cluster.replicas.values() if r is not leader]
    for f in followers:
        with pytest.raises(NotLeaderError) as err:
            f.consensus.check_leadership_and_bind_term()
        assert err.value.leader_id == leader.node_id


def test_every_peer_a_replica_steps_a_message_from_is_reported_heard_from(
    cluster: Cluster,
) -> None:
    """``on_peer_heard`` (what a server's record of its peers is made from,
    ``tserver.servers_heard``) names the sender of every request and answer: the leader
    hears both followers (their votes or acknowledgements), each follower the leader."""
    leader = cluster.wait_leader()
    term = leader.consensus.check_leadership_and_bind_term()
    leader.consensus.replicate([b"row"], term)
    for r in cluster.replicas.values():
        cluster.wait_for(lambda r=r: r.data() == [b"row"], what=f"{r.node_id} applies it")
    others = {n for n in cluster.ids if n != leader.node_id}
    cluster.wait_for(
        lambda: set(cluster.heard[leader.node_id]) == others, what="the leader hears both"
    )
    for n in others:
        assert leader.node_id in cluster.heard[n]
        assert n not in cluster.heard[n]


def test_every_peer_a_replica_sends_to_is_reported_asked(cluster: Cluster) -> None:
    """``on_peer_asked`` (half of what ``tserver.peer_contact`` judges a peer by) names the
    destination of every message sent: the leader's appends go to both followers, and a
    follower that only answers asks nobody."""
    leader = cluster.wait_leader()
    others = {n for n in cluster.ids if n != leader.node_id}
    for n in cluster.ids:
        cluster.asked[n].clear()
    leader.consensus.replicate([b"row"], leader.consensus.check_leadership_and_bind_term())
    for r in cluster.replicas.values():
        cluster.wait_for(lambda r=r: r.data() == [b"row"], what=f"{r.node_id} applies it")
    assert set(cluster.asked[leader.node_id]) == others
    for n in others:
        assert cluster.asked[n] == []  # its answers go back as replies, asked for


def test_an_acknowledgement_counts_only_once_its_sender_is_recorded(cluster: Cluster) -> None:
    """The server writes a peer down in ``on_peer_heard`` (``tserver.servers_heard``) so
    that no vote or acknowledgement of a peer it has not recorded ever counts: while the
    record of both followers' answers is held up, the leader commits nothing."""
    leader = cluster.wait_leader()
    consensus = leader.consensus
    release = threading.Event()
    held: list[str] = []

    def slow_record(sender: str) -> None:
        held.append(sender)
        release.wait(WAIT_S)

    consensus._on_peer_heard = slow_record
    before = consensus.commit_index()
    try:
        consensus.replicate([b"row"], consensus.check_leadership_and_bind_term())
        # No tick passes here (the test is the clock): the only answers are the appends'.
        others = {n for n in cluster.ids if n != leader.node_id}
        wait_for(lambda: set(held) >= others, WAIT_S, "both answers held in the record")
        assert consensus.commit_index() == before
    finally:
        release.set()
    cluster.wait_for(lambda: consensus.commit_index() > before, what="the entry commits")


def test_lockfree_term_check_never_takes_the_consensus_lock(cluster: Cluster) -> None:
    leader = cluster.wait_leader()
    consensus = leader.consensus
    result: list[int] = []
    lock = consensus._lock  # the test holds it, as a slow WAL append would
    with lock:
        t = threading.Thread(
            target=lambda: result.append(consensus.check_leadership_and_bind_term())
        )
        t.start()
        t.join(timeout=5)
        assert not t.is_alive(), "the lock-free check waited for the consensus lock"
    assert result == [consensus.snapshot.term]
    assert consensus.metrics.term_check_lock_acquisitions.value() == 0
    assert consensus.metrics.term_checks[TermCheckMode.LOCKFREE].value() == 1


def test_locked_term_check_waits_for_the_consensus_lock(tmp_path: Path) -> None:
    # The test is the clock: while it holds the lock no tick passes, so no election can
    # race the hold (on the wall clock a loaded machine made this flaky).
    cluster = Cluster(tmp_path, mode=TermCheckMode.LOCKED, ticker=ManualTicker())
    try:
        leader = cluster.wait_leader()
        consensus = leader.consensus
        result: list[int] = []
        waiting = threading.Event()
        with consensus._lock:
            t = threading.Thread(
                target=lambda: (
                    waiting.set(),
                    result.append(consensus.check_leadership_and_bind_term()),
                )
            )
            t.start()
            assert waiting.wait(timeout=10)
            t.join(timeout=0.2)
            assert t.is_alive(), "the locked check did not wait for the lock"
            assert result == []
        t.join(timeout=10)
        assert result == [consensus.snapshot.term]
        assert consensus.metrics.term_check_lock_acquisitions.value() >= 1
        assert consensus.metrics.term_checks[TermCheckMode.LOCKED].value() >= 1
    finally:
        cluster.close()


def test_a_write_bound_to_an_old_term_is_refused_after_leadership_moves(cluster: Cluster) -> None:
    leader = cluster.wait_leader()
    stale_term = leader.consensus.check_leadership_and_bind_term()
    target = leader.consensus.step_down()
    assert target != leader.node_id
    cluster.wait_for(lambda: getattr(cluster.leader(), "node_id", None) == target, what="transfer")
    new = cluster.replicas[target]
    new_term = new.consensus.check_leadership_and_bind_term()
    assert new_term > stale_term
    with pytest.raises(TermMismatch):
        new.consensus.replicate([b"late"], stale_term)
    with pytest.raises((NotLeaderError, TermMismatch)):
        leader.consensus.replicate([b"late"], stale_term)
    new.consensus.replicate([b"fresh"], new_term)
    for r in cluster.replicas.values():
        cluster.wait_for(lambda r=r: r.data() == [b"fresh"], what=f"{r.node_id} applies")


def test_an_isolated_leader_steps_down_and_the_majority_elects_another(
    cluster: Cluster,
) -> None:
    leader = cluster.wait_leader()
    others = [r.node_id for r in cluster.replicas.values() if r is not leader]
    for o in others:
        cluster.transport.cut(leader.node_id, o)
    new = cluster.wait_leader(among=others)
    # Check-quorum: the old leader's published snapshot stops claiming leadership.
    cluster.wait_for(lambda: leader.consensus.snapshot.role is not Role.LEADER, what="step-down")
    with pytest.raises(NotLeaderError):
        leader.consensus.check_leadership_and_bind_term()
    cluster.transport.heal()
    term = new.consensus.check_leadership_and_bind_term()
    new.consensus.replicate([b"healed"], term)
    for r in cluster.replicas.values():
        cluster.wait_for(lambda r=r: r.data() == [b"healed"], what=f"{r.node_id} converges")


def test_failover_keeps_every_committed_entry(cluster: Cluster) -> None:
    leader = cluster.wait_leader()
    term = leader.consensus.check_leadership_and_bind_term()
    for i in range(10):
        leader.consensus.replicate([b"before-%d" % i], term)
    cluster.wait_for(lambda: all(len(r.data()) == 10 for r in cluster.replicas.values()))
    cluster.crash(leader.node_id)
    new = cluster.wait_leader()
    assert new.node_id != leader.node_id
    term = new.consensus.check_leadership_and_bind_term()
    new.consensus.replicate([b"after"], term)
    cluster.open(leader.node_id)
    want = [b"before-%d" % i for i in range(10)] + [b"after"]
    for r in cluster.replicas.values():
        cluster.wait_for(lambda r=r: r.data() == want, what=f"{r.node_id} catches up")


def test_whole_cluster_restart_recovers_from_disk(cluster: Cluster) -> None:
    leader = cluster.wait_leader()
    term = leader.consensus.check_leadership_and_bind_term()
    leader.consensus.replicate([b"x", b"y"], term)
    cluster.wait_for(lambda: all(r.data() == [b"x", b"y"] for r in cluster.replicas.values()))
    for node_id in cluster.ids:
        cluster.crash(node_id)
    for node_id in cluster.ids:
        cluster.open(node_id)
    cluster.wait_leader()
    for r in cluster.replicas.values():
        cluster.wait_for(lambda r=r: r.data() == [b"x", b"y"], what=f"{r.node_id} replays")


def test_leader_not_ready_is_retriable() -> None:
    from raftlet.consensus.raft_consensus import ConsensusSnapshot

    snap = ConsensusSnapshot(
        term=3, role=Role.LEADER, leader_id="a", leader_ready=False, transferring=False
    )
    with pytest.raises(LeaderNotReady):
        snap.bind_term()
    with pytest.raises(LeaderNotReady):
        ConsensusSnapshot(3, Role.LEADER, "a", True, True).bind_term()
    assert ConsensusSnapshot(3, Role.LEADER, "a", True, False).bind_term() == 3
    with pytest.raises(NotLeaderError):
        ConsensusSnapshot(3, Role.FOLLOWER, "b", False, False).bind_term()


def test_consensus_metadata_is_saved_only_for_term_vote_and_a_clean_stop(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit index moving with new entries is no reason to rewrite consensus-meta
    (two fsyncs and a rename, under the consensus lock): not with each append, nor on the
    ticks that pass while writes go on.  A clean stop saves the commit index reached."""
    from raftlet.consensus.log.metadata import ConsensusMetadata

    leader = cluster.wait_leader()
    term = leader.consensus.check_leadership_and_bind_term()
    saves: dict[str, list[tuple[int, str]]] = {}
    for r in cluster.replicas.values():
        log: list[tuple[int, str]] = []
        saves[r.node_id] = log
        real = r.storage.metadata.save_hard_state

        def counting(hard, real=real, log=log):  # type: ignore[no-untyped-def]
            log.append((hard.term, hard.vote))
            real(hard)

        monkeypatch.setattr(r.storage.metadata, "save_hard_state", counting)
    # A follower cut off while entries commit gets them and the commit index that covers
    # them in one append once it is back: a Ready with both new entries and a new commit.
    lagging = next(r for r in cluster.replicas.values() if r is not leader)
    cluster.transport.cut(leader.node_id, lagging.node_id)
    for i in range(8):
        leader.consensus.replicate([b"row-%d" % i], term)
    want = [b"row-%d" % i for i in range(8)]
    cluster.wait_for(lambda: leader.data() == want, what="the leader applies all 8")
    cluster.transport.heal()
    for r in cluster.replicas.values():
        cluster.wait_for(lambda r=r: r.data() == want, what=f"{r.node_id} applies all 8")
    # Ticks while the commit index has moved: a save every 20 ticks was the old rule.
    replicas = list(cluster.replicas.values())
    stepped = [r.consensus._ticks for r in replicas]
    cluster.wait_for(
        lambda: all(r.consensus._ticks >= n + 60 for r, n in zip(replicas, stepped, strict=True)),
        what="every replica steps 60 more ticks",
    )
    if leader.consensus.snapshot.term == term:  # no election meanwhile (it saves term, vote)
        assert all(log == [] for log in saves.values()), saves
    commit = lagging.consensus.commit_index()
    assert commit >= 8
    assert ConsensusMetadata.load(str(lagging.directory)).state.commit_index < commit
    cluster.crash(lagging.node_id)  # Replica.stop: the driver stops cleanly
    assert ConsensusMetadata.load(str(lagging.directory)).state.commit_index == commit


def test_a_peer_request_is_answered_from_the_durability_callback(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """handle_request_async returns as soon as the request is stepped; an append's answer
    goes to ``reply`` only once the WAL reports what it acknowledges durable -- no thread
    waits -- while a heartbeat's, which acknowledges no entries, leaves at once."""
    from raftlet.consensus.core import Message, MessageType

    leader = cluster.wait_leader()
    follower = next(r for r in cluster.replicas.values() if r is not leader)
    held: list[object] = []
    real_append = follower.storage.append_async

    def holding_append(entries, callback):  # type: ignore[no-untyped-def]
        held.append(lambda: real_append(entries, callback))

    monkeypatch.setattr(follower.storage, "append_async", holding_append)
    term = leader.consensus.snapshot.term
    beat = Message(MessageType.HEARTBEAT, leader.node_id, follower.node_id, term)
    beat_answers: list[Message | None] = []
    follower.consensus.handle_request_async(beat, beat_answers.append)
    assert held == []
    assert [a.type for a in beat_answers if a is not None] == [MessageType.HEARTBEAT_RESPONSE]

    last = follower.storage.last_index()
    probe = Message(
        MessageType.APPEND,
        leader.node_id,
        follower.node_id,
        term,
        log_term=follower.storage.term(last),
        index=last,
    )
    answers: list[Message | None] = []
    follower.consensus.handle_request_async(probe, answers.append)
    assert held, "the answer was not made to wait for the WAL"
    assert answers == []  # returned without an answer: nothing blocked on durability
    monkeypatch.setattr(follower.storage, "append_async", real_append)
    for release in held:
        release()  # type: ignore[operator]
    cluster.wait_for(lambda: len(answers) == 1, what="the answer after durability")
    (answer,) = answers
    assert answer is not None
    assert answer.type is MessageType.APPEND_RESPONSE
    assert (answer.dst, answer.index, answer.reject) == (leader.node_id, last, False)


def test_a_read_index_is_the_commit_index_a_quorum_confirmed(cluster: Cluster) -> None:
    leader = cluster.wait_leader()
    term = leader.consensus.check_leadership_and_bind_term()
    [entry] = leader.consensus.replicate([b"written"], term)
    cluster.wait_for(lambda: leader.consensus.commit_index() >= entry.index, what="commit")
    assert leader.consensus.read_index(timeout_s=10) >= entry.index
    follower = next(r for r in cluster.replicas.values() if r is not leader)
    with pytest.raises(NotLeaderError):
        follower.consensus.read_index(timeout_s=10)


def test_a_leader_cut_off_from_its_quorum_serves_no_read(cluster: Cluster) -> None:
    """It still believes it leads (its check-quorum has not run: no time passes here), but
    no follower confirms it, so the read is refused rather than served stale."""
    leader = cluster.wait_leader()
    for other in cluster.replicas.values():
        if other is not leader:
            cluster.transport.cut(leader.node_id, other.node_id)
    assert leader.consensus.snapshot.role is Role.LEADER
    with pytest.raises(LeaderNotReady, match="no quorum confirmed"):
        leader.consensus.read_index(timeout_s=0.3)
    cluster.transport.heal()
    # The lost round is still outstanding: this read waits for the next heartbeat's round,
    # and time passes only while the test waits.
    served: list[int] = []
    reader = threading.Thread(target=lambda: served.append(leader.consensus.read_index(10)))
    reader.start()
    cluster.wait_for(lambda: bool(served), what="the read after healing")
    reader.join()
    assert served[0] >= 1


class _BrokenTo(InMemoryTransport):
    """Raises on every send to ``dst`` while ``broken``, as a transport with a bug would."""

    def __init__(self) -> None:
        super().__init__()
        self.dst = ""
        self.broken = False

    def send(self, message: Message, on_response: ResponseCallback) -> None:
        if self.broken and message.dst == self.dst:
            raise RuntimeError("a transport bug")
        super().send(message, on_response)


def test_a_transport_that_raises_loses_the_message_not_the_replica(tmp_path: Path) -> None:
    """A send that raises under the consensus lock is a lost message: the leader goes on
    committing with the other follower, and the cut-off one catches up once sends work."""
    transport = _BrokenTo()
    cluster = Cluster(tmp_path, ticker=ManualTicker(), transport=transport)
    try:
        leader = cluster.wait_leader()
        cut, other = (r for r in cluster.replicas.values() if r is not leader)
        transport.dst, transport.broken = cut.node_id, True
        term = leader.consensus.check_leadership_and_bind_term()
        for i in range(10):
            leader.consensus.replicate([b"w-%d" % i], term)
        want = [b"w-%d" % i for i in range(10)]
        for r in (leader, other):
            cluster.wait_for(lambda r=r: r.data() == want, what=f"{r.node_id} applies all 10")
        assert cut.data() == []  # nothing reached it
        transport.broken = False
        cluster.wait_for(lambda: cut.data() == want, what=f"{cut.node_id} catches up")
        assert leader.consensus.snapshot.role is Role.LEADER
    finally:
        cluster.close()


def test_a_leadership_change_is_logged_by_the_old_leader_and_its_followers(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    leader = cluster.wait_leader()
    term = leader.consensus.snapshot.term
    caplog.set_level(logging.INFO, logger="raftlet.consensus.raft_consensus")
    target = leader.consensus.step_down()
    cluster.wait_for(lambda: getattr(cluster.leader(), "node_id", None) == target, what="transfer")
    third = next(r for r in cluster.replicas.values() if r.node_id not in (leader.node_id, target))
    cluster.wait_for(
        lambda: third.consensus.snapshot.leader_id == target, what="the third learns of it"
    )
    lines = [r.getMessage() for r in caplog.records]
    group = leader.consensus.group_id
    asked = f"hands leadership of term {term} to {target} (asked to step down)"
    assert f"{group}: {leader.node_id} {asked}" in lines
    assert any(
        m.startswith(f"{group}: {leader.node_id} no longer leads (was leader of term {term}; now ")
        for m in lines
    ), lines
    assert any(
        m.startswith(f"{group}: leader of term ") and f"is {target} (was {leader.node_id})" in m
        for m in lines
    ), lines


def test_a_step_down_hands_leadership_only_to_a_follower_that_answers(cluster: Cluster) -> None:
    """On an idle tablet every follower matches the leader, and the first was picked even
    when its server was dead: the transfer ran out while writes waited (review r32c). One
    named that does not answer is refused alike."""

    def past_the_window(replica: Replica) -> None:
        # Stepped, not only counted (a tick counted while one waits is dropped), and short
        # of check-quorum's election timeout.
        start = replica.consensus._ticks
        window = 2 * FAST.heartbeat_ticks + 1
        cluster.wait_for(lambda: replica.consensus._ticks > start + window, what="ticks")

    leader = cluster.wait_leader()
    first, second = (n for n in cluster.ids if n != leader.node_id)
    cluster.wait_for(
        lambda: {first, second} <= set(cluster.heard[leader.node_id]), what="both heard from"
    )
    cluster.crash(first)
    past_the_window(leader)
    # Named, it is refused too: the call said it had stepped down, and nothing moved while
    # writes waited on the transfer (review r33b).
    with pytest.raises(NoAnsweringFollower, match=f"{first} has not answered within the last 3"):
        leader.consensus.step_down(first)
    assert leader.consensus.snapshot.role is Role.LEADER
    assert leader.consensus.step_down() == second
    cluster.wait_for(lambda: getattr(cluster.leader(), "node_id", None) == second, what="moved")
    new = cluster.replicas[second]
    cluster.crash(leader.node_id)
    past_the_window(new)
    with pytest.raises(NoAnsweringFollower, match="no other voter answered within the last 3"):
        new.consensus.step_down()
    assert new.consensus.snapshot.role is Role.LEADER  # nothing moved, writes not held


def test_a_group_of_one_refuses_a_step_down_as_a_request_that_cannot_succeed(
    tmp_path: Path,
) -> None:
    """It raised ProposalDropped (UNAVAILABLE), which clients retry: `leader-step-down` of
    a one-replica tablet retried for its whole timeout, then failed as a timeout."""
    cluster = Cluster(tmp_path, ids=("a",), ticker=ManualTicker())
    try:
        leader = cluster.wait_leader()
        term = leader.consensus.snapshot.term
        with pytest.raises(ValueError, match=r"has no other voter, so no follower to hand") as e:
            leader.consensus.step_down()
        assert not isinstance(e.value, ProposalDropped)
        assert "raftlet tablet add-replica" in str(e.value)
        snap = leader.consensus.snapshot
        assert (snap.role, snap.term) == (Role.LEADER, term)
    finally:
        cluster.close()


def test_voters_behind_names_the_voters_a_leader_knows_lack_an_entry(cluster: Cluster) -> None:
    """What the log GC warning names (``tserver.log_gc``): on the leader, the voters whose
    acknowledged entries end below the index; elsewhere nobody, since a follower cannot know."""
    leader = cluster.wait_leader()
    down = next(n for n in cluster.ids if n != leader.node_id)
    cluster.crash(down)
    consensus = leader.consensus
    consensus.replicate([b"row"], consensus.check_leadership_and_bind_term())
    cluster.wait_for(lambda: consensus.commit_index() >= consensus.status()["last_index"])
    last = int(consensus.status()["last_index"])  # type: ignore[call-overload]
    assert consensus.voters_behind(last) == [down]
    assert consensus.voters_behind(1) == []
    follower = next(r for n, r in cluster.replicas.items() if n not in (leader.node_id, down))
    assert follower.consensus.voters_behind(last + 1) == []


def test_a_saved_commit_index_never_runs_ahead_of_the_durable_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A follower's commit index covers entries it has only handed to its WAL. Saved with a
    term change before they were durable, a crash left consensus-meta saying "committed to
    N" beside a log whose entries below N were missing -- or, where a new leader had just
    overwritten a stale suffix, another term's entries never committed, which the restarted
    replica then applied as committed."""
    from raftlet.consensus.log.metadata import ConsensusMetadata

    # Each append the follower holds keeps a transport worker waiting for its answer: enough
    # workers that the others' heartbeats still go.
    cluster = Cluster(tmp_path, ticker=ManualTicker(), transport=InMemoryTransport(workers=64))
    request.addfinalizer(cluster.close)
    leader = cluster.wait_leader()
    follower, other = (r for r in cluster.replicas.values() if r is not leader)
    held: list[object] = []
    real_append = follower.storage.append_async

    def holding_append(entries, callback):  # type: ignore[no-untyped-def]
        held.append(lambda: real_append(entries, callback))

    monkeypatch.setattr(follower.storage, "append_async", holding_append)
    durable = follower.storage.last_index()
    term = leader.consensus.check_leadership_and_bind_term()
    for i in range(6):  # each append carries the commit of the ones before it
        leader.consensus.replicate([b"row-%d" % i], term)
        cluster.wait_for(lambda i=i: len(leader.data()) == i + 1, what=f"row {i} committed")
    cluster.wait_for(
        lambda: follower.consensus.commit_index() > durable,
        what="the follower's commit index beyond its durable log",
    )
    leader.consensus.step_down(other.node_id)  # a new term, which the follower saves
    cluster.wait_for(
        lambda: ConsensusMetadata.load(str(follower.directory)).state.current_term > term,
        what="the follower saves the next term",
    )
    saved = ConsensusMetadata.load(str(follower.directory)).state
    assert follower.storage.last_index() == durable  # nothing held has reached the log
    assert saved.commit_index <= durable, (saved, durable)
    monkeypatch.setattr(follower.storage, "append_async", real_append)
    for release in held:
        release()  # type: ignore[operator]
    cluster.wait_for(lambda: follower.data() == leader.data(), what="the follower catches up")


@pytest.mark.parametrize("advance", [True, False])
def test_a_replica_that_starts_asks_for_votes_within_one_election_timeout(
    tmp_path: Path, advance: bool
) -> None:
    """A replica that starts knows no leader: it counts all but one tick of an election
    timeout as passed (``boot_tick_advance``), so the first vote of a new or restarted
    cluster no longer waits one to two timeouts.  A lone voter of three: one timeout's
    worth of ticks, and it has asked both others -- or, without the advance, not yet (its
    randomized timeout, seeded, is longer than one)."""
    storage = LogStorage.open(tmp_path / "a", LogOptions(segment_size_bytes=1 << 20))
    storage.save_metadata(PersistentState(voters=("a", "b", "c")))
    options = dataclasses.replace(FAST, seed=1, boot_tick_advance=advance)
    ticker = ManualTicker(ticks_per_call=options.election_ticks)
    asked: list[str] = []
    transport = InMemoryTransport()
    consensus = RaftConsensus(
        group_id="t1",
        node_id="a",
        storage=storage,
        transport=transport,
        apply_committed=lambda entries: None,
        options=options,
        ticker=ticker,
        on_peer_asked=asked.append,
    )
    transport.register("a", consensus.handle_request)
    consensus.start()
    try:
        ticker.tick()
        if advance:
            wait_for(lambda: sorted(set(asked)) == ["b", "c"], what="vote requests to b and c")
        else:
            # The driver's count of the ticks it stepped into the core: no public figure.
            wait_for(lambda: consensus._ticks == options.election_ticks, what="ticks stepped")
            assert asked == []
    finally:
        consensus.stop()
        storage.close()
