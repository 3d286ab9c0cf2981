"""Opening a tablet replica from disk (Kudu's TabletBootstrap).

A replica directory holds three things, each the source of truth for one question:

    <dir>/consensus-meta      term, vote, voters, a (lazily saved) commit index
    <dir>/wal/                the Raft log: every entry this replica accepted durably
    <dir>/store.sqlite        the rows, and the index/term of the last entry applied to them

Opening = open the store, read the metadata, open (and verify) the log, then replay the
committed entries above the store's applied index into the store.  The metadata's commit
index may lag the truth (it is saved lazily); entries committed past it are applied later,
once the consensus core learns the commit index again from a leader.  Nothing applied is
ever applied twice: the store records its applied index in the same transaction as the rows,
and the core starts with ``Config.applied`` set from it.

Two facts are checked, because a mismatch means the directory lost data and a silent
continue would serve wrong rows: the log must still hold every entry the store has not
applied, and the store's last applied (index, term) must be an entry of the log.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from raftlet.consensus.core.types import Entry, EntryType
from raftlet.consensus.log.metadata import PersistentState
from raftlet.consensus.log.options import LogObserver, LogOptions
from raftlet.consensus.log.raft_storage import LogStorage
from raftlet.consensus.workers import WorkerPool
from raftlet.proto import tablet_pb2
from raftlet.schema.row_block import RowBlockError
from raftlet.schema.row_runs import RowRun, decode_row_runs
from raftlet.schema.rows import ErrorCode, RowFailure, RowOp
from raftlet.schema.schema import Schema
from raftlet.tserver.store import ApplyEntry, EntryResult, TabletStore
from raftlet.tserver.store.tablet_store import AnyOp

__all__ = [
    "STORE_FILE",
    "OpenedReplica",
    "ReplicaOpenError",
    "apply_entries",
    "decode_write",
    "open_replica",
    "to_apply_entry",
]

STORE_FILE = "store.sqlite"
# Committed entries replayed per store transaction on open: bounds memory, keeps batches big.
_REPLAY_CHUNK = 512


class ReplicaOpenError(Exception):
    """The replica's files disagree with each other; it must not serve."""


@dataclass
class OpenedReplica:
    directory: Path
    store: TabletStore
    storage: LogStorage
    # Committed entries applied to the store while opening.
    replayed: int

    def close(self) -> None:
        self.storage.close()
        self.store.close()


def decode_write(entry: Entry) -> tablet_pb2.WriteOperationPB:
    """The write a NORMAL entry carries (NO_OP entries carry none)."""
    op = tablet_pb2.WriteOperationPB()
    if entry.type is EntryType.NORMAL and entry.data:
        op.ParseFromString(entry.data)
    return op


def to_apply_entry(
    entry: Entry,
    schema: Schema,
    decoded: tuple[Sequence[RowRun | RowOp], Sequence[RowFailure]] | None = None,
) -> ApplyEntry:
    """A committed entry as the store applies it, with its request id for exactly-once.

    ``decoded``: the entry's rows already decoded (the leader's own write, decoded when it
    was prepared), used instead of decoding them again.  Otherwise a packed row block is
    decoded here, its bad rows kept as row failures.  A block the
    leader accepted is well formed; should one not be, every replica decodes the same bytes
    to the same single failure, so replicas still agree."""
    write = decode_write(entry)
    rid = write.request_id
    request = (rid.client_id, rid.seq_no) if rid.client_id else None
    ops: list[AnyOp] = list(write.ops)
    failures: list[RowFailure] = []
    if decoded is not None:
        ops, failures = list(decoded[0]), list(decoded[1])
    elif write.HasField("row_block"):
        try:
            runs, failures = decode_row_runs(
                schema, write.row_block.rows, write.row_block.indirect
            )
            ops = list(runs)
        except RowBlockError as e:
            failures = [RowFailure(0, ErrorCode.INVALID_ROW, f"malformed row block: {e}")]
    return ApplyEntry(
        entry.index,
        entry.term,
        ops,
        request=request,
        first_incomplete_seq_no=rid.first_incomplete_seq_no if request else 0,
        row_failures=failures,
    )


def apply_entries(store: TabletStore, entries: Sequence[Entry]) -> list[EntryResult]:
    """Apply committed entries in one store transaction (NO_OPs only move the applied index)."""
    return store.apply_batch([to_apply_entry(e, store.schema) for e in entries])


def open_replica(
    directory: str | os.PathLike[str],
    schema: Schema,
    voters: Sequence[str],
    log_options: LogOptions | None = None,
    log_observer: LogObserver | None = None,
    log_appenders: WorkerPool | None = None,
) -> OpenedReplica:
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    store = TabletStore.open(path / STORE_FILE, schema)
    try:
        storage = LogStorage.open(path, log_options, log_observer, log_appenders)
    except BaseException:
        store.close()
        raise
    try:
        _check_voters(storage, tuple(voters))
        replayed = _replay(store, storage)
    except BaseException:
        storage.close()
        store.close()
        raise
    return OpenedReplica(path, store, storage, replayed)


def _check_voters(storage: LogStorage, voters: tuple[str, ...]) -> None:
    if storage.metadata.fresh:
        storage.save_metadata(PersistentState(voters=voters))
    elif set(storage.voters()) != set(voters):
        raise ReplicaOpenError(
            f"replica in {storage.metadata.directory} belongs to voters {storage.voters()}, "
            f"but the cluster config places it among {voters}"
        )


def _replay(store: TabletStore, storage: LogStorage) -> int:
    applied, applied_term = store.applied_index(), store.applied_term()
    last = storage.last_index()
    where = storage.metadata.directory
    if applied > last:
        raise ReplicaOpenError(
            f"{where}: the store applied up to index {applied} but the log ends at {last}"
        )
    if applied > 0 and applied >= storage.log.first_index():
        log_term = storage.term(applied)
        if log_term != applied_term:
            raise ReplicaOpenError(
                f"{where}: the store applied entry {applied} of term {applied_term}, "
                f"but the log has term {log_term} there"
            )
    if applied + 1 < storage.log.first_index():
        raise ReplicaOpenError(
            f"{where}: the log starts at {storage.log.first_index()}, "
            f"but the store needs entries from {applied + 1}"
        )
    commit = min(storage.initial_state().commit, last)
    replayed = 0
    lo = applied + 1
    while lo <= commit:
        hi = min(commit + 1, lo + _REPLAY_CHUNK)
        chunk = storage.entries(lo, hi)
        apply_entries(store, chunk)
        replayed += len(chunk)
        lo = chunk[-1].index + 1
    return replayed
