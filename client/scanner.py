"""Scans as iterators: page by page with the resume key, failing over between replicas.

Each page is a request carrying the ``resume_key`` of the page before, so any replica can
serve the next page. The replica that served a page with more to come holds its read open
for the next one (``scanner_id``, ``tserver.held_scans``), so the pages of a tablet are read
from one state of it: a batch written meanwhile is in all of them or none (each page used to
be read anew, and a scan saw one row of a two-row batch as before and the other as after).
A page served elsewhere (fail-over, a moved leader) or after the replica let the read go
(idle for 30 s -- or for a second, when a new scan needs its place -- or held for 10
minutes) is read anew from the resume key; a replica holding 32 scans of a tablet, none
idle, refuses a new one's first page as busy (RESOURCE_EXHAUSTED, retried there). A
``Scanner`` walks the table's tablets in partition order -- each tablet read at its own
moment; no scan is a snapshot of several tablets. Each page is one
``client.rpc.call_tablet`` call, so a replica that becomes unreachable (UNAVAILABLE,
connection refused, an attempt's deadline) is left for the next one, a moved leader is
followed (LEADER_LATEST), and the scan continues from the last resume key it received — no
row is returned twice and none is skipped.

- ``ReadMode.LEADER_LATEST`` (default) is linearizable: the leader notes its commit index
  when a tablet's first page is asked for, confirms with a round of heartbeats that a
  majority still follows it (ReadIndex), and answers once it has applied that index -- so
  the tablet's pages see every write acknowledged before the first was asked for (a page
  read anew does the same when it is asked for). A leader cut off from the others answers no
  such page (UNAVAILABLE, retried; then NOT_LEADER once it steps down).
  (With the server's ``--leader_read_mode=lease`` the leader skips the round while its
  lease holds; the page still sees every write acknowledged before it was asked for.)
- ``ReadMode.FOLLOWER_APPLIED`` reads any replica's applied state (possibly stale). The
  scanner sticks to one replica per tablet while it answers (``prefer``), starting with the
  leader if known; after a fail-over, later pages come from another replica, which may have
  applied a little more or less than the first one.  ``min_index`` bounds the staleness:
  a replica serves a page only once it has applied that Raft index, waiting for it up to its
  read wait, else fails UNAVAILABLE and the scanner tries another replica.  Given a
  ``WriteResult`` (what a session's write returns: its ``tablet_id`` and ``op_index``),
  every page of that tablet sees that write and everything before it: read-your-writes from
  any replica: pass ``{result.tablet_id: result.op_index}``.  A Raft index belongs to one
  tablet's log, so ``min_index`` is a mapping ``{tablet_id: index}`` (tablets it does not
  name: no bound), or a plain index for a scan
  that visits one tablet only; a plain index on a scan of several tablets is refused
  (``InvalidArgument``) -- the other tablets' logs may never reach it.

A scan whose predicates fix every key column (EQUALS, or IN_LIST) visits only the tablets
those keys hash to (``schema.partition.partitions_for_predicates``), not every tablet.

Rows are dicts (column name → value) in the projection's order (None or empty: every
column, the table's order). ``limit`` bounds the rows of
the whole scan; ``timeout_s`` bounds each page, retries included. Counters for tests and
tools: ``pages``, ``failovers`` (pages of a tablet answered by another server than the page
before), ``current_server`` (the server of the page whose rows are being handed out),
``current_tablet``.

Pages. ``batch_size_rows`` and ``batch_size_bytes`` bound a page (0: the server chooses --
by bytes, ``--scan_page_bytes``, 1 MiB by default). ``row_format`` says how its rows travel:
``RowFormat.PACKED`` (the default) asks for one packed block per page (``schema.row_pages``),
decoded here a column at a time; ``RowFormat.CELLS`` for a ``RowPB`` per row and a
``ValuePB`` per cell, the original form. Both give the same rows. A reply without a block is
read as cells, so a server that predates packed pages still works.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from itertools import repeat

from raftlet.client.arguments import check_timeout
from raftlet.client.channels import ServerStub
from raftlet.client.errors import InvalidArgument, RaftletError, RemoteError
from raftlet.client.meta_cache import TableInfo
from raftlet.client.rpc import RpcContext, call_tablet
from raftlet.proto import tablet_pb2
from raftlet.schema.predicates import Predicate, PredicateError
from raftlet.schema.row_pages import decode_page
from raftlet.schema.rows import row_from_pb
from raftlet.schema.scan_bounds import MAX_SCAN_LIMIT, scan_bounds_error
from raftlet.schema.schema import Schema
from raftlet.schema.types import TypeMismatch, Value

__all__ = ["ReadMode", "Row", "RowFormat", "Scanner", "check_predicates"]

Row = dict[str, Value]


class ReadMode(enum.IntEnum):
    """The numbers are those of ``tablet_pb2.ReadMode``."""

    LEADER_LATEST = tablet_pb2.READ_LEADER_LATEST
    FOLLOWER_APPLIED = tablet_pb2.READ_FOLLOWER_APPLIED


class RowFormat(enum.IntEnum):
    """The numbers are those of ``tablet_pb2.RowFormat``."""

    CELLS = tablet_pb2.ROW_FORMAT_CELLS
    PACKED = tablet_pb2.ROW_FORMAT_PACKED


def check_predicates(predicates: object) -> None:
    """``InvalidArgument`` unless ``predicates`` is a sequence of ``Predicate`` objects
    (checked before anything reads them: partition pruning raised TypeError)."""
    if isinstance(predicates, Predicate):
        raise InvalidArgument(f"predicates is a list of Predicate objects: [{predicates!r}]")
    if isinstance(predicates, str | bytes) or not isinstance(predicates, Sequence):
        raise InvalidArgument(f"predicates is a list of Predicate objects, got {predicates!r}")
    bad: list[object] = [p for p in predicates if not isinstance(p, Predicate)]
    if bad:
        raise InvalidArgument(
            f"predicates are Predicate objects (Predicate.equals, .range, ...), got {bad[0]!r}"
        )


class Scanner(Iterator[Row]):
    """The rows of one scan (``Client.scan``), fetched a page at a time as they are
    iterated, tablet after tablet, failing over between replicas. An iterator, read once
    as a file or a generator is: a second loop over it yields nothing (scan again)."""

    def __init__(
        self,
        rpc: RpcContext,
        table: TableInfo,
        tablet_ids: Sequence[str],
        *,
        projection: Sequence[str] | None = None,
        predicates: Sequence[Predicate] = (),
        limit: int | None = None,
        read_mode: ReadMode = ReadMode.LEADER_LATEST,
        batch_size_rows: int = 0,
        timeout_s: float = 30.0,
        replica: str | None = None,
        batch_size_bytes: int = 0,
        row_format: RowFormat = RowFormat.PACKED,
        min_index: int | Mapping[str, int] = 0,
    ) -> None:
        schema = table.schema
        self.timeout_s = check_timeout(timeout_s)
        if isinstance(projection, str | bytes):
            raise InvalidArgument(
                f"projection is a sequence of column names, not one name: [{projection!r}]"
            )
        check_predicates(predicates)
        if projection is not None:
            projection = list(projection)  # once: a generator checked here would end empty
            unknown = [c for c in projection if not schema.has_column(c)]
            if unknown:
                raise InvalidArgument(
                    f"table {table.name!r} has no column {unknown[0]!r} "
                    f"(columns: {', '.join(schema.column_names)})"
                )
        try:
            self._predicates = [p.to_pb(schema) for p in predicates]
        except PredicateError as e:
            raise InvalidArgument(f"table {table.name!r}: {e}") from None
        # None is "no limit" here (0 on the wire, which is why the shared check below does
        # not look at the limit: its words for it are the wire's).
        if limit is not None and (
            not isinstance(limit, int)
            or isinstance(limit, bool)
            or not 0 <= limit <= MAX_SCAN_LIMIT
        ):
            raise InvalidArgument(
                f"limit must be 0 to {MAX_SCAN_LIMIT} rows (or None: no limit), got {limit}"
            )
        # The server refuses these too; checked here so the scan fails before any call.
        problem = scan_bounds_error(self._predicates, 0)
        if problem is not None:
            raise InvalidArgument(f"scan of {table.name!r}: {problem}")
        sizes = (("batch_size_rows", batch_size_rows), ("batch_size_bytes", batch_size_bytes))
        for name, size in sizes:
            if not 0 <= size < 2**32:
                raise InvalidArgument(f"{name} must be in [0, 2**32), got {size}")
        self._min_indexes = _min_indexes(min_index, table, tablet_ids)
        self.table = table
        try:
            self.read_mode = ReadMode(read_mode)
            self.row_format = RowFormat(row_format)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        self._rpc = rpc
        self._projection = projection or []  # none on the wire: every column
        self._tablets = list(tablet_ids)
        self._limit_left = limit
        self._batch_size_rows = batch_size_rows
        self._batch_size_bytes = batch_size_bytes
        self._replica = replica
        self._tablet_index = 0
        self._resume: bytes | None = None  # None: from the tablet's start
        # The replica's read of the tablet the next page continues (ScanResponse.scanner_id).
        self._scanner_id = b""
        self._page: Iterator[Row] = iter(())
        self.pages = 0
        self.failovers = 0
        self.rows_returned = 0
        # The server of the page whose rows are being handed out.
        self.current_server: str | None = None
        # The server the tablet being read sticks to; None between tablets, whose first
        # page goes to the leader (or the pinned replica) and is no fail-over.
        self._sticky: str | None = None
        self.current_tablet: str | None = self._tablets[0] if self._tablets else None
        self.columns: list[str] = []

    def __iter__(self) -> Scanner:
        return self

    def __next__(self) -> Row:
        # The path taken for every row: one step of the page's iterator.
        row = next(self._page, None)
        while row is None:
            if not self._fetch():
                raise StopIteration
            row = next(self._page, None)
        self.rows_returned += 1
        return row

    def _fetch(self) -> bool:
        """Fetch the next non-empty page; False when the scan is over."""
        while self._tablet_index < len(self._tablets):
            if self._limit_left is not None and self._limit_left <= 0:
                return False
            tablet_id = self._tablets[self._tablet_index]
            self.current_tablet = tablet_id
            response, server = self._fetch_page(tablet_id)
            if self._sticky is not None and server != self._sticky:
                self.failovers += 1
            self._sticky = self.current_server = server
            self.pages += 1
            rows = self._decode(response)
            if self._limit_left is not None:
                rows = rows[: self._limit_left]
                self._limit_left -= len(rows)
            # Presence, not truth: the last row's key may encode as empty bytes (an empty
            # string or binary key), and the rows after it are still to come.
            if response.has_more and response.HasField("resume_key"):
                self._resume = response.resume_key
                self._scanner_id = response.scanner_id
            else:
                self._tablet_index += 1
                self._resume = None
                self._scanner_id = b""
                self._sticky = None
            if rows:
                self._page = iter(rows)
                return True
        return False

    def _fetch_page(self, tablet_id: str) -> tuple[tablet_pb2.ScanResponse, str]:
        """One page of ``tablet_id`` from ``self._resume`` on, and the server it came from."""
        request = tablet_pb2.ScanRequest(
            tablet_id=tablet_id,
            projection=self._projection,
            predicates=self._predicates,
            limit=self._limit_left or 0,
            resume_key=self._resume,
            read_mode=self.read_mode.value,
            batch_size_rows=self._batch_size_rows,
            batch_size_bytes=self._batch_size_bytes,
            row_format=self.row_format.value,
            min_applied_index=self._min_indexes.get(tablet_id, 0),
            # The rows come back packed for the replica's schema and are read by ours.
            schema_fingerprint=self.table.schema.fingerprint,
            scanner_id=self._scanner_id,
        )

        def scan(stub: ServerStub, timeout: float, _attempt: int) -> tablet_pb2.ScanResponse:
            return stub.scan(request, timeout)

        leader_only = self.read_mode is ReadMode.LEADER_LATEST
        try:
            return call_tablet(
                self._rpc,
                tablet_id,
                scan,
                what=f"scan of tablet {tablet_id}",
                deadline=self._rpc.clock() + self.timeout_s,
                timeout_s=self.timeout_s,
                leader_only=leader_only,
                prefer=None if leader_only else (self._sticky or self._replica),
            )
        except RaftletError as e:
            e.may_have_applied = False  # a read applies nothing (it was True after a timeout)
            raise

    def _decode(self, response: tablet_pb2.ScanResponse) -> list[Row]:
        columns = list(response.columns)
        self.columns = columns
        schema = self.table.schema
        try:
            if response.HasField("row_block"):
                if response.rows:
                    raise ValueError("a page with both cells and a packed block")
                return _packed_rows(schema, columns, response.row_block)
            return [
                dict(zip(columns, row_from_pb(schema, columns, pb), strict=True))
                for pb in response.rows
            ]
        except (TypeMismatch, ValueError, KeyError) as e:
            raise RemoteError(
                f"scan of {self.table.name!r}: the server sent a malformed page: {e}"
            ) from None

    def close(self) -> None:
        """Stop early. A replica holding the scan's read for its next page closes it once
        it has been idle for a while (``tserver.held_scans``)."""
        self._tablet_index = len(self._tablets)
        self._page = iter(())

    def __enter__(self) -> Scanner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _packed_rows(schema: Schema, columns: list[str], block: tablet_pb2.RowBlockPB) -> list[Row]:
    """A packed page's rows as dicts; ``ValueError`` (``RowPageError``) or ``KeyError`` (a
    column the table lacks) if the page is malformed."""
    if not columns:
        raise ValueError("a page names no columns")
    types = [schema.column(c).type for c in columns]
    return _dicts(columns, decode_page(types, block.rows, block.indirect))


def _dicts(columns: list[str], values: list[list[Value]]) -> list[Row]:
    """Rows as dicts from columns of values. A dict display is two to three times cheaper
    per row than ``dict(zip(...))``, so the usual few columns get one."""
    if len(columns) == 1:
        (c0,) = columns
        return [{c0: a} for a in values[0]]
    if len(columns) == 2:
        c0, c1 = columns
        return [{c0: a, c1: b} for a, b in zip(*values, strict=True)]
    if len(columns) == 3:
        c0, c1, c2 = columns
        return [{c0: a, c1: b, c2: c} for a, b, c in zip(*values, strict=True)]
    return list(map(dict, map(zip, repeat(columns), zip(*values, strict=True))))


def _some(names: Sequence[str], shown: int = 4) -> str:
    """The first ``shown`` of ``names`` and how many more (a table may have hundreds)."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f", ... ({more} more)" if more > 0 else "")


def _min_indexes(
    min_index: int | Mapping[str, int], table: TableInfo, tablet_ids: Sequence[str]
) -> dict[str, int]:
    """``min_index`` as a bound per tablet; InvalidArgument when it cannot be one."""

    def index(value: object, what: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise InvalidArgument(f"{what} must be a Raft index in [0, 2**63), got {value!r}")
        return value

    if isinstance(min_index, Mapping):
        unknown = sorted(str(t) for t in min_index if t not in table.tablet_ids)
        if unknown:
            raise InvalidArgument(
                f"min_index names {unknown[0]!r}, not a tablet of table {table.name!r} "
                f"(its tablets: {_some(table.tablet_ids)})"
            )
        return {t: index(i, f"min_index[{t!r}]") for t, i in min_index.items()}
    n = index(min_index, "min_index")
    if n and len(tablet_ids) > 1:
        raise InvalidArgument(
            f"min_index {n} is an index of one tablet's log, and this scan of "
            f"{table.name!r} visits {len(tablet_ids)} tablets: give an index for each "
            "tablet it names (a write's tablet id and op index), or scan one tablet"
        )
    return dict.fromkeys(tablet_ids, n) if n else {}
