"""The source side of tablet copy: sessions on a snapshot of a leader's store.

``BeginTabletCopySession`` takes a consistent copy of the tablet's store with SQLite's
backup API (``TabletStore.snapshot``: one read transaction, the writer is not blocked) into
``<data_dir>/.tablet-copy/out-<session>.sqlite`` and computes its crc32c. Only the leader
serves one: what it copies is committed, its term is what the installed replica adopts, and
its log holds the snapshot's entry (GC never passes the store's flushed index), so it can
go on from there with appends. ``FetchTabletCopyData`` reads a chunk at any offset -- a
chunk lost or damaged on the way is simply fetched again, so a copy resumes where it broke
off -- and ``EndTabletCopySession`` carries the outcome: the file is removed, then the leader's core
learns it (``report_snapshot``).

Sessions are bounded: one per (tablet, requester) -- a new Begin replaces the old one at
once, ended as "replaced": a follower runs one copy of a tablet at a time, so its new Begin
means the old session is dead (it crashed mid-copy and started over; a live download whose
session vanished begins again and resumes) -- and one that sees no call for
``idle_timeout_s`` ends as failed (``expire``, called by the server's copy janitor), as does
a copy the leader asked for whose session never began.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import crc32c

from raftlet.consensus.core import NotLeaderError
from raftlet.tserver.errors import (
    CopySessionNotFound,
    InvalidRequest,
    ServiceUnavailable,
    TabletFailed,
    UnknownTablet,
)
from raftlet.tserver.store import StoreError
from raftlet.tserver.tablet_copy_install import COPY_DIR, SnapshotInfo, outgoing_snapshot

__all__ = ["CopySession", "CopySessions", "CopySource"]

logger = logging.getLogger(__name__)

_READ_CHUNK = 1 << 20


class CopySource(Protocol):
    """What a session needs of a replica (``TabletReplica`` is one)."""

    def copy_snapshot(self, dest: Path) -> SnapshotInfo:
        """Snapshot the store to ``dest``; raises NotLeaderError unless this replica leads."""
        ...

    def has_member(self, server_id: str) -> bool:
        """Whether ``server_id`` is a voter or learner of the group, as this replica knows
        it (committed or not)."""
        ...

    def report_copy(self, peer: str, ok: bool, index: int) -> None: ...


@dataclass(slots=True)
class CopySession:
    session_id: str
    tablet_id: str
    requester: str
    path: Path
    index: int
    term: int
    source_term: int
    voters: tuple[str, ...]
    learners: tuple[str, ...]
    config_index: int
    size: int
    crc: int
    last_used: float


class CopySessions:
    def __init__(
        self,
        data_dir: Path,
        source_of: Callable[[str], CopySource],
        *,
        idle_timeout_s: float,
        on_ended: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``on_ended(outcome)``: a session ended -- "installed", "failed", "expired" or
        "replaced" (its requester began another)."""
        self._data_dir = data_dir
        self._source_of = source_of
        self._on_ended = on_ended or (lambda _outcome: None)
        self.idle_timeout_s = idle_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, CopySession] = {}
        # Copies this leader asked a follower for, whose session has not begun yet:
        # (tablet, peer) -> deadline.
        self._awaited: dict[tuple[str, str], float] = {}

    # --- the leader asks ---------------------------------------------------------------

    def await_begin(self, tablet_id: str, peer: str) -> bool:
        """Note that ``peer`` was asked to copy ``tablet_id``; False if it already was and
        the request is still outstanding (the leader asks again only when that one ends).
        A session ``peer`` has already does not stop the request: the core asks anew only
        once it stopped waiting for that copy (the peer answered as one that lost its
        data: restarted), and a peer still copying answers that it is."""
        key = (tablet_id, peer)
        with self._lock:
            if key in self._awaited:
                return False
            self._awaited[key] = self._clock() + self.idle_timeout_s
            return True

    def not_started(self, tablet_id: str, peer: str) -> None:
        """The follower refused or could not be reached: the request is over."""
        with self._lock:
            self._awaited.pop((tablet_id, peer), None)

    # --- the follower pulls ------------------------------------------------------------

    def begin(self, tablet_id: str, requester: str) -> CopySession:
        source = self._source_of(tablet_id)
        if not source.has_member(requester):
            # A server removed from the group (its replica FAILED, or left behind) would run
            # the copy as a replica of a group it is not in: refused, its operator deletes it.
            raise InvalidRequest(
                f"{requester} is no member of tablet {tablet_id}'s group: no copy for it"
            )
        session_id = secrets.token_hex(12)
        path = outgoing_snapshot(self._data_dir, session_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            snap = source.copy_snapshot(path)
            size, crc = _size_and_crc(path)
        except (OSError, StoreError) as e:
            path.unlink(missing_ok=True)
            # The requester hears why (a full disk here, say), not "internal server error";
            # and this server's operator, whose disk it is, too.
            logger.warning("tablet %s: no copy for %s: %s", tablet_id, requester, e)
            raise ServiceUnavailable(f"{tablet_id}: this server cannot make a copy: {e}") from e
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        session = CopySession(
            session_id,
            tablet_id,
            requester,
            path,
            snap.index,
            snap.term,
            snap.source_term,
            snap.voters,
            snap.learners,
            snap.config_index,
            size,
            crc,
            self._clock(),
        )
        with self._lock:
            self._awaited.pop((tablet_id, requester), None)
            replaced = [
                s
                for s in self._sessions.values()
                if s.tablet_id == tablet_id and s.requester == requester
            ]
            for old in replaced:
                del self._sessions[old.session_id]
            self._sessions[session_id] = session
        for old in replaced:
            old.path.unlink(missing_ok=True)
            # Not reported to the core: the copy it waits for goes on in the new session.
            logger.info(
                "tablet %s: %s began a new copy session; its old one %s (last call %.1f s "
                "ago) is dropped",
                tablet_id,
                requester,
                old.session_id,
                session.last_used - old.last_used,
            )
            self._on_ended("replaced")
        return session

    def fetch(self, session_id: str, offset: int, max_bytes: int, requester: str) -> bytes:
        session = self._touch(session_id, requester)
        if offset > session.size:
            raise InvalidRequest(f"offset {offset} is past the snapshot's {session.size} bytes")
        if max_bytes <= 0:
            raise InvalidRequest("max_bytes must be positive")
        try:
            with open(session.path, "rb") as f:
                f.seek(offset)
                return f.read(max_bytes)
        except FileNotFoundError:
            raise CopySessionNotFound(session_id) from None

    def end(
        self, session_id: str, success: bool, requester: str, installed_index: int = 0
    ) -> CopySession:
        """The requester installed the copy (``success``) and holds the tablet up to
        ``installed_index`` -- beyond the snapshot when it found it already held more and
        kept its own -- or it failed."""
        session = self._touch(session_id, requester)
        with self._lock:
            self._sessions.pop(session_id, None)
            # A request to the peer made meanwhile is answered by this end's report.
            self._awaited.pop((session.tablet_id, session.requester), None)
        session.path.unlink(missing_ok=True)
        index = max(session.index, installed_index)
        self._report(session.tablet_id, session.requester, success, index)
        self._on_ended("installed" if success else "failed")
        return session

    # --- bounds ------------------------------------------------------------------------

    def expire(self) -> int:
        """End every session idle past the timeout, and every awaited copy whose session
        never began, as failed; returns how many."""
        now = self._clock()
        with self._lock:
            idle = [s for s in self._sessions.values() if now - s.last_used > self.idle_timeout_s]
            for s in idle:
                del self._sessions[s.session_id]
                self._awaited.pop((s.tablet_id, s.requester), None)  # one report, not two
            late = [key for key, deadline in self._awaited.items() if now > deadline]
            for key in late:
                del self._awaited[key]
            # A peer asked again while it copies (it said so) is not late: its session's
            # end is the report the core waits for.
            copying = {(s.tablet_id, s.requester) for s in self._sessions.values()}
            late = [key for key in late if key not in copying]
        for s in idle:
            s.path.unlink(missing_ok=True)
            self._report(s.tablet_id, s.requester, False, 0)
            self._on_ended("expired")
        for tablet_id, peer in late:
            self._report(tablet_id, peer, False, 0)
        return len(idle) + len(late)

    def active(self) -> int:
        with self._lock:
            return len(self._sessions)

    def close(self) -> None:
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
            self._awaited.clear()
        for s in sessions:
            s.path.unlink(missing_ok=True)
        root = self._data_dir / COPY_DIR
        if root.is_dir():
            for p in root.glob("out-*.sqlite*"):
                p.unlink(missing_ok=True)

    def _touch(self, session_id: str, requester: str) -> CopySession:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or session.requester != requester:
                raise CopySessionNotFound(session_id)
            session.last_used = self._clock()
            return session

    def _report(self, tablet_id: str, peer: str, ok: bool, index: int) -> None:
        # The replica may be gone, failed or replaced: then no core waits for this copy.
        with contextlib.suppress(LookupError, NotLeaderError, TabletFailed, UnknownTablet):
            self._source_of(tablet_id).report_copy(peer, ok, index)


def _size_and_crc(path: Path) -> tuple[int, int]:
    crc = 0
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_READ_CHUNK):
            crc = crc32c.crc32c(chunk, crc)
            size += len(chunk)
    return size, crc
