"""One scan page, filled from an open store cursor: bounded in rows and in bytes, in either
row form of ``ScanResponse``.

The page is filled as it is fetched, so the server reads from SQLite only about the rows it
sends: a first small fetch tells how big this table's rows are, the next fetch asks for the
rows that should fill the rest of the byte budget (at most ``_MAX_FETCH``), and so on until
the page holds ``max_rows`` rows or reaches ``max_bytes`` -- it ends with the row that
reaches it, so a page always makes progress. Unless that row would take the page past
``cap``, the most a response may carry: then the page ends before it, and the row begins
the next page (a page's first row is always taken: no row is larger than the write that
put it there, and a write is no larger than the cap). Bytes are those of the form sent:
the packed rows and side buffer (``schema.row_pages``), or the ``RowPB`` messages.

The packed form takes the store's tuples as they are -- no ``from_sql`` per cell, no
``ValuePB``: each fetched chunk is transposed into columns and packed with the
projection's precompiled struct. The per-cell form is the original one, kept for clients
that do not ask for packed rows.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Protocol

from raftlet.proto import tablet_pb2
from raftlet.schema.row_pages import RowPageError, encode_page
from raftlet.schema.types import DataType, TypeMismatch, value_to_pb
from raftlet.tserver.store import ScanCursor, StoreError
from raftlet.tserver.store.sql import SqlValue, from_sql

__all__ = ["fill_page", "fill_page_counted"]

# Rows fetched before anything is known of their size: a small page's worth.
_FIRST_FETCH = 64
# Rows fetched at once at most: the estimate comes from the rows before, and if the next
# ones are much bigger, this bounds what is read beyond the page.
_MAX_FETCH = 4096
# Per RowPB in a response: its field tag and length prefix.
_ROW_PB_FRAMING = 3


class _PageForm(Protocol):
    def add(
        self, rows: list[tuple[SqlValue, ...]], budget: int, cap: int, empty: bool
    ) -> tuple[int, int]:
        """Put rows in the page up to and including the one that uses up ``budget``
        bytes, but none that would use more than ``cap`` -- except the first row of an
        ``empty`` page, taken whatever its size; returns (rows taken, bytes used)."""
        ...

    def finish(self, response: tablet_pb2.ScanResponse) -> None: ...


class _Packed:
    def __init__(self, types: Sequence[DataType], projected_at: Sequence[int]) -> None:
        self._types = types
        self._at = projected_at
        self._rows: list[bytes] = []
        self._indirect: list[bytes] = []
        self._side = 0

    def add(
        self, rows: list[tuple[SqlValue, ...]], budget: int, cap: int, empty: bool
    ) -> tuple[int, int]:
        fetched = list(zip(*rows, strict=True))
        columns = [fetched[at] for at in self._at]
        part = encode_page(self._types, columns, max_bytes=budget, base=self._side, cap=cap)
        if part.count == 0 and empty:
            part = encode_page(self._types, columns, max_bytes=1, base=self._side)
        self._rows.append(part.rows)
        self._indirect.append(part.indirect)
        self._side += len(part.indirect)
        return part.count, part.size

    def finish(self, response: tablet_pb2.ScanResponse) -> None:
        block = response.row_block
        block.SetInParent()  # present even when empty: that is what says "packed"
        block.rows = b"".join(self._rows)
        block.indirect = b"".join(self._indirect)


class _Cells:
    def __init__(
        self,
        response: tablet_pb2.ScanResponse,
        types: Sequence[DataType],
        projected_at: Sequence[int],
    ) -> None:
        self._out = response.rows
        self._cells = list(zip(types, projected_at, strict=True))

    def add(
        self, rows: list[tuple[SqlValue, ...]], budget: int, cap: int, empty: bool
    ) -> tuple[int, int]:
        used = 0
        for n, raw in enumerate(rows, 1):
            pb = self._out.add()
            for dtype, at in self._cells:
                value_to_pb(dtype, from_sql(dtype, raw[at]), pb.values.add())
            size = pb.ByteSize() + _ROW_PB_FRAMING
            if used + size > cap and not (empty and n == 1):
                del self._out[-1]
                return n - 1, used
            used += size
            if used >= budget:
                return n, used
        return len(rows), used

    def finish(self, response: tablet_pb2.ScanResponse) -> None:
        pass


def fill_page(
    cursor: ScanCursor,
    row_format: int,
    max_rows: int | None,
    max_bytes: int,
    cap: int | None = None,
) -> tablet_pb2.ScanResponse:
    """The next page of ``cursor`` in ``row_format`` (a ``tablet_pb2.RowFormat``): at most
    ``max_rows`` rows (None: no bound), about ``max_bytes`` bytes and, but for a first row
    larger on its own, at most ``cap`` (None: no cap), with ``has_more`` and the resume key
    when rows are left. ``StoreError`` if the store holds a value its column's type cannot
    (nothing a client can fix)."""
    return fill_page_counted(cursor, row_format, max_rows, max_bytes, cap)[0]


def fill_page_counted(
    cursor: ScanCursor,
    row_format: int,
    max_rows: int | None,
    max_bytes: int,
    cap: int | None = None,
) -> tuple[tablet_pb2.ScanResponse, int]:
    """``fill_page``, and how many rows the page holds."""
    response = tablet_pb2.ScanResponse(columns=cursor.columns, applied_index=cursor.applied_index)
    form: _PageForm
    if row_format == tablet_pb2.ROW_FORMAT_PACKED:
        form = _Packed(cursor.types, cursor.projected_at)
    else:
        form = _Cells(response, cursor.types, cursor.projected_at)
    hard = sys.maxsize if cap is None else cap
    taken = used = 0
    last: tuple[SqlValue, ...] | None = None
    more: bool | None = None  # None: not known without one more fetch
    ask = _FIRST_FETCH if max_rows is None else min(max_rows, _FIRST_FETCH)
    try:
        while True:
            rows = cursor.fetch(ask)
            if not rows:
                more = False
                break
            n, size = form.add(rows, max_bytes - used, hard - used, taken == 0)
            taken += n
            used += size
            if n:
                last = rows[n - 1]
            if n < len(rows):
                cursor.unread(rows[n:])  # the next page's, if the scan is held open
                more = True
                break
            if len(rows) < ask:
                more = False  # the cursor ran out
                break
            left = None if max_rows is None else max_rows - taken
            if used >= max_bytes or left == 0:
                break
            # As many rows as should fill the rest, one more to cross the line.
            ask = min(math.ceil((max_bytes - used) * taken / used) + 1, _MAX_FETCH)
            if left is not None:
                ask = min(ask, left)
        if more is None:
            peek = cursor.fetch(1)
            cursor.unread(peek)
            more = bool(peek)
    except (RowPageError, TypeMismatch) as e:
        raise StoreError(f"a stored value does not fit its column: {e}") from e
    form.finish(response)
    if more and last is not None:
        response.has_more = True
        response.resume_key = cursor.resume_key_after(last)
    return response, taken
