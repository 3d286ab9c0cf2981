"""The one gRPC channel layer: one long-lived channel per server address, and its options.

A gRPC channel is a connection manager (name resolution, a TCP/HTTP2 connection, reconnects
with backoff), expensive to build and safe to share between threads; opening one per call
would pay a handshake per RPC and leak sockets under load. ``ChannelPool`` opens a channel
the first time an address is used, keeps it until ``close()``, and counts how many it ever
opened (``ClientStats.channels_created``) so a test can prove the sharing. Everything that
dials a server uses it: the ``Client``, the tablet server's channels to its peers, the
cluster check (``health``) and the CLI. ``aio_channels.AsyncChannelPool`` is the same for
``grpc.aio``, on the same options and bookkeeping (``ChannelsByAddress``).

``channel_options`` defines the options once. A channel to a server that was killed
reconnects by itself when the server returns; the reconnect backoff is capped low
(``MAX_RECONNECT_BACKOFF_MS``) because gRPC's default grows to two minutes, far longer than a
tablet server restart. Calls never wait for a connection (no ``wait_for_ready``): a dead
server answers UNAVAILABLE at once, and the retry policy moves on to another replica. A
tablet server passes its own message cap and asks for keepalive pings on its peer channels;
``server_options`` is the matching server side. A pool given ``credentials``
(``tls.channel_credentials``) opens TLS channels, else plaintext ones.

The ``GrpcServerStub`` objects of a process keep at most ``MAX_CALLS_IN_FLIGHT`` writes and
scans in flight to one server address between them (gRPC gives the channels of a process
one connection per address when their options are equal); more threads wait in line for a
slot (``call_slots.FairSlots``) within their attempt's timeout, and one that gets none by
then fails as busy, saying so (``NoCallSlot``), never having sent. The server refuses
streams of a connection beyond its cap (``tserver.grpc_limits``), and gRPC's own holding
back of calls over it counts calls ended when the client sees them end, while the server
counts them until its core lets them go: a client of 60 threads on one connection had
hundreds of writes refused. A refusal that still happens (other gRPC users of the process on
that connection) is retried on the same server, ``retry.Cause.STREAM_REFUSED``.

``ServerStub`` / ``StubProvider`` are the seam the rest of the client uses, so unit tests can
plug in fakes without a server.

A write or scan made as an attempt of ``rpc.call_tablet`` is waited for by that attempt's
``AnswerWatch`` (``ANSWER_WATCH``, set around the attempt): the call is made as a future, so
the attempt can be cut short (cancelled) when its leader went silent and another was elected;
outside an attempt it is a plain blocking call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError
from contextvars import ContextVar
from typing import Any, Generic, Protocol, TypeVar, cast

import grpc

from raftlet.client.aio_write_stream import StreamedRpcError
from raftlet.client.call_slots import NEVER_SENT, FairSlots
from raftlet.client.errors import ClientClosed
from raftlet.proto import admin_pb2, admin_pb2_grpc, tablet_pb2, tablet_pb2_grpc

__all__ = [
    "ANSWER_WATCH",
    "CHANNEL_OPTIONS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MAX_CALLS_IN_FLIGHT",
    "AnswerWatch",
    "AttemptCutShort",
    "CallFuture",
    "ChannelPool",
    "ChannelsByAddress",
    "GrpcServerStub",
    "NoCallSlot",
    "ResultFuture",
    "ServerStub",
    "StubProvider",
    "answer_of",
    "channel_options",
    "server_options",
    "wait_for_answer",
]

MAX_RECONNECT_BACKOFF_MS = 1000
# Half the 64 streams a server takes on one connection: it still counts calls that ended
# here until its event loop lets them go, and on a loaded machine (load 20 on 2 cores) 64
# threads kept to 48 in flight had ~1,000 of 5,000 writes refused, kept to 32 none. Enough
# to keep the tablet service's 10 threads busy with a queue behind them.
MAX_CALLS_IN_FLIGHT = 32
# Scan pages of wide rows can exceed gRPC's 4 MiB default.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20

# Keepalive of a server's peer channels: an idle one (a tablet with no leader here, say)
# pings every KEEPALIVE_TIME_MS so a silently dead connection (a peer host lost without a
# FIN) is noticed and re-established before the next election needs it, not after a TCP
# timeout of minutes.
KEEPALIVE_TIME_MS = 20_000
KEEPALIVE_TIMEOUT_MS = 10_000
# A gRPC server by default answers pings more frequent than every 5 minutes with GOAWAY
# ("too_many_pings"); servers that accept keepalive channels must allow their interval.
_SERVER_MIN_PING_INTERVAL_MS = KEEPALIVE_TIME_MS // 2


def channel_options(
    *,
    max_message_bytes: int | None = None,
    keepalive: bool = False,
    max_reconnect_backoff_ms: int = MAX_RECONNECT_BACKOFF_MS,
) -> list[tuple[str, int]]:
    """The options of every channel to a raftlet server.

    ``max_message_bytes`` caps both directions (a tablet server's peer channels use the
    server's own ``--max_message_bytes``, so what one server sends its peer accepts); left
    out, a channel receives up to ``DEFAULT_MAX_MESSAGE_BYTES`` and sends what gRPC allows.
    ``keepalive`` pings idle connections (``server_options`` must then be the server's).
    ``max_reconnect_backoff_ms`` is lower where a restarted server must be seen at once (the
    cluster check). gRPC shares a connection, and its reconnect backoff, between channels of
    one process with equal options, so distinct options also keep such a check from failing
    fast on a backoff a ``Client`` of the same process is sitting in."""
    options: list[tuple[str, int]] = [
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", max_reconnect_backoff_ms),
        # Loopback and cluster-internal addresses must never go through an environment proxy.
        ("grpc.enable_http_proxy", 0),
    ]
    if max_message_bytes is None:
        options.append(("grpc.max_receive_message_length", DEFAULT_MAX_MESSAGE_BYTES))
    else:
        options += [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
    if keepalive:
        options += [
            ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
    return options


CHANNEL_OPTIONS: list[tuple[str, int]] = channel_options()


def server_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """gRPC server options that match ``channel_options(max_message_bytes=...,
    keepalive=True)``: the same message cap, and permission for the channels' keepalive
    pings (without it the server would GOAWAY them)."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", _SERVER_MIN_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", 0),
        # gRPC binds with SO_REUSEPORT on Linux by default: a second server given a port in
        # use started, and the kernel split connections between the two -- clients of one
        # cluster read another's rows. Off, the second fails to listen, as it should.
        ("grpc.so_reuseport", 0),
    ]


class ResultFuture(Protocol):
    def result(self, timeout: float | None = None) -> Any: ...

    def add_done_callback(self, fn: Callable[[Any], object]) -> None: ...


class CallFuture(ResultFuture, Protocol):
    """A call in flight (``grpc.Future``, or ``concurrent.futures.Future`` in tests)."""

    def done(self) -> bool: ...

    def cancel(self) -> bool: ...

    def exception(self, timeout: float | None = None) -> BaseException | None: ...


class AnswerWatch(Protocol):
    """Waits for an attempt's call to end (``rpc._Watch``): returns once ``future`` is done,
    or cancels it and raises ``AttemptCutShort``."""

    def __call__(self, future: CallFuture) -> None: ...


# The watch of the tablet attempt this thread (or task) is making, if any.
ANSWER_WATCH: ContextVar[AnswerWatch | None] = ContextVar("raftlet_answer_watch", default=None)


class AttemptCutShort(StreamedRpcError):
    """An attempt at a leader silent for ``SILENCE_S``, cancelled once a look-up found another
    replica leading: retried as the DEADLINE_EXCEEDED it would have become, with the same
    request id."""

    def __init__(self, details: str, leader: str) -> None:
        super().__init__(grpc.StatusCode.DEADLINE_EXCEEDED, details)
        self.leader = leader


def wait_for_answer(future: CallFuture, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``future`` to end; whether it has."""
    try:
        future.exception(timeout=seconds)
    except (grpc.FutureTimeoutError, TimeoutError):
        return False
    except (grpc.FutureCancelledError, CancelledError):
        pass
    return True


def answer_of(future: CallFuture) -> Any:
    """The call's answer (or its error raised), waited for as the attempt in progress says
    (``ANSWER_WATCH``), else plainly."""
    watch = ANSWER_WATCH.get()
    if watch is not None:
        watch(future)
    return future.result()


class ServerStub(Protocol):
    """The RPCs the client makes to one server. ``timeout`` is in seconds."""

    address: str

    def write(
        self, request: tablet_pb2.WriteRequest, timeout: float
    ) -> tablet_pb2.WriteResponse: ...

    def scan(self, request: tablet_pb2.ScanRequest, timeout: float) -> tablet_pb2.ScanResponse: ...

    def list_tablets_future(self, timeout: float, *, disk_usage: bool = False) -> ResultFuture:
        """Starts ListTablets; ``result()`` is a ``ListTabletsResponse`` or raises.
        ``disk_usage``: with each replica's ``disk_bytes``."""
        ...

    def get_cluster_config(self, timeout: float) -> tablet_pb2.GetClusterConfigResponse: ...

    def leader_step_down(
        self, request: admin_pb2.LeaderStepDownRequest, timeout: float
    ) -> admin_pb2.LeaderStepDownResponse: ...

    def checksum_tablet(
        self, request: admin_pb2.ChecksumTabletRequest, timeout: float
    ) -> admin_pb2.ChecksumTabletResponse: ...


class StubProvider(Protocol):
    def stub(self, address: str) -> ServerStub: ...


R = TypeVar("R")


def _unless_closed(call: Callable[[], R]) -> R:
    """``call()``, with grpc's error for a channel closed under it (a client closed while
    this thread held a stub) raised as the ``ClientClosed`` every other path raises."""
    try:
        return call()
    except ValueError as e:
        # grpc words it "Cannot invoke RPC on closed channel!" or "...: Channel closed!"
        if "closed" in str(e) and "channel" in str(e).lower():
            raise ClientClosed("the client is closed") from e
        raise


# One set of slots per server address for the whole process: gRPC gives channels of equal
# options one connection, so two clients of a process share it, and slots of their own let
# 4 clients of 64 threads have as many refused calls as rows written (a verifier's run).
_SLOTS: dict[str, FairSlots] = {}
_SLOTS_LOCK = threading.Lock()


def _process_slots(address: str) -> FairSlots:
    with _SLOTS_LOCK:
        slots = _SLOTS.get(address)
        if slots is None:
            slots = _SLOTS[address] = FairSlots(MAX_CALLS_IN_FLIGHT)
        return slots


class NoCallSlot(StreamedRpcError):
    """No slot for a call to the server freed within its attempt's time: the client's own
    limit, said as such. RESOURCE_EXHAUSTED saying it was never sent (``retry.Cause``
    NO_CALL_SLOT): the same server is tried again after a backoff, the call counts as never
    sent, and running out of time on it is a plain ``Timeout``, not ServerTooBusy. (As
    DEADLINE_EXCEEDED it marked a healthy server down for every thread of the process, sent
    the next attempt to a follower, and said a write never sent may have been applied.)"""

    def __init__(self, address: str, waited_s: float) -> None:
        super().__init__(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{NEVER_SENT}: this process already had {MAX_CALLS_IN_FLIGHT} calls in flight "
            f"to {address}, and none ended within {waited_s * 1000:.0f} ms (fewer threads "
            "per client process, or a longer timeout, may help)",
        )


def _unary(method: Any, request: object, timeout: float) -> Any:
    """One unary call: blocking, or as a future its attempt's watch waits for (so it can be
    cut short: a blocking call to a paused leader held its thread for the whole timeout)."""
    if ANSWER_WATCH.get() is None:
        return method(request, timeout=timeout)
    return answer_of(method.future(request, timeout=timeout))


class GrpcServerStub:
    """``ServerStub`` over a shared ``grpc.Channel``; its writes and scans take the
    process's slots for its address (``MAX_CALLS_IN_FLIGHT``)."""

    def __init__(self, address: str, channel: grpc.Channel) -> None:
        self.address = address
        self._tablet = tablet_pb2_grpc.TabletServiceStub(channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(channel)
        self._slots = _process_slots(address)

    def _in_slot(self, call: Callable[[float], R], timeout: float) -> R:
        """``call(time left)`` once a slot is free (``NoCallSlot`` if none is within
        ``timeout``)."""
        start = time.monotonic()
        if not self._slots.acquire(timeout=timeout):
            raise NoCallSlot(self.address, timeout)
        try:
            left = timeout - (time.monotonic() - start)
            return _unless_closed(lambda: call(max(left, 0.0)))
        finally:
            self._slots.release()

    def write(self, request: tablet_pb2.WriteRequest, timeout: float) -> tablet_pb2.WriteResponse:
        method = self._tablet.Write
        return cast(
            tablet_pb2.WriteResponse,
            self._in_slot(lambda left: _unary(method, request, left), timeout),
        )

    def scan(self, request: tablet_pb2.ScanRequest, timeout: float) -> tablet_pb2.ScanResponse:
        method = self._tablet.Scan
        return cast(
            tablet_pb2.ScanResponse,
            self._in_slot(lambda left: _unary(method, request, left), timeout),
        )

    def list_tablets_future(self, timeout: float, *, disk_usage: bool = False) -> ResultFuture:
        request = tablet_pb2.ListTabletsRequest(with_disk_usage=disk_usage)
        future = _unless_closed(lambda: self._tablet.ListTablets.future(request, timeout=timeout))
        return cast(ResultFuture, future)

    def get_cluster_config(self, timeout: float) -> tablet_pb2.GetClusterConfigResponse:
        request = tablet_pb2.GetClusterConfigRequest()
        return cast(
            tablet_pb2.GetClusterConfigResponse,
            _unless_closed(lambda: self._tablet.GetClusterConfig(request, timeout=timeout)),
        )

    def leader_step_down(
        self, request: admin_pb2.LeaderStepDownRequest, timeout: float
    ) -> admin_pb2.LeaderStepDownResponse:
        return cast(
            admin_pb2.LeaderStepDownResponse,
            _unless_closed(lambda: self._admin.LeaderStepDown(request, timeout=timeout)),
        )

    def checksum_tablet(
        self, request: admin_pb2.ChecksumTabletRequest, timeout: float
    ) -> admin_pb2.ChecksumTabletResponse:
        return cast(
            admin_pb2.ChecksumTabletResponse,
            _unless_closed(lambda: self._admin.ChecksumTablet(request, timeout=timeout)),
        )


C = TypeVar("C")


class ChannelsByAddress(Generic[C]):
    """The bookkeeping both pools share: channels by address, opened by ``open_channel`` on
    first use, counted, and refused once closed. Not thread-safe: ``ChannelPool`` holds its
    lock around it, ``AsyncChannelPool`` runs on one event loop."""

    def __init__(
        self,
        open_channel: Callable[[str], C],
        on_created: Callable[[str], None] | None = None,
    ) -> None:
        self._open = open_channel
        self._on_created = on_created
        self._channels: dict[str, C] = {}
        self._closed = False
        self.created = 0

    def get(self, address: str) -> C:
        """The channel to ``address`` ("host:port"); ``ClientClosed`` once closed."""
        channel = self._channels.get(address)
        if channel is None:
            if self._closed:
                raise ClientClosed("the client is closed")
            channel = self._open(address)
            self._channels[address] = channel
            self.created += 1
            if self._on_created is not None:
                self._on_created(address)
        return channel

    def addresses(self) -> list[str]:
        return sorted(self._channels)

    def close(self) -> list[C]:
        """Refuse new channels and forget the open ones, returned for the caller to close."""
        self._closed = True
        channels = list(self._channels.values())
        self._channels.clear()
        return channels


class ChannelPool:
    """Channels (and their stubs) by address, opened on first use, closed by ``close()``.

    Thread-safe. ``channel(address)`` is the raw ``grpc.Channel`` (for any service's stub);
    ``stub(address)`` the client's ``ServerStub`` over it."""

    def __init__(
        self,
        options: Sequence[tuple[str, int]] = CHANNEL_OPTIONS,
        *,
        on_created: Callable[[str], None] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._options = list(options)
        # None: plaintext; else TLS (and a token) for every channel (client.tls).
        self._credentials = credentials
        self._lock = threading.Lock()
        self._channels: ChannelsByAddress[grpc.Channel] = ChannelsByAddress(self._open, on_created)
        self._stubs: dict[str, GrpcServerStub] = {}

    def _open(self, address: str) -> grpc.Channel:
        if self._credentials is not None:
            return grpc.secure_channel(address, self._credentials, options=self._options)
        return grpc.insecure_channel(address, options=self._options)

    @property
    def options(self) -> list[tuple[str, int]]:
        return list(self._options)

    def channel(self, address: str) -> grpc.Channel:
        """The channel to ``address`` ("host:port"); ``ClientClosed`` once closed."""
        with self._lock:
            return self._channels.get(address)

    def stub(self, address: str) -> ServerStub:
        stub = self._stubs.get(address)  # the common case takes no lock
        if stub is not None:
            return stub
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                stub = GrpcServerStub(address, self._channels.get(address))
                self._stubs[address] = stub
            return stub

    @property
    def channels_created(self) -> int:
        """How many channels this pool ever opened: one per address, never per call."""
        with self._lock:
            return self._channels.created

    def addresses(self) -> list[str]:
        with self._lock:
            return self._channels.addresses()

    def close(self) -> None:
        """Close every channel; calls still in flight on them end CANCELLED."""
        with self._lock:
            channels = self._channels.close()
            self._stubs.clear()
        for channel in channels:
            channel.close()
