"""Shared fixtures-by-function for the tablet store tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
