"""Errors of the tablet store. The service boundary maps ``InvalidScan`` to INVALID_ARGUMENT;
any other ``StoreError`` means the replica cannot go on serving from this store."""

from __future__ import annotations

import sqlite3

from raftlet.consensus.log.errors import NewerFormat

__all__ = [
    "InvalidScan",
    "ScanDeadlineExceeded",
    "SchemaMismatchError",
    "StoreClosedError",
    "StoreError",
    "StoreFilesGone",
    "StoreNewerFormat",
    "damage_in",
]

# SQLite's primary result codes for a file that is not what it should be.
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26


class StoreError(Exception):
    """The store cannot be opened or used (corrupt, foreign file, I/O failure)."""


class StoreFilesGone(StoreError):
    """The store's file or its -wal was deleted or replaced while the store had them open:
    what it writes goes nowhere a restart would find, so no retry mends it; a copy of the
    tablet does."""


class StoreNewerFormat(StoreError, NewerFormat):
    """A store whose format version is above what this build reads (a newer release's)."""


class SchemaMismatchError(StoreError):
    """An existing store was opened with a schema other than the one it was created with."""


class StoreClosedError(StoreError):
    """The store was used after ``close()``."""


class InvalidScan(StoreError, ValueError):
    """A scan's projection, predicates, limit or resume key do not fit the schema."""


class ScanDeadlineExceeded(StoreError):
    """A scan ran past the deadline it was given and SQLite was interrupted; the store is
    as it was."""


def damage_in(exc: BaseException) -> str | None:
    """What says the store file is damaged (SQLITE_CORRUPT, SQLITE_NOTADB) in ``exc`` or
    what caused it; None for any other failure (a full disk, say, which may pass)."""
    seen: BaseException | None = exc
    for _ in range(8):  # a cause chain is short; never loop on a cycle
        if seen is None:
            return None
        if isinstance(seen, StoreFilesGone):
            return str(seen)
        if isinstance(seen, sqlite3.DatabaseError):
            code = getattr(seen, "sqlite_errorcode", None)
            if code is not None and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
                return str(exc)
        seen = seen.__cause__ or seen.__context__
    return None
