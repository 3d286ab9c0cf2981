"""The request records of one apply batch, read and written in bulk.

Exactly-once needs, per applied write, a record ``(client_id, seq_no) → (index, term, row
errors)`` written in the same transaction as its rows, a look-up before each write (is it a
retry of one already applied?), and the deletion of a client's records below its
``first_incomplete_seq_no``. Done per entry that was three statements per write -- more than
the write itself for a single row. ``RequestBatch`` reads every record the batch could
repeat with one query up front, keeps the batch's own changes in memory, and writes them
with two ``executemany`` at the end.

The outcome must be exactly that of applying the entries one after another (replicas group
entries into apply batches differently, and must agree), so the in-memory view follows the
same order: a record written earlier in the batch is seen by a later entry; a deletion
(``prune``) hides older records from later entries, whether they were in the table or
written earlier in the batch; at the end deletions run before insertions, so a record
written after a deletion that covered its seq_no survives, as it would have.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

__all__ = ["REQUESTS_TABLE", "RequestBatch", "StoredRecord"]

REQUESTS_TABLE = '"raftlet_requests"'
# (op_index, op_term, encoded row errors) of an applied request.
StoredRecord = tuple[int, int, bytes]
# Pairs per look-up query: 2 parameters each, well under SQLite's variable limit.
_CHUNK = 400


class RequestBatch:
    def __init__(self, cur: sqlite3.Cursor, requests: Iterable[tuple[str, int]]) -> None:
        self._cur = cur
        self._stored: dict[tuple[str, int], StoredRecord] = {}
        wanted = list(dict.fromkeys(requests))
        for start in range(0, len(wanted), _CHUNK):
            chunk = wanted[start : start + _CHUNK]
            marks = ", ".join("(?, ?)" for _ in chunk)
            rows = cur.execute(
                f"SELECT client_id, seq_no, op_index, op_term, row_errors FROM {REQUESTS_TABLE} "
                f"WHERE (client_id, seq_no) IN (VALUES {marks})",
                [v for pair in chunk for v in pair],
            )
            for client_id, seq_no, index, term, errors in rows:
                self._stored[client_id, seq_no] = (int(index), int(term), bytes(errors))
        self._written: dict[str, dict[int, StoredRecord]] = {}  # this batch's, by client
        self._pruned: dict[str, int] = {}  # client -> records below this are deleted

    def original(self, client_id: str, seq_no: int) -> StoredRecord | None:
        """The record of an earlier application of this request, as applying the batch's
        entries one by one would find it at this point."""
        mine = self._written.get(client_id, {}).get(seq_no)
        if mine is not None:
            return mine
        if seq_no < self._pruned.get(client_id, 0):
            return None
        return self._stored.get((client_id, seq_no))

    def record(self, client_id: str, seq_no: int, stored: StoredRecord) -> None:
        self._written.setdefault(client_id, {})[seq_no] = stored

    def prune(self, client_id: str, below: int) -> None:
        """Forget the client's records with seq_no < ``below``."""
        # Records this batch wrote since an earlier, higher prune are below it too.
        self._pruned[client_id] = max(below, self._pruned.get(client_id, 0))
        mine = self._written.get(client_id)
        if mine:
            for seq_no in [s for s in mine if s < below]:
                del mine[seq_no]

    def write(self) -> None:
        """Apply the batch's deletions, then its records, to the table."""
        if self._pruned:
            self._cur.executemany(
                f"DELETE FROM {REQUESTS_TABLE} WHERE client_id = ? AND seq_no < ?",
                list(self._pruned.items()),
            )
        records = [
            (client_id, seq_no, *stored)
            for client_id, mine in self._written.items()
            for seq_no, stored in mine.items()
        ]
        if records:
            self._cur.executemany(
                f"INSERT INTO {REQUESTS_TABLE} (client_id, seq_no, op_index, op_term, row_errors) "
                "VALUES (?, ?, ?, ?, ?)",
                records,
            )
