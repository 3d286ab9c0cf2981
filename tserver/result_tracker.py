"""Exactly-once write requests, in memory (Kudu's ResultTracker).

Keyed by (client_id, seq_no).  A request is IN_FLIGHT from the moment a service thread
accepts it until the apply thread completes it (or it is aborted because its entry was
lost); a retry of an in-flight request attaches to it, a retry of a completed one gets the
stored response, a request below the client's first_incomplete_seq_no is STALE.

The memory is only a cache: the store records every applied request id with its outcome in
the same transaction as the rows (``TabletStore.lookup_request``), and the apply path
refuses to apply a request id twice.  So a retry that reaches a new leader after failover,
or this server after a restart, is answered from the store, never applied again.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from raftlet.proto import tablet_pb2

__all__ = ["Admission", "RequestKey", "ResultTracker"]

RequestKey = tuple[str, int]
Respond = Callable[[tablet_pb2.WriteResponse], None]
Fail = Callable[[BaseException], None]


class Admission(enum.Enum):
    NEW = "NEW"  # the caller must execute the request
    ATTACHED = "ATTACHED"  # in flight already; the caller will be answered with it
    COMPLETED = "COMPLETED"  # answered already from the stored response
    STALE = "STALE"  # below the client's first incomplete seq_no


@dataclass
class _InFlight:
    waiters: list[tuple[Respond, Fail]] = field(default_factory=list)


class ResultTracker:
    def __init__(self, max_completed_per_client: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._in_flight: dict[RequestKey, _InFlight] = {}
        self._completed: dict[str, dict[int, tablet_pb2.WriteResponse]] = {}
        self._first_incomplete: dict[str, int] = {}
        self._max_completed = max_completed_per_client

    def admit(
        self, key: RequestKey, first_incomplete_seq_no: int, respond: Respond, fail: Fail
    ) -> tuple[Admission, tablet_pb2.WriteResponse | None]:
        client_id, seq_no = key
        with self._lock:
            self._forget_below(client_id, first_incomplete_seq_no)
            if seq_no < self._first_incomplete.get(client_id, 0):
                return Admission.STALE, None
            done = self._completed.get(client_id, {}).get(seq_no)
            if done is not None:
                return Admission.COMPLETED, done
            flight = self._in_flight.get(key)
            if flight is not None:
                flight.waiters.append((respond, fail))
                return Admission.ATTACHED, None
            self._in_flight[key] = _InFlight([(respond, fail)])
            return Admission.NEW, None

    def complete(
        self, key: RequestKey, response: tablet_pb2.WriteResponse, first_incomplete_seq_no: int = 0
    ) -> int:
        """Record the outcome and answer every waiter; returns how many were answered.

        Called for every applied entry with a request id, on leaders and followers alike,
        so whoever leads next already knows the outcome.  ``first_incomplete_seq_no`` is the
        one the entry carried: a follower never sees ``admit``, so this is where it forgets
        what the client no longer needs (otherwise its table only grows, and the cap's
        ``min()`` runs over it on every apply)."""
        client_id, seq_no = key
        with self._lock:
            self._forget_below(client_id, first_incomplete_seq_no)
            flight = self._in_flight.pop(key, None)
            if seq_no >= self._first_incomplete.get(client_id, 0):
                done = self._completed.setdefault(client_id, {})
                # The first answer stands: a later duplicate must not replace it.
                response = done.setdefault(seq_no, response)
                if len(done) > self._max_completed:
                    # A client that never advances first_incomplete_seq_no must not grow
                    # memory forever; the store still answers for what is dropped here.
                    del done[min(done)]
        waiters = flight.waiters if flight else []
        for respond, _ in waiters:
            respond(response)
        return len(waiters)

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

    def _forget_below(self, client_id: str, first_incomplete: int) -> None:
        if first_incomplete <= self._first_incomplete.get(client_id, 0):
            return
        self._first_incomplete[client_id] = first_incomplete
        done = self._completed.get(client_id)
        if done:
            for seq in [s for s in done if s < first_incomplete]:
                del done[seq]
