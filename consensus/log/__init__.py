"""consensus.log — the durable Raft log (WAL segments) and consensus metadata.

``Log`` keeps one replica's entries in size-capped segment files of CRC-framed
``EntryBatchPB`` records, group-commits appends on one appender thread (many batches, one
fdatasync), serves reads from an in-memory index and a bounded cache, and garbage-collects
whole segments.  ``ConsensusMetadata`` persists term, vote, voters and commit index
atomically.  ``LogStorage`` puts the two together as a ``consensus.core.Storage``.
See docs/ARCHITECTURE.md, "consensus.log — the durable log".
"""

from raftlet.consensus.log.errors import (
    LogClosedError,
    LogCorruptionError,
    LogEntryCompactedError,
    LogError,
    LogFailedError,
    MetadataCorruptionError,
)
from raftlet.consensus.log.log import AppendCallback, Log, write_log_start
from raftlet.consensus.log.metadata import ConsensusMetadata, PersistentState
from raftlet.consensus.log.options import LogObserver, LogOptions, NullLogObserver
from raftlet.consensus.log.raft_storage import LogStorage

__all__ = [
    "AppendCallback",
    "ConsensusMetadata",
    "Log",
    "LogClosedError",
    "LogCorruptionError",
    "LogEntryCompactedError",
    "LogError",
    "LogFailedError",
    "LogObserver",
    "LogOptions",
    "LogStorage",
    "MetadataCorruptionError",
    "NullLogObserver",
    "PersistentState",
    "write_log_start",
]
