"""A scan's result page packed in one block: the row block layout, read and written column-wise.

A page in the per-cell form (``RowPB`` per row, ``ValuePB`` per cell) costs a protobuf
message per cell, built by the server and parsed by the client in Python. A packed page is
a ``RowBlockPB`` laid out as ``row_block`` lays out a write, with the page's columns -- the
scan's projection, in ``ScanResponse.columns`` order -- in the place of the schema's:

    op type      u8      always INSERT (1)
    isset        ceil(columns / 8) bytes, every projected column's bit set
    null         ceil(columns / 8) bytes, bit i set: column i is NULL in this row
    cells        one per projected column (zero when NULL): INT8 i8 · INT16 i16 · INT32 i32 ·
                 INT64 / UNIXTIME_MICROS i64 · FLOAT f32 · DOUBLE f64 · BOOL u8 (0 or 1) ·
                 STRING / BINARY u32 offset + u32 length into ``indirect`` (STRING as UTF-8)

INSERT and a full isset bitmap make a page of a whole-schema projection, in schema order,
also a valid write block of INSERTs of those rows; nothing else reads them. The side buffer
is written column by column (each column's bytes together, NULL cells as empty runs where
the column's next bytes would go), but a reader must only follow offsets.

Both directions work a column at a time, in C as far as possible: the server transposes the
store's row tuples, encodes each column's strings with one ``join`` and one ``encode`` when
it is ASCII, and packs each row with one call of the layout's precompiled struct (``map``
over the columns, no Python code per row); the client unpacks with ``iter_unpack`` and
takes columns out with ``itemgetter``, like ``row_runs``. Python code per row is left only
where there are NULLs (their bitmaps) and non-ASCII text.

A page that breaks this layout -- a length that is not a whole number of rows, another op
type, a missing isset bit, a bit for a column the page lacks, a cell pointing outside
``indirect``, a BOOL that is neither 0 nor 1, a NaN, invalid UTF-8 -- raises
``RowPageError``; nothing of it is returned. The values decoded are exactly those the
per-cell form decodes to (``rows.row_from_pb``), so a client sees the same rows either way.
"""

from __future__ import annotations

import math
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache, reduce
from itertools import accumulate, compress, islice, repeat
from operator import add, and_, itemgetter, lshift, not_, or_, sub, truth
from typing import Any, Literal

from raftlet.schema.row_block import RowLayout, layout_of_types
from raftlet.schema.rows import OpType
from raftlet.schema.types import DataType, Value

__all__ = [
    "PAGE_OP",
    "EncodedPage",
    "RowPageError",
    "decode_page",
    "encode_page",
    "page_layout",
    "page_rows",
]

# The op type byte of every row of a page.
PAGE_OP = int(OpType.INSERT)
_VARLEN = (DataType.STRING, DataType.BINARY)
_FLOATS = (DataType.FLOAT, DataType.DOUBLE)


class RowPageError(ValueError):
    """A page that does not follow the layout (a client reports the server's reply as
    malformed), or values a page cannot hold (a store value outside its column's type)."""


def page_layout(types: Sequence[DataType]) -> RowLayout:
    """The (cached) layout of a page whose columns have ``types``, in that order."""
    if not types:
        raise RowPageError("a page has at least one column")
    return layout_of_types(tuple(types))


@dataclass(frozen=True, slots=True)
class EncodedPage:
    """``count`` rows packed: ``rows`` (``count`` fixed-width rows) and ``indirect``."""

    rows: bytes
    indirect: bytes
    count: int

    @property
    def size(self) -> int:
        return len(self.rows) + len(self.indirect)


@dataclass(slots=True)
class _Varlen:
    """One STRING or BINARY column's bytes, one after the other, and each row's length."""

    data: bytes
    lengths: list[int]


def encode_page(
    types: Sequence[DataType],
    columns: Sequence[Sequence[Any]],
    *,
    max_bytes: int | None = None,
    base: int = 0,
    cap: int | None = None,
) -> EncodedPage:
    """Pack rows given column-wise: ``columns[j][i]`` is row i's value of column j, a value
    as the store returns it (int, also for BOOL; float or int for FLOAT/DOUBLE; str; bytes;
    None for NULL). ``max_bytes``: stop after the row that brings the page (fixed-width
    rows plus side buffer) to that size, so a page holds at least one row. ``cap``: but
    stop before a row that would take the page past it -- none at all if the first would
    (the caller, which knows whether its page is empty, decides). ``base``: where this
    part's side buffer will start, when parts are joined into one page.
    ``RowPageError`` for a value its column's cell cannot hold."""
    layout = page_layout(types)
    if len(columns) != len(types):
        raise RowPageError(f"{len(columns)} columns of values for {len(types)} column types")
    n = len(columns[0])
    if any(len(c) != n for c in columns):
        raise RowPageError("columns of different lengths")
    width = layout.row.size
    varlen: dict[int, _Varlen] = {}
    for j, dtype in enumerate(types):
        if dtype in _VARLEN:
            try:
                varlen[j] = _encode_varlen(dtype, columns[j])
            except (TypeError, UnicodeEncodeError) as e:
                raise RowPageError(f"column {j} ({dtype.name}): {e}") from None
    count = _rows_within(n, width, [v.lengths for v in varlen.values()], max_bytes, cap)
    nulls = [j for j, c in enumerate(columns) if None in c]
    fields: list[Iterable[Any]] = [repeat(PAGE_OP), repeat(_all_bits(len(types)))]
    fields.append(_null_bitmaps(columns, nulls, count, layout.bitmap_bytes))
    side: list[bytes] = []
    at = base
    for j, dtype in enumerate(types):
        col = columns[j]
        if j in varlen:
            v = varlen[j]
            offsets = list(accumulate(islice(v.lengths, count), initial=at))
            fields += (offsets[:count], v.lengths[:count])
            side.append(v.data[: offsets[count] - at])
            at = offsets[count]
        elif dtype is DataType.BOOL:
            # The store keeps 0/1; truth() is what reading it back as a bool means.
            fields.append(map(truth, islice(col, count)))
        elif j in nulls:
            zero = 0.0 if dtype in _FLOATS else 0
            fields.append([zero if x is None else x for x in islice(col, count)])
        else:
            fields.append(col)
    try:
        rows = b"".join(islice(map(layout.row.pack, *fields), count))
    except Exception as e:  # struct.error or TypeError: which value it was is in the message
        raise RowPageError(f"a value does not fit its column's cell: {e}") from None
    return EncodedPage(rows, b"".join(side), count)


def _all_bits(ncols: int) -> bytes:
    return ((1 << ncols) - 1).to_bytes((ncols + 7) // 8, "little")


def _encode_varlen(dtype: DataType, col: Sequence[Any]) -> _Varlen:
    empty: Any = "" if dtype is DataType.STRING else b""
    values: Sequence[Any] = [empty if x is None else x for x in col] if None in col else col
    if dtype is DataType.BINARY:
        return _Varlen(b"".join(values), list(map(len, values)))  # TypeError unless bytes
    text = "".join(values)  # TypeError unless every value is a str
    data = text.encode("utf-8")
    if len(data) == len(text):  # all ASCII: a character is a byte
        return _Varlen(data, list(map(len, values)))
    encoded = [s.encode("utf-8") for s in values]
    return _Varlen(b"".join(encoded), list(map(len, encoded)))


def _rows_within(
    n: int, width: int, lengths: list[list[int]], max_bytes: int | None, cap: int | None
) -> int:
    """How many of the n rows fill a page up to ``max_bytes``: up to and including the row
    that reaches it, but none that would take it past ``cap``."""
    if (max_bytes is None and cap is None) or n == 0:
        return n
    if not lengths:
        count = n if max_bytes is None else min(n, max(1, -(-max_bytes // width)))
        return count if cap is None else min(count, cap // width)
    per_row = lengths[0] if len(lengths) == 1 else list(map(sum, zip(*lengths, strict=True)))
    totals = list(map(add, accumulate(per_row), range(width, width * (n + 1), width)))
    count = n if max_bytes is None else min(n, bisect_left(totals, max_bytes) + 1)
    return count if cap is None else min(count, bisect_right(totals, cap))


def _null_bitmaps(
    columns: Sequence[Sequence[Any]], nulls: list[int], count: int, nbytes: int
) -> Iterator[bytes]:
    if not nulls:
        return repeat(bytes(nbytes))
    masks = [0] * count
    for j in nulls:
        bit = 1 << j
        masks = list(map(or_, masks, [bit if x is None else 0 for x in islice(columns[j], count)]))
    little: Literal["little"] = "little"
    return map(int.to_bytes, masks, repeat(nbytes), repeat(little))


def decode_page(types: Sequence[DataType], rows: bytes, indirect: bytes) -> list[list[Value]]:
    """The page's values column-wise (``[j][i]``: row i's value of column j), exactly the
    values the per-cell form gives; ``RowPageError`` if the page breaks the layout."""
    layout = page_layout(types)
    width = layout.row.size
    n, extra = divmod(len(rows), width)
    if extra:
        raise RowPageError(
            f"a page of {len(rows)} bytes is not a whole number of {width}-byte rows"
        )
    if n == 0:
        return [[] for _ in types]
    nb = layout.bitmap_bytes
    if rows[0::width] != bytes([PAGE_OP]) * n:
        raise RowPageError(f"a row's op type is not {PAGE_OP} (INSERT)")
    for b, expected in enumerate(_all_bits(len(types))):
        if rows[1 + b :: width] != bytes([expected]) * n:
            raise RowPageError("a row's isset bitmap does not give every column")
    # The header is checked above (and the null bitmaps below) a byte column at a time: the
    # struct that unpacks each row skips it, so no bytes object is made per row for it.
    unpacked = list(_cells_struct(layout).iter_unpack(rows))
    zeros = bytes(n)
    masks: list[int] | None = None
    if any(rows[1 + nb + b :: width] != zeros for b in range(nb)):
        masks = list(rows[1 + nb :: width])
        for b in range(1, nb):
            masks = list(map(or_, masks, map(lshift, rows[1 + nb + b :: width], repeat(8 * b))))
        if reduce(or_, masks) & layout.spare_mask:
            raise RowPageError("a null bitmap has a bit for a column the page lacks")
    header_fields = layout.field[0]
    return [
        _decode_column(j, dtype, layout.field[j] - header_fields, unpacked, indirect, masks)
        for j, dtype in enumerate(types)
    ]


@lru_cache(maxsize=64)
def _cells_struct(layout: RowLayout) -> struct.Struct:
    """A row of ``layout`` with its header skipped: only the cells are unpacked."""
    header = f"<B{layout.bitmap_bytes}s{layout.bitmap_bytes}s"
    assert layout.row.format.startswith(header)
    return struct.Struct(f"<{layout.header_size}x" + layout.row.format[len(header) :])


def _decode_column(
    j: int,
    dtype: DataType,
    at: int,
    unpacked: list[tuple[Any, ...]],
    indirect: bytes,
    masks: list[int] | None,
) -> list[Value]:
    is_null = list(map(and_, masks, repeat(1 << j))) if masks is not None else None
    if is_null is not None and not any(is_null):
        is_null = None
    values: list[Any] = list(map(itemgetter(at), unpacked))
    # Checked: the cells that are not NULL (a NULL cell's content means nothing).
    given = values if is_null is None else list(compress(values, map(not_, is_null)))
    if dtype in _VARLEN:
        values = _decode_varlen(j, dtype, values, list(map(itemgetter(at + 1), unpacked)), indirect)
    elif dtype is DataType.BOOL:
        if given and max(given) > 1:
            raise RowPageError(f"column {j}: a BOOL cell holds {max(given)}")
        values = list(map(truth, values))
    elif dtype in _FLOATS:
        if any(map(math.isnan, given)):
            raise RowPageError(f"column {j}: NaN is not a value a column holds")
        values = list(map(add, values, repeat(0.0)))  # -0.0 becomes +0.0, as normalize does
    if is_null is None:
        return values
    return [None if z else v for v, z in zip(values, is_null, strict=True)]


def _decode_varlen(
    j: int, dtype: DataType, offsets: list[int], lengths: list[int], indirect: bytes
) -> list[Any]:
    ends = list(map(add, offsets, lengths))
    if max(ends) > len(indirect):
        raise RowPageError(f"column {j}: a cell points past the {len(indirect)}-byte side buffer")
    if dtype is DataType.BINARY:
        return list(map(indirect.__getitem__, map(slice, offsets, ends)))
    lo = min(offsets)
    region = indirect[lo : max(ends)]
    if region.isascii():  # one decode, and byte offsets are character offsets
        text = region.decode("ascii")
        starts = map(sub, offsets, repeat(lo))
        return list(map(text.__getitem__, map(slice, starts, map(sub, ends, repeat(lo)))))
    try:
        return list(map(bytes.decode, map(indirect.__getitem__, map(slice, offsets, ends))))
    except UnicodeDecodeError as e:
        raise RowPageError(f"column {j}: not valid UTF-8: {e.reason}") from None


def page_rows(columns: list[list[Value]]) -> list[tuple[Value, ...]]:
    """``decode_page``'s columns as row tuples."""
    return list(zip(*columns, strict=True))
