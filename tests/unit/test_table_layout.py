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
from raftlet.tserver.table_layout import (
    TABLES_FILE,
    LayoutMismatch,
    check_table_layout,
    record_table_layout,
)

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


def start(data_dir: Path, tables: list[TableConfig]) -> frozenset[str]:
    """What a server start does: check, then (its replicas noted) record."""
    known = check_table_layout(data_dir, tables)
    record_table_layout(data_dir, tables)
    return known


def test_the_first_start_records_the_tables_and_the_same_config_passes(tmp_path: Path) -> None:
    assert start(tmp_path, [KV]) == frozenset()  # every table is new to a new server
    recorded = (tmp_path / TABLES_FILE).read_text()
    assert '"partitions": 4' in recorded
    assert start(tmp_path, [KV]) == {"kv"}
    assert (tmp_path / TABLES_FILE).read_text() == recorded


def test_checking_records_nothing_and_says_which_tables_were_known(tmp_path: Path) -> None:
    """A crash between the check and the record (before the new table's replicas were
    noted as being made) must leave the table unknown, or its replicas are never made."""
    assert check_table_layout(tmp_path, [KV]) == frozenset()
    assert not (tmp_path / TABLES_FILE).exists()
    start(tmp_path, [KV])
    other = dataclasses.replace(KV, name="events", partitions=2)
    assert check_table_layout(tmp_path, [KV, other]) == {"kv"}


def test_a_table_repartitioned_or_reshaped_is_refused(tmp_path: Path) -> None:
    start(tmp_path, [KV])
    (tmp_path / "kv-p2").mkdir()  # a replica of it here
    with pytest.raises(
        LayoutMismatch, match="says 8 partitions, but its replicas here were made for 4"
    ):
        check_table_layout(tmp_path, [dataclasses.replace(KV, partitions=8)])
    wider = Schema([*KV.schema.columns, ColumnSchema("n", DataType.INT32, nullable=True)])
    with pytest.raises(LayoutMismatch, match="a schema cannot change"):
        check_table_layout(tmp_path, [dataclasses.replace(KV, schema=wider)])


def test_tables_added_are_recorded_and_removed_ones_stay(tmp_path: Path) -> None:
    start(tmp_path, [KV])
    other = dataclasses.replace(KV, name="events", partitions=2)
    start(tmp_path, [KV, other])
    (tmp_path / "kv-p0").mkdir()
    assert start(tmp_path, [other]) == {"kv", "events"}  # kv left the config
    # ... and cannot come back partitioned otherwise.
    with pytest.raises(LayoutMismatch, match="'kv'"):
        check_table_layout(tmp_path, [dataclasses.replace(KV, partitions=2), other])


def test_a_table_with_no_replica_here_is_taken_as_new_when_the_config_changes_it(
    tmp_path: Path,
) -> None:
    """The way out for a server whose record is the odd one (its config gave a table
    another schema than its peers'): once its replicas of the table are removed, the
    config its peers run starts it. It once refused that for good ("put it back")."""
    start(tmp_path, [KV])
    (tmp_path / "kv-p1").mkdir()
    (tmp_path / "kv-p1" / "tombstone").touch()  # deleted (`tablet remove-replica`)
    wider = Schema([*KV.schema.columns, ColumnSchema("n", DataType.INT32, nullable=True)])
    changed = dataclasses.replace(KV, schema=wider)
    assert check_table_layout(tmp_path, [changed]) == frozenset()  # new to this server
    assert "kv" not in (tmp_path / TABLES_FILE).read_text()
    record_table_layout(tmp_path, [changed])
    assert start(tmp_path, [changed]) == {"kv"}
    (tmp_path / "kv-p3").mkdir()
    with pytest.raises(LayoutMismatch, match="remove its replicas of the table first") as e:
        check_table_layout(tmp_path, [KV])
    assert "`raftlet tablet remove-replica kv-pN SERVER --wait` for each" in str(e.value)
