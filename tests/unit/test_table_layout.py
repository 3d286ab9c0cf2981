"""A table's partitioning and schema, recorded where its replicas are, refuse a config that
changes them: 4 partitions edited to 8 made half the keys invisible and let an insert write a
second row for an existing key, and `ksck --checksum` said OK."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from raftlet.cluster import TableConfig
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from raftlet.tserver.table_layout import TABLES_FILE, LayoutMismatch, check_table_layout

KV = TableConfig(
    "kv",
    Schema(
        [
            ColumnSchema("key", DataType.INT64, is_key=True),
            ColumnSchema("value", DataType.STRING, nullable=True),
        ]
    ),
    partitions=4,
    replication_factor=3,
)


def test_the_first_start_records_the_tables_and_the_same_config_passes(tmp_path: Path) -> None:
    check_table_layout(tmp_path, [KV])
    recorded = (tmp_path / TABLES_FILE).read_text()
    assert '"partitions": 4' in recorded
    check_table_layout(tmp_path, [KV])
    assert (tmp_path / TABLES_FILE).read_text() == recorded


def test_a_table_repartitioned_or_reshaped_is_refused(tmp_path: Path) -> None:
    check_table_layout(tmp_path, [KV])
    with pytest.raises(
        LayoutMismatch, match="says 8 partitions, but its replicas here were made for 4"
    ):
        check_table_layout(tmp_path, [dataclasses.replace(KV, partitions=8)])
    wider = Schema([*KV.schema.columns, ColumnSchema("n", DataType.INT32, nullable=True)])
    with pytest.raises(LayoutMismatch, match="a schema cannot change"):
        check_table_layout(tmp_path, [dataclasses.replace(KV, schema=wider)])


def test_tables_added_are_recorded_and_removed_ones_stay(tmp_path: Path) -> None:
    check_table_layout(tmp_path, [KV])
    other = dataclasses.replace(KV, name="events", partitions=2)
    check_table_layout(tmp_path, [KV, other])
    check_table_layout(tmp_path, [other])  # kv left the config
    # ... and cannot come back partitioned otherwise.
    with pytest.raises(LayoutMismatch, match="'kv'"):
        check_table_layout(tmp_path, [dataclasses.replace(KV, partitions=2), other])
