"""The rows of one replica, read from a stopped server's data directory: the way out of a
tablet that lost a majority of its replicas for good.

Such a tablet elects no leader, so no command that goes through one can read it, copy it or
change its membership, and raftlet has no unsafe way to make a surviving replica a group of
its own (docs/ARCHITECTURE.md, "A tablet that lost a majority"). What a surviving replica
holds can still be saved: this reads it offline -- never the server's own files, which it
leaves as they are, but a copy of the replica directory, opened as a server would open it
(``bootstrap.open_replica``: the store checked, the log verified, the committed entries the
store had not applied yet replayed into it). Its rows come out in the form of ``raftlet scan
--format json``, for ``raftlet row upsert --json`` to write into a new cluster.

What the copy knows to be committed is what the replica knew: its log may hold entries after
that, which a majority may have acknowledged, or never have seen. With the majority gone
nobody can say which; ``all_logged`` applies them too (what it holds, rather than what it
knew committed), and the result says how many there were either way.

The server must be stopped: its data directory's lock (``tserver.data_dir_lock``) is tried
first, and a running server's files, copied mid-write, would be no replica at all.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from raftlet.consensus.log import LogStorage
from raftlet.schema.schema import ColumnSchema, Schema, SchemaError
from raftlet.schema.types import DataType, Value
from raftlet.tserver.bootstrap import STORE_FILE, apply_entries, open_replica
from raftlet.tserver.data_dir_lock import LOCK_FILE
from raftlet.tserver.store.sql import SqlValue, from_sql
from raftlet.tserver.store.tablet_store import TabletStore
from raftlet.tserver.table_layout import TABLES_FILE

__all__ = ["ExportError", "ReplicaRows", "exported_replica", "schema_from_description"]

_FETCH_ROWS = 1000
_APPLY_CHUNK = 4096


class ExportError(Exception):
    """The replica cannot be read: the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class ReplicaRows:
    tablet_id: str
    table: str
    schema: Schema
    # The store's applied index once the copy was opened (and, with all_logged, extended).
    applied_index: int
    # The commit index the replica knew; the log's last index.
    commit_index: int
    last_index: int
    # Entries after the commit index the replica knew: applied with all_logged, else left.
    beyond_commit: int
    rows: Iterator[dict[str, Value]]
    # False with store_only: the rows are the store's alone, and the log was not read.
    log_read: bool = True


@contextlib.contextmanager
def exported_replica(
    replica_dir: str | os.PathLike[str],
    *,
    all_logged: bool = False,
    store_only: bool = False,
    work_dir: str | os.PathLike[str] | None = None,
) -> Iterator[ReplicaRows]:
    """The rows of the replica in ``replica_dir`` (``<data dir>/<tablet id>``), read from a
    copy made under ``work_dir`` (the system's temporary directory by default) and removed
    when the ``with`` block ends. ``store_only``: the store file alone, neither checked
    against nor replayed from the log -- for a replica the server refuses to open (a damaged
    log, lost metadata), whose store may still be read. ``ExportError`` when it cannot be
    read."""
    # Resolved: the lock checked must be the one of the directory really read (a symlink's
    # parent is another), and ``..`` names no tablet.
    source = Path(replica_dir).resolve()
    tablet_id = source.name
    data_dir = source.parent
    if not source.is_dir():
        what = "is a file, not a" if source.exists() else "no such"
        raise ExportError(f"{source}: {what} replica directory (a tablet's, named TABLE-pN)")
    table, schema = _table_of(data_dir, tablet_id)
    scratch_parent = _work_dir(work_dir, source)
    with (
        _server_stopped(data_dir),
        tempfile.TemporaryDirectory(prefix="raftlet-export-", dir=scratch_parent) as scratch,
    ):
        copy = Path(scratch) / tablet_id
        if store_only:
            store = _store_copy(source, copy, schema)
            try:
                applied = store.applied_index()
                with _scanned(store, (tablet_id, table), applied, applied, log_read=False) as rows:
                    yield rows
            finally:
                store.close()
            return
        _replica_copy(source, copy, scratch_parent)
        try:
            opened = open_replica(copy, schema, (), create=False, tablet_id=tablet_id)
        except Exception as e:
            # Every refusal of a server's (damage, a lost log, a foreign file) is the
            # operator's to read, naming the server's files, not the copy's.
            raise ExportError(
                f"{source} cannot be opened: {str(e).replace(str(copy), str(source))} "
                "(--store-only reads its store alone, as of the last batch it applied)"
            ) from None
        try:
            storage, store = opened.storage, opened.store
            commit = min(storage.initial_state().commit, storage.last_index())
            commit = max(commit, store.applied_index())
            if all_logged:
                _apply_rest(store, storage, source)
            last = storage.last_index()
            with _scanned(store, (tablet_id, table), commit, last, log_read=True) as rows:
                yield rows
        finally:
            opened.close()


@contextlib.contextmanager
def _scanned(
    store: TabletStore, tablet: tuple[str, str], commit: int, last: int, *, log_read: bool
) -> Iterator[ReplicaRows]:
    """``store``'s rows, read in one transaction; ``tablet``: its id and its table."""
    with store.open_scan() as cursor:
        yield ReplicaRows(
            tablet_id=tablet[0],
            table=tablet[1],
            schema=store.schema,
            applied_index=store.applied_index(),
            commit_index=commit,
            last_index=last,
            beyond_commit=last - commit,
            rows=_rows(cursor.columns, cursor.types, cursor.projected_at, cursor.fetch),
            log_read=log_read,
        )


def _replica_copy(source: Path, copy: Path, scratch_parent: Path) -> None:
    """Copy the replica directory ``source`` to ``copy`` (but its log's lock)."""
    try:
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("wal.lock"))
    except shutil.Error as e:
        # One (source, destination, reason) per file that failed: the first says why.
        failed = e.args[0] if e.args and isinstance(e.args[0], list) else []
        why = failed[0][2] if failed and len(failed[0]) == 3 else str(e)
        raise ExportError(
            f"cannot copy {source} to {scratch_parent} ({len(failed) or 'some'} files "
            f"failed; the first: {why}): --work-dir names a directory with room for it"
        ) from None
    except OSError as e:
        raise ExportError(
            f"cannot copy {source} to {scratch_parent}: {e.strerror or e} "
            "(--work-dir names a directory with room for it)"
        ) from None


def _store_copy(source: Path, copy: Path, schema: Schema) -> TabletStore:
    """A copy of ``source``'s store file alone (with its SQLite journal), opened."""
    copy.mkdir()
    present = [p for p in (source / STORE_FILE, *_journals(source)) if p.is_file()]
    if not present or present[0].name != STORE_FILE:
        raise ExportError(f"{source} holds no {STORE_FILE}")
    try:
        for path in present:
            shutil.copy2(path, copy / path.name)
    except OSError as e:
        raise ExportError(f"cannot copy {source}'s store to {copy.parent}: {e}") from None
    try:
        return TabletStore.open(copy / STORE_FILE, schema, source.name)
    except Exception as e:
        raise ExportError(
            f"{source / STORE_FILE} cannot be read: {str(e).replace(str(copy), str(source))}"
        ) from None


def _journals(source: Path) -> list[Path]:
    return [source / f"{STORE_FILE}-wal", source / f"{STORE_FILE}-shm"]


def _work_dir(work_dir: str | os.PathLike[str] | None, source: Path) -> Path:
    """Where the copy is made: ``work_dir`` (or the system's temporary directory), which
    must exist and lie outside the replica directory (a copy into itself recursed until
    its names grew too long, writing into the server's directory)."""
    where = Path(work_dir).resolve() if work_dir is not None else Path(tempfile.gettempdir())
    if not where.is_dir():
        raise ExportError(f"--work-dir {where}: no such directory")
    if where == source or source in where.parents:
        raise ExportError(f"--work-dir {where} lies inside the replica directory {source}")
    return where


def _apply_rest(store: TabletStore, storage: LogStorage, source: Path) -> None:
    """Apply every entry of the log the store has not applied, committed or not."""
    lo, last = store.applied_index() + 1, storage.last_index()
    try:
        while lo <= last:
            chunk = storage.entries(lo, min(last + 1, lo + _APPLY_CHUNK))
            apply_entries(store, chunk)
            lo = chunk[-1].index + 1
    except Exception as e:
        raise ExportError(f"{source}: entry {lo} or after cannot be applied: {e}") from None


def _rows(
    columns: tuple[str, ...],
    types: tuple[DataType, ...],
    at: tuple[int, ...],
    fetch: Callable[[int], list[tuple[SqlValue, ...]]],
) -> Iterator[dict[str, Value]]:
    cells = list(zip(columns, types, at, strict=True))
    while raw := fetch(_FETCH_ROWS):
        for r in raw:
            yield {c: from_sql(t, r[i]) for c, t, i in cells}


@contextlib.contextmanager
def _server_stopped(data_dir: Path) -> Iterator[None]:
    """Hold the data directory's lock, so no server starts on it meanwhile; ExportError if
    a server holds it now."""
    lock = data_dir / LOCK_FILE
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield  # never started by a version with the lock, or not a data directory
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise ExportError(
                f"{data_dir} is in use by a running server (pid {holder}): stop it first "
                "(a replica whose tablet has a leader is read with `raftlet scan`)"
            ) from None
        yield
    finally:
        os.close(fd)


def _table_of(data_dir: Path, tablet_id: str) -> tuple[str, Schema]:
    """The table of ``tablet_id`` and its schema, as the server recorded them when it made
    its replicas (``tables.json``: the schema its rows were written with)."""
    table, sep, partition = tablet_id.rpartition("-p")
    if not sep or not partition.isdigit():
        raise ExportError(f"{tablet_id}: not a tablet's directory (named TABLE-pN)")
    path = data_dir / TABLES_FILE
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExportError(
            f"{path} not found: {data_dir} is not the data directory of a server of this "
            "version (the replica directory's parent)"
        ) from None
    except (OSError, ValueError) as e:
        raise ExportError(f"{path} cannot be read: {e}") from None
    entry = recorded.get(table) if isinstance(recorded, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("schema"), str):
        raise ExportError(f"{path} has no record of table {table!r}")
    try:
        return table, schema_from_description(entry["schema"])
    except SchemaError as e:
        raise ExportError(f"{path}: the schema of {table!r} cannot be read: {e}") from None


def schema_from_description(text: str) -> Schema:
    """The schema ``Schema.describe`` wrote as ``text`` (``id INT64 KEY, v STRING NULL``);
    SchemaError if it is not one."""
    columns = []
    for part in text.split(", "):
        words = part.split(" ")
        if len(words) < 3 or " ".join(words[2:]) not in ("KEY", "NULL", "NOT NULL"):
            raise SchemaError(f"{part!r} is not a column")
        try:
            dtype = DataType[words[1]]
        except KeyError:
            raise SchemaError(f"{part!r}: no type {words[1]!r}") from None
        flags = " ".join(words[2:])
        columns.append(
            ColumnSchema(words[0], dtype, nullable=flags == "NULL", is_key=flags == "KEY")
        )
    return Schema(columns)
