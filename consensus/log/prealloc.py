"""Reserving a segment's disk space up front (Kudu's ``log_preallocate_segments``).

A new segment asks the filesystem for its whole size at once with ``fallocate(2)`` and
``FALLOC_FL_KEEP_SIZE``: the blocks are reserved but the file's size stays what was
written, so readers, the torn-tail rule and recovery see exactly the bytes appended, as
without it.  What it buys: on a disk that fills up, appends into a reserved segment cannot
fail with ENOSPC, so a full disk fails the tablet's store first (which recovers once
space is freed, see docs/ARCHITECTURE.md "Failure model") and not its log (a log failure
needs a restart).  Only rolling over to a new segment needs new space.

Best effort: where ``fallocate`` is missing or refused (another OS, a filesystem without
it, no space left for the reservation) the segment is written as before, unreserved, and
the reason is logged once per process. A refused reservation may still have taken some
blocks (ext4 keeps what it allocated before ENOSPC): those are given back at once, so a
reservation that does not fit never makes a full disk fuller (a 1 GiB segment on a 365 MB
filesystem once took all of it, and every tablet's store then failed).  A closed segment
gives back what it did not use (``ftruncate`` to its own size frees the blocks past the end
on ext4, xfs and tmpfs).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import sys

__all__ = ["preallocate", "release_unused"]

logger = logging.getLogger(__name__)

_FALLOC_FL_KEEP_SIZE = 0x01
_warned: set[int] = set()


def _load_fallocate() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


_fallocate = _load_fallocate()


def preallocate(fd: int, offset: int, length: int) -> bool:
    """Reserve ``length`` bytes of ``fd`` from ``offset`` without changing its size; True if
    the filesystem did. If it did not, the file holds no reservation past its size after."""
    if length <= 0 or _fallocate is None:
        return False
    if _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0:  # type: ignore[operator]
        return True
    err = ctypes.get_errno()
    # KEEP_SIZE leaves the size as it was, so cutting the file to its size frees the blocks
    # past it -- those this failed call took, and any an earlier reservation left -- and
    # nothing written: the segment goes on unreserved.
    release_unused(fd, os.fstat(fd).st_size)
    if err not in _warned:
        _warned.add(err)
        logger.warning(
            "cannot reserve space for WAL segments (%s); writing them without a reservation",
            errno.errorcode.get(err, str(err)),
        )
    return False


def release_unused(fd: int, size: int) -> None:
    """Give back the reserved blocks past ``size`` (the bytes written)."""
    try:
        os.ftruncate(fd, size)
    except OSError as e:  # the space stays reserved until the segment is deleted
        logger.warning("cannot release a WAL segment's unused reservation: %s", e)
