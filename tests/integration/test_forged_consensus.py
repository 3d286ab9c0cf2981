"""Forged consensus messages against a real plaintext loopback 3-server cluster (issue #15,
item 3): the black-box probe's attacks, replayed.

The consensus service takes any caller whose claimed uuid is a voter of the tablet, and
voter names are public; so a forger can speak as any voter.  Each attack here must change
nothing persistent -- every replica's term and vote, as GetConsensusState reports them, and
its role and leader as ListTablets does -- while a write load keeps being acknowledged; a
ready leader is there within two election timeouts once the attack stops; and in the end
every acknowledged write is on every replica (``wait_converged``).

What a forger speaking as the *current leader in its term* can do (an AppendEntries with a
forged row) is not stopped here: that needs the caller's identity (TLS).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from raftlet.proto import consensus_pb2 as pb
from tests.integration.tserver_cluster import (
    Server,
    TserverCluster,
    WriteLoad,
    running_cluster,
    server_error,
    wait_for,
)

U64 = (1 << 64) - 1
I63 = (1 << 63) - 1
TABLET = "kv-p0"
# RaftTimings of TserverCluster: 50 ms ticks, elections after 10-20 ticks.
ELECTION_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class ReplicaState:
    term: int
    voted_for: str
    role: int
    leader: str
    # As ListTablets reports them.
    listed_term: int
    listed_leader: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TserverCluster]:
    root: Path = tmp_path_factory.mktemp("forged")
    with running_cluster(root, partitions=1) as c:  # stops every server by PID at the end
        c.wait_leaders()
        yield c


def _states(cluster: TserverCluster) -> dict[str, ReplicaState]:
    out: dict[str, ReplicaState] = {}
    for s in cluster.servers.values():
        st = s.consensus.GetConsensusState(
            pb.GetConsensusStateRequest(tablet_id=TABLET), timeout=5
        ).state
        listed = s.list_tablets()[TABLET]
        # Two calls, two moments: each view is recorded, neither checked against the other.
        out[s.id] = ReplicaState(
            st.current_term, st.voted_for, st.role, st.leader_uuid, listed.term, listed.leader_uuid
        )
    return out


def _settled(cluster: TserverCluster) -> tuple[Server, dict[str, ReplicaState]]:
    """The tablet's ready leader, once every replica follows it."""
    holder: list[dict[str, ReplicaState]] = []

    def agreed() -> bool:
        leaders = cluster.leaders()
        if TABLET not in leaders:
            return False
        states = _states(cluster)
        holder[:] = [states]
        return all(
            s.leader == s.listed_leader == leaders[TABLET] and s.term == s.listed_term
            for s in states.values()
        )

    wait_for(agreed, 30, "every replica follows one ready leader")
    return cluster.servers[cluster.leaders()[TABLET]], holder[0]


def _others(cluster: TserverCluster, *not_: str) -> list[Server]:
    return [s for s in cluster.servers.values() if s.id not in not_]


def _heartbeat(caller: str, dest: str, term: int, commit: int = 0) -> pb.UpdateConsensusRequest:
    return pb.UpdateConsensusRequest(
        tablet_id=TABLET,
        caller_uuid=caller,
        dest_uuid=dest,
        caller_term=term,
        committed_index=commit,
        is_heartbeat=True,
    )


def _forged_row_append(caller: str, dest: str, term: int, prev: int) -> pb.UpdateConsensusRequest:
    return pb.UpdateConsensusRequest(
        tablet_id=TABLET,
        caller_uuid=caller,
        dest_uuid=dest,
        caller_term=term,
        prev_log_index=prev,
        prev_log_term=1 if prev else 0,
        entries=[pb.EntryPB(term=term, index=prev + 1, type=pb.NORMAL, payload=b"forged")],
        committed_index=prev + 1,
    )


def _status(call: Callable[..., object], request: object) -> grpc.StatusCode:
    """The status ``call(request)`` ends with (a stream's, once its answers are read)."""
    try:
        result = call(request, timeout=5)
        if isinstance(result, Iterator):
            list(result)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def _after_attack(
    cluster: TserverCluster, before: dict[str, ReplicaState], load: WriteLoad, since: float
) -> None:
    """Nothing persistent moved, writes went on, a ready leader is there within two election
    timeouts, and every acknowledged write is on every replica."""
    wait_for(
        lambda: TABLET in cluster.leaders(),
        2 * ELECTION_TIMEOUT_S,
        "a ready leader within two election timeouts of the attack's end",
    )
    assert _states(cluster) == before
    load.wait_acked(20, timeout=10, tablet_id=TABLET, after=since)


_loads = itertools.count(1)


@pytest.fixture
def load(cluster: TserverCluster) -> Iterator[WriteLoad]:
    """Two writers for the test's whole length, with their own client ids and keys."""
    n = next(_loads)
    with WriteLoad(
        cluster, n_writers=2, write_timeout=30, key_base=n * 100_000_000, name=f"load{n}"
    ) as w:
        w.wait_acked(10, tablet_id=TABLET)
        yield w
    assert not w.errors, w.errors
    cluster.wait_converged(TABLET, _all_rows(cluster, w))


# Every acknowledged row of the tests so far: they share the cluster (and its one tablet).
_ROWS: dict[int, str] = {}


def _all_rows(cluster: TserverCluster, load: WriteLoad) -> dict[int, str]:
    """Every acknowledged row of every test so far (the tests share the cluster)."""
    expected = dict(_ROWS)
    expected.update(load.expected(TABLET))
    _ROWS.update(expected)
    return expected


# --- the attacks ------------------------------------------------------------------------------


def test_maximum_term_heartbeat_is_refused(cluster: TserverCluster, load: WriteLoad) -> None:
    """The report: one heartbeat of term 2**64 - 1 left the tablet leaderless for good.  Now
    it is INVALID_ARGUMENT at every replica, whoever it claims to come from; a term inside
    int63 but far past the replica's is dropped (answered with an error, nothing adopted)."""
    leader, before = _settled(cluster)
    since = time.monotonic()
    for target in cluster.servers.values():
        for caller in _others(cluster, target.id):
            for term in (U64, I63 + 1):
                code = _status(
                    target.consensus.UpdateConsensus, _heartbeat(caller.id, target.id, term)
                )
                assert code is grpc.StatusCode.INVALID_ARGUMENT
            vote = pb.RequestVoteRequest(
                tablet_id=TABLET, candidate_uuid=caller.id, dest_uuid=target.id, candidate_term=U64
            )
            assert _status(target.consensus.RequestVote, vote) is grpc.StatusCode.INVALID_ARGUMENT
            resp = target.consensus.UpdateConsensus(
                _heartbeat(caller.id, target.id, I63), timeout=5
            )
            assert resp.HasField("error")
            assert resp.responder_term == before[target.id].term
    _after_attack(cluster, before, load, since)
    assert cluster.leaders()[TABLET] == leader.id


def test_timeout_now_from_a_non_leader_changes_nothing(
    cluster: TserverCluster, load: WriteLoad
) -> None:
    """The report: a forged TimeoutNow moved leadership every time.  Now only the leader
    the follower knows, in its term, may send one: a follower naming another follower, or
    the leader at a term the follower never reached, is ignored."""
    leader, before = _settled(cluster)
    since = time.monotonic()
    f1, f2 = _others(cluster, leader.id)
    term = before[f1.id].term
    for target, caller, t in (
        (f1, f2.id, term),
        (f2, f1.id, term),
        (f1, leader.id, term + 1),
        (f1, f2.id, term + 1),
    ):
        resp = target.consensus.TimeoutNow(
            pb.TimeoutNowRequest(
                tablet_id=TABLET, caller_uuid=caller, dest_uuid=target.id, caller_term=t
            ),
            timeout=5,
        )
        assert not resp.HasField("error")
    # The leader itself is asked, too: a leader never steps into an election from one.
    leader.consensus.TimeoutNow(
        pb.TimeoutNowRequest(
            tablet_id=TABLET, caller_uuid=f1.id, dest_uuid=leader.id, caller_term=term
        ),
        timeout=5,
    )
    _after_attack(cluster, before, load, since)
    assert cluster.leaders()[TABLET] == leader.id


def test_transfer_vote_without_timeout_now_is_an_ordinary_vote(
    cluster: TserverCluster, load: WriteLoad
) -> None:
    """The report: a RequestVote with the transfer flag made a follower persist a vote for a
    server that never asked.  Without the leader having announced that server as its
    transferee, the flag counts for nothing: the lease holds, no vote, no term."""
    leader, before = _settled(cluster)
    since = time.monotonic()
    f1, f2 = _others(cluster, leader.id)
    term = before[f1.id].term
    for target, candidate in ((f1, f2.id), (f2, f1.id), (leader, f1.id), (f1, leader.id)):
        for pre_vote in (False, True):
            resp = target.consensus.RequestVote(
                pb.RequestVoteRequest(
                    tablet_id=TABLET,
                    candidate_uuid=candidate,
                    dest_uuid=target.id,
                    candidate_term=term + 1,
                    last_log_index=1 << 40,
                    last_log_term=term,
                    is_pre_vote=pre_vote,
                    leader_transfer=True,
                ),
                timeout=5,
            )
            assert not resp.vote_granted
    _after_attack(cluster, before, load, since)
    assert cluster.leaders()[TABLET] == leader.id


def test_forged_higher_term_heartbeats_for_seconds_change_nothing(
    cluster: TserverCluster, load: WriteLoad
) -> None:
    """The report: forged higher-term heartbeats every 0.5 s cut writes from 338 per 2 s to
    16 per 10 s.  Now a replica that hears from its leader ignores a later term it has no
    evidence of, so three seconds of them -- heartbeats and appends of a forged row, from each
    follower's name, ten a second to every replica -- move no term and depose nobody."""
    leader, before = _settled(cluster)
    f1, f2 = _others(cluster, leader.id)
    term = before[f1.id].term
    stop = threading.Event()
    refused: list[str] = []

    def forge() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            for target in cluster.servers.values():
                for caller in (f1.id, f2.id):
                    if caller == target.id:
                        continue
                    for req in (
                        _heartbeat(caller, target.id, term + n),
                        _heartbeat(caller, target.id, term + 1, commit=1 << 20),
                        _forged_row_append(caller, target.id, term + 1, 0),
                    ):
                        try:
                            resp = target.consensus.UpdateConsensus(req, timeout=5)
                        except grpc.RpcError as e:
                            err = server_error(e)
                            refused.append(f"{e.code()}: {err.message if err else ''}")
                            continue
                        assert resp.rejected or resp.HasField("error"), resp
            stop.wait(0.1)

    since = time.monotonic()
    forger = threading.Thread(target=forge, name="forger", daemon=True)
    forger.start()
    try:
        load.wait_acked(50, timeout=30, tablet_id=TABLET, after=since)
        stop.wait(3.0 - (time.monotonic() - since))
        during = load.count(TABLET, after=since)
    finally:
        stop.set()
        forger.join(10)
    assert not forger.is_alive()
    assert not refused, refused[:5]
    assert during >= 50
    _after_attack(cluster, before, load, since)
    assert cluster.leaders()[TABLET] == leader.id
    for s in cluster.servers.values():
        rows = s.scan_rows(TABLET)
        assert b"forged" not in {str(v).encode() for v in rows.values()}


def test_garbage_on_the_consensus_service_is_refused_and_the_server_survives(
    cluster: TserverCluster, load: WriteLoad
) -> None:
    leader, before = _settled(cluster)
    since = time.monotonic()
    for target in cluster.servers.values():
        for method in ("UpdateConsensus", "RequestVote", "TimeoutNow"):
            raw = target.channel.unary_unary(f"/raftlet.ConsensusService/{method}")
            code = _status(raw, b"\xff\xff\xff\x0f garbage")
            assert code is grpc.StatusCode.INVALID_ARGUMENT
        stream = target.channel.stream_stream("/raftlet.ConsensusService/Stream")
        code = _status(stream, iter([b"\xff\xff\xff\x0f garbage"]))
        assert code is not grpc.StatusCode.OK
        # A frame that parses but holds requests that cannot be (term beyond int63, no kind).
        frame = pb.ConsensusFramePB(
            items=[
                pb.ConsensusItemPB(
                    seq=1, update=_heartbeat(_others(cluster, target.id)[0].id, target.id, U64)
                ),
                pb.ConsensusItemPB(seq=2),
            ]
        )
        _stream_answers(target, frame)
    _after_attack(cluster, before, load, since)
    assert cluster.leaders()[TABLET] == leader.id


def _stream_answers(target: Server, frame: pb.ConsensusFramePB) -> None:
    """Send ``frame`` on a consensus stream and check each item is answered ``failed``."""
    stub_stream = target.consensus.Stream
    done = threading.Event()
    got: list[pb.ConsensusItemPB] = []

    def requests() -> Iterator[pb.ConsensusFramePB]:
        yield frame
        done.wait(10)  # keep our side open until the answers are in

    call = stub_stream(requests(), timeout=10)
    try:
        for answer in call:
            got.extend(answer.items)
            if len(got) >= len(frame.items):
                break
    finally:
        done.set()
        call.cancel()
    assert sorted(i.seq for i in got) == [1, 2]
    assert all(i.WhichOneof("kind") == "failed" for i in got), got
    by_seq = {i.seq: i.failed for i in got}
    assert "outside" in by_seq[1].message
