"""The consensus RPCs over gRPC: channels, the client-side Transport, the server-side handler.

- ``ChannelPool``: one long-lived ``grpc.Channel`` per peer address, shared by every tablet
  replica (and the client-facing code) of a server.  A channel multiplexes any number of
  concurrent calls over one HTTP/2 connection, so a channel per call or per tablet would only
  add connection setup and file descriptors.
- ``GrpcTransport``: the unary transport (``--consensus_transport=unary``; the default is
  ``tserver.consensus_stream``), one per tablet replica; implements the consensus
  ``Transport`` by turning each core request into its RPC, sent with the stub's ``.future()``
  so the caller (holding the consensus lock) never waits on the network, and stepping the
  answer back through ``on_response`` from gRPC's callback thread.
- ``ConsensusRequestHandler``: what the consensus service runs on its own service-pool
  threads: decode, find the replica, let ``RaftConsensus`` step it, encode.  The unary RPCs
  block until the answer may leave (after what it acknowledges is durable); ``start``, the
  consensus stream's way, returns at once and completes the answer from a callback.

Failures follow Raft's model of the network: an RPC error, deadline, cancellation, or an
answer that cannot be stepped is a lost message (``on_response(None)``); the transport never
retries, the core resends what still matters on its next heartbeat or append.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from raftlet.consensus.core import Message, MessageType, Role
from raftlet.consensus.raft_consensus import RaftConsensus
from raftlet.consensus.transport import ResponseCallback
from raftlet.proto import common_pb2, consensus_pb2_grpc
from raftlet.proto import consensus_pb2 as pb
from raftlet.tserver.consensus_codec import (
    MalformedRequest,
    MalformedResponse,
    WireRequest,
    decode_response,
    encode_request,
    message_from_timeout_now_request,
    message_from_update_request,
    message_from_vote_request,
    update_response_from_message,
    vote_response_from_message,
)
from raftlet.tserver.errors import TabletNotFound

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "ChannelPool",
    "ConsensusRequestHandler",
    "GrpcTransport",
    "log_unsendable",
    "server_options",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20

# Client keepalive: an idle peer channel (a tablet with no leader here, say) pings every
# KEEPALIVE_TIME_MS so a silently dead connection (a peer host lost without a FIN) is noticed
# and re-established before the next election needs it, not after a TCP timeout of minutes.
_KEEPALIVE_TIME_MS = 20_000
_KEEPALIVE_TIMEOUT_MS = 10_000
# A gRPC server by default answers pings more frequent than every 5 minutes with GOAWAY
# ("too_many_pings"); servers that accept our channels must allow our interval.
_SERVER_MIN_PING_INTERVAL_MS = _KEEPALIVE_TIME_MS // 2


def server_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """gRPC server options that match ``ChannelPool``'s channels: the same message cap, and
    permission for their keepalive pings (without it the server would GOAWAY them)."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", _SERVER_MIN_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", 0),
    ]


class ChannelPool:
    """One ``grpc.Channel`` per address, created on first use and kept until ``close()``."""

    def __init__(
        self,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        *,
        max_reconnect_backoff_s: float = 1.0,
    ) -> None:
        self._options: list[tuple[str, int]] = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.keepalive_time_ms", _KEEPALIVE_TIME_MS),
            ("grpc.keepalive_timeout_ms", _KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # gRPC's default reconnect backoff grows to 120 s: a peer that restarts would be
            # unreachable from here for minutes after it is back.  Raft peers are few, so
            # retrying the connection often is cheap, and a returning replica catches up
            # (or a restarted leader is deposed) within about a second.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", max(100, int(max_reconnect_backoff_s * 1000))),
            # Replica-to-replica traffic never goes through an HTTP proxy from the environment.
            ("grpc.enable_http_proxy", 0),
        ]
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        self._created = 0
        self._closed = False

    @property
    def options(self) -> list[tuple[str, int]]:
        return list(self._options)

    def get(self, addr: str) -> grpc.Channel:
        """The channel to ``addr`` ("host:port"); RuntimeError once the pool is closed."""
        with self._lock:
            if self._closed:
                raise RuntimeError("channel pool is closed")
            channel = self._channels.get(addr)
            if channel is None:
                channel = grpc.insecure_channel(addr, options=self._options)
                self._channels[addr] = channel
                self._created += 1
            return channel

    @property
    def channels_created(self) -> int:
        """How many channels this pool ever created: one per address, never per call."""
        with self._lock:
            return self._created

    def addresses(self) -> list[str]:
        with self._lock:
            return sorted(self._channels)

    def close(self) -> None:
        """Close every channel; calls still in flight on them end CANCELLED."""
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
        for channel in channels:
            channel.close()


def log_unsendable(tablet_id: str, message: Message, exc: Exception, *, closed: bool) -> None:
    """A message a transport could not send: a warning, unless the transport is closed --
    then it is the normal end of a replica's traffic, not news."""
    logger.log(
        logging.DEBUG if closed else logging.WARNING,
        "%s: cannot send %s to %s: %s",
        tablet_id,
        message.type.value,
        message.dst,
        exc,
    )


class GrpcTransport:
    """The ``Transport`` of one tablet replica over a server's shared ``ChannelPool``.

    ``addresses`` maps each peer's node id (its server uuid) to its RPC address.
    ``timeout_s`` is every call's deadline; it should exceed the peer's
    ``ConsensusOptions.request_timeout_s`` plus its fsync time, since a follower answers an
    append only once the entries are durable."""

    def __init__(
        self,
        tablet_id: str,
        addresses: Mapping[str, str],
        channels: ChannelPool,
        timeout_s: float,
    ) -> None:
        self.tablet_id = tablet_id
        self._addresses = dict(addresses)
        self._channels = channels
        self._timeout_s = timeout_s
        self._stubs: dict[str, consensus_pb2_grpc.ConsensusServiceStub] = {}
        self._inflight: set[grpc.Future] = set()
        self._lock = threading.Lock()
        self._closed = False

    def send(self, message: Message, on_response: ResponseCallback) -> None:
        """Start the RPC for ``message`` and return at once; ``on_response`` gets the answer,
        or None if there is none to step (exactly once per send, from any thread)."""
        try:
            request = encode_request(message, self.tablet_id)
            future = self._call(message, request)
        except Exception as exc:  # unknown peer, closed pool/transport, unencodable message
            log_unsendable(self.tablet_id, message, exc, closed=self._closed)
            on_response(None)
            return
        future.add_done_callback(lambda f: self._done(message, f, on_response))

    def _call(self, message: Message, request: Any) -> grpc.Future:
        with self._lock:
            if self._closed:
                raise RuntimeError("transport is closed")
            stub = self._stubs.get(message.dst)
            if stub is None:
                addr = self._addresses.get(message.dst)
                if addr is None:
                    raise LookupError(f"no address for peer {message.dst!r}")
                channel = self._channels.get(addr)
                stub = consensus_pb2_grpc.ConsensusServiceStub(channel)  # type: ignore[no-untyped-call]
                self._stubs[message.dst] = stub
            if message.type in (MessageType.APPEND, MessageType.HEARTBEAT):
                rpc = stub.UpdateConsensus
            elif message.type is MessageType.TIMEOUT_NOW:
                rpc = stub.TimeoutNow
            else:
                rpc = stub.RequestVote
            future: grpc.Future = rpc.future(request, timeout=self._timeout_s)
            # Registered under the lock so close() cannot miss a call started concurrently.
            self._inflight.add(future)
        return future

    def _done(self, request: Message, future: grpc.Future, on_response: ResponseCallback) -> None:
        # Runs on a gRPC thread (or inline if the call already finished): must not raise,
        # and only hands the answer on; the replica queues it for its worker thread.
        with self._lock:
            self._inflight.discard(future)
        answer: Message | None = None
        try:
            if not future.cancelled() and future.exception() is None:
                if request.type is not MessageType.TIMEOUT_NOW:  # its answer carries nothing
                    answer = decode_response(request, future.result())
            elif not future.cancelled():
                logger.debug(
                    "%s: %s to %s failed: %s",
                    self.tablet_id,
                    request.type.value,
                    request.dst,
                    future.exception(),
                )
        except MalformedResponse as exc:
            logger.debug("%s: dropping answer from %s: %s", self.tablet_id, request.dst, exc)
        except Exception:
            logger.exception("%s: answer from %s could not be read", self.tablet_id, request.dst)
        try:
            on_response(answer)
        except Exception:
            logger.exception("%s: on_response failed", self.tablet_id)

    def close(self) -> None:
        """Refuse further sends and cancel calls in flight (their callbacks get None).  The
        channels belong to the pool and stay open for the server's other replicas."""
        with self._lock:
            self._closed = True
            inflight = list(self._inflight)
        for future in inflight:
            future.cancel()


WireResponse = pb.UpdateConsensusResponse | pb.RequestVoteResponse | pb.TimeoutNowResponse
_UPDATE_ANSWERS = frozenset({MessageType.APPEND_RESPONSE, MessageType.HEARTBEAT_RESPONSE})
_VOTE_ANSWERS = frozenset({MessageType.VOTE_RESPONSE, MessageType.PRE_VOTE_RESPONSE})


class ConsensusRequestHandler:
    """The consensus service's work, as plain blocking methods for its service-pool threads.

    Raises ``TabletNotFound`` (NOT_FOUND) for a tablet with no replica here and
    ``MalformedRequest`` -- a ``ValueError``; ``WrongServerUuid`` when dest_uuid names another
    server -- (INVALID_ARGUMENT) for a request that is garbage, misaddressed, or from a
    server that is not a voter of the tablet.  A request the replica drops (stale, ignored
    under the leader lease, or the replica is stopping) is still answered, with ``error`` set
    and ``rejected`` true, so the caller's call completes at once instead of timing out."""

    def __init__(self, lookup: Callable[[str], RaftConsensus | None], server_uuid: str) -> None:
        self._lookup = lookup
        self.server_uuid = server_uuid

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
            raise TabletNotFound(req.tablet_id)
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
        )
        return pb.GetConsensusStateResponse(state=state)

    # --- helpers -------------------------------------------------------------------------

    def _replica_for(self, tablet_id: str, caller: str) -> RaftConsensus:
        consensus = self._lookup(tablet_id)
        if consensus is None:
            raise TabletNotFound(tablet_id)
        # The core would silently drop it; refusing it here tells the caller (a server with a
        # stale or wrong config) why it is never heard.
        if caller not in consensus.voters:
            raise MalformedRequest(
                f"{caller!r} is not a voter of tablet {tablet_id!r} (voters: "
                f"{', '.join(consensus.voters)})"
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
                "stale term, ignored under the leader lease, not answered in time, "
                "or the replica is stopping"
            ),
            leader_uuid=snapshot.leader_id,
        )


def _int(value: object) -> int:
    assert isinstance(value, int)
    return value
