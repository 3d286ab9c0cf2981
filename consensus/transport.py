"""How a replica reaches its peers: a small Protocol, and an in-memory version for tests.

The core speaks in one-way messages; the wire speaks in request/response RPCs
(UpdateConsensus answers APPEND and HEARTBEAT, RequestVote answers VOTE and PRE_VOTE,
TimeoutNow has an empty answer).  A transport sends a request message and hands the
response message (or None, on any failure: peer down, timeout, bad answer) to a callback,
from any thread.  Raft tolerates loss, duplication and reordering, so a transport needs no
retries of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from raftlet.consensus.core.types import Message

__all__ = ["InMemoryTransport", "RequestHandler", "ResponseCallback", "Transport"]

ResponseCallback = Callable[[Message | None], None]
RequestHandler = Callable[[Message], Message | None]


class Transport(Protocol):
    def send(self, message: Message, on_response: ResponseCallback) -> None:
        """Send ``message`` to ``message.dst``; never blocks on the network."""
        ...

    def close(self) -> None: ...


class InMemoryTransport:
    """Delivers requests to handlers registered by node id, on a small thread pool (the
    way a server's consensus service would run them).  ``cut(a, b)`` drops traffic both
    ways between two nodes, and ``isolate(a)`` between ``a`` and every other node registered,
    so tests can partition a cluster without sockets."""

    def __init__(self, workers: int = 8) -> None:
        self._handlers: dict[str, RequestHandler] = {}
        self._cut: set[frozenset[str]] = set()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="inmem-transport")
        self._in_flight = 0  # sent and not yet answered; under _lock

    def register(self, node_id: str, handler: RequestHandler) -> None:
        with self._lock:
            self._handlers[node_id] = handler

    def unregister(self, node_id: str) -> None:
        with self._lock:
            self._handlers.pop(node_id, None)

    def cut(self, a: str, b: str) -> None:
        with self._lock:
            self._cut.add(frozenset((a, b)))

    def isolate(self, node_id: str) -> None:
        with self._lock:
            self._cut.update(frozenset((node_id, o)) for o in self._handlers if o != node_id)

    def heal(self) -> None:
        with self._lock:
            self._cut.clear()

    def idle(self) -> bool:
        """Whether nothing sent is still being delivered or answered: after ``cut``, a test
        waits for this before it counts on no message reaching the other side."""
        with self._lock:
            return self._in_flight == 0

    def send(self, message: Message, on_response: ResponseCallback) -> None:
        with self._lock:
            self._in_flight += 1
        try:
            self._pool.submit(self._deliver, message, on_response)
        except RuntimeError:  # the pool is shut down: the transport is closed
            with self._lock:
                self._in_flight -= 1
            on_response(None)

    def _deliver(self, message: Message, on_response: ResponseCallback) -> None:
        with self._lock:
            handler = self._handlers.get(message.dst)
            blocked = frozenset((message.src, message.dst)) in self._cut
        response: Message | None = None
        if handler is not None and not blocked:
            try:
                response = handler(message)
            except Exception:
                response = None
        with self._lock:
            if frozenset((message.src, message.dst)) in self._cut:
                response = None
        try:
            on_response(response)
        finally:
            with self._lock:
                self._in_flight -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
