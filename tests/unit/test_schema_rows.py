"""Row operations: decoding with per-row errors, client-side encoding, scan rows."""

from __future__ import annotations

import pytest

from raftlet.proto import tablet_pb2
from raftlet.schema.rows import (
    ErrorCode,
    OpType,
    RowFailure,
    RowOp,
    RowOpError,
    decode_row_op,
    decode_row_ops,
    encode_row_op,
    row_from_pb,
    row_to_pb,
)
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType

S = Schema(
    [
        ColumnSchema("tenant", DataType.STRING, is_key=True),
        ColumnSchema("id", DataType.INT32, is_key=True),
        ColumnSchema("name", DataType.STRING),  # NOT NULL
        ColumnSchema("score", DataType.FLOAT, nullable=True),
        ColumnSchema("flag", DataType.BOOL, nullable=True),
    ]
)
Op = tablet_pb2.RowOperationPB


def cell(column: str, **value: object) -> tablet_pb2.CellPB:
    return tablet_pb2.CellPB(column=column, value=tablet_pb2.ValuePB(**value))  # type: ignore[arg-type]


def op(op_type: int, *cells: tablet_pb2.CellPB) -> tablet_pb2.RowOperationPB:
    return Op(type=op_type, cells=cells)  # type: ignore[arg-type]


KEY = (cell("tenant", string_value="t"), cell("id", int_value=7))


def test_decode_each_op_type() -> None:
    ins = decode_row_op(S, op(Op.INSERT, *KEY, cell("name", string_value="n")), 3)
    assert ins == RowOp(OpType.INSERT, ("t", 7), {"name": "n"}, row_index=3)
    ups = decode_row_op(
        S, op(Op.UPSERT, cell("score", float_value=0.5), *KEY, cell("name", string_value="n"))
    )
    # Values come out in schema order whatever the cell order.
    assert list(ups.values) == ["name", "score"]
    upd = decode_row_op(S, op(Op.UPDATE, *KEY, cell("flag", null_value=True)))
    assert upd.type is OpType.UPDATE
    assert upd.values == {"flag": None}
    dele = decode_row_op(S, op(Op.DELETE, *KEY))
    assert dele == RowOp(OpType.DELETE, ("t", 7), {})


@pytest.mark.parametrize(
    ("row", "code", "message"),
    [
        (op(0, *KEY), ErrorCode.INVALID_ROW, "unknown operation type 0"),
        (op(9, *KEY), ErrorCode.INVALID_ROW, "unknown operation type 9"),
        (op(Op.DELETE, *KEY, cell("nope", int_value=1)), ErrorCode.UNKNOWN_COLUMN, "'nope'"),
        (op(Op.DELETE, *KEY, cell("ID", int_value=1)), ErrorCode.UNKNOWN_COLUMN, "'ID'"),
        (op(Op.DELETE, *KEY, cell("id", int_value=8)), ErrorCode.INVALID_ROW, "'id' given twice"),
        (
            op(Op.DELETE, cell("tenant", int_value=1), KEY[1]),
            ErrorCode.TYPE_MISMATCH,
            "'tenant': STRING travels as string_value, got int_value",
        ),
        (
            op(Op.DELETE, KEY[0], cell("id", int_value=2**31)),
            ErrorCode.TYPE_MISMATCH,
            "'id': 2147483648 is out of range for INT32",
        ),
        (
            op(Op.DELETE, KEY[0], cell("id", null_value=True)),
            ErrorCode.NULL_NOT_ALLOWED,
            "'id' is not nullable",
        ),
        (
            op(Op.UPDATE, *KEY, cell("name", null_value=True)),
            ErrorCode.NULL_NOT_ALLOWED,
            "'name' is not nullable",
        ),
        (op(Op.DELETE, KEY[0]), ErrorCode.MISSING_KEY_COLUMN, "key column 'id' not given"),
        (op(Op.INSERT, KEY[1]), ErrorCode.MISSING_KEY_COLUMN, "key column 'tenant' not given"),
        # A cell with no value member set means "not given".
        (op(Op.DELETE, KEY[0], cell("id")), ErrorCode.MISSING_KEY_COLUMN, "'id' not given"),
        (
            op(Op.DELETE, *KEY, cell("flag", bool_value=True)),
            ErrorCode.INVALID_ROW,
            "DELETE takes only key columns, got 'flag'",
        ),
        (op(Op.UPDATE, *KEY), ErrorCode.INVALID_ROW, "UPDATE changes no column"),
        (
            op(Op.INSERT, *KEY, cell("score", float_value=1.0)),
            ErrorCode.NULL_NOT_ALLOWED,
            "INSERT gives no value for non-nullable column 'name'",
        ),
        (
            op(Op.UPSERT, *KEY),
            ErrorCode.NULL_NOT_ALLOWED,
            "UPSERT gives no value for non-nullable column 'name'",
        ),
    ],
)
def test_per_row_errors(row: tablet_pb2.RowOperationPB, code: int, message: str) -> None:
    with pytest.raises(RowOpError, match=message) as exc:
        decode_row_op(S, row)
    assert exc.value.code == code


def test_unset_value_cells_are_ignored_and_nullable_columns_may_be_omitted() -> None:
    row = decode_row_op(S, op(Op.INSERT, *KEY, cell("name", string_value="n"), cell("score")))
    assert row.values == {"name": "n"}


def test_decode_row_ops_keeps_good_rows_and_reports_bad_ones_by_index() -> None:
    ops = [
        op(Op.DELETE, *KEY),
        op(Op.UPDATE, *KEY),
        op(Op.DELETE, *KEY, cell("x", int_value=1)),
        op(Op.INSERT, *KEY, cell("name", string_value="n")),
    ]
    good, errors = decode_row_ops(S, ops)
    assert [r.row_index for r in good] == [0, 3]
    assert [(e.row_index, e.code) for e in errors] == [
        (1, ErrorCode.INVALID_ROW),
        (2, ErrorCode.UNKNOWN_COLUMN),
    ]
    pb = errors[1].to_pb()
    assert pb.row_index == 2
    assert pb.code == tablet_pb2.RowErrorPB.UNKNOWN_COLUMN
    assert "'x'" in pb.message
    assert errors[1].code_name == "UNKNOWN_COLUMN"


def test_encode_row_op_round_trips_and_validates_like_the_server() -> None:
    row = {"tenant": "t", "id": 7, "name": "n", "score": 0.1, "flag": None}
    pb = encode_row_op(S, OpType.INSERT, row)
    wire = Op.FromString(pb.SerializeToString())
    decoded = decode_row_op(S, wire)
    assert decoded.key == ("t", 7)
    assert decoded.values["score"] == pytest.approx(0.1, rel=1e-7)
    assert decoded.values["flag"] is None
    with pytest.raises(RowOpError, match="unknown column 'zzz'") as exc:
        encode_row_op(S, OpType.INSERT, {**row, "zzz": 1})
    assert exc.value.code == ErrorCode.UNKNOWN_COLUMN
    with pytest.raises(RowOpError, match="'id': INT32 needs an int") as exc:
        encode_row_op(S, OpType.INSERT, {**row, "id": "7"})
    assert exc.value.code == ErrorCode.TYPE_MISMATCH
    with pytest.raises(RowOpError, match="UPDATE changes no column"):
        encode_row_op(S, OpType.UPDATE, {"tenant": "t", "id": 1})
    assert encode_row_op(S, OpType.DELETE, {"tenant": "t", "id": 1}).type == Op.DELETE


def test_scan_rows_round_trip() -> None:
    columns = ["flag", "id", "score", "name"]
    row = (None, -5, 0.25, "ü")
    pb = tablet_pb2.RowPB.FromString(row_to_pb(S, columns, row).SerializeToString())
    assert row_from_pb(S, columns, pb) == row
    with pytest.raises(ValueError, match="2 columns but 1 values"):
        row_to_pb(S, ["id", "name"], (1,))
    with pytest.raises(ValueError, match="1 columns but 4 values"):
        row_from_pb(S, ["id"], pb)


def test_row_error_is_plain_data() -> None:
    e = RowFailure(4, ErrorCode.KEY_EXISTS, "key present")
    assert e.code_name == "KEY_EXISTS"
    assert e.to_pb().message == "key present"
