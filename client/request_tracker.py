"""Request ids for exactly-once writes (Kudu's ``rpc/request_tracker``).

A ``Client`` owns one ``RequestTracker``: ``client_id`` is a fresh uuid per client, and every
write RPC takes the next ``seq_no`` (``new_seq_no``) and keeps it — with the same
``client_id`` — on every retry, wherever the retry goes; only ``attempt_no`` counts up. The
server's result tracker answers a retry of a completed request with the stored response and
attaches a retry of an in-flight one to it, so a write is applied once however often it is
sent (docs/ARCHITECTURE.md, "Exactly-once").

``first_incomplete_seq_no`` is the lowest seq_no still outstanding (or the next one to be
handed out when none is): every request carries it, and the server may forget results below
it. It never decreases, and it never passes a seq_no that is still outstanding, so a retry is
never refused as stale. A seq_no is ``complete``d once its RPC has a final answer — success,
a row-level result, or a failure after which it will not be sent again (deadline passed).
"""

from __future__ import annotations

import threading
import uuid

__all__ = ["RequestTracker"]


class RequestTracker:
    def __init__(self, client_id: str | None = None) -> None:
        self.client_id = client_id or uuid.uuid4().hex
        self._lock = threading.Lock()
        self._next = 1
        self._outstanding: set[int] = set()
        self._first_incomplete = 1

    def new_seq_no(self) -> int:
        with self._lock:
            seq = self._next
            self._next += 1
            self._outstanding.add(seq)
            if len(self._outstanding) == 1:
                self._first_incomplete = seq
            return seq

    def first_incomplete_seq_no(self) -> int:
        with self._lock:
            return self._first_incomplete

    def complete(self, seq_no: int) -> None:
        with self._lock:
            self._outstanding.discard(seq_no)
            if seq_no == self._first_incomplete:
                self._first_incomplete = min(self._outstanding, default=self._next)

    def outstanding(self) -> int:
        with self._lock:
            return len(self._outstanding)
