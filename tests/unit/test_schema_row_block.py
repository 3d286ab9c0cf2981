"""The packed row block: it decodes to exactly what the per-cell form decodes to, for every
column type, NULLs, empty and edge values; a malformed block is refused as a whole and a bad
row is a per-row failure, as with the per-cell form."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings

from raftlet.schema.row_block import (
    RowBlockError,
    decode_row_block,
    encode_row_block,
    join_row_blocks,
    row_width,
)
from raftlet.schema.rows import ErrorCode, OpType, RowOpError, decode_row_ops, encode_row_op
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from tests.unit.schema_strategies import Batch, batches


@settings(max_examples=300, deadline=None)
@given(batches())
def test_a_block_decodes_to_what_the_per_cell_form_decodes_to(
    batch: Batch,
) -> None:
    schema, ops = batch
    rows, indirect = encode_row_block(schema, ops)
    assert len(rows) == len(ops) * row_width(schema)
    per_cell = [encode_row_op(schema, op, row) for op, row in ops]
    assert decode_row_block(schema, rows, indirect) == decode_row_ops(schema, per_cell)


def _kv() -> Schema:
    return Schema(
        [
            ColumnSchema("k", DataType.INT64, is_key=True),
            ColumnSchema("s", DataType.STRING, nullable=True),
            ColumnSchema("b", DataType.BOOL, nullable=True),
            ColumnSchema("d", DataType.DOUBLE, nullable=True),
            ColumnSchema("n", DataType.INT32),
        ]
    )


def test_an_empty_block_is_no_rows() -> None:
    assert encode_row_block(_kv(), []) == (b"", b"")
    assert decode_row_block(_kv(), b"", b"") == ([], [])


def test_given_null_and_not_given_stay_apart() -> None:
    schema = _kv()
    rows, side = encode_row_block(schema, [(OpType.UPDATE, {"k": 1, "s": None})])
    (op,), errors = decode_row_block(schema, rows, side)
    assert not errors
    assert op.values == {"s": None}  # b, d and n were not given: an UPDATE leaves them


def _row(schema: Schema, **cols: Any) -> tuple[bytearray, bytes]:
    rows, side = encode_row_block(schema, [(OpType.INSERT, {"k": 1, "n": 5, **cols})])
    return bytearray(rows), side


def test_malformed_blocks_are_refused_as_a_whole() -> None:
    schema = _kv()
    rows, side = _row(schema, s="abc", b=True)
    with pytest.raises(RowBlockError, match="not a whole number"):
        decode_row_block(schema, bytes(rows[:-1]), side)
    with pytest.raises(RowBlockError, match="points past"):
        decode_row_block(schema, bytes(rows), side[:-1])
    spare = bytearray(rows)
    spare[1] |= 0x80  # isset bit of a 6th column the schema lacks
    with pytest.raises(RowBlockError, match="lacks"):
        decode_row_block(schema, bytes(spare), side)
    orphan = bytearray(rows)
    orphan[1] &= ~0x02  # s no longer given ...
    orphan[2] |= 0x02  # ... but NULL
    with pytest.raises(RowBlockError, match="NULL but not given"):
        decode_row_block(schema, bytes(orphan), side)
    # The BOOL cell sits after op, two bitmaps, k (8) and s (4 + 4).
    bad_bool = bytearray(rows)
    bad_bool[1 + 1 + 1 + 8 + 8] = 2
    with pytest.raises(RowBlockError, match="holds 2"):
        decode_row_block(schema, bytes(bad_bool), side)


def test_a_bad_row_is_a_row_failure_and_the_others_still_decode() -> None:
    schema = _kv()
    good, side = _row(schema, s="ok")
    width = row_width(schema)

    def failure_of(row: bytearray, indirect: bytes = side) -> tuple[int, str]:
        ops, errors = decode_row_block(schema, bytes(good + row), indirect)
        assert [o.row_index for o in ops] == [0]
        ((failure),) = errors
        assert failure.row_index == 1
        return failure.code, failure.message

    no_key = bytearray(good)
    no_key[1] &= ~0x01
    assert failure_of(no_key)[0] == ErrorCode.MISSING_KEY_COLUMN
    null_n = bytearray(good)
    null_n[2] |= 0x10
    assert failure_of(null_n)[0] == ErrorCode.NULL_NOT_ALLOWED
    unknown_op = bytearray(good)
    unknown_op[0] = 9
    assert failure_of(unknown_op)[0] == ErrorCode.INVALID_ROW
    nan = bytearray(good)
    nan[1] |= 0x08
    struct.pack_into("<d", nan, 1 + 1 + 1 + 8 + 8 + 1, float("nan"))
    assert failure_of(nan)[0] == ErrorCode.TYPE_MISMATCH
    bad_utf8 = bytearray(good)
    assert len(bad_utf8) == width
    struct.pack_into("<II", bad_utf8, 1 + 1 + 1 + 8, len(side), 2)  # s → the next 2 bytes
    code, message = failure_of(bad_utf8, side + b"\xff\xfe")
    assert code == ErrorCode.TYPE_MISMATCH
    assert "UTF-8" in message


def test_the_encoder_refuses_what_the_server_would() -> None:
    schema = _kv()
    with pytest.raises(RowOpError, match=r"row 1: .*unknown column"):
        encode_row_block(schema, [(OpType.INSERT, {"k": 1, "n": 1}), (OpType.INSERT, {"x": 1})])
    with pytest.raises(RowOpError, match="row 0: column 'n'"):
        encode_row_block(schema, [(OpType.INSERT, {"k": 1, "n": "five"})])
    with pytest.raises(RowOpError, match="not nullable"):
        encode_row_block(schema, [(OpType.INSERT, {"k": 1, "n": None})])
    with pytest.raises(RowOpError, match="unknown op type"):
        encode_row_block(schema, [(9, {"k": 1, "n": 1})])
    with pytest.raises(RowOpError) as missing:
        encode_row_block(schema, [(OpType.INSERT, {"n": 1})])
    assert missing.value.code == ErrorCode.MISSING_KEY_COLUMN


@settings(max_examples=200, deadline=None)
@given(batches())
def test_rows_packed_one_by_one_join_into_the_block_of_the_whole_batch(
    batch: Batch,
) -> None:
    schema, ops = batch
    one_by_one = [encode_row_block(schema, [op]) for op in ops]
    assert join_row_blocks(schema, one_by_one) == encode_row_block(schema, ops)


def test_maximal_values_round_trip() -> None:
    schema = Schema(
        [
            ColumnSchema("k", DataType.INT64, is_key=True),
            ColumnSchema("i8", DataType.INT8),
            ColumnSchema("f", DataType.DOUBLE),
            ColumnSchema("s", DataType.STRING),
            ColumnSchema("b", DataType.BINARY),
        ]
    )
    big = {"s": "\U0010ffff" * (1 << 18), "b": b"\xff" * (1 << 20)}  # 1 MiB each
    ops = [
        (OpType.INSERT, {"k": 2**63 - 1, "i8": 127, "f": 1.7976931348623157e308, **big}),
        (OpType.INSERT, {"k": -(2**63), "i8": -128, "f": float("-inf"), "s": "", "b": b""}),
    ]
    rows, side = encode_row_block(schema, ops)
    good, errors = decode_row_block(schema, rows, side)
    assert errors == []
    assert [dict(zip(("k",), op.key, strict=True)) | dict(op.values) for op in good] == [
        row for _, row in ops
    ]
