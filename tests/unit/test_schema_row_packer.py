"""The fast per-row packer gives exactly the reference encoder's bytes, and its errors."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlet.proto import tablet_pb2
from raftlet.schema import row_packer as packer_module
from raftlet.schema.row_block import encode_row_block
from raftlet.schema.row_packer import row_packer
from raftlet.schema.rows import MAX_KEY_BYTES, OpType, RowOpError
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from tests.unit.schema_strategies import Batch, batches

# Values a program might pass that the fast path does not take itself (or must refuse).
_ODD = st.sampled_from(
    [
        True,
        1,
        -(2**63) - 1,
        2**64,
        1.5,
        float("nan"),
        -0.0,
        "\udcff",  # a lone surrogate: not UTF-8
        "",
        b"",
        bytearray(b"ab"),
        memoryview(b"cd"),
        dt.datetime(2026, 12, 1, tzinfo=dt.UTC),
        None,
        object(),
    ]
)


def _reference(schema: Schema, op: object, row: dict[str, Any]) -> tuple[bytes, bytes] | str:
    try:
        return encode_row_block(schema, [(op, row)])  # type: ignore[list-item]
    except RowOpError as e:
        return f"{e.code}: {e.message}"


def _fast(schema: Schema, op: object, row: dict[str, Any]) -> tuple[bytes, bytes] | str:
    try:
        return row_packer(schema).pack(op, row)  # type: ignore[arg-type]
    except RowOpError as e:
        return f"{e.code}: {e.message}"


@settings(max_examples=300, deadline=None)
@given(batches())
def test_valid_rows_pack_as_the_reference_encoder_packs_them(batch: Batch) -> None:
    schema, ops = batch
    for op, row in ops:
        assert row_packer(schema).pack(op, row) == encode_row_block(schema, [(op, row)])


@settings(max_examples=300, deadline=None)
@given(batches(max_rows=2), st.data())
def test_odd_values_unknown_columns_and_broken_rules_get_the_reference_answer(
    batch: Batch, data: st.DataObject
) -> None:
    schema, ops = batch
    for op, row in ops:
        row = dict(row)
        for _ in range(data.draw(st.integers(0, 3))):
            action = data.draw(st.sampled_from(["odd", "drop", "unknown", "op"]))
            name = data.draw(st.sampled_from([c.name for c in schema.columns]))
            if action == "odd":
                row[name] = data.draw(_ODD)
            elif action == "drop":
                row.pop(name, None)
            elif action == "unknown":
                row["nope"] = 1
            else:
                op = data.draw(st.sampled_from([*OpType, 0, 9, True]))
        assert _fast(schema, op, row) == _reference(schema, op, row)


def test_the_usual_row_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    schema = Schema(
        [
            ColumnSchema("k", DataType.INT64, is_key=True),
            ColumnSchema("s", DataType.STRING),
            ColumnSchema("d", DataType.DOUBLE, nullable=True),
            ColumnSchema("b", DataType.BOOL, nullable=True),
            ColumnSchema("x", DataType.BINARY, nullable=True),
        ]
    )
    row = {"k": 7, "s": "é", "d": -0.0, "b": True, "x": None}
    expected = encode_row_block(schema, [(OpType.INSERT, row)])

    def refuse(*_: object) -> None:
        raise AssertionError("the reference encoder was used")

    monkeypatch.setattr(packer_module, "encode_row_block", refuse)
    assert row_packer(schema).pack(OpType.INSERT, row) == expected
    with pytest.raises(AssertionError, match="reference encoder"):
        row_packer(schema).pack(OpType.INSERT, {**row, "d": float("nan")})


@pytest.mark.parametrize(
    "key",
    [
        # Each one byte over: 16,385 bytes, the INT64 column counted as 8.
        {"s": "x" * (MAX_KEY_BYTES - 7), "n": 1},
        {"s": "é" * (MAX_KEY_BYTES // 2 - 4) + "x", "n": 1},  # counted in UTF-8 bytes
        {"s": "x" * (MAX_KEY_BYTES - 8), "n": 1, "b": b"y"},
        {"s": "", "n": 1, "b": b"y" * (MAX_KEY_BYTES - 7)},
    ],
    ids=["ascii", "utf8", "string-and-int-and-binary", "binary"],
)
def test_a_key_over_the_limit_is_refused_as_the_reference_refuses_it(key: dict[str, Any]) -> None:
    """The fast path checked the row's shape with placeholder values, so a 20,000-byte
    string key was packed and sent, to be refused by the server."""
    schema = Schema(
        [
            ColumnSchema("s", DataType.STRING, is_key=True),
            ColumnSchema("n", DataType.INT64, is_key=True),
            ColumnSchema("b", DataType.BINARY, is_key=True),
            ColumnSchema("v", DataType.INT64, nullable=True),
        ]
    )
    row = {"b": b"", **key, "v": 3}
    with pytest.raises(RowOpError, match=r"over the 16384-byte limit") as fast:
        row_packer(schema).pack(OpType.INSERT, row)
    assert _fast(schema, OpType.INSERT, row) == _reference(schema, OpType.INSERT, row)
    assert fast.value.code == tablet_pb2.RowErrorPB.INVALID_ROW
    # One byte less is a key the fast path packs itself.
    shorter = {**row, "s": row["s"][:-1]} if row["s"] else {**row, "b": row["b"][:-1]}
    assert row_packer(schema).pack(OpType.INSERT, shorter) == encode_row_block(
        schema, [(OpType.INSERT, shorter)]
    )
