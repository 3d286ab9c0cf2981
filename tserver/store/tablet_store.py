"""One tablet replica's rows in one SQLite database file.

The file holds the rows and the replica's bookkeeping: ``tablet_rows`` (the schema's
columns, ``PRIMARY KEY(key columns)``: a rowid table -- a single integer key is the rowid,
any other key a unique index beside it, which a scan in key order walks; stores made before
were ``WITHOUT ROWID``, the rows clustered in the key's b-tree, and work the same,
``sql.SqlBuilder.create_table`` says why it changed),
``raftlet_meta`` (the
schema, the format version, the id of the tablet it belongs to, and the Raft index and term
of the last applied entry), and the clients' request records for exactly-once writes
(``raftlet_requests``, ``raftlet_request_bounds``: ``request_records``).

Durability. The database runs in WAL journal mode with ``synchronous=NORMAL``: a commit is
atomic and survives a process crash, but a power loss may take back the last few commits.
That is enough because the Raft log, which *is* fsynced before an entry commits, is the
source of truth: the applied index is written in the same transaction as the rows it
describes, so a lost commit also loses its applied index, and recovery replays the log from
``applied_index() + 1``. The one thing this leaves to the caller: before garbage-collecting
the Raft log up to index N, make the store durable at or past N (``flush()``) or keep a
``snapshot()`` at or past N.

Threads. One thread (the tablet's apply worker) calls ``apply_batch``; a lock makes a
second writer wait rather than corrupt anything, but it is not meant to be contended. Any
thread may call ``scan``, ``count`` and ``snapshot`` concurrently with it: those use a pool
of read-only connections, each scan in its own read transaction, which WAL mode lets run
beside the writer and which sees exactly the state of some committed batch.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from raftlet.consensus.log.errors import newer_release
from raftlet.proto import tablet_pb2
from raftlet.schema.keys import KeyDecodeError, decode_key, encode_key
from raftlet.schema.predicates import Predicate, PredicateError
from raftlet.schema.row_runs import RowRun, runs_of_row_ops
from raftlet.schema.rows import ErrorCode, OpType, RowFailure, RowOp, RowOpError, decode_row_op
from raftlet.schema.schema import Schema, SchemaError
from raftlet.schema.types import DataType, Value
from raftlet.tserver.store.errors import (
    InvalidScan,
    ScanDeadlineExceeded,
    SchemaMismatchError,
    StoreClosedError,
    StoreError,
    StoreFilesGone,
    StoreNewerFormat,
)
from raftlet.tserver.store.request_records import (
    BOUNDS_TABLE,
    REQUEST_RECORD_WINDOW,
    REQUESTS_TABLE,
    plan_requests,
    read_bounds,
    read_records,
    write_records,
)
from raftlet.tserver.store.sql import (
    META_TABLE,
    SqlBuilder,
    SqlValue,
    from_sql,
    projected_at,
    quote_ident,
    to_sql,
)

__all__ = [
    "FORMAT_VERSION",
    "ApplyEntry",
    "EntryResult",
    "RequestRecord",
    "ScanCursor",
    "ScanResult",
    "TabletStore",
]

FORMAT_VERSION = 1
# How many SQLite virtual-machine steps a scan with a deadline runs between two looks at
# the clock (``open_scan``): a fraction of a millisecond of a plain scan's time.
_PROGRESS_EVERY_OPS = 1000
# SQLite's result code of an interrupted statement.
_SQLITE_INTERRUPT = 9
# What SQLite's -wal file shrinks back to after it grew (``_init_db``).
WAL_FILE_LIMIT_BYTES = 16 * 1024 * 1024
# Readers only wait on a writer during WAL recovery or a checkpoint restart: seconds, not ms.
_BUSY_TIMEOUT_S = 30.0
_MAX_REPR = 120
# A run shorter than this is applied row by row: a savepoint costs more than it saves.
_MIN_BULK_ROWS = 4
# A savepoint's journal holds the original of each page its statement changes, in memory
# (``temp_store=MEMORY``): longer runs go in statements of at most this many rows, so that
# a run's journal holds ~2 MiB of pages at most, however many rows the batch applies.
_MAX_BULK_ROWS = 512
_INSERTS = (OpType.INSERT, OpType.UPSERT)
# Where each operation counts in ``EntryResult.rows_by_op``.
_OP_SLOT = {OpType.INSERT: 0, OpType.UPSERT: 1, OpType.UPDATE: 2, OpType.DELETE: 3}

StorePath = str | os.PathLike[str]
AnyOp = RowRun | RowOp | tablet_pb2.RowOperationPB


class ApplyEntry(NamedTuple):
    """One committed Raft entry to apply. ``ops`` may be empty (a NO_OP still advances the
    applied index). Decoded ``RowOp``s keep their own ``row_index``; a ``RowOperationPB`` at
    position i is decoded here and reported as row i.

    A named tuple, as ``consensus.core.Entry`` is and for the same reason: one is made per
    applied entry (a million in a long replay), and a frozen dataclass's ``__init__``,
    one ``object.__setattr__`` per field, costs ~1.2 us against ~0.35 us."""

    index: int  # type: ignore[assignment]  # shadows tuple.index(), which nothing calls
    term: int
    ops: Sequence[AnyOp] = ()
    # Exactly-once identity of the write, (client_id, seq_no); None for anonymous writes.
    request: tuple[str, int] | None = None
    # The client's first incomplete seq_no: its results below it are forgotten.
    first_incomplete_seq_no: int = 0
    # Rows that failed before the store saw them (a packed row block decodes every row up
    # front): reported with the store's own row errors, in row order.
    row_failures: Sequence[RowFailure] = ()


class EntryResult(NamedTuple):
    """What applying one entry did. ``skipped``: it was at or below the applied index
    already (a replay), so nothing was done and there are no row results.
    ``duplicate_of``: the entry repeats a request applied before at that index (a client's
    retry that reached a new leader), so its rows were not applied again and ``row_errors``
    are the original's.  ``stale_below``: the entry's request is below its client's first
    incomplete seq_no, this bound (a late copy of a request answered before), so nothing
    was applied.  A named tuple, like ``ApplyEntry`` (one per applied entry)."""

    index: int  # type: ignore[assignment]  # shadows tuple.index(), which nothing calls
    term: int
    skipped: bool
    row_errors: tuple[RowFailure, ...] = ()
    rows_applied: int = 0
    duplicate_of: int = 0
    # The term of the original entry when ``duplicate_of`` is set.
    duplicate_term: int = 0
    stale_below: int = 0
    # ``rows_applied`` by operation: inserts, upserts, updates, deletes.
    rows_by_op: tuple[int, int, int, int] = (0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """The durable outcome of an applied write request."""

    index: int
    term: int
    row_errors: tuple[RowFailure, ...]


@dataclass(frozen=True, slots=True)
class ScanResult:
    """``rows[i][j]`` is the value of ``columns[j]``; rows are in primary-key order.

    ``resume_key`` is set when ``limit`` cut the result short and more rows match: pass it
    back to continue strictly after the last row returned. ``applied_index`` is the Raft
    index of the state the rows were read from.
    """

    columns: tuple[str, ...]
    rows: list[tuple[Value, ...]]
    resume_key: bytes | None
    applied_index: int


class ScanCursor:
    """The rows of an open scan (``TabletStore.open_scan``), fetched as needed. Each row is
    a tuple as SQLite returns it: the key columns, then the projected columns that are not
    key columns; ``columns[j]`` (of type ``types[j]``) is at ``projected_at[j]``.
    ``applied_index`` is the state they are read from. Valid only inside the ``with``
    block, used by one thread at a time (a scan held between pages moves between them).
    ``deadline`` (``time.monotonic()``; None: none) may be moved for each page."""

    def __init__(
        self,
        store: TabletStore,
        columns: tuple[str, ...],
        types: tuple[DataType, ...],
        applied_index: int,
        cursor: sqlite3.Cursor,
        deadline: _Deadline | None = None,
    ) -> None:
        self.columns = columns
        self.types = types
        self.projected_at = projected_at(store.schema, columns)
        self.applied_index = applied_index
        self.num_keys = store.schema.num_key_columns
        self._schema = store.schema
        self._key_types = [c.type for c in store.schema.key_columns]
        self._cursor = cursor
        self._path = store.path
        self._deadline = deadline or _Deadline(None)
        # Rows fetched and handed back (``unread``): the next fetch returns them first.
        self._unread: list[tuple[SqlValue, ...]] = []

    @property
    def deadline(self) -> float | None:
        return self._deadline.at

    @deadline.setter
    def deadline(self, at: float | None) -> None:
        self._deadline.at = at

    def fetch(self, n: int) -> list[tuple[SqlValue, ...]]:
        """The next ``n`` rows at most; fewer only at the end."""
        if self._unread:
            rows, self._unread = self._unread[:n], self._unread[n:]
            if len(rows) == n:
                return rows
            return rows + self.fetch(n - len(rows))
        try:
            if n > _MAX_FETCHMANY:  # sqlite3 takes a C int; that many rows is all of them
                return self._cursor.fetchall()
            return self._cursor.fetchmany(n)
        except sqlite3.Error as e:
            raise _scan_error(self._path, e) from e

    def fetch_all(self) -> list[tuple[SqlValue, ...]]:
        rows, self._unread = self._unread, []
        try:
            return rows + self._cursor.fetchall()
        except sqlite3.Error as e:
            raise _scan_error(self._path, e) from e

    def unread(self, rows: Sequence[tuple[SqlValue, ...]]) -> None:
        """Hand back ``rows``, the last ones fetched: the next fetch returns them again (a
        page that could not take them leaves them to the next, of a scan held open)."""
        self._unread[:0] = rows

    def resume_key_after(self, row: Sequence[SqlValue]) -> bytes:
        """The resume key that continues a scan strictly after ``row`` (one fetched here)."""
        key = [from_sql(t, v) for t, v in zip(self._key_types, row[: self.num_keys], strict=True)]
        return encode_key(self._schema, key)


class _Deadline:
    """When a scan's SQLite work is interrupted (``time.monotonic()``; None: never), read
    by the connection's progress handler, so that each page of a held scan has its own."""

    __slots__ = ("at",)

    def __init__(self, at: float | None) -> None:
        self.at = at

    def passed(self) -> bool:
        at = self.at
        return at is not None and time.monotonic() > at


# Outcomes of applied write requests, for exactly-once retries (see _apply_entries).
_REQUESTS = REQUESTS_TABLE
_MAX_FETCHMANY = 2**31 - 1


def _pieces(run: RowRun) -> list[RowRun]:
    """``run`` in consecutive pieces of at most ``_MAX_BULK_ROWS`` rows: a statement each."""
    n = _MAX_BULK_ROWS
    return [
        RowRun(
            run.type,
            run.num_keys,
            run.columns,
            run.params[lo : lo + n],
            run.row_indexes[lo : lo + n],
        )
        for lo in range(0, len(run), n)
    ]


def _encode_errors(errors: Sequence[RowFailure]) -> bytes:
    return tablet_pb2.WriteResponse(row_errors=[e.to_pb() for e in errors]).SerializeToString()


def _decode_errors(data: bytes) -> tuple[RowFailure, ...]:
    pb = tablet_pb2.WriteResponse.FromString(data)
    return tuple(RowFailure(e.row_index, e.code, e.message) for e in pb.row_errors)


_NO_ERRORS = _encode_errors(())


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _check_writable(path: Path) -> None:
    """``StoreError`` if the store's file or its -wal exists and cannot be opened for
    writing (made immutable or read-only): SQLite then opens the database read-only without
    a word, every apply fails with SQLITE_READONLY on that connection, and no retry mends
    it even once the file is writable again."""
    for p in (path, Path(f"{path}-wal")):
        try:
            os.close(os.open(p, os.O_RDWR | os.O_CLOEXEC))
        except FileNotFoundError:
            continue
        except OSError as e:
            raise StoreError(
                f"cannot open tablet store {path}: {p} cannot be written ({e.strerror}: made "
                "read-only or immutable?)"
            ) from e


def _file_id(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


def _fsync_path(path: Path, *, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TabletStore:
    """The row store of one tablet replica. Create or open with ``TabletStore.open``."""

    def __init__(
        self,
        path: Path,
        schema: Schema,
        writer: sqlite3.Connection,
        applied_index: int,
        applied_term: int,
        tablet_id: str | None = None,
    ) -> None:
        """Internal: use ``open``."""
        self.path = path
        self.schema = schema
        # The tablet the file says it belongs to (None: a store made before stores
        # recorded it, opened without an id to record).
        self.tablet_id = tablet_id
        self._sql = SqlBuilder(schema)
        self._writer = writer
        self._write_lock = threading.Lock()
        # Written only after a commit, by the writer; a plain attribute read elsewhere.
        self._applied = (applied_index, applied_term)
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self._reader_uri = path.absolute().as_uri() + "?mode=ro"
        # The exactly-once window (``request_records``); a constant outside tests, since
        # every replica must keep the same records.
        self.request_window = REQUEST_RECORD_WINDOW
        # Request records expired by the window since the store was opened.
        self.requests_expired = 0
        # The file this store opened (device, inode): one deleted or replaced under it is
        # found by ``flush`` (``_check_files``).
        self._file_id = _file_id(path)
        self._flushed_index = -1  # the applied index the last ``flush`` made durable

    # --- open / close ---------------------------------------------------------------------

    @classmethod
    def open(
        cls, path: StorePath, schema: Schema | None = None, tablet_id: str | None = None
    ) -> TabletStore:
        """Open the store at ``path``, creating it (with ``schema``) if the file is absent or
        empty. An existing store must have been created with an equal schema
        (``SchemaMismatchError`` otherwise); ``schema=None`` opens it with its own.

        ``tablet_id``: the tablet whose replica opens the store. A new store records it; an
        existing one must hold the same id (``StoreError`` otherwise: the file came from
        another tablet's directory, and its rows are not this tablet's), and one made before
        stores recorded an id has it recorded now. ``None`` checks and records nothing (tools
        that read a store file on its own).
        """
        p = Path(path)
        existed = p.exists()
        _check_writable(p)
        try:
            conn = sqlite3.connect(
                p, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S
            )
        except sqlite3.Error as e:
            raise StoreError(f"cannot open tablet store {p}: {e}") from e
        try:
            stored_schema, applied_index, applied_term, stored_id = cls._init_db(
                conn, p, schema, tablet_id
            )
        except BaseException:
            conn.close()
            raise
        if not existed:
            _fsync_path(p.parent, directory=True)
        return cls(p, stored_schema, conn, applied_index, applied_term, stored_id)

    @staticmethod
    def _init_db(
        conn: sqlite3.Connection, path: Path, schema: Schema | None, tablet_id: str | None
    ) -> tuple[Schema, int, int, str | None]:
        meta = quote_ident(META_TABLE)
        try:
            (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
            if str(mode).lower() != "wal":
                raise StoreError(f"tablet store {path}: cannot use WAL journal mode (got {mode})")
            # See the module docstring: the Raft log, not this file, carries durability.
            conn.execute("PRAGMA synchronous=NORMAL")
            # A bulk run's savepoint keeps the original of every page it changes in a
            # statement journal, which SQLite spills to a file in the temp directory past
            # 64 KiB: a run of a few dozen rows on as many leaf pages (scattered keys) paid
            # an open, an unlink and a close of it, a fifth or more of the transaction's CPU
            # (docs/benchmarks.md, "Store transactions without a temp file").  In memory it
            # holds one statement's pages, and ``_MAX_BULK_ROWS`` bounds those.
            conn.execute("PRAGMA temp_store=MEMORY")
            # SQLite keeps its -wal file at the largest size it ever reached (one large
            # transaction, checkpoints held off by readers): after a checkpoint it shrinks
            # back to this.
            conn.execute(f"PRAGMA journal_size_limit={WAL_FILE_LIMIT_BYTES}")
            conn.execute("BEGIN IMMEDIATE")
            try:
                tables = {
                    row[0]
                    for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
                }
                if META_TABLE not in tables:
                    if tables:
                        raise StoreError(
                            f"{path} is not a tablet store: it has tables "
                            f"{sorted(tables)} but no {META_TABLE}"
                        )
                    if schema is None:
                        raise StoreError(f"no tablet store at {path}, and no schema to create one")
                    conn.execute(SqlBuilder(schema).create_table())
                    conn.execute(
                        f"CREATE TABLE {meta} (key TEXT PRIMARY KEY NOT NULL, value NOT NULL)"
                        " WITHOUT ROWID"
                    )
                    conn.executemany(
                        f"INSERT INTO {meta} (key, value) VALUES (?, ?)",
                        [
                            ("format_version", FORMAT_VERSION),
                            ("schema", schema.to_pb().SerializeToString()),
                            ("applied_index", 0),
                            ("applied_term", 0),
                            *([("tablet_id", tablet_id)] if tablet_id is not None else []),
                        ],
                    )
                    result = (schema, 0, 0, tablet_id)
                else:
                    result = TabletStore._read_meta(conn, path, schema)
                    result = TabletStore._check_tablet_id(conn, path, result, tablet_id)
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {_REQUESTS} (client_id TEXT NOT NULL, "
                    "seq_no INTEGER NOT NULL, op_index INTEGER NOT NULL, "
                    "op_term INTEGER NOT NULL, row_errors BLOB NOT NULL, "
                    "PRIMARY KEY (client_id, seq_no)) WITHOUT ROWID"
                )
                # Records expire by the index of their entry (``REQUEST_RECORD_WINDOW``).
                conn.execute(
                    'CREATE INDEX IF NOT EXISTS "raftlet_requests_by_index" '
                    f"ON {_REQUESTS} (op_index)"
                )
                # A store made before the bounds had none: its clients' bounds start
                # with their next writes (``request_records``).
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {BOUNDS_TABLE} (client_id TEXT PRIMARY KEY "
                    "NOT NULL, bound INTEGER NOT NULL, op_index INTEGER NOT NULL) WITHOUT ROWID"
                )
                conn.execute(
                    'CREATE INDEX IF NOT EXISTS "raftlet_request_bounds_by_index" '
                    f"ON {BOUNDS_TABLE} (op_index)"
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.rollback()
                raise
        except sqlite3.Error as e:
            raise StoreError(f"cannot open tablet store {path}: {e}") from e
        return result

    @staticmethod
    def _read_meta(
        conn: sqlite3.Connection, path: Path, schema: Schema | None
    ) -> tuple[Schema, int, int, str | None]:
        rows = dict(conn.execute(f"SELECT key, value FROM {quote_ident(META_TABLE)}").fetchall())
        missing = {"format_version", "schema", "applied_index", "applied_term"} - rows.keys()
        if missing:
            raise StoreError(f"tablet store {path}: metadata lacks {sorted(missing)}")
        version = rows["format_version"]
        if isinstance(version, int) and version > FORMAT_VERSION:
            raise StoreNewerFormat(f"tablet store {path}: {newer_release(version, FORMAT_VERSION)}")
        if version != FORMAT_VERSION:
            raise StoreError(
                f"tablet store {path}: format version {rows['format_version']!r}, "
                f"this build reads {FORMAT_VERSION}"
            )
        try:
            stored = Schema.from_pb(tablet_pb2.SchemaPB.FromString(rows["schema"]))
        except (SchemaError, TypeError, ValueError) as e:
            raise StoreError(f"tablet store {path}: stored schema is unreadable: {e}") from e
        if schema is not None and schema != stored:
            raise SchemaMismatchError(
                f"tablet store {path} was created with schema ({stored.describe()}) "
                f"but is opened with ({schema.describe()})"
            )
        held = rows.get("tablet_id")
        held_id = None if held is None else str(held)
        return stored, int(rows["applied_index"]), int(rows["applied_term"]), held_id

    @staticmethod
    def _check_tablet_id(
        conn: sqlite3.Connection,
        path: Path,
        meta: tuple[Schema, int, int, str | None],
        tablet_id: str | None,
    ) -> tuple[Schema, int, int, str | None]:
        """``meta`` (``_read_meta``'s) once its tablet id is checked against ``tablet_id``:
        a store file copied from another tablet's directory has the same schema and an
        applied entry that may well be in this log too, so nothing else tells them apart --
        opened, it served that tablet's rows as this one's."""
        held = meta[3]
        if tablet_id is None or held == tablet_id:
            return meta
        if held is not None:
            raise StoreError(
                f"tablet store {path} belongs to tablet {held!r}, not to {tablet_id!r} whose "
                "replica opens it: the file was copied or moved from another tablet's "
                "directory, and its rows are not this tablet's. Put this tablet's own store "
                "file back, or let a tablet copy from the leader replace the replica"
            )
        # A store made before stores recorded their tablet: taken as this tablet's, as it
        # always was, and marked so that a copy of it elsewhere is caught from now on.
        conn.execute(
            f"INSERT INTO {quote_ident(META_TABLE)} (key, value) VALUES ('tablet_id', ?)",
            (tablet_id,),
        )
        return meta[0], meta[1], meta[2], tablet_id

    def close(self) -> None:
        """Close every connection. Idempotent; readers in use close when their scan ends."""
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
            with self._readers_lock:
                idle, self._readers = self._readers, []
            for conn in idle:
                conn.close()
            self._writer.close()

    def __enter__(self) -> TabletStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"tablet store {self.path} is closed")

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        self._check_open()
        with self._readers_lock:
            conn = self._readers.pop() if self._readers else None
        if conn is None:
            try:
                conn = sqlite3.connect(
                    self._reader_uri,
                    uri=True,
                    isolation_level=None,
                    check_same_thread=False,
                    timeout=_BUSY_TIMEOUT_S,
                )
            except sqlite3.Error as e:
                raise StoreError(f"tablet store {self.path}: cannot open a reader: {e}") from e
        try:
            yield conn
        finally:
            with self._readers_lock:
                if not self._closed and not conn.in_transaction:
                    self._readers.append(conn)
                    conn = None
            if conn is not None:
                conn.close()

    # --- applied state ----------------------------------------------------------------------

    def applied_index(self) -> int:
        """Raft index of the last entry whose effects are committed in this store (0: none)."""
        return self._applied[0]

    def applied_term(self) -> int:
        return self._applied[1]

    # --- writes -------------------------------------------------------------------------

    def apply_batch(
        self,
        entries: Iterable[ApplyEntry | tuple[int, int, Sequence[AnyOp]]],
        before_commit: Callable[[list[EntryResult]], None] | None = None,
    ) -> list[EntryResult]:
        """Apply committed entries in ONE transaction that also records the last one's index
        and term as applied. Returns one ``EntryResult`` per entry, in order.

        Entries at or below the applied index are skipped (replay after a restart is
        idempotent). Indexes must increase strictly and terms must not decrease (ValueError,
        nothing applied). A failed row (KEY_EXISTS on INSERT; KEY_NOT_FOUND on UPDATE or
        DELETE; a row that does not decode) is reported and the rest of the batch is applied.
        Any other failure rolls the whole batch back and raises ``StoreError``: the replica
        must then stop applying, since this store no longer knows what it has.

        ``before_commit(results)`` runs once every statement has run and before COMMIT, so
        that what waits on the results (a leader's writers) need not wait for the commit:
        the entries are committed in the Raft log already and their results are a
        function of them, so a commit that then fails changes no result, only when the
        store holds them. Readers see the batch, and ``applied_index`` moves, only after
        the commit. An exception it raises is raised after the commit (the batch is
        applied either way); it is not called for a batch of replayed entries only.
        """
        batch = [e if isinstance(e, ApplyEntry) else ApplyEntry(*e) for e in entries]
        with self._write_lock:
            self._check_open()
            applied_index, applied_term = self._applied
            last_index, last_term = applied_index, applied_term
            prev = None
            for e in batch:
                if isinstance(e.index, bool) or not isinstance(e.index, int) or e.index < 1:
                    raise ValueError(f"entry index must be a positive int, got {e.index!r}")
                if isinstance(e.term, bool) or not isinstance(e.term, int) or e.term < 0:
                    raise ValueError(f"entry term must be a non-negative int, got {e.term!r}")
                if prev is not None and e.index <= prev:
                    raise ValueError(f"entry indexes must increase: {e.index} after {prev}")
                prev = e.index
                if e.index > applied_index:
                    if e.term < last_term:
                        raise ValueError(
                            f"entry {e.index} has term {e.term}, below term {last_term} "
                            f"of entry {last_index}"
                        )
                    last_index, last_term = e.index, e.term
            if last_index == applied_index:
                return [EntryResult(e.index, e.term, skipped=True) for e in batch]

            skipped = [
                EntryResult(e.index, e.term, skipped=True)
                for e in batch
                if e.index <= applied_index
            ]
            cur = self._writer.cursor()
            callback_error: BaseException | None = None
            try:
                cur.execute("BEGIN IMMEDIATE")
                results = skipped + self._apply_entries(cur, batch[len(skipped) :])
                cur.executemany(
                    f"UPDATE {quote_ident(META_TABLE)} SET value = ? WHERE key = ?",
                    [(last_index, "applied_index"), (last_term, "applied_term")],
                )
                if before_commit is not None:
                    try:
                        before_commit(results)
                    except BaseException as exc:  # the batch is applied all the same
                        callback_error = exc
                cur.execute("COMMIT")
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    if self._writer.in_transaction:
                        self._writer.rollback()
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(
                        f"tablet store {self.path}: applying entries up to {last_index} "
                        f"failed, nothing applied: {exc}"
                    ) from exc
                raise
            finally:
                cur.close()
            self._applied = (last_index, last_term)
        if callback_error is not None:
            raise callback_error
        return results

    def _apply_entries(self, cur: sqlite3.Cursor, entries: list[ApplyEntry]) -> list[EntryResult]:
        """Apply entries above the applied index, with exactly the outcome of applying them
        one at a time in order (a request's duplicates, rows, records), in few statements:
        the request table is read and written in bulk (``request_records``), and runs of
        rows alike are applied across entries."""
        ids = [e.request for e in entries if e.request is not None]
        plan = plan_requests(
            [(e.request, e.first_incomplete_seq_no) for e in entries],
            read_records(cur, ids),
            [e.index for e in entries],
            self.request_window,
            read_bounds(cur, [client for client, _ in ids]) if ids else None,
        )
        repeats = plan.repeats_stored.keys() | plan.repeats_batch.keys() | plan.stale.keys()
        fresh = [p for p in range(len(entries)) if p not in repeats] if repeats else None
        rows = self._apply_rows(cur, entries if fresh is None else [entries[p] for p in fresh])
        if fresh is None:
            results = rows
        else:
            results = [EntryResult(e.index, e.term, False) for e in entries]  # placeholders
            for pos, result in zip(fresh, rows, strict=True):
                results[pos] = result
        blobs: dict[int, bytes] = {}

        def blob_of(pos: int) -> bytes:
            """The row errors of fresh entry ``pos`` as its request record stores them."""
            if pos not in blobs:
                errors = results[pos].row_errors
                blobs[pos] = _encode_errors(errors) if errors else _NO_ERRORS
            return blobs[pos]

        for pos, (op_index, op_term, blob) in plan.repeats_stored.items():
            e = entries[pos]
            results[pos] = EntryResult(
                e.index, e.term, False, _decode_errors(blob), 0, op_index, op_term
            )
        for pos, original in plan.repeats_batch.items():
            e, o = entries[pos], entries[original]
            # As if read back from the record ``original`` wrote (the one-at-a-time order).
            results[pos] = EntryResult(
                e.index, e.term, False, _decode_errors(blob_of(original)), 0, o.index, o.term
            )
        for pos, bound in plan.stale.items():
            e = entries[pos]
            results[pos] = EntryResult(e.index, e.term, False, stale_below=bound)
        records = []
        for pos in plan.inserts:
            e = entries[pos]
            assert e.request is not None
            records.append((e.request[0], e.request[1], e.index, e.term, blob_of(pos)))
        # In the same transaction as the rows: after any crash, either both the rows and
        # the records are there or neither is, so a retry is never applied twice.
        self.requests_expired += write_records(
            cur, plan.deletes, records, plan.expire_below, plan.bounds
        )
        return results

    def lookup_request(self, client_id: str, seq_no: int) -> RequestRecord | None:
        """The outcome of an applied request, if this store still remembers it."""
        with self._reader() as conn:
            row = conn.execute(
                f"SELECT op_index, op_term, row_errors FROM {_REQUESTS} "
                "WHERE client_id = ? AND seq_no = ?",
                (client_id, seq_no),
            ).fetchone()
        if row is None:
            return None
        return RequestRecord(int(row[0]), int(row[1]), _decode_errors(row[2]))

    def request_bound(self, client_id: str) -> int:
        """The client's first incomplete seq_no as the store last applied it (0: none kept):
        a request below it is a late copy, which apply would not run."""
        with self._reader() as conn:
            row = conn.execute(
                f"SELECT bound FROM {BOUNDS_TABLE} WHERE client_id = ?", (client_id,)
            ).fetchone()
        return 0 if row is None else int(row[0])

    def request_records(self) -> int:
        """How many request records the store holds (status pages, tests)."""
        try:
            with self._reader() as conn:
                (n,) = conn.execute(f"SELECT count(*) FROM {_REQUESTS}").fetchone()
        except sqlite3.Error as e:
            raise StoreError(f"tablet store {self.path}: counting requests failed: {e}") from e
        return int(n)

    def _apply_rows(self, cur: sqlite3.Cursor, entries: list[ApplyEntry]) -> list[EntryResult]:
        """Apply the rows of ``entries`` in order.  Consecutive runs alike (op type, key
        width, columns), within an entry or across entries, go in one ``executemany``; if a
        row of it fails, its runs are applied one by one instead, from the same state, so
        each entry's outcome is what applying it alone gives.  No statement carries more
        than ``_MAX_BULK_ROWS`` rows: a longer run goes in pieces (``_pieces``)."""
        errors: list[list[RowFailure]] = []
        applied = [[0, 0, 0, 0] for _ in entries]  # rows by _OP_SLOT
        # Consecutive (entry position, run)s of one shape; built inline, as replay goes
        # through here once per entry.
        groups: list[list[tuple[int, RowRun]]] = []
        group: list[tuple[int, RowRun]] = []
        group_rows = 0
        shape: tuple[OpType, int, tuple[str, ...]] | None = None
        for pos, entry in enumerate(entries):
            errs, runs = self._runs_of(entry)
            errors.append(errs)
            for whole in runs:
                for run in (whole,) if len(whole) <= _MAX_BULK_ROWS else _pieces(whole):
                    if (run.type, run.num_keys, run.columns) == shape and (
                        group_rows + len(run) <= _MAX_BULK_ROWS
                    ):
                        group.append((pos, run))
                        group_rows += len(run)
                    else:
                        shape = (run.type, run.num_keys, run.columns)
                        group = [(pos, run)]
                        group_rows = len(run)
                        groups.append(group)
        for group in groups:
            if len(group) > 1:
                first = group[0][1]
                params = [p for _, run in group for p in run.params]
                merged = RowRun(
                    first.type, first.num_keys, first.columns, params, range(len(params))
                )
                if len(params) >= _MIN_BULK_ROWS and self._apply_run(cur, merged):
                    slot = _OP_SLOT[first.type]
                    for pos, run in group:
                        applied[pos][slot] += len(run.params)
                    continue
            for pos, run in group:
                applied[pos][_OP_SLOT[run.type]] += self._apply_run_or_rows(cur, run, errors[pos])
        results: list[EntryResult] = []
        for entry, errs, by_op in zip(entries, errors, applied, strict=True):
            if len(errs) > 1:
                errs.sort(key=lambda e: e.row_index)
            i, u, p, d = by_op
            results.append(
                EntryResult(
                    entry.index,
                    entry.term,
                    False,
                    tuple(errs),
                    i + u + p + d,
                    rows_by_op=(i, u, p, d),
                )
            )
        return results

    def _runs_of(self, entry: ApplyEntry) -> tuple[list[RowFailure], list[RowRun]]:
        """An entry's row failures so far and its rows as runs, in order."""
        errors: list[RowFailure] = list(entry.row_failures)
        ops = entry.ops
        if len(ops) == 1 and type(ops[0]) is RowRun:
            return errors, [ops[0]]  # a packed write of rows alike: the common case
        runs: list[RowRun] = []
        loose: list[RowOp] = []  # consecutive RowOps, made into runs when a run comes
        for position, op in enumerate(entry.ops):
            if isinstance(op, RowRun):
                if loose:
                    runs += runs_of_row_ops(loose)
                    loose = []
                runs.append(op)
            elif isinstance(op, RowOp):
                loose.append(op)
            elif isinstance(op, tablet_pb2.RowOperationPB):
                try:
                    # Committed: no key limit (``rows`` rule 3 is for admitting writes).
                    loose.append(decode_row_op(self.schema, op, position, key_limit=False))
                except RowOpError as e:
                    errors.append(RowFailure(position, e.code, e.message))
            else:
                raise TypeError(f"entry {entry.index}: op {position} is a {type(op).__name__}")
        if loose:
            runs += runs_of_row_ops(loose)
        return errors, runs

    def _apply_run_or_rows(self, cur: sqlite3.Cursor, run: RowRun, errors: list[RowFailure]) -> int:
        """Apply one run, in one statement if it is long enough and no row fails, else row
        by row (adding each failure to ``errors``); how many rows were applied."""
        if len(run) >= _MIN_BULK_ROWS and self._apply_run(cur, run):
            return len(run)
        applied = 0
        for row in run.row_ops():
            error = self._apply_op(cur, row)
            if error is None:
                applied += 1
            else:
                errors.append(error)
        return applied

    def _apply_run(self, cur: sqlite3.Cursor, run: RowRun) -> bool:
        """Apply a run with one ``executemany``, or nothing and False if any row of it fails
        (a key already present, or absent for UPDATE and DELETE): the caller then applies
        it row by row, which reports each failure -- the same outcome either way, so
        replicas agree whichever path they take."""
        nkeys = self.schema.num_key_columns
        if run.num_keys != nkeys:
            return False  # _apply_op raises the error this is
        params: Sequence[Sequence[SqlValue]] = run.params
        if run.type is OpType.INSERT:
            sql = self._sql.insert(run.columns)
        elif run.type is OpType.UPSERT:
            sql = self._sql.upsert(run.columns)
        elif run.type is OpType.UPDATE:
            sql = self._sql.update(run.columns)
            params = [p[nkeys:] + p[:nkeys] for p in run.params]
        else:
            sql = self._sql.delete()
        cur.execute("SAVEPOINT raftlet_run")
        try:
            cur.executemany(sql, params)
            # UPDATE and DELETE change one row each, unless a key is absent.
            ok = run.type in _INSERTS or cur.rowcount == len(params)
        except sqlite3.IntegrityError:
            ok = False
        if not ok:
            cur.execute("ROLLBACK TO raftlet_run")
        cur.execute("RELEASE raftlet_run")
        return ok

    def _apply_op(self, cur: sqlite3.Cursor, op: RowOp) -> RowFailure | None:
        if len(op.key) != self.schema.num_key_columns:
            raise ValueError(
                f"row {op.row_index}: key has {len(op.key)} values, "
                f"schema has {self.schema.num_key_columns} key columns"
            )
        key = [to_sql(v) for v in op.key]
        columns = tuple(op.values)
        values = [to_sql(v) for v in op.values.values()]
        try:
            if op.type is OpType.INSERT:
                cur.execute(self._sql.insert(columns), key + values)
            elif op.type is OpType.UPSERT:
                cur.execute(self._sql.upsert(columns), key + values)
            elif op.type is OpType.UPDATE:
                cur.execute(self._sql.update(columns), values + key)
                if cur.rowcount == 0:
                    return RowFailure(
                        op.row_index, ErrorCode.KEY_NOT_FOUND, f"key {_short(op.key)} not found"
                    )
            elif op.type is OpType.DELETE:
                cur.execute(self._sql.delete(), key)
                if cur.rowcount == 0:
                    return RowFailure(
                        op.row_index, ErrorCode.KEY_NOT_FOUND, f"key {_short(op.key)} not found"
                    )
            else:
                raise ValueError(f"row {op.row_index}: unknown op type {op.type!r}")
        except sqlite3.IntegrityError as e:
            # A failed statement undoes only itself, so the rest of the batch carries on;
            # the failure is a function of the row and the state, so every replica agrees.
            if getattr(e, "sqlite_errorname", "") == "SQLITE_CONSTRAINT_PRIMARYKEY":
                return RowFailure(
                    op.row_index, ErrorCode.KEY_EXISTS, f"key {_short(op.key)} already present"
                )
            return RowFailure(op.row_index, ErrorCode.INVALID_ROW, f"constraint failed: {e}")
        return None

    # --- reads --------------------------------------------------------------------------

    def scan(
        self,
        projection: Sequence[str] | None = None,
        predicates: Sequence[Predicate | tablet_pb2.PredicatePB] = (),
        limit: int | None = None,
        resume_key: bytes | None = None,
    ) -> ScanResult:
        """Rows matching all ``predicates`` (ANDed), in primary-key order.

        ``projection``: column names in the order wanted; None or empty means every column
        in schema order. ``limit``: at most this many rows (None: all). ``resume_key``: from
        an earlier ``ScanResult``; continue strictly after that key (None or b"": from the
        start). Raises ``InvalidScan`` for an unknown column, a mistyped predicate value, a
        bad limit or a resume key that is not a key of this schema.
        """
        bad_limit = isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        if limit is not None and bad_limit:
            raise InvalidScan(f"limit must be a positive int or None, got {limit!r}")
        # One more than asked, to know whether to hand out a resume key.
        with self.open_scan(projection, predicates, resume_key, limit and limit + 1) as cursor:
            raw = cursor.fetch(limit + 1) if limit is not None else cursor.fetch_all()
        more = limit is not None and len(raw) > limit
        if more:
            del raw[limit:]
        cells = list(zip(cursor.types, cursor.projected_at, strict=True))
        rows = [tuple(from_sql(t, r[at]) for t, at in cells) for r in raw]
        next_key = cursor.resume_key_after(raw[-1]) if more and raw else None
        return ScanResult(cursor.columns, rows, next_key, cursor.applied_index)

    @contextlib.contextmanager
    def open_scan(
        self,
        projection: Sequence[str] | None = None,
        predicates: Sequence[Predicate | tablet_pb2.PredicatePB] = (),
        resume_key: bytes | None = None,
        limit: int | None = None,
        deadline: float | None = None,
    ) -> Iterator[ScanCursor]:
        """A ``ScanCursor`` over the rows ``scan`` would return (same arguments; ``limit``
        only tells SQLite how many rows at most will be fetched), in one read transaction
        that ends with the ``with`` block. For a caller that fills a page as it fetches,
        by its own measure of size, without reading rows it will not send. Past
        ``deadline`` (``time.monotonic()``; the cursor's ``deadline`` moves it) SQLite is
        interrupted and the cursor raises ``ScanDeadlineExceeded``: a slow query (IN lists
        over rows with large cells took seconds) must not hold a service thread after its
        caller gave up."""
        columns = self._resolve_projection(projection)
        preds = [self._resolve_predicate(p) for p in predicates]
        resume: tuple[Value, ...] | None = None
        if resume_key is not None:  # empty bytes too: an empty string or binary key
            try:
                resume = decode_key(self.schema, resume_key)
            except KeyDecodeError as e:
                raise InvalidScan(f"bad resume key: {e}") from None
        sql, params = self._sql.select(
            columns, preds, resume=resume is not None, limit=limit is not None
        )
        if resume is not None:
            params.extend(to_sql(v) for v in resume)
        if limit is not None:
            params.append(limit)
        types = tuple(self.schema.column(c).type for c in columns)
        until = _Deadline(deadline)
        try:
            with self._reader() as conn:
                conn.set_progress_handler(until.passed, _PROGRESS_EVERY_OPS)
                conn.execute("BEGIN")
                try:
                    applied_index = self._read_applied_index(conn)
                    yield ScanCursor(
                        self,
                        tuple(columns),
                        types,
                        applied_index,
                        conn.execute(sql, params),
                        until,
                    )
                finally:
                    conn.set_progress_handler(None, 0)
                    conn.rollback()
        except sqlite3.Error as e:
            raise _scan_error(self.path, e) from e

    def _resolve_projection(self, projection: Sequence[str] | None) -> list[str]:
        if not projection:
            return list(self.schema.column_names)
        if isinstance(projection, str):
            raise InvalidScan("projection is a sequence of column names, not one string")
        seen: set[str] = set()
        for name in projection:
            if not isinstance(name, str) or not self.schema.has_column(name):
                raise InvalidScan(f"projection names unknown column {name!r}")
            if name in seen:
                raise InvalidScan(f"projection names column {name!r} twice")
            seen.add(name)
        return list(projection)

    def _resolve_predicate(self, p: Predicate | tablet_pb2.PredicatePB) -> Predicate:
        try:
            if isinstance(p, tablet_pb2.PredicatePB):
                return Predicate.from_pb(self.schema, p)
            if isinstance(p, Predicate):
                return p.validate(self.schema)
        except PredicateError as e:
            raise InvalidScan(str(e)) from None
        raise InvalidScan(f"a predicate is a Predicate or PredicatePB, got {type(p).__name__}")

    @staticmethod
    def _read_applied_index(conn: sqlite3.Connection) -> int:
        row = conn.execute(
            f"SELECT value FROM {quote_ident(META_TABLE)} WHERE key = 'applied_index'"
        ).fetchone()
        return int(row[0])

    def count(self) -> int:
        """Number of rows (a full scan of the key b-tree: for tests and tools)."""
        try:
            with self._reader() as conn:
                (n,) = conn.execute(self._sql.count()).fetchone()
        except sqlite3.Error as e:
            raise StoreError(f"tablet store {self.path}: count failed: {e}") from e
        return int(n)

    def quick_check(self, max_problems: int = 5) -> list[str]:
        """SQLite's structural check of the file (``PRAGMA quick_check``: b-tree pages,
        cell order, freelist, record formats -- not index contents, and no checksum of the
        values, which SQLite does not keep): the problems it reports, [] when it says ok.
        About a quarter of a second per 100 MiB from the page cache."""
        try:
            with self._reader() as conn:
                rows = conn.execute(f"PRAGMA quick_check({int(max_problems)})").fetchall()
        except sqlite3.Error as e:
            return [str(e)]
        problems = [str(r[0]) for r in rows]
        return [] if problems == ["ok"] else problems

    # --- snapshots and durability ------------------------------------------------------------

    def snapshot(self, dest_path: StorePath) -> tuple[int, int]:
        """Write a consistent copy of the store to ``dest_path`` (replaced if present) and
        return the (applied index, applied term) it contains.

        The copy is made with the SQLite backup API in a single step, i.e. inside one read
        transaction, so it is exactly the state after some applied batch, taken without
        blocking the writer. It is one self-contained file (rollback journal, no -wal), is
        fsynced, and appears under ``dest_path`` atomically (written aside, then renamed), so
        a crash never leaves a partial snapshot under that name.
        """
        dest = Path(dest_path)
        tmp = dest.with_name(dest.name + ".tmp")
        leftovers = (tmp, Path(f"{tmp}-journal"))
        for leftover in leftovers:
            leftover.unlink(missing_ok=True)
        try:
            with self._reader() as src:
                dst = sqlite3.connect(tmp, isolation_level=None)
                try:
                    src.backup(dst)
                    dst.execute("PRAGMA journal_mode=DELETE")
                    meta = dict(dst.execute(f"SELECT key, value FROM {quote_ident(META_TABLE)}"))
                finally:
                    dst.close()
            _fsync_path(tmp)
            os.replace(tmp, dest)
            _fsync_path(dest.parent, directory=True)
        except (sqlite3.Error, OSError) as e:
            # Its rollback journal too: one per failed attempt piled up on a full disk.
            for leftover in leftovers:
                leftover.unlink(missing_ok=True)
            raise StoreError(f"tablet store {self.path}: snapshot to {dest} failed: {e}") from e
        return int(meta["applied_index"]), int(meta["applied_term"])

    def flush(self) -> int:
        """Make every applied batch durable (fsync of the WAL and the database file), and
        return the applied index that is now safe from power loss. Call before
        garbage-collecting the Raft log up to that index.
        """
        with self._write_lock:
            self._check_open()
            self._check_files()
            index = self._applied[0]
            if index == self._flushed_index:
                return index  # nothing applied since: durable already
            # SQLite ignores a failed automatic checkpoint: with its file made read-only
            # or its disk full, the -wal grew without bound and nothing said so.
            try:
                self._writer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            except sqlite3.Error as e:
                raise StoreError(f"tablet store {self.path}: checkpoint failed: {e}") from e
            for p in (Path(f"{self.path}-wal"), self.path):
                _fsync_path(p)
            _fsync_path(self.path.parent, directory=True)
            self._flushed_index = index
            return index

    def _check_files(self) -> None:
        """``StoreFilesGone`` if the store's file or its -wal is no longer where it was
        opened (a tablet directory deleted by hand, say): rows written since live only in
        files no restart finds, and the log must not be collected on their strength."""
        wal = Path(f"{self.path}-wal")
        try:
            same = _file_id(self.path) == self._file_id
            wal.stat()  # exists as long as a connection is open in WAL mode
        except FileNotFoundError as e:
            raise StoreFilesGone(
                f"tablet store {self.path}: {e.filename} was deleted while the store had it open"
            ) from e
        except OSError as e:
            raise StoreError(f"tablet store {self.path}: cannot check its files: {e}") from e
        if not same:
            raise StoreFilesGone(
                f"tablet store {self.path}: the file was replaced while the store had it open"
            )

    @staticmethod
    def install_snapshot(snapshot_path: StorePath, path: StorePath) -> None:
        """Replace the (closed) store at ``path`` by the snapshot file, which is moved.

        The old store is first checkpointed so that its WAL can be deleted safely: a WAL
        left next to the new file would be replayed into it. Open the result with ``open``.
        """
        src, p = Path(snapshot_path), Path(path)
        if not src.is_file():
            raise StoreError(f"no snapshot file at {src}")
        if p.exists():
            try:
                conn = sqlite3.connect(p, isolation_level=None)
                try:
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                finally:
                    conn.close()
            except sqlite3.Error as e:
                raise StoreError(f"cannot checkpoint old store {p}: {e}") from e
        for suffix in ("-wal", "-shm", "-journal"):
            Path(f"{p}{suffix}").unlink(missing_ok=True)
        os.replace(src, p)
        _fsync_path(p.parent, directory=True)

    def __repr__(self) -> str:
        index, term = self._applied
        return f"TabletStore({str(self.path)!r}, applied={index}/{term})"


def _scan_error(path: Path, e: sqlite3.Error) -> StoreError:
    if getattr(e, "sqlite_errorcode", None) == _SQLITE_INTERRUPT:
        return ScanDeadlineExceeded(f"tablet store {path}: the scan ran past its deadline")
    return StoreError(f"tablet store {path}: scan failed: {e}")
