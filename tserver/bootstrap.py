"""Opening a tablet replica from disk (Kudu's TabletBootstrap).

A replica directory holds three things, each the source of truth for one question:

    <dir>/consensus-meta      term, vote, the membership (voters, learners) and the index of
                              its log entry, a (lazily saved) commit index
    <dir>/wal/                the Raft log: every entry this replica accepted durably
    <dir>/store.sqlite        the rows, the index/term of the last entry applied to them,
                              and the id of the tablet they belong to

Opening = open the store, read the metadata, open (and verify) the log, then replay the
committed entries above the store's applied index into the store.  The metadata's commit
index may lag the truth (it is saved lazily); entries committed past it are applied later,
once the consensus core learns the commit index again from a leader.  Nothing applied is
ever applied twice: the store records its applied index in the same transaction as the rows,
and the core starts with ``Config.applied`` set from it.

Five facts are checked, because a mismatch means the directory lost data or holds another's
files, and a silent continue would serve wrong rows or break Raft: the store must belong to
this tablet (``TabletStore.open`` checks the id it records; a store file copied from another
tablet's directory raises ``StoreError``), the consensus metadata must exist if the log or
the store holds anything (a replica that started afresh beside its old log would forget its
term and vote, and could vote twice in a term), its term must be at least the term of the
log's last entry (the driver saves a term before it appends an entry of that term, so a
lower one is an older copy of the file, and the replica would forget its vote), the log
must still hold every entry the store has not applied, and the store's last applied (index,
term) must be an entry of the log.  The last four raise ``ReplicaOpenError``.  The
membership a fresh directory records is the one it is opened with (the cluster config's
placement, or the membership a replica is created to join); once the metadata exists it is
authoritative -- memberships change at run time (``consensus.core.membership``), and the
placement is only where a tablet started.  A directory holding a ``tombstone`` file was
deleted from its group (the server skips it); ``open_replica`` refuses it.  Any other check
failing raises ``ReplicaOpenError`` too; so does damage the log or metadata reader finds
(``LogCorruptionError``).  The tablet server turns any failure to open into a FAILED
replica of that one tablet (``tserver.failed_tablet``), never a failed server.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from raftlet.consensus.core.types import Entry, EntryType
from raftlet.consensus.log.metadata import FILE_NAME as META_FILE
from raftlet.consensus.log.metadata import PersistentState
from raftlet.consensus.log.options import LogObserver, LogOptions
from raftlet.consensus.log.raft_storage import WAL_DIR, LogStorage
from raftlet.consensus.workers import WorkerPool
from raftlet.proto import tablet_pb2
from raftlet.schema.row_block import RowBlockError
from raftlet.schema.row_runs import BlockOutcome, RowRun, decode_row_blocks, decode_row_runs
from raftlet.schema.rows import ErrorCode, RowFailure, RowOp
from raftlet.schema.schema import Schema
from raftlet.tserver.store import ApplyEntry, EntryResult, StoreError, TabletStore
from raftlet.tserver.store.tablet_store import AnyOp

__all__ = [
    "STORE_FILE",
    "TOMBSTONE_FILE",
    "OpenedReplica",
    "ReplicaOpenError",
    "apply_entries",
    "decode_write",
    "open_replica",
    "to_apply_entries",
    "to_apply_entry",
]

logger = logging.getLogger(__name__)

STORE_FILE = "store.sqlite"
# Left in a deleted replica's directory: the server opens no replica there (not even the
# placement's, which would start afresh among voters that moved on).
TOMBSTONE_FILE = "tombstone"
# Committed entries replayed per store transaction on open: bounds memory (a few MB of
# decoded rows), while the per-transaction and per-read costs are spread thin.
_REPLAY_CHUNK = 4096


class ReplicaOpenError(Exception):
    """The replica's files disagree with each other; it must not serve."""


@dataclass
class OpenedReplica:
    directory: Path
    store: TabletStore
    storage: LogStorage
    # Committed entries applied to the store while opening.
    replayed: int
    # Seconds each step of opening took: "store", "log" (consensus metadata, then every
    # segment verified and indexed), "replay".
    seconds: dict[str, float] = field(default_factory=dict)

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
    to the same single failure, so replicas still agree -- if they read it by one schema:
    an entry written for another (``SchemaMismatchedEntry``) is not applied at all."""
    write = decode_write(entry)
    if decoded is not None:
        return _apply_entry_of(entry, write, list(decoded[0]), list(decoded[1]))
    _check_entry_schema(entry, write, schema)
    if write.HasField("row_block"):
        block = write.row_block
        outcome: BlockOutcome
        try:
            outcome = decode_row_runs(schema, block.rows, block.indirect)
        except RowBlockError as e:
            outcome = e
        return _apply_entry_of(entry, write, *_ops_of(write, outcome))
    return _apply_entry_of(entry, write, list(write.ops), [])


def to_apply_entries(entries: Sequence[Entry], schema: Schema) -> list[ApplyEntry]:
    """``to_apply_entry`` of each entry, their row blocks decoded together: for a one-row
    write the fixed cost of decoding a block is most of the work (``decode_row_blocks``).
    Written for speed, as replay makes one per entry: each protobuf field read once."""
    writes: list[tuple[Entry, tablet_pb2.WriteOperationPB, bool]] = []
    blocks: list[tuple[bytes, bytes]] = []
    for e in entries:
        write = tablet_pb2.WriteOperationPB()
        if e.type is EntryType.NORMAL and e.data:
            write.ParseFromString(e.data)
            _check_entry_schema(e, write, schema)
        has_block = write.HasField("row_block")
        if has_block:
            block = write.row_block
            blocks.append((block.rows, block.indirect))
        writes.append((e, write, has_block))
    outcomes = iter(decode_row_blocks(schema, blocks))
    out: list[ApplyEntry] = []
    ops: Sequence[AnyOp]
    failures: Sequence[RowFailure]
    for e, write, has_block in writes:
        if has_block:
            outcome = next(outcomes)
            if isinstance(outcome, RowBlockError):
                ops, failures = _ops_of(write, outcome)
            else:
                ops, failures = outcome  # a fresh list from the decoder: no copy needed
        else:
            ops, failures = list(write.ops), []
        rid = write.request_id
        client_id = rid.client_id
        if client_id:
            out.append(
                ApplyEntry(
                    e.index,
                    e.term,
                    ops,
                    (client_id, rid.seq_no),
                    rid.first_incomplete_seq_no,
                    failures,
                )
            )
        else:
            out.append(ApplyEntry(e.index, e.term, ops, None, 0, failures))
    return out


class SchemaMismatchedEntry(ValueError):
    """A committed entry written by a leader whose schema of the tablet is not this
    replica's. Its rows, read by this replica's schema, would be stored as other values
    (of the same width, they decode without an error) or not at all; so the replica applies
    nothing and fails, saying why, instead of diverging in silence."""


def _check_entry_schema(entry: Entry, write: tablet_pb2.WriteOperationPB, schema: Schema) -> None:
    if write.schema_fingerprint and write.schema_fingerprint != schema.fingerprint:
        raise SchemaMismatchedEntry(
            f"entry {entry.index} was written by a leader with another schema of the tablet "
            f"than this replica's ({schema.describe()}): the servers' cluster.toml files "
            "disagree on the table. Remove this replica (`raftlet tablet remove-replica`), "
            "give this server the config its peers run, then `raftlet tablet add-replica`"
        )


def _ops_of(
    write: tablet_pb2.WriteOperationPB, outcome: BlockOutcome
) -> tuple[list[AnyOp], list[RowFailure]]:
    """A write's ops and row failures given what decoding its row block gave."""
    if isinstance(outcome, RowBlockError):
        failure = RowFailure(0, ErrorCode.INVALID_ROW, f"malformed row block: {outcome}")
        return list(write.ops), [failure]
    runs, failures = outcome
    return list(runs), failures


def _apply_entry_of(
    entry: Entry, write: tablet_pb2.WriteOperationPB, ops: list[AnyOp], failures: list[RowFailure]
) -> ApplyEntry:
    rid = write.request_id
    request = (rid.client_id, rid.seq_no) if rid.client_id else None
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
    return store.apply_batch(to_apply_entries(entries, store.schema))


def open_replica(
    directory: str | os.PathLike[str],
    schema: Schema,
    voters: Sequence[str],
    log_options: LogOptions | None = None,
    log_observer: LogObserver | None = None,
    log_appenders: WorkerPool | None = None,
    learners: Sequence[str] = (),
    *,
    create: bool = True,
    tablet_id: str | None = None,
) -> OpenedReplica:
    """Open (or create, with the membership ``voters`` + ``learners``) the replica in
    ``directory``; see the module docstring.  With ``create`` False, a directory that holds
    no replica (no consensus metadata) is refused, not started afresh: the replica was
    there, and its directory was wiped or lost (``tserver.hosted_tablets``).  ``tablet_id``:
    the tablet the store must belong to; None means the directory's name, which it is on a
    server (``<data_dir>/<tablet id>``, a tablet copy's included)."""
    path = Path(directory)
    if tablet_id is None:
        tablet_id = Path(os.path.abspath(path)).name
    if (path / TOMBSTONE_FILE).exists():
        raise ReplicaOpenError(f"{path} holds a deleted replica (a tombstone)")
    if not create and not any(path.iterdir() if path.is_dir() else ()):
        raise ReplicaOpenError(_lost(path))
    if (path / META_FILE).is_file() and not (path / WAL_DIR).is_dir():
        # Metadata is saved after the log is made (and a copy installs both at once): a
        # log gone from beside it was lost -- opened, the replica would keep its term and
        # vote and forget the entries it acknowledged.  (A store gone beside a whole log
        # is replayed again from it; beside a collected one, ``_replay`` refuses it.)
        raise ReplicaOpenError(
            f"{path} holds consensus metadata but no {WAL_DIR} (lost or deleted): opened, "
            "it would forget the entries it acknowledged; a tablet copy from the leader "
            "repairs it"
        )
    path.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    store = TabletStore.open(path / STORE_FILE, schema, tablet_id)
    # Damage SQLite can see is refused here, not met later as a failed apply or a wrong scan.
    problems = store.quick_check()
    if problems:
        store.close()
        raise StoreError(
            f"tablet store {path / STORE_FILE} is damaged (PRAGMA quick_check): "
            + "; ".join(problems)
        )
    t1 = time.perf_counter()
    try:
        storage = LogStorage.open(path, log_options, log_observer, log_appenders)
    except BaseException:
        store.close()
        raise
    t2 = time.perf_counter()
    try:
        _check_membership(storage, store, tuple(voters), tuple(learners), create)
        _check_term(storage)
        replayed = _replay(store, storage)
    except BaseException:
        storage.close()
        store.close()
        raise
    t3 = time.perf_counter()
    seconds = {"store": t1 - t0, "log": t2 - t1, "replay": t3 - t2}
    logger.info(
        "%s: opened in %.2f s (store %.2f s, log of %d entries %.2f s, %d entries replayed "
        "in %.2f s)",
        path,
        t3 - t0,
        seconds["store"],
        storage.last_index() - storage.log.first_index() + 1,
        seconds["log"],
        replayed,
        seconds["replay"],
    )
    return OpenedReplica(path, store, storage, replayed, seconds)


def _lost(path: Path) -> str:
    return (
        f"{path} holds no replica (wiped or lost), yet the tablet is hosted here: starting "
        "afresh would forget its term, vote and the entries it acknowledged; a tablet copy "
        "from the leader repairs it"
    )


def _check_membership(
    storage: LogStorage,
    store: TabletStore,
    voters: tuple[str, ...],
    learners: tuple[str, ...],
    create: bool,
) -> None:
    if storage.metadata.fresh:
        last, applied = storage.last_index(), store.applied_index()
        if last > 0 or applied > 0:
            raise ReplicaOpenError(
                f"consensus metadata {storage.metadata.path} is missing, beside a log of "
                f"entries up to {last} and a store applied to {applied}: starting afresh "
                "would forget this replica's term and vote; refusing to open"
            )
        if not create:
            raise ReplicaOpenError(_lost(Path(storage.metadata.directory)))
        storage.save_metadata(PersistentState(voters=voters, learners=learners))
    # Otherwise the metadata's membership stands, whatever the caller placed it among.


def _check_term(storage: LogStorage) -> None:
    """Refuse consensus metadata whose term is below its log's last entry's.  The driver
    saves a term (and a membership) before it appends any entry of it, a tablet copy writes
    its log's one entry at or below the term it saves, and a truncation only takes entries
    away: so no crash leaves a lower term, and one is a stale copy of the file (restored
    from a backup, say).  Opened, the replica would forget the vote it cast in the terms
    between, and could vote twice in one.  (The membership is not checked the same way: a
    crash after a truncation's membership was saved, before the truncation was written,
    leaves a CONFIG entry above the saved one legitimately; ``consensus.core`` sorts that
    out.)"""
    meta = storage.metadata
    last = storage.last_index()
    if meta.fresh or last < storage.log.first_index():
        return
    saved, log_term = meta.state.current_term, storage.term(last)
    if saved < log_term:
        raise ReplicaOpenError(
            f"consensus metadata {meta.path} is older than the log beside it: its term "
            f"{saved} < {log_term}, the term of the log's last entry ({last}). A replica "
            "saves its term before it appends an entry of that term, so the file was "
            "replaced by an older copy; opened, the replica would forget the votes it cast "
            "since and could vote twice in one term. Put the current consensus-meta back, or "
            "let a tablet copy from the leader replace the replica"
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
    with _collector_paused():
        while lo <= commit:
            hi = min(commit + 1, lo + _REPLAY_CHUNK)
            chunk = storage.entries(lo, hi)
            apply_entries(store, chunk)
            replayed += len(chunk)
            lo = chunk[-1].index + 1
    return replayed


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Run without Python's cyclic garbage collector.  Replay allocates a dozen containers
    per entry and holds a chunk's worth alive at a time, so the collector would keep
    traversing them as they age (measured: about a third of the replay's time); they
    form no cycles, so reference counting frees every one of them anyway."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
