"""Errors of the tablet store. The service boundary maps ``InvalidScan`` to INVALID_ARGUMENT;
any other ``StoreError`` means the replica cannot go on serving from this store."""

from __future__ import annotations

__all__ = ["InvalidScan", "SchemaMismatchError", "StoreClosedError", "StoreError"]


class StoreError(Exception):
    """The store cannot be opened or used (corrupt, foreign file, I/O failure)."""


class SchemaMismatchError(StoreError):
    """An existing store was opened with a schema other than the one it was created with."""


class StoreClosedError(StoreError):
    """The store was used after ``close()``."""


class InvalidScan(StoreError, ValueError):
    """A scan's projection, predicates, limit or resume key do not fit the schema."""
