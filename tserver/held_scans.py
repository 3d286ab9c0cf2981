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
for at most ``idle_s`` between two pages (a client that stopped reading, or crashed) and
``max_age_s`` in all (one read slowly but steadily); a page past those is read at the
current state from its resume key, as before, and says so by its new (or empty) id. A scan
that moves to another replica (its server stopped, leadership moved) starts a new read
there the same way. A scan taken for a page keeps its place (``_Taken``) until it is held
again or ended. A new scan finding every place taken gets the place of the one idle
longest, if that one has been idle for ``yield_after_s`` (a client that opened scans and
left them blocked the others' for 30 s); if not -- so many scans read at once -- it is
refused by the replica before its first page is sent (``TabletReplica.scan``). A page the
server made but dropped (over its connection's unread-bytes budget) releases its scan at
once (``release``): its client never learned the id.
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
# A scan read slowly but steadily kept its read -- and SQLite's WAL file growing with every
# write meanwhile -- for as long as it lasted; past this its pages are read anew.
DEFAULT_MAX_AGE_S = 600.0
# With every place taken, a held scan idle this long gives its place to a new one: a
# client that opened scans and left them blocked every other multi-page scan of the
# tablet until they idled out.
DEFAULT_YIELD_AFTER_S = 1.0


@dataclass(slots=True)
class _Held:
    scope: AbstractContextManager[ScanCursor]
    cursor: ScanCursor
    # What the scan was opened for (projection, predicates, format): a page that asks for
    # another scan under its id is not continued from it.
    shape: Hashable
    # When its last page was sent: closed idle_s later.
    last_page: float
    # When its read began: held no longer than max_age_s in all.
    opened: float


class HeldScans:
    """The open scans of one replica, by id. Thread-safe; a scan taken for a page is the
    caller's until it is held again or closed."""

    def __init__(
        self,
        idle_s: float = DEFAULT_IDLE_S,
        max_open: int = DEFAULT_MAX_OPEN,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        yield_after_s: float = DEFAULT_YIELD_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_s = idle_s
        self.max_open = max_open
        self.max_age_s = max_age_s
        self.yield_after_s = yield_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[bytes, _Held] = {}
        # Taken for a page and not yet held again or ended: their places stay theirs (a
        # new scan took the place between a page's take and hold, and the scan held since
        # its first page lost its read halfway).
        self._lent: set[int] = set()
        self._next_expiry = float("inf")
        self._closed = False

    def __len__(self) -> int:
        return len(self._held)

    def take(self, scanner_id: bytes, shape: Hashable) -> _Taken | None:
        """The scan held under ``scanner_id`` for a request of ``shape``, lent to the
        caller, who holds it again or ends it (``_Taken``); None if there is none (closed,
        expired, another replica's) -- or it was opened for another request, or is older
        than ``max_age_s``, which closes it."""
        with self._lock:
            held = self._held.pop(scanner_id, None)
            if held is not None:
                too_old = self._clock() - held.opened > self.max_age_s
                if held.shape == shape and not too_old:
                    self._lent.add(id(held))
                    return _Taken(self, held)
        if held is not None:
            _close(held.scope)
        return None

    def hold(
        self,
        scope: AbstractContextManager[ScanCursor],
        cursor: ScanCursor,
        shape: Hashable,
        taken: _Taken | None = None,
    ) -> bytes | None:
        """Hold the open scan ``scope`` (whose cursor is ``cursor``) for its next page: its
        id, or None if no more may be held (the caller closes it). A scan ``taken`` for this
        page has its place kept."""
        self.expire()
        now = self._clock()
        gone: _Held | None = None
        with self._lock:
            if taken is not None:
                self._lent.discard(id(taken.held))
            if self._closed:
                return None
            if taken is None and len(self._held) + len(self._lent) >= self.max_open:
                # The place of the scan idle longest, if it has been idle a while.
                oldest = min(self._held, key=lambda k: self._held[k].last_page, default=None)
                if oldest is None or now - self._held[oldest].last_page < self.yield_after_s:
                    return None
                gone = self._held.pop(oldest)
            scanner_id = secrets.token_bytes(12)
            opened = now if taken is None else taken.held.opened
            self._held[scanner_id] = _Held(scope, cursor, shape, now, opened)
            self._next_expiry = min(self._next_expiry, now + self.idle_s)
        if gone is not None:
            _close(gone.scope)  # its next page is read anew
        return scanner_id

    def release(self, scanner_id: bytes) -> None:
        """Close the scan held under ``scanner_id``, if it is: the page that carried its id
        never reached the client, which cannot ask for the next one."""
        with self._lock:
            held = self._held.pop(scanner_id, None)
        if held is not None:
            _close(held.scope)

    def _give_back(self, held: _Held) -> None:
        with self._lock:
            self._lent.discard(id(held))

    def due(self) -> bool:
        """Whether a held scan has been idle too long (a clock read: for a ticker)."""
        return self._clock() >= self._next_expiry

    def expire(self) -> None:
        """Close the scans idle for longer than ``idle_s``."""
        now = self._clock()
        with self._lock:
            if now < self._next_expiry:
                return
            idle_since = now - self.idle_s
            gone = [k for k, h in self._held.items() if h.last_page <= idle_since]
            ended = [self._held.pop(k) for k in gone]
            self._next_expiry = (
                min((h.last_page for h in self._held.values()), default=float("inf")) + self.idle_s
            )
        for held in ended:
            _close(held.scope)

    def close(self) -> None:
        """Close every held scan, and hold no more (the replica stops)."""
        with self._lock:
            self._closed = True
            ended, self._held = list(self._held.values()), {}
            self._lent.clear()
            self._next_expiry = float("inf")
        for held in ended:
            _close(held.scope)


class _Taken:
    """A held scan lent for one page: ``scope``, ``cursor``; ``end`` when it is not held
    again (its last page, or a failure)."""

    __slots__ = ("_scans", "held")

    def __init__(self, scans: HeldScans, held: _Held) -> None:
        self._scans = scans
        self.held = held

    @property
    def scope(self) -> AbstractContextManager[ScanCursor]:
        return self.held.scope

    @property
    def cursor(self) -> ScanCursor:
        return self.held.cursor

    def end(self) -> None:
        """Give its place back (the caller ends its read)."""
        self._scans._give_back(self.held)


def _close(scope: AbstractContextManager[ScanCursor]) -> None:
    # Ends the read transaction; an error there (the store closed under it) ends it too.
    with contextlib.suppress(Exception):
        scope.__exit__(None, None, None)
