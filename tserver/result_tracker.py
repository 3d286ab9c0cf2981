"""Exactly-once write requests, in memory (Kudu's ResultTracker).

Keyed by (client_id, seq_no).  A request is IN_FLIGHT from the moment a service thread
accepts it until the apply thread completes it (or it is aborted because its entry was
lost); a retry of an in-flight request attaches to it, a retry of a completed one gets the
stored response, a request below the client's first_incomplete_seq_no is STALE.

The memory is only a cache: the store records every applied request id with its outcome in
the same transaction as the rows (``TabletStore.lookup_request``), and the apply path
refuses to apply a request id twice.  So a retry that reaches a new leader after failover,
or this server after a restart, is answered from the store, never applied again.

Being a cache, it is bounded: at most ``max_clients`` clients and about ``max_bytes`` of
stored responses. Past either bound the client used least recently (admitted or completed)
is forgotten whole; a retry of one of its requests then finds nothing here and is answered
from the store's record (``TabletReplica.write`` looks it up for every retry). A request
below the client's first incomplete seq_no -- a late copy, which a well-behaved client never
sends -- is judged by the bound the store keeps for the client: a retry is refused STALE at
admission, a first attempt when its entry is applied (as nothing). In-flight requests are
not evicted: they are bounded by the service and prepare queues.
"""

from __future__ import annotations

import enum
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from raftlet.proto import tablet_pb2
from raftlet.tserver.errors import InvalidRequest

__all__ = [
    "ANONYMOUS_PREFIX",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_CLIENTS",
    "MAX_CLIENT_ID_BYTES",
    "Admission",
    "RequestKey",
    "ResultTracker",
    "check_client_id",
]

DEFAULT_MAX_CLIENTS = 4096
# The client ids the replica makes up for writes without a request id: tracked while in
# flight, to answer their waiters, but never remembered once complete -- nothing can retry
# them, and thousands of them would push real clients out.
ANONYMOUS_PREFIX = "~anonymous-"
# The longest client id a write may carry (bytes of UTF-8; the client library's are 32):
# every replica keeps each client's id in memory and in the store's request records.
MAX_CLIENT_ID_BYTES = 256
DEFAULT_MAX_BYTES = 8 << 20
# What a stored response costs beyond its encoded size (dict slot, message object), and what
# a client's own entry costs: rough, but they keep many tiny responses from looking free.
_RESPONSE_OVERHEAD = 200
_CLIENT_OVERHEAD = 400
# What a request learned applied (no response kept) costs: its dict slot.
_LEARNED_OVERHEAD = 100

RequestKey = tuple[str, int]


def check_client_id(client_id: str) -> None:
    """Refuse (InvalidRequest) a client id a write may not carry: one of the replica's own
    names for anonymous writes -- taken as one, its write would be answered as another
    write's and never applied -- or one longer than ``MAX_CLIENT_ID_BYTES``."""
    if client_id.startswith(ANONYMOUS_PREFIX):
        raise InvalidRequest(
            f"client ids beginning {ANONYMOUS_PREFIX!r} are reserved for writes without one"
        )
    if len(client_id) * 4 <= MAX_CLIENT_ID_BYTES:
        return  # at most 4 bytes a character: short enough without encoding it (every write)
    size = len(client_id.encode("utf-8", "surrogatepass"))
    if size > MAX_CLIENT_ID_BYTES:
        raise InvalidRequest(
            f"a client id of {size} bytes is longer than {MAX_CLIENT_ID_BYTES} bytes"
        )


Respond = Callable[[tablet_pb2.WriteResponse], None]
Fail = Callable[[BaseException], None]


class Admission(enum.Enum):
    NEW = "NEW"  # the caller must execute the request
    ATTACHED = "ATTACHED"  # in flight already; the caller will be answered with it
    COMPLETED = "COMPLETED"  # answered already from the stored response
    # Applied (another replica proposed it), its response not kept: in flight now, as NEW,
    # for the caller to answer from the store's record (``TabletStore.lookup_request``).
    APPLIED = "APPLIED"
    STALE = "STALE"  # below the client's first incomplete seq_no


@dataclass
class _InFlight:
    waiters: list[tuple[Respond, Fail]] = field(default_factory=list)


@dataclass
class _Client:
    first_incomplete: int = 0
    # seq_no -> (response, the bytes it is counted for); None: applied, response not kept
    done: dict[int, tuple[tablet_pb2.WriteResponse | None, int]] = field(default_factory=dict)
    size: int = _CLIENT_OVERHEAD


class ResultTracker:
    def __init__(
        self,
        max_completed_per_client: int = 10_000,
        *,
        max_clients: int = DEFAULT_MAX_CLIENTS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        on_evict: Callable[[], object] | None = None,
    ) -> None:
        """``on_evict`` is called (under the tracker's lock) for each client forgotten."""
        if max_clients < 1 or max_bytes < 1 or max_completed_per_client < 1:
            raise ValueError("the result tracker's bounds must be positive")
        self._lock = threading.Lock()
        self._in_flight: dict[RequestKey, _InFlight] = {}
        # Least recently used first.
        self._clients: OrderedDict[str, _Client] = OrderedDict()
        self._bytes = 0
        self._max_completed = max_completed_per_client
        self._max_clients = max_clients
        self._max_bytes = max_bytes
        self._evictions = 0
        self._on_evict = on_evict

    def admit(
        self, key: RequestKey, first_incomplete_seq_no: int, respond: Respond, fail: Fail
    ) -> tuple[Admission, tablet_pb2.WriteResponse | None]:
        client_id, seq_no = key
        done: tuple[tablet_pb2.WriteResponse | None, int] | None = None
        with self._lock:
            if not client_id.startswith(ANONYMOUS_PREFIX):
                client = self._use(client_id)
                self._forget_below(client, first_incomplete_seq_no)
                if seq_no < client.first_incomplete:
                    return Admission.STALE, None
                done = client.done.get(seq_no)
                if done is not None and done[0] is not None:
                    return Admission.COMPLETED, done[0]
            flight = self._in_flight.get(key)
            if flight is not None:
                flight.waiters.append((respond, fail))
                return Admission.ATTACHED, None
            self._in_flight[key] = _InFlight([(respond, fail)])
            # Applied, its response not kept: the caller reads it back from the store and
            # completes the request (or executes it, as NEW, if the store forgot it).
            return (Admission.APPLIED if done is not None else Admission.NEW), None

    def first_incomplete(self, client_id: str) -> int:
        """The client's first incomplete seq_no as this tracker holds it (0: unknown)."""
        with self._lock:
            client = self._clients.get(client_id)
            return client.first_incomplete if client is not None else 0

    def complete(
        self, key: RequestKey, response: tablet_pb2.WriteResponse, first_incomplete_seq_no: int = 0
    ) -> int:
        """Record the outcome and answer every waiter; returns how many were answered.

        Called for the entries this replica proposed (and for those a retry it admitted
        waits on); the others only teach it how far their clients got (``learn_applied``).
        ``first_incomplete_seq_no`` is the one the entry carried: this is where a replica
        forgets what the client no longer needs (otherwise its table only grows, and the
        cap's ``min()`` runs over it on every apply)."""
        client_id, seq_no = key
        if client_id.startswith(ANONYMOUS_PREFIX):
            with self._lock:
                flight = self._in_flight.pop(key, None)
            for respond, _ in flight.waiters if flight else []:
                respond(response)
            return len(flight.waiters) if flight else 0
        with self._lock:
            client = self._use(client_id)
            self._forget_below(client, first_incomplete_seq_no)
            flight = self._in_flight.pop(key, None)
            if seq_no >= client.first_incomplete:
                held = client.done.get(seq_no)
                if held is not None and held[0] is not None:
                    # The first answer stands: a later duplicate must not replace it.
                    response = held[0]
                else:
                    if held is not None:  # learned applied: now its response too
                        self._drop(client, seq_no)
                    self._store(client, seq_no, response)
                    if len(client.done) > self._max_completed:
                        # A client that never advances first_incomplete_seq_no must not
                        # grow memory forever; the store still answers for what is dropped.
                        self._drop(client, min(client.done))
            self._evict(client_id)
        waiters = flight.waiters if flight else []
        for respond, _ in waiters:
            respond(response)
        return len(waiters)

    def learn_applied(self, applied: Sequence[tuple[RequestKey, int]]) -> list[RequestKey]:
        """Requests applied here that this replica did not propose: each (key, the first
        incomplete seq_no its entry carried).  Remembers that each was applied and how far
        its client got -- what a retry's answer and a STALE one need once this replica
        leads -- but not the response: building and sizing one per write was a follower's
        largest cost after the rows.  A retry of one is admitted as ``APPLIED``, and its
        response read from the store's record, which every replica writes in the same
        transaction as the rows.  Returns the keys that are in flight here (a retry this
        replica admitted while the entry was on its way), which the caller must
        ``complete``: they have waiters."""
        waiting: list[RequestKey] = []
        with self._lock:
            in_flight = self._in_flight
            for key, first_incomplete in applied:
                client_id, seq_no = key
                if key in in_flight:
                    waiting.append(key)
                if client_id.startswith(ANONYMOUS_PREFIX):
                    continue
                client = self._use(client_id)
                self._forget_below(client, first_incomplete)
                done = client.done
                if seq_no >= client.first_incomplete and seq_no not in done:
                    done[seq_no] = (None, _LEARNED_OVERHEAD)
                    client.size += _LEARNED_OVERHEAD
                    self._bytes += _LEARNED_OVERHEAD
                    if len(done) > self._max_completed:
                        self._drop(client, min(done))
                self._evict(client_id)
        return waiting

    def abort(self, key: RequestKey, error: BaseException) -> None:
        """The request will not complete here (its entry was lost, or never proposed):
        fail the waiters and forget it, so a retry executes afresh."""
        with self._lock:
            flight = self._in_flight.pop(key, None)
        for _, fail in flight.waiters if flight else []:
            fail(error)

    def abort_all(self, error: BaseException) -> None:
        """Fail every in-flight request (the replica is stopping)."""
        with self._lock:
            flights, self._in_flight = self._in_flight, {}
        for flight in flights.values():
            for _, fail in flight.waiters:
                fail(error)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def clients(self) -> int:
        """How many clients are remembered."""
        with self._lock:
            return len(self._clients)

    def evictions(self) -> int:
        """How many clients were forgotten to stay within the bounds."""
        with self._lock:
            return self._evictions

    def memory_bytes(self) -> int:
        """The (estimated) bytes held for completed requests and clients."""
        with self._lock:
            return self._bytes

    def _use(self, client_id: str) -> _Client:
        """The client's entry, made the most recently used (created if new)."""
        client = self._clients.get(client_id)
        if client is None:
            # The id is kept as long as the client is: counted with it.
            client = self._clients[client_id] = _Client(size=_CLIENT_OVERHEAD + len(client_id))
            self._bytes += client.size
            self._evict(client_id)
        else:
            self._clients.move_to_end(client_id)
        return client

    def _store(self, client: _Client, seq_no: int, response: tablet_pb2.WriteResponse) -> None:
        size = response.ByteSize() + _RESPONSE_OVERHEAD
        client.done[seq_no] = (response, size)
        client.size += size
        self._bytes += size

    def _drop(self, client: _Client, seq_no: int) -> None:
        _, size = client.done.pop(seq_no)
        client.size -= size
        self._bytes -= size

    def _evict(self, keep: str) -> None:
        """Forget least recently used clients until within the bounds, never ``keep`` (the
        client being served); if it alone is over the byte bound, its oldest responses."""
        while len(self._clients) > self._max_clients or self._bytes > self._max_bytes:
            oldest = next(iter(self._clients))
            if oldest == keep:
                if len(self._clients) > 1:
                    self._clients.move_to_end(keep)
                    continue
                client = self._clients[keep]
                if not client.done:
                    return
                self._drop(client, min(client.done))
                continue
            self._bytes -= self._clients.pop(oldest).size
            self._evictions += 1
            if self._on_evict is not None:
                self._on_evict()

    def _forget_below(self, client: _Client, first_incomplete: int) -> None:
        if first_incomplete <= client.first_incomplete:
            return
        client.first_incomplete = first_incomplete
        for seq in [s for s in client.done if s < first_incomplete]:
            self._drop(client, seq)
