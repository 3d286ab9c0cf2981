"""Scans a replica holds open between their pages, so that every page of a scan is read
from one state of the tablet.

A page used to be a read of its own, at the replica's state when the page was asked for: a
scan of many pages saw a batch written between two of them in part -- one of its rows as
before, another as after -- though every write is applied whole (a reviewer tore a
two-row batch in 5 of 5 full scans of a 300,000-row table). So the first page's read --
an SQLite read transaction, which sees the store as one applied batch left it -- stays open
with its cursor after the page is sent, under an id the page carries
(``ScanResponse.scanner_id``); the next page, asked with that id, goes on from the same
cursor, and rows that did not fit the last page come first.

What a held scan costs: a reader connection, and a read transaction that keeps SQLite from
restarting its WAL file while it lasts (the file grows with the writes meanwhile; a
checkpoint catches up once it ends). So a replica holds at most ``max_open`` scans, each
for at most ``idle_s`` between two pages (a client that stopped reading, or crashed); a
page past either limit is read at the current state from its resume key, as before, and
says so by its new (or empty) id. A scan that moves to another replica (its server
stopped, leadership moved) starts a new read there the same way.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from raftlet.tserver.store.tablet_store import ScanCursor

__all__ = ["HeldScans"]

DEFAULT_IDLE_S = 30.0
DEFAULT_MAX_OPEN = 32


@dataclass(slots=True)
class _Held:
    scope: AbstractContextManager[ScanCursor]
    cursor: ScanCursor
    # What the scan was opened for (projection, predicates, format): a page that asks for
    # another scan under its id is not continued from it.
    shape: Hashable
    expires: float


class HeldScans:
    """The open scans of one replica, by id. Thread-safe; a scan taken for a page is the
    caller's until it is held again or closed."""

    def __init__(
        self,
        idle_s: float = DEFAULT_IDLE_S,
        max_open: int = DEFAULT_MAX_OPEN,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_s = idle_s
        self.max_open = max_open
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[bytes, _Held] = {}
        self._next_expiry = float("inf")
        self._closed = False

    def __len__(self) -> int:
        return len(self._held)

    def take(
        self, scanner_id: bytes, shape: Hashable
    ) -> tuple[AbstractContextManager[ScanCursor], ScanCursor] | None:
        """The scan held under ``scanner_id`` for a request of ``shape``, no longer held;
        None if there is none (closed, expired, another replica's) -- or it was opened for
        another request, which closes it."""
        with self._lock:
            held = self._held.pop(scanner_id, None)
        if held is None:
            return None
        if held.shape != shape:
            _close(held.scope)
            return None
        return held.scope, held.cursor

    def hold(
        self, scope: AbstractContextManager[ScanCursor], cursor: ScanCursor, shape: Hashable
    ) -> bytes | None:
        """Hold the open scan ``scope`` (whose cursor is ``cursor``) for its next page: its
        id, or None if no more may be held (the caller closes it)."""
        self.expire()
        expires = self._clock() + self.idle_s
        with self._lock:
            if self._closed or len(self._held) >= self.max_open:
                return None
            scanner_id = secrets.token_bytes(12)
            self._held[scanner_id] = _Held(scope, cursor, shape, expires)
            self._next_expiry = min(self._next_expiry, expires)
        return scanner_id

    def due(self) -> bool:
        """Whether a held scan has been idle too long (a clock read: for a ticker)."""
        return self._clock() >= self._next_expiry

    def expire(self) -> None:
        """Close the scans idle for longer than ``idle_s``."""
        now = self._clock()
        with self._lock:
            if now < self._next_expiry:
                return
            gone = [k for k, h in self._held.items() if h.expires <= now]
            ended = [self._held.pop(k) for k in gone]
            self._next_expiry = min((h.expires for h in self._held.values()), default=float("inf"))
        for held in ended:
            _close(held.scope)

    def close(self) -> None:
        """Close every held scan, and hold no more (the replica stops)."""
        with self._lock:
            self._closed = True
            ended, self._held = list(self._held.values()), {}
            self._next_expiry = float("inf")
        for held in ended:
            _close(held.scope)


def _close(scope: AbstractContextManager[ScanCursor]) -> None:
    # Ends the read transaction; an error there (the store closed under it) ends it too.
    with contextlib.suppress(Exception):
        scope.__exit__(None, None, None)
