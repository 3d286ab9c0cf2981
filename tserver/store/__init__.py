"""The per-tablet row store: one SQLite database file per tablet replica.

See ``tablet_store`` for durability and threading; ``sql`` builds every statement from the
schema; ``errors`` holds what the service boundary maps to a status.
"""

from raftlet.tserver.store.errors import (
    InvalidScan,
    ScanDeadlineExceeded,
    SchemaMismatchError,
    StoreClosedError,
    StoreError,
    damage_in,
)
from raftlet.tserver.store.tablet_store import (
    FORMAT_VERSION,
    ApplyEntry,
    EntryResult,
    RequestRecord,
    ScanCursor,
    ScanResult,
    TabletStore,
)

__all__ = [
    "FORMAT_VERSION",
    "ApplyEntry",
    "EntryResult",
    "InvalidScan",
    "RequestRecord",
    "ScanCursor",
    "ScanDeadlineExceeded",
    "ScanResult",
    "SchemaMismatchError",
    "StoreClosedError",
    "StoreError",
    "TabletStore",
    "damage_in",
]
