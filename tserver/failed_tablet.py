"""A tablet whose replica could not be opened on this server: ``FailedTablet``.

Opening a replica reads three things from its directory (``tserver.bootstrap``); when any of
them is damaged or missing -- a corrupt WAL record, a store SQLite will not open, consensus
metadata missing beside a non-empty log, any ``OSError`` -- that one tablet is FAILED and the
server starts anyway, serving its other tablets.  A FAILED tablet holds no files open, takes
no part in its Raft group (it never votes or campaigns: it has no consensus at all), answers
every RPC for it with UNAVAILABLE "tablet failed: <why>" (``TabletFailed``), and shows as
FAILED, with the reason, in ListTablets, on ``/tablets`` and in the ``tablet_failed`` gauge.
The other two replicas keep the tablet available, and the server repairs it by copying the
tablet from the leader (``tserver.tablet_copier``, every ``--tablet_copy_repair_interval_s``).
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from raftlet.consensus.core import EntriesUnreadable, RaftConfigError
from raftlet.consensus.log.errors import LogError, NewerFormat
from raftlet.consensus.raft_consensus import out_of_space
from raftlet.tserver.bootstrap import ReplicaOpenError
from raftlet.tserver.errors import TabletFailed
from raftlet.tserver.store import StoreError

__all__ = ["OPEN_FAILURES", "FailedTablet", "open_or_fail"]

logger = logging.getLogger(__name__)

# What a damaged or unreadable replica directory raises while it is opened.  Anything else
# is a bug, and still takes the server down loudly.
OPEN_FAILURES: tuple[type[BaseException], ...] = (
    ReplicaOpenError,
    # A membership in the metadata the core will not take (written by an older build).
    RaftConfigError,
    LogError,
    # The log's entries read back at open (replayed into the store): damaged or gone.
    EntriesUnreadable,
    StoreError,
    OSError,
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class FailedTablet:
    """This server's replica of ``tablet_id``, which failed to open for ``reason``."""

    tablet_id: str
    table: str
    partition: int
    voters: tuple[str, ...]
    directory: Path
    reason: str
    # False for files a newer release wrote (``NewerFormat``): a copy would replace them.
    repairable: bool = True
    # It failed for want of disk space: its server opens it again once there is room.
    out_of_space: bool = False

    def error(self) -> TabletFailed:
        """What every RPC for this tablet is answered with."""
        return TabletFailed(self.reason)

    def status(self) -> dict[str, object]:
        """Its row on ``/tablets``: the same keys a running replica shows, where they apply."""
        return {
            "tablet_id": self.tablet_id,
            "table": self.table,
            "partition": self.partition,
            "state": "FAILED",
            "failed": True,
            "failure": self.reason,
            "role": "",
            "term": "",
            "leader": "",
            "leader_ready": False,
        }


def open_or_fail(
    opener: Callable[[], T],
    *,
    tablet_id: str,
    table: str,
    partition: int,
    voters: tuple[str, ...],
    directory: Path,
) -> T | FailedTablet:
    """``opener()``, or a ``FailedTablet`` saying why it raised one of ``OPEN_FAILURES``.
    The log says why once, with the traceback at debug level only: the reason is the
    news, not where in the reader it was found."""
    try:
        return opener()
    except OPEN_FAILURES as exc:
        reason = describe_open_failure(exc) + _full_disk_note(directory)
        logger.error(
            "tablet %s failed to open from %s and is FAILED (the server's other tablets serve): %s",
            tablet_id,
            directory,
            reason,
        )
        logger.debug("tablet %s: %s", tablet_id, "".join(traceback.format_exception(exc)))
        repairable = not isinstance(exc, NewerFormat)
        return FailedTablet(
            tablet_id, table, partition, voters, directory, reason, repairable, out_of_space(exc)
        )


# Less free space than this where a replica failed to open is named in the reason: SQLite
# says "disk I/O error" when it cannot make its -wal or -shm file on a full disk, which
# sent a reviewer looking for failing hardware.
LOW_SPACE_BYTES = 16 << 20


def _full_disk_note(directory: Path) -> str:
    """ " (its filesystem has N bytes free: ...)" when that is almost nothing, else ""."""
    for path in (directory, *directory.parents):
        try:
            st = os.statvfs(path)
        except OSError:
            continue
        free = st.f_bavail * st.f_frsize
        if free >= LOW_SPACE_BYTES:
            return ""
        return (
            f" (the filesystem holding {directory} has {free:,} bytes free: a full disk? "
            "free space, then restart the server or let the tablet copy repair it)"
        )
    return ""


def describe_open_failure(exc: BaseException) -> str:
    """One line for an operator: the error's kind and message (an OSError's message holds
    its errno and the path)."""
    return f"{type(exc).__name__}: {exc}"
