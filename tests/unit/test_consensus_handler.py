"""tserver/consensus_handler.py: the consensus service's work against a real RaftConsensus
(accepts, rejects, drops, refuses garbage), and the status codes it maps to over the wire."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from raftlet.client.channels import ChannelPool
from raftlet.consensus.core import Role
from raftlet.consensus.rpc.codec import MalformedRequest, WrongServerUuid
from raftlet.proto import common_pb2, consensus_pb2_grpc
from raftlet.proto import consensus_pb2 as pb
from raftlet.tserver.consensus_handler import ConsensusRequestHandler
from raftlet.tserver.errors import UnknownTablet
from tests.unit.consensus_cluster import Replica, wait_for
from tests.unit.consensus_grpc_servers import (
    IDS,
    TABLET,
    Server,
    append_request,
    lone_replica,
    start_server,
    vote_request,
)


@pytest.fixture
def lone(tmp_path: Path) -> Iterator[Replica]:
    with lone_replica(tmp_path / "b") as replica:
        yield replica


def test_handler_appends_heartbeats_and_reports_state(lone: Replica) -> None:
    handler = ConsensusRequestHandler({TABLET: lone.consensus}.get, "ts-b")

    resp = handler.update_consensus(append_request(term=1, prev=0, prev_term=0, n=2))
    assert not resp.HasField("error")
    assert (resp.responder_uuid, resp.responder_term, resp.rejected) == ("ts-b", 1, False)
    assert resp.last_log_index == 2
    assert not resp.is_heartbeat

    # A probe (APPEND, no entries) whose prev does not match is rejected with a hint...
    probe = handler.update_consensus(append_request(term=1, prev=5, prev_term=1, n=0))
    assert probe.rejected
    assert (probe.last_log_index, probe.conflict_index, probe.conflict_term) == (5, 2, 1)
    # ...while a heartbeat has no log check and just moves the commit index.
    hb = handler.update_consensus(
        pb.UpdateConsensusRequest(
            tablet_id=TABLET,
            caller_uuid="ts-a",
            dest_uuid="ts-b",
            caller_term=1,
            committed_index=2,
            is_heartbeat=True,
        )
    )
    assert hb.is_heartbeat
    assert not hb.rejected
    wait_for(lambda: lone.data() == [b"e0", b"e1"], what="both entries applied")

    state = handler.get_consensus_state(pb.GetConsensusStateRequest(tablet_id=TABLET)).state
    assert state.tablet_id == TABLET
    assert (state.current_term, state.role, state.leader_uuid) == (1, pb.FOLLOWER, "ts-a")
    assert (state.commit_index, state.last_log_index) == (2, 2)
    assert list(state.voters) == list(IDS)
    assert not state.leader_ready

    # Same term, but b already follows ts-a: the vote is refused -- an answer, not an error.
    denied = handler.request_vote(vote_request(term=1))
    assert not denied.HasField("error")
    assert (denied.responder_term, denied.vote_granted) == (1, False)


def test_a_dropped_request_is_answered_with_an_error_not_silence(lone: Replica) -> None:
    handler = ConsensusRequestHandler({TABLET: lone.consensus}.get, "ts-b")
    handler.update_consensus(append_request(term=3, prev=0, prev_term=0, n=0))

    # The core ignores a vote from a past term and sends nothing back.
    stale = handler.request_vote(vote_request(term=2))
    assert stale.HasField("error")
    assert stale.error.code == common_pb2.ServerErrorPB.UNKNOWN
    assert "dropped VOTE of term 2" in stale.error.message
    assert (stale.responder_uuid, stale.responder_term, stale.vote_granted) == ("ts-b", 3, False)

    # A stale leader's heartbeat IS answered by the core (with the newer term), no error.
    old = handler.update_consensus(
        pb.UpdateConsensusRequest(
            tablet_id=TABLET, caller_uuid="ts-c", dest_uuid="ts-b", caller_term=2, is_heartbeat=True
        )
    )
    assert not old.HasField("error")
    assert old.responder_term == 3

    lone.consensus.stop()  # a stopping replica drops everything
    gone = handler.update_consensus(append_request(term=3, prev=0, prev_term=0, n=1))
    assert gone.HasField("error")
    assert gone.rejected
    assert gone.responder_term == 3
    assert "stopping" in gone.error.message


def test_handler_refuses_misaddressed_and_unknown(lone: Replica) -> None:
    handler = ConsensusRequestHandler({TABLET: lone.consensus}.get, "ts-b")
    with pytest.raises(UnknownTablet) as missing:
        handler.update_consensus(
            pb.UpdateConsensusRequest(
                tablet_id="nope", caller_uuid="ts-a", dest_uuid="ts-b", caller_term=1
            )
        )
    assert missing.value.tablet_id == "nope"
    with pytest.raises(UnknownTablet):
        handler.get_consensus_state(pb.GetConsensusStateRequest(tablet_id="nope"))
    with pytest.raises(MalformedRequest, match="'ts-x' is not a voter of tablet"):
        handler.request_vote(vote_request(term=1, caller="ts-x"))
    with pytest.raises(WrongServerUuid):
        ConsensusRequestHandler({TABLET: lone.consensus}.get, "ts-c").update_consensus(
            append_request(term=1, prev=0, prev_term=0, n=1)
        )
    bad = append_request(term=1, prev=0, prev_term=0, n=1)
    bad.entries[0].type = pb.CONFIG_CHANGE  # whose payload is no membership
    with pytest.raises(ValueError, match="holds no membership"):
        handler.update_consensus(bad)
    with pytest.raises(ValueError, match="tablet_id is missing"):
        handler.get_consensus_state(pb.GetConsensusStateRequest())
    assert lone.consensus.snapshot.term == 0, "nothing malformed reached the core"


def test_timeout_now_makes_the_follower_campaign_at_once(lone: Replica) -> None:
    handler = ConsensusRequestHandler({TABLET: lone.consensus}.get, "ts-b")
    handler.update_consensus(append_request(term=1, prev=0, prev_term=0, n=1))
    resp = handler.timeout_now(
        pb.TimeoutNowRequest(tablet_id=TABLET, caller_uuid="ts-a", dest_uuid="ts-b", caller_term=1)
    )
    assert not resp.HasField("error")
    # No pre-vote for a transfer: straight to a real candidacy in the next term.
    wait_for(
        lambda: (
            lone.consensus.snapshot.role is Role.CANDIDATE and lone.consensus.snapshot.term == 2
        ),
        what="ts-b campaigns in term 2",
    )


# --- over the wire ---------------------------------------------------------------------------


@pytest.fixture
def served(lone: Replica) -> Iterator[tuple[Server, ChannelPool]]:
    server = start_server("ts-b")
    server.replicas[TABLET] = lone.consensus
    pool = ChannelPool()
    try:
        yield server, pool
    finally:
        pool.close()
        server.stop()


def test_status_codes_over_the_wire_and_the_server_survives_garbage(
    served: tuple[Server, ChannelPool],
) -> None:
    server, pool = served
    channel = pool.channel(server.addr)
    stub = consensus_pb2_grpc.ConsensusServiceStub(channel)  # type: ignore[no-untyped-call]

    def code_of(call: Callable[[], object]) -> grpc.StatusCode:
        with pytest.raises(grpc.RpcError) as info:
            call()
        return info.value.code()

    bad = append_request(term=1, prev=0, prev_term=0, n=2)
    bad.entries[1].index = 7
    assert code_of(lambda: stub.UpdateConsensus(bad, timeout=5)) is grpc.StatusCode.INVALID_ARGUMENT
    wrong = vote_request(term=1)
    wrong.dest_uuid = "ts-c"
    assert code_of(lambda: stub.RequestVote(wrong, timeout=5)) is grpc.StatusCode.INVALID_ARGUMENT
    unknown = append_request(term=1, prev=0, prev_term=0, n=0)
    unknown.tablet_id = "nope"
    assert code_of(lambda: stub.UpdateConsensus(unknown, timeout=5)) is grpc.StatusCode.NOT_FOUND

    raw = channel.unary_unary("/raftlet.ConsensusService/UpdateConsensus")
    assert code_of(lambda: raw(b"\xff\xff\xff garbage", timeout=5)) is not grpc.StatusCode.OK

    state = stub.GetConsensusState(pb.GetConsensusStateRequest(tablet_id=TABLET), timeout=5)
    assert state.state.current_term == 0, "nothing reached the replica, and it still serves"
    assert pool.channels_created == 1
