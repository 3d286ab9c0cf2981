"""The copying side of tablet copy: fetch a source's store snapshot in checksummed chunks.

``download`` begins a session on the source, fetches the snapshot chunk by chunk into
``<staging>/store.sqlite.part``, checks every chunk's crc32c as it arrives and the whole
file's at the end, and renames it to ``store.sqlite``: a store file under that name is
always complete and verified. It is resumable: a failed or damaged fetch is retried from
the same offset with backoff; if the session itself is gone (it expired, or the source
restarted), a new one is begun and, when it describes the same snapshot (index, term, size
and checksum), the download goes on from where it stopped, else it starts over. Nothing
here touches the live replica: installing is ``tablet_copy_install``'s.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import grpc

from raftlet.client.retry import Cause, classify
from raftlet.proto import tablet_copy_pb2 as pb
from raftlet.tserver.bootstrap import STORE_FILE
from raftlet.tserver.tablet_copy_install import CopiedState

__all__ = ["CopyFailed", "CopySourceNotLeader", "Downloaded", "download"]

logger = logging.getLogger(__name__)

_PART = ".part"
# A source that answers so serves no copy: another may (NOT_LEADER names the leader).
_NO_SOURCE_HERE = frozenset(
    {Cause.NOT_LEADER, Cause.TABLET_NOT_FOUND, Cause.TABLET_NOT_RUNNING, Cause.LEADER_NOT_READY}
)


class CopyFailed(Exception):
    """The copy could not be completed (the reason is the message)."""


class CopySourceNotLeader(CopyFailed):
    """The source does not lead the tablet; ``leader`` is the one it believes in ("" if
    none)."""

    def __init__(self, message: str, leader: str) -> None:
        super().__init__(message)
        self.leader = leader


@dataclass(frozen=True, slots=True)
class Downloaded:
    state: CopiedState
    session_id: str
    chunks: int
    retries: int
    sessions: int


def download(
    stub: Any,
    tablet_id: str,
    requester: str,
    staging: Path,
    *,
    chunk_bytes: int = 1 << 20,
    attempts: int = 8,
    timeout_s: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Downloaded:
    """Fetch ``tablet_id``'s snapshot from ``stub`` (a ``TabletCopyServiceStub``) into the
    (existing, empty) directory ``staging``. ``attempts``: failures in a row, per chunk or
    begin, before giving up. ``sleep`` is the backoff between them (tests pass a no-op)."""
    part = staging / (STORE_FILE + _PART)
    begun: pb.BeginTabletCopySessionResponse | None = None
    prev: pb.BeginTabletCopySessionResponse | None = None
    offset = 0
    crc = 0
    chunks = retries = sessions = 0
    failures = 0

    def backoff(why: str) -> None:
        nonlocal failures, retries
        failures += 1
        retries += 1
        if failures >= attempts:
            raise CopyFailed(f"tablet copy of {tablet_id}: giving up after {failures} tries: {why}")
        logger.info("tablet copy of %s: %s; retrying", tablet_id, why)
        sleep(min(0.05 * (2 ** (failures - 1)), 2.0))

    with open(part, "wb") as out:
        while True:
            if begun is None:
                try:
                    fresh = _begin(stub, tablet_id, requester, timeout_s)
                except grpc.RpcError as e:
                    backoff(f"begin: {classify(e)}")
                    continue
                sessions += 1
                if prev is not None and _snapshot_of(fresh) != _snapshot_of(prev):
                    offset, crc = 0, 0  # a different snapshot: what we have is of no use
                    out.seek(0)
                    out.truncate()
                begun = prev = fresh
            if offset >= begun.store_bytes:
                break
            try:
                got = stub.FetchTabletCopyData(
                    pb.FetchTabletCopyDataRequest(
                        session_id=begun.session_id,
                        offset=offset,
                        max_bytes=chunk_bytes,
                        requester_uuid=requester,
                    ),
                    timeout=timeout_s,
                )
            except grpc.RpcError as e:
                failure = classify(e)
                if failure.status == grpc.StatusCode.NOT_FOUND.name:
                    begun = None  # the session is gone: begin again, resume if we can
                backoff(f"fetch at {offset}: {failure}")
                continue
            data = got.data
            if crc32c.crc32c(data) != got.crc32c or not data:
                backoff(f"chunk at {offset} arrived damaged or empty")
                continue
            out.seek(offset)
            out.write(data)
            crc = crc32c.crc32c(data, crc)
            offset += len(data)
            chunks += 1
            failures = 0
        out.flush()
        os.fsync(out.fileno())
    if offset != begun.store_bytes or crc != begun.store_crc32c:
        raise CopyFailed(
            f"tablet copy of {tablet_id}: the snapshot arrived as {offset} bytes with crc32c "
            f"{crc:#x}, the source said {begun.store_bytes} bytes, {begun.store_crc32c:#x}"
        )
    os.replace(part, staging / STORE_FILE)
    state = CopiedState(
        index=begun.snapshot_index,
        term=begun.snapshot_term,
        source_uuid="",  # the caller knows whom it asked
        source_term=begun.source_term,
        voters=tuple(begun.voters),
        learners=tuple(begun.learners),
        config_index=begun.config_index,
    )
    return Downloaded(state, begun.session_id, chunks, retries, sessions)


def end_session(
    stub: Any, session_id: str, requester: str, success: bool, index: int, timeout_s: float = 10.0
) -> None:
    """Tell the source how the copy ended (best effort: a lost end expires there)."""
    try:
        stub.EndTabletCopySession(
            pb.EndTabletCopySessionRequest(
                session_id=session_id,
                success=success,
                installed_index=index,
                requester_uuid=requester,
            ),
            timeout=timeout_s,
        )
    except grpc.RpcError as e:
        logger.info("tablet copy session %s: end not delivered (%s)", session_id, classify(e))


def _begin(
    stub: Any, tablet_id: str, requester: str, timeout_s: float
) -> pb.BeginTabletCopySessionResponse:
    try:
        resp: pb.BeginTabletCopySessionResponse = stub.BeginTabletCopySession(
            pb.BeginTabletCopySessionRequest(tablet_id=tablet_id, requester_uuid=requester),
            timeout=timeout_s,
        )
    except grpc.RpcError as e:
        failure = classify(e)
        if failure.cause in _NO_SOURCE_HERE:
            raise CopySourceNotLeader(str(failure), failure.leader_uuid) from None
        raise
    return resp


def _snapshot_of(r: pb.BeginTabletCopySessionResponse) -> tuple[int, int, int, int]:
    """What names a snapshot: two sessions with equal ones serve the same bytes."""
    return (r.snapshot_index, r.snapshot_term, r.store_bytes, r.store_crc32c)
