"""A write's rows as runs: rows that share an op type and given columns, ready for one SQL
statement each.

``row_block.decode_row_block`` builds one ``RowOp`` per row, checking every cell in Python;
at 1000 rows per write that was most of a replica's CPU. But the rows of a batch almost
always look alike: same op type, same columns given, same NULLs -- the same *header* bytes.
Everything ``build_row_op`` checks depends on the header alone, so ``decode_row_runs``
checks each distinct header once and then takes the cells column by column out of the
unpacked rows (``struct.iter_unpack``, ``map`` over whole columns), checking the rest --
side-buffer bounds, BOOL bytes, NaN, UTF-8 -- over whole columns too.

Any doubt sends the whole block to the row-by-row decoder: a header that breaks a rule, a
cell a column check refuses. So a block decodes to the same rows and the same failures (or
the same ``RowBlockError``) either way -- replicas agree whichever path a block takes, and
``tests/unit/test_schema_row_runs.py`` checks that on random and damaged blocks.

``decode_row_blocks`` does the same for many blocks at once -- each still decoded as if
alone -- because for a one-row block, the common write, the fixed cost of a call is most
of the work, and replaying a log decodes a million of them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from operator import add, gt, itemgetter
from typing import Any

from raftlet.schema.row_block import RowBlockError, RowLayout, decode_row_block, row_layout
from raftlet.schema.rows import (
    OpType,
    RowFailure,
    RowOp,
    RowOpError,
    build_row_op,
)
from raftlet.schema.schema import Schema
from raftlet.schema.types import DataType, Value

__all__ = ["BlockOutcome", "RowRun", "decode_row_blocks", "decode_row_runs", "runs_of_row_ops"]

_FLOATS = (DataType.FLOAT, DataType.DOUBLE)
_VARLEN = (DataType.STRING, DataType.BINARY)


@dataclass(slots=True)
class RowRun:
    """Validated rows of one write with the same op type and the same given non-key
    ``columns``. ``params[i]`` holds row i's key values (key order) then its ``columns``
    values; ``row_indexes[i]`` is its position in the write.

    A value: nothing changes a run once built.  Not a frozen dataclass only because its
    ``__init__`` (an ``object.__setattr__`` per field, ~0.9 us) would be a tenth of the
    cost of replaying a one-row write, which is one run."""

    type: OpType
    num_keys: int
    columns: tuple[str, ...]
    params: Sequence[tuple[Value, ...]]
    row_indexes: Sequence[int]

    def __len__(self) -> int:
        return len(self.params)

    def row_ops(self) -> list[RowOp]:
        """The run as one ``RowOp`` per row (the store's row-by-row path)."""
        k = self.num_keys
        return [
            RowOp(self.type, p[:k], dict(zip(self.columns, p[k:], strict=True)), i)
            for p, i in zip(self.params, self.row_indexes, strict=True)
        ]


def runs_of_row_ops(ops: Sequence[RowOp]) -> list[RowRun]:
    """Consecutive ``ops`` with the same type, key width and given columns, as runs."""
    runs: list[RowRun] = []
    for (op_type, num_keys, columns), group in itertools.groupby(
        ops, key=lambda op: (op.type, len(op.key), tuple(op.values))
    ):
        members = list(group)
        runs.append(
            RowRun(
                op_type,
                num_keys,
                columns,
                [op.key + tuple(op.values.values()) for op in members],
                [op.row_index for op in members],
            )
        )
    return runs


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to read rows of one (valid) header: the op, the non-key columns given, and for
    every given column, in schema order, its type and tuple field (None: NULL)."""

    op: OpType
    columns: tuple[str, ...]
    cells: tuple[tuple[DataType, int | None], ...]


_OP_VALUES = frozenset(int(t) for t in OpType)


@lru_cache(maxsize=1024)
def _plan_of(schema: Schema, header: bytes) -> _Plan | None:
    """The plan for rows with ``header``, or None if such a row is malformed or fails a
    rule: then the row-by-row decoder must report it."""
    layout = row_layout(schema)
    nbytes = layout.bitmap_bytes
    isset = int.from_bytes(header[1 : 1 + nbytes], "little")
    null = int.from_bytes(header[1 + nbytes :], "little")
    if (isset | null) & layout.spare_mask or null & ~isset or header[0] not in _OP_VALUES:
        return None
    given: dict[int, Value] = {}
    cells: list[tuple[DataType, int | None]] = []
    for idx, col in enumerate(schema.columns):
        bit = 1 << idx
        if not isset & bit:
            continue
        if null & bit and not col.nullable:
            return None
        given[idx] = None if null & bit else 0  # a stand-in: the rules look at what is given
        cells.append((col.type, None if null & bit else layout.field[idx]))
    try:
        op = build_row_op(schema, OpType(header[0]), given, 0, key_limit=False)
    except RowOpError:
        return None
    return _Plan(op.type, tuple(op.values), tuple(cells))


class _Fallback(Exception):
    """A cell needs the row-by-row decoder's judgement."""


class _SideBuffer:
    """The block's variable-length bytes, decoded as text at most once if all ASCII."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._text: str | None = None
        self._ascii: bool | None = None

    def ascii_text(self) -> str | None:
        if self._ascii is None:
            self._ascii = self.data.isascii()
            if self._ascii:
                self._text = self.data.decode("ascii")
        return self._text


def decode_row_runs(
    schema: Schema, rows: bytes, indirect: bytes
) -> tuple[list[RowRun], list[RowFailure]]:
    """Decode and validate a block into runs and per-row failures: the same rows and the
    same failures as ``decode_row_block`` (whose ``RowBlockError`` it raises too)."""
    layout = row_layout(schema)
    width = layout.row.size
    n = len(rows) // width
    if len(rows) % width or n == 0:
        return _slow(schema, rows, indirect)
    h = layout.header_size
    if all(rows[k::width] == rows[k : k + 1] * n for k in range(h)):
        segments = [(0, n, bytes(rows[:h]))]
    else:
        segments = []
        start = 0
        heads = (bytes(rows[i : i + h]) for i in range(0, len(rows), width))
        for header, group in itertools.groupby(heads):
            count = sum(1 for _ in group)
            segments.append((start, count, header))
            start += count
    side = _SideBuffer(indirect)
    runs: list[RowRun] = []
    view = memoryview(rows)
    try:
        for start, count, header in segments:
            plan = _plan_of(schema, header)
            if plan is None:
                raise _Fallback
            unpacked = list(layout.row.iter_unpack(view[start * width : (start + count) * width]))
            columns = [_column(dtype, at, unpacked, side) for dtype, at in plan.cells]
            runs.append(
                RowRun(
                    plan.op,
                    schema.num_key_columns,
                    plan.columns,
                    list(zip(*columns, strict=True)),
                    range(start, start + count),
                )
            )
    except _Fallback:
        return _slow(schema, rows, indirect)
    return runs, []


def _column(
    dtype: DataType, at: int | None, unpacked: list[tuple[Any, ...]], side: _SideBuffer
) -> list[Any]:
    """Column ``at`` of every unpacked row as values; ``_Fallback`` if any cell is bad."""
    if at is None:
        return [None] * len(unpacked)
    if dtype in _VARLEN:
        offsets = list(map(itemgetter(at), unpacked))
        lengths = list(map(itemgetter(at + 1), unpacked))
        data = side.data
        if max(map(add, offsets, lengths)) > len(data):
            raise _Fallback
        if dtype is DataType.BINARY:
            return [data[o : o + n] for o, n in zip(offsets, lengths, strict=True)]
        text = side.ascii_text()
        if text is not None:  # ASCII: byte offsets are character offsets
            return [text[o : o + n] for o, n in zip(offsets, lengths, strict=True)]
        try:
            return [str(data[o : o + n], "utf-8") for o, n in zip(offsets, lengths, strict=True)]
        except UnicodeDecodeError:
            raise _Fallback from None
    values = list(map(itemgetter(at), unpacked))
    if dtype is DataType.BOOL:
        if max(values) > 1:
            raise _Fallback
        return [v == 1 for v in values]
    if dtype in _FLOATS:
        if any(map(math.isnan, values)):
            raise _Fallback
        return [v + 0.0 for v in values]  # -0.0 becomes +0.0, as normalize does
    return values


# What decoding one block gives: its runs and row failures, or the error that refuses it.
BlockOutcome = tuple[list[RowRun], list[RowFailure]] | RowBlockError
_HEADER_FIELDS = itemgetter(0, 1, 2)
_ONE = range(1)  # the row indexes of a one-row run (a range is immutable: shared)


def decode_row_blocks(schema: Schema, blocks: Sequence[tuple[bytes, bytes]]) -> list[BlockOutcome]:
    """``decode_row_runs`` of each ``(rows, indirect)`` block, its ``RowBlockError`` returned
    in its place.  The blocks' rows are unpacked and their cells checked and read together,
    column by column; a block whose length or header is in doubt is decoded alone, and a
    cell in doubt sends every block to ``decode_row_runs`` one by one, so each outcome is
    exactly what that call gives."""
    if len(blocks) < 2:  # the common batch of a lightly loaded tablet: nothing to share
        return [_decode_alone(schema, *block) for block in blocks]
    layout = row_layout(schema)
    width = layout.row.size
    out: list[BlockOutcome | None] = [None] * len(blocks)
    together = [k for k, (rows, _) in enumerate(blocks) if rows and not len(rows) % width]
    if len(together) > 1:
        try:
            for k, outcome in _decode_together(schema, layout, blocks, together):
                out[k] = outcome
        except _Fallback:
            pass
    return [_decode_alone(schema, *blocks[k]) if o is None else o for k, o in enumerate(out)]


def _decode_alone(schema: Schema, rows: bytes, indirect: bytes) -> BlockOutcome:
    try:
        return decode_row_runs(schema, rows, indirect)
    except RowBlockError as e:
        return e


def _decode_together(
    schema: Schema, layout: RowLayout, blocks: Sequence[tuple[bytes, bytes]], ks: list[int]
) -> list[tuple[int, BlockOutcome]]:
    """The outcomes of blocks ``ks`` (whole rows each) whose headers all have a plan; the
    others are left out, for the caller to decode alone.  ``_Fallback`` if a cell is bad."""
    width = layout.row.size
    chosen = [blocks[k] for k in ks]
    unpacked = list(layout.row.iter_unpack(b"".join([rows for rows, _ in chosen])))
    heads = list(map(_HEADER_FIELDS, unpacked))
    plans = {h: _plan_of(schema, bytes((h[0],)) + h[1] + h[2]) for h in set(heads)}
    counts = [len(rows) // width for rows, _ in chosen]
    sizes = [len(indirect) for _, indirect in chosen]
    starts = list(itertools.accumulate(sizes, initial=0))
    firsts = list(itertools.accumulate(counts, initial=0))
    one_row_each = len(unpacked) == len(chosen)
    # Per row: where its block's side buffer starts in the joined one, and its length.
    if one_row_each:
        bases, limits = starts, sizes
    else:
        bases = [b for b, n in zip(starts, counts, strict=False) for _ in range(n)]
        limits = [size for size, n in zip(sizes, counts, strict=True) for _ in range(n)]
    if None in plans.values():
        bad = {h for h, plan in plans.items() if plan is None}
        kept = [
            j
            for j in range(len(chosen))
            if not any(h in bad for h in heads[firsts[j] : firsts[j + 1]])
        ]
        rows_kept = [i for j in kept for i in range(firsts[j], firsts[j + 1])]
    else:
        kept = list(range(len(chosen)))
        rows_kept = list(range(len(unpacked)))
    side = _SideBuffer(b"".join([indirect for _, indirect in chosen]))
    params: list[tuple[Value, ...]] = [()] * len(unpacked)
    if len(plans) == 1 and len(rows_kept) == len(unpacked):
        by_head = {heads[0]: rows_kept}  # the usual case: every row alike
    else:
        by_head = {}
        for i in rows_kept:
            by_head.setdefault(heads[i], []).append(i)
    for head, where in by_head.items():
        plan = plans[head]
        assert plan is not None
        if not plan.cells:
            raise _Fallback  # no cells, no rows to zip: leave such a block to the reference
        if len(where) == len(unpacked):
            rows_of, bases_of, limits_of = unpacked, bases, limits
        else:
            rows_of = [unpacked[i] for i in where]
            bases_of = [bases[i] for i in where]
            limits_of = [limits[i] for i in where]
        columns = [
            _joined_column(dtype, at, rows_of, side, bases_of, limits_of)
            for dtype, at in plan.cells
        ]
        if len(where) == len(unpacked):
            params = list(zip(*columns, strict=True))
        else:
            for i, values in zip(where, zip(*columns, strict=True), strict=True):
                params[i] = values
    nkeys = schema.num_key_columns
    if one_row_each:
        out: list[tuple[int, BlockOutcome]] = []
        for j in kept:
            plan = plans[heads[j]]
            assert plan is not None
            out.append((ks[j], ([RowRun(plan.op, nkeys, plan.columns, [params[j]], _ONE)], [])))
        return out
    outcomes: list[tuple[int, BlockOutcome]] = []
    for j in kept:
        runs = []
        start = 0
        for head, group in itertools.groupby(range(firsts[j], firsts[j + 1]), heads.__getitem__):
            members = list(group)
            plan = plans[head]
            assert plan is not None
            end = start + len(members)
            runs.append(
                RowRun(
                    plan.op, nkeys, plan.columns, [params[i] for i in members], range(start, end)
                )
            )
            start = end
        outcomes.append((ks[j], (runs, [])))
    return outcomes


def _joined_column(
    dtype: DataType,
    at: int | None,
    unpacked: list[tuple[Any, ...]],
    side: _SideBuffer,
    bases: list[int],
    limits: list[int],
) -> list[Any]:
    """``_column`` over rows of many blocks whose side buffers are joined in ``side``: a
    cell must lie within its own block's buffer (``limits``), and is read at ``bases``."""
    if at is None or dtype not in _VARLEN:
        return _column(dtype, at, unpacked, side)
    offsets = list(map(itemgetter(at), unpacked))
    ends = list(map(add, offsets, map(itemgetter(at + 1), unpacked)))
    if any(map(gt, ends, limits)):
        raise _Fallback
    starts = list(map(add, offsets, bases))
    stops = list(map(add, ends, bases))
    data = side.data
    if dtype is DataType.BINARY:
        return [data[a:b] for a, b in zip(starts, stops, strict=True)]
    text = side.ascii_text()
    if text is not None:  # ASCII: byte offsets are character offsets
        return [text[a:b] for a, b in zip(starts, stops, strict=True)]
    try:
        return [str(data[a:b], "utf-8") for a, b in zip(starts, stops, strict=True)]
    except UnicodeDecodeError:
        raise _Fallback from None


def _slow(schema: Schema, rows: bytes, indirect: bytes) -> tuple[list[RowRun], list[RowFailure]]:
    good, failures = decode_row_block(schema, rows, indirect)
    return runs_of_row_ops(good), failures
