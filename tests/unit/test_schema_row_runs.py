"""Runs decode a block to exactly what the row-by-row decoder gives -- the same rows, the same
failures, the same RowBlockError -- on valid, uniform, mixed and damaged blocks; and a clean
uniform block takes the column-wise path."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlet.schema import row_runs
from raftlet.schema.row_block import RowBlockError, decode_row_block, encode_row_block, row_width
from raftlet.schema.row_runs import RowRun, decode_row_runs, runs_of_row_ops
from raftlet.schema.rows import OpType, RowFailure, RowOp
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from tests.unit.schema_strategies import Batch, batches


def _expand(runs: list[RowRun]) -> list[RowOp]:
    return [op for run in runs for op in run.row_ops()]


def _outcome(
    decode: object, schema: Schema, rows: bytes, side: bytes
) -> tuple[list[RowOp], list[RowFailure]] | str:
    """What a decoder makes of a block: rows and failures, or the RowBlockError's text."""
    try:
        if decode is decode_row_runs:
            runs, failures = decode_row_runs(schema, rows, side)
            return _expand(runs), failures
        return decode_row_block(schema, rows, side)
    except RowBlockError as e:
        return f"RowBlockError: {e}"


@settings(max_examples=300, deadline=None)
@given(st.one_of(batches(), batches(uniform=True, max_rows=40)))
def test_runs_hold_the_rows_the_row_by_row_decoder_gives(batch: Batch) -> None:
    schema, ops = batch
    rows, side = encode_row_block(schema, ops)
    runs, failures = decode_row_runs(schema, rows, side)
    good, expected_failures = decode_row_block(schema, rows, side)
    assert failures == expected_failures == []
    assert _expand(runs) == good
    for run in runs:
        assert len(run) == len(run.row_indexes) > 0
        assert {type(v) for v in run.params[0]} <= {int, float, bool, str, bytes, type(None)}


@settings(max_examples=400, deadline=None)
@given(batches(uniform=True, max_rows=12), st.data())
def test_a_damaged_block_gets_the_same_verdict_either_way(
    batch: Batch, data: st.DataObject
) -> None:
    schema, ops = batch
    rows, side = (bytearray(b) for b in encode_row_block(schema, ops))
    for _ in range(data.draw(st.integers(1, 3))):
        target = data.draw(st.sampled_from([rows, side] if side else [rows]))
        if not target:
            continue
        at = data.draw(st.integers(0, len(target) - 1))
        target[at] = data.draw(st.sampled_from([0, 1, 2, 0x7F, 0x80, 0xFF]))
    if data.draw(st.booleans()) and rows:
        rows = rows[: data.draw(st.integers(0, len(rows)))]
    fast = _outcome(decode_row_runs, schema, bytes(rows), bytes(side))
    assert fast == _outcome(decode_row_block, schema, bytes(rows), bytes(side))


def _kv() -> Schema:
    return Schema(
        [
            ColumnSchema("k", DataType.INT64, is_key=True),
            ColumnSchema("s", DataType.STRING, nullable=True),
            ColumnSchema("b", DataType.BOOL, nullable=True),
        ]
    )


def test_a_clean_uniform_block_is_decoded_column_by_column(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    schema = _kv()
    ops = [(OpType.INSERT, {"k": k, "s": f"é{k}", "b": k % 2 == 0}) for k in range(500)]
    rows, side = encode_row_block(schema, ops)

    def refuse(*_: object) -> None:
        raise AssertionError("the row-by-row decoder was used")

    monkeypatch.setattr(row_runs, "decode_row_block", refuse)
    (run,), failures = decode_row_runs(schema, rows, side)
    assert failures == []
    assert run.type is OpType.INSERT
    assert run.columns == ("s", "b")
    assert run.params[7] == (7, "é7", False)
    assert list(run.row_indexes) == list(range(500))


def test_rows_of_different_shapes_make_consecutive_runs() -> None:
    schema = _kv()
    ops = [
        (OpType.INSERT, {"k": 1, "s": "a", "b": True}),
        (OpType.INSERT, {"k": 2, "s": "b", "b": False}),
        (OpType.UPDATE, {"k": 1, "s": None}),
        (OpType.DELETE, {"k": 2}),
        (OpType.DELETE, {"k": 3}),
    ]
    rows, side = encode_row_block(schema, ops)
    runs, failures = decode_row_runs(schema, rows, side)
    assert failures == []
    assert [(r.type, r.columns, list(r.row_indexes)) for r in runs] == [
        (OpType.INSERT, ("s", "b"), [0, 1]),
        (OpType.UPDATE, ("s",), [2]),
        (OpType.DELETE, (), [3, 4]),
    ]
    assert runs[1].params == [(1, None)]


def _mixed() -> Schema:
    return Schema(
        [
            ColumnSchema("k", DataType.INT64, is_key=True),
            ColumnSchema("s", DataType.STRING),
            ColumnSchema("b", DataType.BOOL),
            ColumnSchema("d", DataType.DOUBLE),
            ColumnSchema("f", DataType.FLOAT),
        ]
    )


# Where row 2's cells sit: op, two 1-byte bitmaps, k (8), s (4 + 4), b (1), d (8), f (4).
_S, _B, _D, _F = 3 + 8, 3 + 16, 3 + 17, 3 + 25


@pytest.mark.parametrize(
    ("damage", "verdict"),
    [
        (lambda row, side: struct.pack_into("<II", row, _S, len(side), 2), "TYPE_MISMATCH"),
        (lambda row, side: struct.pack_into("<II", row, _S, len(side), 9), "points past"),
        (lambda row, side: struct.pack_into("<B", row, _B, 2), "holds 2"),
        (lambda row, side: struct.pack_into("<d", row, _D, float("nan")), "TYPE_MISMATCH"),
        (lambda row, side: struct.pack_into("<f", row, _F, float("nan")), "TYPE_MISMATCH"),
        (lambda row, side: struct.pack_into("<B", row, 0, 7), "INVALID_ROW"),
        (lambda row, side: struct.pack_into("<B", row, 2, 0x02), "NULL_NOT_ALLOWED"),
        (lambda row, side: struct.pack_into("<B", row, 1, 0x3F), "lacks"),
        (lambda row, side: struct.pack_into("<B", row, 1, 0x1E), "MISSING_KEY_COLUMN"),
    ],
)
def test_a_bad_cell_sends_the_block_to_the_row_by_row_decoder(damage, verdict) -> None:  # type: ignore[no-untyped-def]
    schema = _mixed()
    row = {"s": "x", "b": True, "d": 1.5, "f": 2.5}
    rows, side = encode_row_block(schema, [(OpType.INSERT, {"k": k, **row}) for k in range(4)])
    damaged = bytearray(rows)
    width = row_width(schema)
    assert width == _F + 4
    cell = damaged[2 * width : 3 * width]
    damage(cell, side)
    damaged[2 * width : 3 * width] = cell
    side += b"\xff\xfe"  # not UTF-8
    fast = _outcome(decode_row_runs, schema, bytes(damaged), side)
    assert fast == _outcome(decode_row_block, schema, bytes(damaged), side)
    if isinstance(fast, str):
        assert verdict in fast
    else:
        good, (failure,) = fast
        assert failure.row_index == 2
        assert failure.code_name == verdict
        assert [op.row_index for op in good] == [0, 1, 3]


def test_row_ops_make_runs_of_the_same_type_key_width_and_columns() -> None:
    ops = [
        RowOp(OpType.INSERT, (1,), {"v": 1}, 0),
        RowOp(OpType.INSERT, (2,), {"v": 2}, 2),
        RowOp(OpType.INSERT, (3,), {"w": 3}, 3),
        RowOp(OpType.INSERT, (4, 4), {"w": 4}, 4),
    ]
    runs = runs_of_row_ops(ops)
    assert [(r.columns, r.params, list(r.row_indexes)) for r in runs] == [
        (("v",), [(1, 1), (2, 2)], [0, 2]),
        (("w",), [(3, 3)], [3]),
        (("w",), [(4, 4, 4)], [4]),
    ]
    assert _expand(runs) == ops


def _alone(schema: Schema, rows: bytes, side: bytes) -> object:
    try:
        return decode_row_runs(schema, rows, side)
    except RowBlockError as e:
        return e


def _same(a: object, b: object) -> bool:
    if isinstance(a, RowBlockError) or isinstance(b, RowBlockError):
        return type(a) is type(b) and str(a) == str(b)
    return a == b


@settings(max_examples=300, deadline=None)
@given(batches(max_rows=12), st.data())
def test_blocks_decoded_together_give_what_each_gives_alone(
    batch: Batch, data: st.DataObject
) -> None:
    """Any blocks of one schema -- one row or many, empty, damaged -- decode together to
    exactly the outcome each block has on its own."""
    schema, ops = batch
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ops)), max_size=5)))
    pieces = [ops[a:b] for a, b in zip([0, *cuts], [*cuts, len(ops)], strict=True)]
    blocks: list[tuple[bytes, bytes]] = []
    for piece in pieces:
        rows, side = (bytearray(b) for b in encode_row_block(schema, piece))
        if data.draw(st.integers(0, 3)) == 0:  # damage this block
            target = data.draw(st.sampled_from([rows, side] if side else [rows]))
            if target:
                at = data.draw(st.integers(0, len(target) - 1))
                target[at] = data.draw(st.sampled_from([0, 1, 2, 0x7F, 0x80, 0xFF]))
            if data.draw(st.booleans()) and rows:
                del rows[data.draw(st.integers(0, len(rows) - 1)) :]
        blocks.append((bytes(rows), bytes(side)))
    together = row_runs.decode_row_blocks(schema, blocks)
    assert len(together) == len(blocks)
    for outcome, (rows, side) in zip(together, blocks, strict=True):
        assert _same(outcome, _alone(schema, rows, side))


def test_one_row_blocks_are_decoded_together_without_the_row_by_row_decoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    schema = _kv()
    blocks = [
        encode_row_block(schema, [(OpType.INSERT, {"k": k, "s": f"é{k}", "b": k % 2 == 0})])
        for k in range(300)
    ]
    blocks.append(encode_row_block(schema, [(OpType.DELETE, {"k": 7})]))
    expected = [decode_row_runs(schema, rows, side) for rows, side in blocks]

    def refuse(*_: object) -> None:
        raise AssertionError("a block was decoded on its own")

    monkeypatch.setattr(row_runs, "decode_row_runs", refuse)
    monkeypatch.setattr(row_runs, "decode_row_block", refuse)
    assert row_runs.decode_row_blocks(schema, blocks) == expected
