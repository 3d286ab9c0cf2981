"""Schemas: validation rules and the SchemaPB round trip."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from raftlet.proto import tablet_pb2
from raftlet.schema.schema import (
    MAX_COLUMN_NAME_LENGTH,
    MAX_COLUMNS,
    ColumnSchema,
    Schema,
    SchemaError,
)
from raftlet.schema.types import DataType

I64 = DataType.INT64


def key(name: str, dtype: DataType = I64) -> ColumnSchema:
    return ColumnSchema(name, dtype, is_key=True)


def col(name: str, dtype: DataType = I64, nullable: bool = True) -> ColumnSchema:
    return ColumnSchema(name, dtype, nullable=nullable)


def test_valid_schema_and_accessors() -> None:
    s = Schema([key("tenant", DataType.STRING), key("id"), col("v", DataType.DOUBLE), col("n")])
    assert s.num_key_columns == 2
    assert [c.name for c in s.key_columns] == ["tenant", "id"]
    assert s.column_names == ("tenant", "id", "v", "n")
    assert s.index_of("v") == 2
    assert s.column("n").nullable
    assert s.has_column("id")
    assert not s.has_column("ID")
    assert len(s) == 4
    assert [c.name for c in s] == list(s.column_names)
    assert "tenant STRING KEY" in s.describe()
    with pytest.raises(SchemaError, match="unknown column 'nope'"):
        s.index_of("nope")


def test_pb_round_trip_and_equality() -> None:
    keys = [key(f"k_{t.name}", t) for t in DataType]
    s = Schema(keys + [col(f"c_{t.name}", t) for t in DataType])
    wire = s.to_pb().SerializeToString()
    back = Schema.from_pb(tablet_pb2.SchemaPB.FromString(wire))
    assert back == s
    assert hash(back) == hash(s)
    assert back != Schema([key("k_INT8", DataType.INT8)])


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ([], "at least one column"),
        ([col("a")], "at least one key column"),
        ([key("a"), col("b"), key("c")], "key columns must come first.*'b'"),
        ([ColumnSchema("a", I64, nullable=True, is_key=True)], "key column 'a' cannot be nullable"),
        ([key("a"), col("a")], "duplicate column name 'a'"),
        ([key("Id"), col("id")], "duplicate column name 'id'.*'Id'.*ignoring case"),
        ([key("1abc")], "not an identifier"),
        ([key("has space")], "not an identifier"),
        ([key('quo"te')], "not an identifier"),
        ([key("")], "not an identifier"),
        ([key("naïve")], "not an identifier"),
        ([key("a" * (MAX_COLUMN_NAME_LENGTH + 1))], "longer than"),
        ([ColumnSchema("a", 4, is_key=True)], "unknown data type"),  # type: ignore[arg-type]
    ],
)
def test_invalid_schemas_are_rejected_clearly(columns: list[ColumnSchema], message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        Schema(columns)


def test_max_length_name_and_underscores_are_fine() -> None:
    Schema([key("_" + "a" * (MAX_COLUMN_NAME_LENGTH - 1)), col("_x9")])


def test_unknown_type_in_pb_is_a_schema_error() -> None:
    pb = tablet_pb2.SchemaPB(columns=[tablet_pb2.ColumnSchemaPB(name="a", is_key=True)])
    with pytest.raises(SchemaError, match="column 'a': unknown data type 0"):
        Schema.from_pb(pb)
    pb.columns[0].type = 99  # type: ignore[assignment]
    with pytest.raises(SchemaError, match="unknown data type 99"):
        Schema.from_pb(pb)


def test_schema_error_is_a_value_error() -> None:
    assert issubclass(SchemaError, ValueError)


def test_a_schema_holds_no_more_columns_than_the_store() -> None:
    """2001 columns passed validation, then every replica of the table FAILED for good
    ("too many columns on tablet_rows": SQLite's SQLITE_MAX_COLUMN is 2000)."""
    cols = [key("k"), *(col(f"c{i}") for i in range(MAX_COLUMNS - 1))]
    assert len(Schema(cols)) == MAX_COLUMNS == 2000
    with pytest.raises(SchemaError, match=rf"at most {MAX_COLUMNS} columns.*has {MAX_COLUMNS + 1}"):
        Schema([*cols, col("one_more")])


def test_the_widest_schema_is_a_table_the_store_can_create(tmp_path: Path) -> None:
    """MAX_COLUMNS is the store's own bound, not a guess: the widest schema opens, writes
    and scans, and one column more is what SQLite refuses."""
    from raftlet.tserver.store import TabletStore
    from raftlet.tserver.store.sql import SqlBuilder
    from tests.unit.store_helpers import insert

    schema = Schema([key("k"), *(col(f"c{i}") for i in range(MAX_COLUMNS - 1))])
    row = {c.name: i for i, c in enumerate(schema.columns)}
    with TabletStore.open(tmp_path / "t.db", schema) as store:
        store.apply_batch([(1, 1, insert(schema, row))])
        assert store.scan().rows == [tuple(range(MAX_COLUMNS))]
    wider = (
        SqlBuilder(schema).create_table().replace("PRIMARY KEY", '"one_more" INTEGER, PRIMARY KEY')
    )
    conn = sqlite3.connect(":memory:")
    try:
        with pytest.raises(sqlite3.OperationalError, match="too many columns"):
            conn.execute(wider)
    finally:
        conn.close()
