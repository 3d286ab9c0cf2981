"""Shared fixtures-by-function for the tablet store tests."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from raftlet.proto import tablet_pb2
from raftlet.schema.rows import OpType, encode_row_op
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType

# A key of every kind of encoding (string escaped, int fixed-width) and a nullable column of
# every type.
WIDE = Schema(
    [
        ColumnSchema("tenant", DataType.STRING, is_key=True),
        ColumnSchema("id", DataType.INT64, is_key=True),
        *(ColumnSchema(f"c_{t.name.lower()}", t, nullable=True) for t in DataType),
    ]
)

SIMPLE = Schema(
    [
        ColumnSchema("id", DataType.INT32, is_key=True),
        ColumnSchema("name", DataType.STRING),
        ColumnSchema("score", DataType.DOUBLE, nullable=True),
    ]
)


def ops(
    schema: Schema, op_type: OpType, rows: Sequence[Mapping[str, object]]
) -> list[tablet_pb2.RowOperationPB]:
    return [encode_row_op(schema, op_type, r) for r in rows]


def insert(schema: Schema, *rows: Mapping[str, object]) -> list[tablet_pb2.RowOperationPB]:
    return ops(schema, OpType.INSERT, rows)


def store_contents(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table of a (closed) store file, in key order: two stores with
    equal contents hold the same rows, request records and applied index."""
    conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    try:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        return {t: conn.execute(f'SELECT * FROM "{t}" ORDER BY 1, 2').fetchall() for t in tables}
    finally:
        conn.close()


class CommitHook:
    """Runs ``before(self)`` whenever ``store``'s writer is about to COMMIT (after every
    statement of the transaction ran): to fail the commit (raise) or hold it (wait)."""

    def __init__(self, store: Any, before: Callable[[CommitHook], None]) -> None:
        self.commits = 0
        hook = self
        real: sqlite3.Connection = store._writer

        class Cursor:
            def __init__(self, cur: sqlite3.Cursor) -> None:
                self._cur = cur

            def execute(self, sql: str, *args: Any) -> Any:
                if sql == "COMMIT":
                    hook.commits += 1
                    before(hook)
                return self._cur.execute(sql, *args)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._cur, name)

        class Connection:
            def cursor(self) -> Cursor:
                return Cursor(real.cursor())

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        store._writer = Connection()


class RefusedCheckpoints:
    """Stands in for a store's SQLite connection (``TabletStore._writer``): while ``refusing``
    is set its checkpoints fail with a disk I/O error, as with the store file made immutable;
    everything else goes to the real connection."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real
        self.refusing = threading.Event()
        self.refusing.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if self.refusing.is_set() and "wal_checkpoint" in sql:
            raise sqlite3.OperationalError("disk I/O error")
        return self.real.execute(sql, *args)
