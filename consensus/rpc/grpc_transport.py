"""The unary consensus transport: one gRPC call per Raft message.

``GrpcTransport`` is the transport of ``--consensus_transport=unary`` (the default is
``tcp_transport``), one per tablet replica; it implements the consensus ``Transport`` by
turning each core request into its RPC, sent with the stub's ``.future()`` so the caller
(holding the consensus lock) never waits on the network, and stepping the answer back
through ``on_response`` from gRPC's callback thread.  Its channels come from the server's
one pool (``client.channels.ChannelPool``, seen here as a ``ChannelSource``): a channel
multiplexes any number of concurrent calls over one HTTP/2 connection, so a channel per
call or per tablet would only add connection setup and file descriptors.

Failures follow Raft's model of the network: an RPC error, deadline, cancellation, or an
answer that cannot be stepped is a lost message (``on_response(None)``); the transport never
retries, the core resends what still matters on its next heartbeat or append.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

import grpc

from raftlet.consensus.core import Message, MessageType
from raftlet.consensus.rpc.codec import MalformedResponse, decode_response, encode_request
from raftlet.consensus.transport import ResponseCallback
from raftlet.proto import consensus_pb2_grpc

__all__ = ["ChannelSource", "GrpcTransport", "log_unsendable"]

logger = logging.getLogger(__name__)


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


class ChannelSource(Protocol):
    """Where a transport gets its channels: the server's ``client.channels.ChannelPool``."""

    def channel(self, address: str) -> grpc.Channel: ...


class GrpcTransport:
    """The ``Transport`` of one tablet replica over a server's shared channels.

    ``addresses`` maps each peer's node id (its server uuid) to its RPC address.
    ``timeout_s`` is every call's deadline; it should exceed the peer's
    ``ConsensusOptions.request_timeout_s`` plus its fsync time, since a follower answers an
    append only once the entries are durable."""

    def __init__(
        self,
        tablet_id: str,
        addresses: Mapping[str, str],
        channels: ChannelSource,
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
                channel = self._channels.channel(addr)
                stub = consensus_pb2_grpc.ConsensusServiceStub(channel)
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
