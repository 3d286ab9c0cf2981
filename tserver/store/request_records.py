"""The request records of one apply batch, read and written in bulk.

Exactly-once needs, per applied write, a record ``(client_id, seq_no) → (index, term, row
errors)`` written in the same transaction as its rows, a look-up before each write (is it a
retry of one already applied?), and the deletion of a client's records below its
``first_incomplete_seq_no``. Done per entry that was three statements per write -- more than
the write itself for a single row. Instead an apply batch reads every record it could repeat
with one query up front (``read_records``), works out in memory which of its entries repeat
a request and which records it leaves (``plan_requests``), and writes those with one
``executemany`` per table and kind at the end (``write_records``).

The outcome must be exactly that of applying the entries one after another (replicas group
entries into apply batches differently, and must agree), so the plan follows the same order:
a record written earlier in the batch is seen by a later entry; a deletion hides older
records from later entries, whether they were in the table or written earlier in the batch;
a repeat deletes nothing. At the end deletions run before insertions, so a record written
after a deletion that covered its seq_no survives, as it would have. The plan is made
before any row is applied -- which entries repeat a request depends only on the ids, never on
row outcomes -- so the store can apply the rows of many entries together; the records'
row errors are filled in afterwards.

The records are bounded by a window of log entries (``REQUEST_RECORD_WINDOW``): the entry at
index ``i`` sees only records written at index ``i - window`` or later, and an apply batch
deletes the records older than its last entry's window. A client's records are forgotten
below its first incomplete seq_no as before; the window also forgets the records of clients
that never advance it, or never come back (one write per client id), oldest first. So a
retry is answered exactly once if its request was applied within the last ``window``
entries of the tablet's log; an older one is applied again. The rule depends only on entry
indexes, never on time or on a flag, so every replica keeps exactly the same records, as it
must: whether an entry repeats a request is part of the replicated state.

Forgetting a client's records below its first incomplete seq_no must not let a late copy of
one of those requests run again (a duplicate the network delivered late, a client id
reused): its record is gone, so the records alone would take it for a new request. So the
store also keeps each client's bound -- the highest first incomplete seq_no its applied
entries carried, ``BOUNDS_TABLE`` -- and an entry below its client's bound is *stale*: its
rows are not applied and it writes nothing (its client said it retries nothing there, and
has its answer). A bound lives by the same window as the records, counted from the last
entry that carried it, so it too is the same on every replica.
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "BOUNDS_TABLE",
    "REQUESTS_TABLE",
    "REQUEST_RECORD_WINDOW",
    "Request",
    "RequestPlan",
    "StoredBound",
    "StoredRecord",
    "plan_requests",
    "read_bounds",
    "read_records",
    "write_records",
]

REQUESTS_TABLE = '"raftlet_requests"'
BOUNDS_TABLE = '"raftlet_request_bounds"'
# (client_id, seq_no)
Request = tuple[str, int]
# (op_index, op_term, encoded row errors) of an applied request.
StoredRecord = tuple[int, int, bytes]
# (bound, op_index) of a client: its highest first incomplete seq_no, and the index of the
# last entry that carried it (what the window counts from).
StoredBound = tuple[int, int]
# Log entries a request record outlives its entry by: the exactly-once window. Records are
# about 60 bytes in SQLite, so at most some 60 MiB of disk per tablet, reached only by
# clients that never advance their first incomplete seq_no.
REQUEST_RECORD_WINDOW = 1 << 20
# Pairs per look-up query: 2 parameters each, well under SQLite's variable limit.
_CHUNK = 400


def read_records(cur: sqlite3.Cursor, requests: Iterable[Request]) -> dict[Request, StoredRecord]:
    """The table's records for ``requests``, in one query per 400 of them."""
    found: dict[Request, StoredRecord] = {}
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
            found[client_id, seq_no] = (int(index), int(term), bytes(errors))
    return found


def read_bounds(cur: sqlite3.Cursor, clients: Iterable[str]) -> dict[str, StoredBound]:
    """The table's bounds for ``clients``, in one query per 400 of them."""
    found: dict[str, StoredBound] = {}
    wanted = list(dict.fromkeys(clients))
    for start in range(0, len(wanted), _CHUNK):
        chunk = wanted[start : start + _CHUNK]
        rows = cur.execute(
            f"SELECT client_id, bound, op_index FROM {BOUNDS_TABLE} "
            f"WHERE client_id IN ({', '.join('?' * len(chunk))})",
            chunk,
        )
        for client_id, bound, index in rows:
            found[client_id] = (int(bound), int(index))
    return found


@dataclass(slots=True)
class RequestPlan:
    # position -> the stored record it repeats (the table held it before the batch)
    repeats_stored: dict[int, StoredRecord] = field(default_factory=dict)
    # position -> position of the earlier entry of this batch it repeats
    repeats_batch: dict[int, int] = field(default_factory=dict)
    # (client_id, seq_no bound): delete the client's records below the bound, first
    deletes: list[Request] = field(default_factory=list)
    # positions whose record is in the table at the end of the batch, in order
    inserts: list[int] = field(default_factory=list)
    # position -> the client's bound its seq_no is below: stale, neither applied nor recorded
    stale: dict[int, int] = field(default_factory=dict)
    # (client_id, bound, op_index): the bounds the batch moved, as the table ends holding them
    bounds: list[tuple[str, int, int]] = field(default_factory=list)
    # records written at a lower index are out of the window at the end of the batch
    expire_below: int = 0


def plan_requests(
    requests: Sequence[tuple[Request | None, int]],
    stored: Mapping[Request, StoredRecord],
    indexes: Sequence[int] | None = None,
    window: int = REQUEST_RECORD_WINDOW,
    bounds: Mapping[str, StoredBound] | None = None,
) -> RequestPlan:
    """``requests[i]``: entry i's request id (None: anonymous) and first incomplete seq_no.
    ``stored``: the table's records, before the batch, for (at least) the batch's ids (any
    other record in it changes nothing). ``indexes[i]``: entry i's log index (None: the
    window never applies); a record or bound older than an entry's ``window`` is not seen by
    it. ``bounds``: the bounds table's rows, before the batch, for (at least) its clients."""
    plan = RequestPlan()
    # Each client's bound as the entries see it, one after another: (bound, index written).
    limits: dict[str, StoredBound] = dict(bounds or {})
    moved: set[str] = set()
    # What the table holds for the ids in play: a stored record or a batch position.
    present: dict[Request, StoredRecord | int] = dict(stored)
    # Per client, a heap of the seq_nos in ``present``: a deletion pops from the bottom, so
    # a batch costs O(n log n) however long a client's first incomplete seq_no stays put.
    seqs: dict[str, list[int]] = {}
    for client, seq_no in stored:
        seqs.setdefault(client, []).append(seq_no)
    for heap in seqs.values():
        heapq.heapify(heap)
    bound: dict[str, int] = {}
    held_at = present.get
    push, pop = heapq.heappush, heapq.heappop
    for pos, (key, first_incomplete) in enumerate(requests):
        if key is None:
            continue
        held = held_at(key)
        new_seq = held is None
        if held is not None and indexes is not None:
            written = indexes[held] if isinstance(held, int) else held[0]
            if written < indexes[pos] - window:
                # Out of the window: as if gone. Its seq_no is in the heap already; the
                # new record takes its place, the old one goes with the expired ones.
                held = None
        if held is not None:
            if isinstance(held, int):
                plan.repeats_batch[pos] = held
            else:
                plan.repeats_stored[pos] = held
            continue  # a repeat deletes nothing
        client, seq_no = key
        limit = limits.get(client)
        seen = 0
        if limit is not None and (indexes is None or limit[1] >= indexes[pos] - window):
            seen = limit[0]
            if seq_no < seen:
                plan.stale[pos] = seen
                continue  # below what its client still retries: a late copy
        if first_incomplete > 0:
            limits[client] = (max(seen, first_incomplete), indexes[pos] if indexes else 0)
            moved.add(client)
        present[key] = pos
        held_seqs = seqs.get(client)
        if held_seqs is None:
            held_seqs = seqs[client] = []
        if new_seq:
            push(held_seqs, seq_no)
        if first_incomplete > 0:
            if first_incomplete > bound.get(client, 0):
                bound[client] = first_incomplete
            while held_seqs and held_seqs[0] < first_incomplete:
                del present[(client, pop(held_seqs))]
    plan.deletes = list(bound.items())
    plan.inserts = sorted(p for p in present.values() if isinstance(p, int))
    plan.bounds = [(c, *limits[c]) for c in sorted(moved)]
    if indexes:
        plan.expire_below = indexes[-1] - window
        plan.inserts = [p for p in plan.inserts if indexes[p] >= plan.expire_below]
        plan.bounds = [b for b in plan.bounds if b[2] >= plan.expire_below]
    return plan


def write_records(
    cur: sqlite3.Cursor,
    deletes: Sequence[Request],
    records: Sequence[tuple[str, int, int, int, bytes]],
    expire_below: int = 0,
    bounds: Sequence[tuple[str, int, int]] = (),
) -> int:
    """Apply a batch's deletions (client, below) and expiry (records and bounds written
    below the index ``expire_below``), then its records and bounds, to the tables; returns
    how many records expired."""
    expired = 0
    if expire_below > 0:
        # A range of the op_index index: nothing to read when nothing expires.
        cur.execute(f"DELETE FROM {REQUESTS_TABLE} WHERE op_index < ?", (expire_below,))
        expired = max(cur.rowcount, 0)
        cur.execute(f"DELETE FROM {BOUNDS_TABLE} WHERE op_index < ?", (expire_below,))
    if bounds:
        cur.executemany(
            f"INSERT OR REPLACE INTO {BOUNDS_TABLE} (client_id, bound, op_index) VALUES (?, ?, ?)",
            bounds,
        )
    if deletes:
        cur.executemany(f"DELETE FROM {REQUESTS_TABLE} WHERE client_id = ? AND seq_no < ?", deletes)
    if records:
        cur.executemany(
            f"INSERT INTO {REQUESTS_TABLE} (client_id, seq_no, op_index, op_term, row_errors) "
            "VALUES (?, ?, ?, ?, ?)",
            records,
        )
    return expired
