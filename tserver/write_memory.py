"""The server's budget for writes it admitted and has not answered yet.

A client connection's window (``tserver.write_stream``) bounds what one client may have
outstanding, but not what all of them have together: 1,024 connections at their windows,
or many unary callers, could still make a leader hold gigabytes of writes while it falls
behind (a slow disk, a lost follower). Every write a leader admits -- whichever front door
it came by: unary ``Write``, the gRPC ``WriteStream``, the write port -- takes its share of
one server-wide budget (``--write_memory_limit_bytes``) in ``TabletReplica.write``, and
gives it back when it is answered. A write that finds the budget spent is refused at once
with RESOURCE_EXHAUSTED and ``ServerErrorPB.MEMORY_LIMIT``, before anything about it is
kept: nothing of it reached a log, and the client backs off and retries, as for a full
service queue (Kudu refuses writes past its soft memory limit the same way).

A write is charged its serialized size plus ``WRITE_OVERHEAD_BYTES``, what holding one
costs beyond its bytes: measured on this build, a parsed single-row write of ~200 bytes
with its callbacks and request key takes ~1.7 KB more (the Python objects, not the wire
form). A server that holds nothing admits any write, however large. A refused write keeps
room for itself for ``RESERVATION_S``: meanwhile smaller writes are admitted only while
room for it is left (none, for one larger than the budget), so a steady stream of small
writes cannot keep a large one out for good (8 MB batches against 4 KB writes once failed
7 times in 8); each retry of it renews the reservation, and a writer that gave up loses it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from raftlet.metrics.counter import StripedCounter
from raftlet.tserver.errors import ServiceUnavailable

__all__ = ["RESERVATION_S", "WRITE_OVERHEAD_BYTES", "MemoryLimitExceeded", "WriteMemory"]

logger = logging.getLogger(__name__)

WRITE_OVERHEAD_BYTES = 2048
# How long room is kept for a refused write: longer than a client's longest backoff after
# RESOURCE_EXHAUSTED (0.5 s, ``client.retry``), so its retry finds it.
RESERVATION_S = 1.0
# A budget that stays spent refuses every write: say so at most once a minute.
_LOG_INTERVAL_S = 60.0


class MemoryLimitExceeded(ServiceUnavailable):
    """The server holds as many admitted writes as ``--write_memory_limit_bytes`` allows
    (RESOURCE_EXHAUSTED with ``MEMORY_LIMIT``: nothing was kept, back off and retry)."""


class WriteMemory:
    """Bytes of admitted, unanswered writes across a server's tablets. Thread-safe: writes
    are admitted on the service pool's threads and answered on the apply stage's."""

    def __init__(
        self,
        limit_bytes: int,
        refusals: StripedCounter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"a write memory limit must be positive, not {limit_bytes}")
        self.limit_bytes = limit_bytes
        self.refusals = refusals if refusals is not None else StripedCounter()
        self._lock = threading.Lock()
        self._held = 0
        # The largest charge refused lately, and until when room is kept for it.
        self._reserved = 0
        self._reserved_until = 0.0
        self._clock = clock
        self._last_log: float | None = None
        self._unsaid = 0

    def held(self) -> int:
        """Bytes charged for writes admitted and not answered yet."""
        return self._held

    def take(self, nbytes: int) -> int:
        """Charge a write of ``nbytes`` serialized bytes; returns the charge to ``give``
        back once it is answered. Raises ``MemoryLimitExceeded`` when the budget is spent."""
        charge = nbytes + WRITE_OVERHEAD_BYTES
        with self._lock:
            held = self._held
            reserved = self._reserved
            if reserved and self._clock() >= self._reserved_until:
                reserved = self._reserved = 0  # its writer gave up
            kept = 0  # room kept for another write that refused this one
            if charge >= reserved:
                refused = bool(held) and held + charge > self.limit_bytes
                if refused:  # room is kept for the largest refused lately
                    self._reserved = charge
                    self._reserved_until = self._clock() + RESERVATION_S
                elif reserved:
                    self._reserved = 0  # it went
            else:  # smaller than one refused lately: only while room is left for that one
                refused = held + charge + reserved > self.limit_bytes
                kept = reserved if refused else 0
            if not refused:
                self._held = held + charge
        if refused:
            self.refusals.increment()
            self._log_refusal(held, charge)
            room = f" with {kept} kept for a larger write refused a moment ago" if kept else ""
            raise MemoryLimitExceeded(
                f"this server holds {held} bytes of writes not answered yet{room}; a write of "
                f"{nbytes} bytes would pass --write_memory_limit_bytes={self.limit_bytes}: "
                "back off and retry"
            )
        return charge

    def give(self, charge: int) -> None:
        with self._lock:
            self._held -= charge

    def _log_refusal(self, held: int, charge: int) -> None:
        now = self._clock()
        with self._lock:
            if self._last_log is not None and now - self._last_log < _LOG_INTERVAL_S:
                self._unsaid += 1
                return
            unsaid, self._unsaid, self._last_log = self._unsaid, 0, now
        since = f"; {unsaid} more since the last warning" if unsaid else ""
        logger.warning(
            "refusing writes: %d bytes of admitted writes are not answered yet, and a write "
            "charged %d would pass --write_memory_limit_bytes=%d (clients back off and "
            "retry); the server is behind -- a slow disk or a lagging majority%s",
            held,
            charge,
            self.limit_bytes,
            since,
        )
