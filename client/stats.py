"""What a client counts about itself: retries and errors by cause, channels, write latency.

``StatsRecorder`` is the live, thread-safe side (one per ``Client``); ``Client.stats``
returns a ``ClientStats``, an immutable snapshot, so a caller can diff two of them.

Cause names are ``retry.Cause`` values (``"NOT_LEADER"``, ``"RESOURCE_EXHAUSTED"``,
``"UNAVAILABLE"``…) for retries and failed RPCs, and ``RowErrorPB`` code names
(``"KEY_EXISTS"``…) for rows the server refused. ``errors_by_cause`` counts *rows*: a batch of
100 rows that timed out adds 100 under ``"TIMEOUT"``.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from raftlet.metrics import Histogram, HistogramSnapshot

__all__ = ["ClientStats", "StatsRecorder"]


@dataclass(frozen=True)
class ClientStats:
    retries_by_cause: dict[str, int] = field(default_factory=dict)
    errors_by_cause: dict[str, int] = field(default_factory=dict)
    # gRPC channels this client ever opened: one per server address it talked to.
    channels_created: int = 0
    # Write RPCs acknowledged (a retried RPC counts once) and the rows they carried.
    writes_acked: int = 0
    rows_acked: int = 0
    # Leader look-ups (ListTablets on every server) and config fetches.
    leader_refreshes: int = 0
    config_fetches: int = 0
    # Latency of acknowledged write RPCs in microseconds, retries and backoff included.
    write_latency_us: HistogramSnapshot | None = None

    @property
    def total_retries(self) -> int:
        return sum(self.retries_by_cause.values())


class StatsRecorder:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._retries: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._channels = 0
        self._writes = 0
        self._rows = 0
        self._leader_refreshes = 0
        self._config_fetches = 0
        self._write_latency = Histogram()

    def retry(self, cause: str) -> None:
        key = str(cause)  # a Cause is a StrEnum: keep plain strings in the snapshot
        with self._lock:
            self._retries[key] += 1

    def error(self, cause: str, rows: int = 1) -> None:
        key = str(cause)
        with self._lock:
            self._errors[key] += rows

    def channel_created(self) -> None:
        with self._lock:
            self._channels += 1

    def write_acked(self, rows: int, latency_s: float) -> None:
        self._write_latency.observe(latency_s * 1e6)
        with self._lock:
            self._writes += 1
            self._rows += rows

    def leader_refresh(self) -> None:
        with self._lock:
            self._leader_refreshes += 1

    def config_fetch(self) -> None:
        with self._lock:
            self._config_fetches += 1

    def snapshot(self) -> ClientStats:
        latency = self._write_latency.snapshot()
        with self._lock:
            return ClientStats(
                retries_by_cause=dict(self._retries),
                errors_by_cause=dict(self._errors),
                channels_created=self._channels,
                writes_acked=self._writes,
                rows_acked=self._rows,
                leader_refreshes=self._leader_refreshes,
                config_fetches=self._config_fetches,
                write_latency_us=latency,
            )
