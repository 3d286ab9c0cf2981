"""The tables a data directory's replicas were made for, kept beside them: a table's
partitioning and schema cannot change under its rows.

A row lives in the tablet its key hashes to among the table's partitions
(``schema.partition``). A cluster.toml edited from 4 partitions to 8 between `cluster down`
and `cluster up` was taken as it was: about half the existing keys were then sought in
tablets that never held them -- point reads found nothing, inserts of existing keys
succeeded, so one key had two rows, and `ksck --checksum` said OK. A schema edit failed
every replica at open and had the repair loop copy the tablets again and again. So the
server writes down, in ``tables.json`` at the top of its data directory, each table's
partition count and schema as its replicas were made, and refuses to start (exit 2, one
line) on a config that says otherwise. A table added to the config is added to the record;
one removed from it stays recorded, so it cannot come back partitioned differently.

The record also tells a table new to this server from one it has served: only a new
table's placed replicas are made from the placement (``TabletServer._tablets_to_open``).
Adding or removing servers moves the placement of every table, and replicas made for a
table that existed already formed groups of their own -- two new servers elected a leader
among their empty replicas and took writes beside the real group.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from raftlet.cluster import TableConfig
from raftlet.consensus.log.segment import replace_durably

__all__ = ["TABLES_FILE", "LayoutMismatch", "check_table_layout", "record_table_layout"]

TABLES_FILE = "tables.json"


class LayoutMismatch(Exception):
    """The config partitions or shapes a table otherwise than its replicas here were made."""


def _recorded(path: Path) -> dict[str, object]:
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise OSError(f"{path} cannot be read ({e}); move it aside and restart") from e
    if not isinstance(recorded, dict):
        raise OSError(f"{path} is not a record of tables; move it aside and restart")
    return recorded


def check_table_layout(data_dir: Path, tables: Sequence[TableConfig]) -> frozenset[str]:
    """Refuse (``LayoutMismatch``) a config whose tables differ from those recorded in
    ``data_dir``; the names of the tables recorded. ``OSError`` if the record cannot be
    read."""
    path = data_dir / TABLES_FILE
    recorded = _recorded(path)
    for table in tables:
        was = recorded.get(table.name)
        if not isinstance(was, dict):
            continue
        if was.get("partitions") != table.partitions:
            raise LayoutMismatch(
                f"table {table.name!r}: the config says {table.partitions} partitions, but "
                f"its replicas here were made for {was.get('partitions')}; a table's "
                "partitioning cannot change under its rows (they would be sought in other "
                f"tablets): put partitions = {was.get('partitions')} back"
            )
        if was.get("schema") != table.schema.describe():
            raise LayoutMismatch(
                f"table {table.name!r}: the config's schema ({table.schema.describe()}) is not "
                f"the one its replicas here were made with ({was.get('schema')}); a schema "
                "cannot change: put it back"
            )
    return frozenset(recorded)


def record_table_layout(data_dir: Path, tables: Sequence[TableConfig]) -> None:
    """Add the tables of ``tables`` not recorded in ``data_dir`` yet to its record -- once
    the replicas they place here are noted as being made, so a crash in between cannot
    leave a table recorded whose replicas were never made."""
    path = data_dir / TABLES_FILE
    recorded = _recorded(path)
    wanted = dict(recorded)
    for table in tables:
        wanted.setdefault(
            table.name, {"partitions": table.partitions, "schema": table.schema.describe()}
        )
    if wanted != recorded:
        replace_durably(path, json.dumps(wanted, indent=1, sort_keys=True) + "\n")
