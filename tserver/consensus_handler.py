"""What the consensus service runs on its own threads: ``ConsensusRequestHandler``.

Decode a peer's request, find the replica, let ``RaftConsensus`` step it, encode the
answer.  The unary RPCs block until the answer may leave (after what it acknowledges is
durable); ``start``, the consensus stream's way (``consensus_stream_server``), returns at
once and completes the answer from a callback.  The client side of both lives in
``consensus.rpc``; this side needs the tablet server's replicas, so it lives here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from raftlet.consensus.core import Message, MessageType, Role
from raftlet.consensus.raft_consensus import RaftConsensus
from raftlet.consensus.rpc.codec import (
    MalformedRequest,
    WireRequest,
    message_from_timeout_now_request,
    message_from_update_request,
    message_from_vote_request,
    update_response_from_message,
    vote_response_from_message,
)
from raftlet.proto import common_pb2
from raftlet.proto import consensus_pb2 as pb
from raftlet.tserver.errors import UnknownTablet

__all__ = ["ConsensusRequestHandler", "WireResponse"]

logger = logging.getLogger(__name__)

WireResponse = pb.UpdateConsensusResponse | pb.RequestVoteResponse | pb.TimeoutNowResponse
_UPDATE_ANSWERS = frozenset({MessageType.APPEND_RESPONSE, MessageType.HEARTBEAT_RESPONSE})
_VOTE_ANSWERS = frozenset({MessageType.VOTE_RESPONSE, MessageType.PRE_VOTE_RESPONSE})


class ConsensusRequestHandler:
    """The consensus service's work, as plain blocking methods for its service-pool threads.

    Raises ``UnknownTablet`` (NOT_FOUND) for a tablet with no replica here and
    ``MalformedRequest`` -- a ``ValueError``; ``WrongServerUuid`` when dest_uuid names another
    server -- (INVALID_ARGUMENT) for a request that is garbage, misaddressed, or from a
    server that is neither a member of the tablet's group nor one of ``peers`` (the cluster's
    servers, which a member that lags behind a membership change must hear: see
    ``consensus.core.Config.peers``) -- all before anything is stepped, so none of it
    can change the replica's state.  A request the replica drops (stale, ignored under the
    leader lease, implausible from its sender -- ``Raft.step`` -- or the replica is stopping)
    is still answered, with ``error`` set and ``rejected`` true, so the caller's call
    completes at once instead of timing out."""

    def __init__(
        self,
        lookup: Callable[[str], RaftConsensus | None],
        server_uuid: str,
        peers: Collection[str] = (),
    ) -> None:
        self._lookup = lookup
        self.server_uuid = server_uuid
        self._peers = frozenset(peers)

    def update_consensus(self, req: pb.UpdateConsensusRequest) -> pb.UpdateConsensusResponse:
        message = message_from_update_request(req, self.server_uuid)
        consensus = self._replica_for(req.tablet_id, message.src)
        return self._update_answer(consensus, message, req, consensus.handle_request(message))

    def request_vote(self, req: pb.RequestVoteRequest) -> pb.RequestVoteResponse:
        message = message_from_vote_request(req, self.server_uuid)
        consensus = self._replica_for(req.tablet_id, message.src)
        return self._vote_answer(consensus, message, req, consensus.handle_request(message))

    def timeout_now(self, req: pb.TimeoutNowRequest) -> pb.TimeoutNowResponse:
        message = message_from_timeout_now_request(req, self.server_uuid)
        consensus = self._replica_for(req.tablet_id, message.src)
        consensus.handle_request(message)
        return self._timeout_now_answer(consensus, message)

    def start(self, req: WireRequest, done: Callable[[WireResponse], None]) -> None:
        """Step ``req`` and return at once; ``done`` gets its response from whichever thread
        makes the answer durable (the consensus stream's way: no thread waits for it).
        Raises what the blocking methods raise, before anything is stepped."""
        if isinstance(req, pb.UpdateConsensusRequest):
            update = message_from_update_request(req, self.server_uuid)
            consensus = self._replica_for(req.tablet_id, update.src)
            consensus.handle_request_async(
                update, lambda a: done(self._update_answer(consensus, update, req, a))
            )
        elif isinstance(req, pb.RequestVoteRequest):
            vote = message_from_vote_request(req, self.server_uuid)
            consensus = self._replica_for(req.tablet_id, vote.src)
            consensus.handle_request_async(
                vote, lambda a: done(self._vote_answer(consensus, vote, req, a))
            )
        else:
            timeout_now = message_from_timeout_now_request(req, self.server_uuid)
            consensus = self._replica_for(req.tablet_id, timeout_now.src)
            consensus.handle_request_async(
                timeout_now, lambda _a: done(self._timeout_now_answer(consensus, timeout_now))
            )

    def _update_answer(
        self,
        consensus: RaftConsensus,
        message: Message,
        req: pb.UpdateConsensusRequest,
        answer: Message | None,
    ) -> pb.UpdateConsensusResponse:
        if answer is not None and answer.type in _UPDATE_ANSWERS:
            return update_response_from_message(answer)
        return pb.UpdateConsensusResponse(
            responder_uuid=self.server_uuid,
            responder_term=consensus.snapshot.term,
            rejected=True,
            is_heartbeat=req.is_heartbeat,
            error=self._dropped(consensus, message, answer),
        )

    def _vote_answer(
        self,
        consensus: RaftConsensus,
        message: Message,
        req: pb.RequestVoteRequest,
        answer: Message | None,
    ) -> pb.RequestVoteResponse:
        if answer is not None and answer.type in _VOTE_ANSWERS:
            return vote_response_from_message(answer)
        error = self._dropped(consensus, message, answer)
        return pb.RequestVoteResponse(
            responder_uuid=self.server_uuid,
            responder_term=consensus.snapshot.term,
            vote_granted=False,
            is_pre_vote=req.is_pre_vote,
            reason=error.message,
            error=error,
        )

    def _timeout_now_answer(
        self, consensus: RaftConsensus, message: Message
    ) -> pb.TimeoutNowResponse:
        # The answer to TIMEOUT_NOW is the election it starts; the step itself answers nothing.
        if consensus.failed():
            return pb.TimeoutNowResponse(error=self._dropped(consensus, message, None))
        return pb.TimeoutNowResponse()

    def get_consensus_state(self, req: pb.GetConsensusStateRequest) -> pb.GetConsensusStateResponse:
        if not req.tablet_id:
            raise MalformedRequest("GetConsensusState: tablet_id is missing")
        consensus = self._lookup(req.tablet_id)
        if consensus is None:
            raise UnknownTablet(req.tablet_id)
        st = consensus.status()
        role = Role(st["role"])
        state = pb.ConsensusStatePB(
            tablet_id=req.tablet_id,
            current_term=_int(st["term"]),
            role=role.value,  # RaftRole names match Role values
            leader_uuid=str(st["leader"]),
            leader_ready=bool(st["leader_ready"]),
            commit_index=_int(st["commit_index"]),
            applied_index=_int(st["applied_index"]),
            last_log_index=_int(st["last_index"]),
            voters=list(consensus.voters),
            voted_for=str(st["voted_for"]),
            learners=list(consensus.membership.learners),
            config_index=_int(st["config_index"]),
        )
        return pb.GetConsensusStateResponse(state=state)

    # --- helpers -------------------------------------------------------------------------

    def _replica_for(self, tablet_id: str, caller: str) -> RaftConsensus:
        consensus = self._lookup(tablet_id)
        if consensus is None:
            raise UnknownTablet(tablet_id)
        # The core would silently drop it; refusing it here tells the caller (a server with a
        # stale or wrong config) why it is never heard.
        members = consensus.membership.members()
        if caller not in members and caller not in self._peers:
            raise MalformedRequest(
                f"{caller!r} is not a voter of tablet {tablet_id!r} (voters: "
                f"{', '.join(consensus.voters)}; learners: "
                f"{', '.join(consensus.membership.learners) or 'none'})"
            )
        return consensus

    def _dropped(
        self, consensus: RaftConsensus, request: Message, answer: Message | None
    ) -> common_pb2.ServerErrorPB:
        if consensus.failed():
            return common_pb2.ServerErrorPB(
                code=common_pb2.ServerErrorPB.TABLET_NOT_RUNNING,
                message=f"replica of {consensus.group_id} on {self.server_uuid} has failed",
            )
        if answer is not None:  # cannot happen with the core as it is; say so if it does
            logger.warning(
                "%s: %s answered with %s", consensus.group_id, request.type.value, answer.type
            )
        snapshot = consensus.snapshot
        # UNKNOWN: "fits no other code; the message says more".  The core drops a request
        # silently and does not say why, so the message lists what it can be.
        return common_pb2.ServerErrorPB(
            code=common_pb2.ServerErrorPB.UNKNOWN,
            message=(
                f"replica of {consensus.group_id} on {self.server_uuid} (term {snapshot.term}) "
                f"dropped {request.type.value} of term {request.term} from {request.src}: "
                "stale term, ignored under the leader lease, not plausible from this sender "
                "(a term leap, a TimeoutNow or append not from the known leader), "
                "not answered in time, or the replica is stopping"
            ),
            leader_uuid=snapshot.leader_id,
        )


def _int(value: object) -> int:
    assert isinstance(value, int)
    return value
