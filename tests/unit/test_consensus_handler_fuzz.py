"""Hypothesis fuzzing of the consensus handlers (``ConsensusRequestHandler``: UpdateConsensus,
RequestVote, TimeoutNow, and ``start``, the consensus stream's path) against a real
``RaftConsensus`` over a real log.

Two properties:

- Refused inputs change nothing: requests no honest peer sends -- terms and indexes beyond
  int63, term 0, TimeoutNow from anyone but the leader in its term, votes and would-be
  leaders of later terms under the leader lease (the transfer flag included), a second
  leader in the known leader's term, non-voters, garbage bytes, unknown enum values -- leave
  the durable term, vote and log exactly as they were, and the replica's role and leader.
- Anything at all (mutated valid requests, any term or index) is answered or refused with a
  ``ValueError``/``UnknownTablet``, never another exception, within the request timeout; and
  afterwards the replica still accepts its leader's appends and commits them, and still
  campaigns when that leader hands over.

The replica is ts-b of (ts-a, ts-b, ts-c), with no peer reachable and an election timeout of
500 s, so the test scripts every input and the leader lease (ts-a's) never runs out.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlet.consensus.core import Role
from raftlet.consensus.core.types import MAX_TERM
from raftlet.consensus.log.metadata import ConsensusMetadata
from raftlet.consensus.rpc.codec import WireRequest
from raftlet.proto import consensus_pb2 as pb
from raftlet.tserver.consensus_handler import ConsensusRequestHandler, WireResponse
from raftlet.tserver.errors import UnknownTablet
from tests.unit.consensus_cluster import Replica, wait_for
from tests.unit.consensus_grpc_servers import TABLET, append_request, lone_replica

U64 = (1 << 64) - 1
I63 = MAX_TERM
# Each call is bounded by the replica's request timeout (5 s); a call this slow is a hang.
CALL_BOUND_S = 8.0

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[tuple[Replica, ConsensusRequestHandler]]:
    """ts-b follows ts-a in term 1, two entries committed and applied."""
    with lone_replica(tmp_path / "b") as replica:
        handler = ConsensusRequestHandler({TABLET: replica.consensus}.get, "ts-b")
        resp = handler.update_consensus(append_request(term=1, prev=0, prev_term=0, n=2, commit=2))
        assert (resp.rejected, resp.last_log_index) == (False, 2)
        wait_for(lambda: replica.data() == [b"e0", b"e1"], what="the priming entries applied")
        yield replica, handler


def _durable(replica: Replica) -> tuple[object, ...]:
    """What a restart would find: the metadata file's term and vote (read back from disk),
    the log's last entry; and the replica's role and leader."""
    hard = ConsensusMetadata.load(str(replica.directory)).hard_state()
    last = replica.storage.last_index()
    snap = replica.consensus.snapshot
    return (hard.term, hard.vote, last, replica.storage.term(last), snap.role, snap.leader_id)


def _call(handler: ConsensusRequestHandler, req: WireRequest, stream: bool) -> WireResponse | None:
    """One request through the unary method or the stream's ``start``; None if refused."""
    began = time.monotonic()
    try:
        if stream:
            box: list[WireResponse] = []
            handler.start(req, box.append)
            wait_for(lambda: bool(box), timeout=CALL_BOUND_S, what="the stream answer")
            return box[0]
        if isinstance(req, pb.UpdateConsensusRequest):
            return handler.update_consensus(req)
        if isinstance(req, pb.RequestVoteRequest):
            return handler.request_vote(req)
        return handler.timeout_now(req)
    except (ValueError, UnknownTablet):
        return None
    finally:
        assert time.monotonic() - began < CALL_BOUND_S, f"{type(req).__name__} hung"


# --- strategies -----------------------------------------------------------------------------

huge = st.one_of(st.integers(I63 + 1, U64), st.sampled_from([I63 + 1, U64]))
any_u64 = st.one_of(st.integers(0, 8), st.integers(0, U64), st.sampled_from([I63, I63 + 1, U64]))
later = st.one_of(st.integers(2, 6), st.integers(2, I63), st.just(I63))
voters = st.sampled_from(["ts-a", "ts-c"])


def _update(**fields: Any) -> pb.UpdateConsensusRequest:
    base: dict[str, Any] = {"tablet_id": TABLET, "caller_uuid": "ts-a", "dest_uuid": "ts-b"}
    base.update(fields)
    return pb.UpdateConsensusRequest(**base)


def _vote(**fields: Any) -> pb.RequestVoteRequest:
    base: dict[str, Any] = {"tablet_id": TABLET, "candidate_uuid": "ts-c", "dest_uuid": "ts-b"}
    base.update(fields)
    return pb.RequestVoteRequest(**base)


def _timeout_now(**fields: Any) -> pb.TimeoutNowRequest:
    base: dict[str, Any] = {"tablet_id": TABLET, "caller_uuid": "ts-a", "dest_uuid": "ts-b"}
    base.update(fields)
    return pb.TimeoutNowRequest(**base)


@st.composite
def entries(draw: st.DrawFn, prev: int, term: int) -> list[pb.EntryPB]:
    return [
        pb.EntryPB(
            index=prev + 1 + i,
            term=term,
            type=draw(st.sampled_from([pb.NORMAL, pb.NO_OP])),
            payload=b"forged",
        )
        for i in range(draw(st.integers(0, 3)))
    ]


@st.composite
def refused_requests(draw: st.DrawFn) -> WireRequest:
    """One request of a kind the replica must refuse or drop without any state change."""
    kind = draw(st.integers(0, 11))
    if kind == 0:  # a term beyond int63 -- the reported wedge was 2**64 - 1
        return _update(caller_term=draw(huge), is_heartbeat=True, caller_uuid=draw(voters))
    if kind == 1:
        return _vote(
            candidate_term=draw(huge),
            is_pre_vote=draw(st.booleans()),
            leader_transfer=draw(st.booleans()),
        )
    if kind == 2:  # an index beyond int63
        field = draw(st.sampled_from(["prev_log_index", "committed_index", "read_round"]))
        return _update(caller_term=1, prev_log_term=1, **{field: draw(huge)})
    if kind == 3:  # a would-be leader of a later term, under ts-a's lease
        term = draw(later)
        heartbeat = draw(st.booleans())
        return _update(
            caller_uuid=draw(voters),
            caller_term=term,
            is_heartbeat=heartbeat,
            committed_index=draw(st.integers(0, 4)),
            entries=[] if heartbeat else draw(entries(0, term)),
        )
    if kind == 4:  # a vote of a later term, under the lease; the transfer flag alone is no proof
        term = draw(later)
        return _vote(
            candidate_uuid=draw(voters),
            candidate_term=term,
            last_log_index=draw(st.sampled_from([2, 100])),
            last_log_term=min(term - 1, draw(st.integers(1, 9))),
            is_pre_vote=draw(st.booleans()),
            leader_transfer=draw(st.booleans()),
        )
    if kind == 5:  # TimeoutNow from a follower, or from any term but the leader's current one
        if draw(st.booleans()):
            # Mostly in the current term (1), where only the sender's identity is wrong.
            term = draw(st.one_of(st.just(1), st.integers(1, 9)))
            return _timeout_now(caller_uuid="ts-c", caller_term=term)
        return _timeout_now(caller_term=draw(st.one_of(later, st.just(0), huge)))
    if kind == 6:  # a second leader in ts-a's term
        return _update(
            caller_uuid="ts-c",
            caller_term=1,
            is_heartbeat=True,
            committed_index=draw(st.integers(0, 4)),
            transferee_uuid=draw(st.sampled_from(["", "ts-a"])),
        )
    if kind == 7:  # a vote in the current term, whose leader is known
        return _vote(candidate_term=1, last_log_index=draw(st.integers(0, 9)), last_log_term=0)
    if kind == 8:  # not a voter, or not for this server
        caller = draw(st.sampled_from(["ts-x", "ts-b", ""]))
        return draw(
            st.sampled_from(
                [
                    _update(caller_uuid=caller, caller_term=draw(later), is_heartbeat=True),
                    _vote(candidate_uuid=caller, candidate_term=draw(later)),
                    _timeout_now(caller_uuid=caller, caller_term=1),
                    _timeout_now(caller_term=1, dest_uuid="ts-c"),
                ]
            )
        )
    if kind == 9:  # unknown enum values and nonsensical log positions
        return draw(
            st.sampled_from(
                [
                    _update(caller_term=1, prev_log_index=2, prev_log_term=1,
                            entries=[pb.EntryPB(index=3, term=1, type=draw(
                                st.sampled_from([0, pb.CONFIG_CHANGE, 9, 1 << 20])))]),
                    _update(caller_term=1, prev_log_index=2, prev_log_term=0),
                    _update(caller_term=1, prev_log_index=0, prev_log_term=1),
                    _update(caller_term=1, prev_log_index=2, prev_log_term=1,
                            entries=[pb.EntryPB(index=3, term=2)]),
                    _update(caller_term=1, prev_log_index=2, prev_log_term=1,
                            entries=[pb.EntryPB(index=3, term=1), pb.EntryPB(index=5, term=1)]),
                    _update(caller_term=1, is_heartbeat=True, prev_log_index=2, prev_log_term=1),
                    _update(caller_term=1, is_heartbeat=True, transferee_uuid="ts-a"),
                    _vote(candidate_term=2, last_log_index=2, last_log_term=2),
                ]
            )
        )  # fmt: skip
    if kind == 10:  # garbage bytes, whatever they parse as
        raw = draw(st.binary(max_size=64))
        kind_of = draw(st.sampled_from([pb.UpdateConsensusRequest, pb.RequestVoteRequest]))
        try:
            req = kind_of.FromString(raw)
        except Exception:
            return _update(caller_term=0)
        # Only garbage that could not be an acceptable request: addressed as it came, from
        # whoever it names, at a term the lease or the range check refuses.
        if isinstance(req, pb.UpdateConsensusRequest):
            if req.caller_term <= 1:
                req.caller_term = draw(st.one_of(later, huge))
        elif req.candidate_term <= 1:
            req.candidate_term = draw(st.one_of(later, huge))
        return req
    # A request of term 0, which no leader or candidate has.
    return draw(st.sampled_from([_update(is_heartbeat=True), _vote(), _timeout_now(caller_term=0)]))


@st.composite
def any_requests(draw: st.DrawFn) -> WireRequest:
    """Mutated valid requests: every field sometimes anything."""

    def sometimes(good: Any, bad: st.SearchStrategy[Any]) -> Any:
        return draw(st.one_of(st.just(good), bad))

    caller = sometimes("ts-a", st.sampled_from(["ts-c", "ts-b", "ts-x", ""]))
    dest = sometimes("ts-b", st.sampled_from(["ts-a", ""]))
    term = sometimes(1, any_u64)
    which = draw(st.integers(0, 2))
    if which == 0:
        prev = sometimes(2, any_u64)
        return _update(
            tablet_id=sometimes(TABLET, st.sampled_from(["", "other"])),
            caller_uuid=caller,
            dest_uuid=dest,
            caller_term=term,
            prev_log_index=prev,
            prev_log_term=sometimes(1, any_u64),
            committed_index=sometimes(2, any_u64),
            is_heartbeat=draw(st.booleans()),
            read_round=sometimes(0, any_u64),
            transferee_uuid=sometimes("", st.sampled_from(["ts-a", "ts-c", "ts-x"])),
            entries=[
                pb.EntryPB(
                    index=sometimes(min(prev, U64 - 9) + 1 + i, any_u64),
                    term=sometimes(min(term, 1), any_u64),
                    type=sometimes(pb.NORMAL, st.sampled_from([pb.NO_OP, 0, 3, 99])),
                    payload=b"fuzz",
                )
                for i in range(draw(st.integers(0, 3)))
            ],
        )
    if which == 1:
        return _vote(
            candidate_uuid=sometimes("ts-c", st.sampled_from(["ts-a", "ts-b", "ts-x", ""])),
            dest_uuid=dest,
            candidate_term=term,
            last_log_index=sometimes(2, any_u64),
            last_log_term=sometimes(1, any_u64),
            is_pre_vote=draw(st.booleans()),
            leader_transfer=draw(st.booleans()),
        )
    return _timeout_now(caller_uuid=caller, dest_uuid=dest, caller_term=term)


# --- the properties ---------------------------------------------------------------------------


def test_refused_inputs_persist_nothing_and_change_nothing(
    follower: tuple[Replica, ConsensusRequestHandler],
) -> None:
    replica, handler = follower
    before = _durable(replica)
    assert before[:2] == (1, "")
    assert before[4:] == (Role.FOLLOWER, "ts-a")

    @FUZZ
    @given(refused_requests(), st.booleans())
    def run(req: WireRequest, stream: bool) -> None:
        resp = _call(handler, req, stream)
        if isinstance(resp, pb.RequestVoteResponse):
            assert not resp.vote_granted
        elif isinstance(resp, pb.UpdateConsensusResponse):
            # Answered, not followed: a dropped request (error set) or a stale caller told
            # our term; never an acknowledgement of a would-be leader's log.
            assert (
                resp.HasField("error") or resp.responder_term > req.caller_term or (resp.rejected)
            )
        assert _durable(replica) == before, f"{type(req).__name__} changed durable state"

    run()
    _still_works(replica, handler)


def test_any_input_is_answered_or_refused_and_the_replica_still_works(
    follower: tuple[Replica, ConsensusRequestHandler],
) -> None:
    replica, handler = follower
    terms_seen = [replica.consensus.snapshot.term]

    @FUZZ
    @given(any_requests(), st.booleans())
    def run(req: WireRequest, stream: bool) -> None:
        _call(handler, req, stream)
        st_ = replica.consensus.status()
        term = st_["term"]
        assert isinstance(term, int)
        assert terms_seen[-1] <= term <= MAX_TERM
        terms_seen.append(term)
        commit, last = st_["commit_index"], st_["last_index"]
        assert isinstance(commit, int)
        assert isinstance(last, int)
        assert commit <= last
        assert not replica.consensus.failed()

    run()
    hard = ConsensusMetadata.load(str(replica.directory)).hard_state()
    assert hard.term <= MAX_TERM
    _still_works(replica, handler)


def _still_works(replica: Replica, handler: ConsensusRequestHandler) -> None:
    """The replica's leader (ts-a if it knows none) appends and commits an entry in its term,
    then hands over: the replica campaigns at once."""
    snap = replica.consensus.snapshot
    leader = snap.leader_id or "ts-a"
    term = snap.term
    last = replica.storage.last_index()
    # Probe at our own last index; a rejection's hint names the last entry we hold.
    probe = handler.update_consensus(
        _update(caller_uuid=leader, caller_term=term, prev_log_index=last, prev_log_term=term)
    )
    assert not probe.HasField("error"), probe.error.message
    prev, prev_term = (
        (probe.last_log_index, term)
        if not probe.rejected
        else (probe.conflict_index, probe.conflict_term)
    )
    append = _update(
        caller_uuid=leader,
        caller_term=term,
        prev_log_index=prev,
        prev_log_term=prev_term,
        entries=[pb.EntryPB(index=prev + 1, term=term, type=pb.NORMAL, payload=b"after")],
        committed_index=prev + 1,
    )
    resp = handler.update_consensus(append)
    assert (resp.HasField("error"), resp.rejected, resp.last_log_index) == (False, False, prev + 1)
    wait_for(lambda: replica.data()[-1:] == [b"after"], what="the leader's entry applied")

    handler.timeout_now(_timeout_now(caller_uuid=leader, caller_term=term))

    def is_candidate() -> bool:
        snap = replica.consensus.snapshot
        return snap.role is Role.CANDIDATE and snap.term == term + 1

    wait_for(is_candidate, what="the replica campaigns when its leader hands over")
