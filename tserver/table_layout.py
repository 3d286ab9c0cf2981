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

A table new to this server is checked against the servers that answer first
(``check_new_tables``): a rolling restart that adds a table passes through servers on two
configs, and one whose config gave the table another schema made its replicas with it --
the others' entries, read by that schema, were stored as other values, in silence. Such a
server now refuses to start, naming the servers it disagrees with, and records nothing.
(Should replicas of one tablet end up on two schemas all the same -- a table recorded by an
older version -- each write's log entry carries its leader's schema fingerprint, and a
replica of another schema fails rather than apply it: ``tserver.bootstrap``.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import grpc

from raftlet.cluster import TableConfig
from raftlet.cluster.placement import tablet_id
from raftlet.consensus.log.segment import replace_durably
from raftlet.proto import tablet_pb2
from raftlet.schema.schema import Schema, SchemaError

__all__ = [
    "TABLES_FILE",
    "LayoutMismatch",
    "check_new_tables",
    "check_table_layout",
    "peer_configs",
    "record_table_layout",
]

TABLES_FILE = "tables.json"

logger = logging.getLogger(__name__)


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
    read.

    A table of which this server holds no replica (none made, or all deleted) has no rows
    here to misread: its record is dropped instead, and the table is new to the server
    again -- checked against its peers (``check_new_tables``). That is the way out for a
    server whose record is the odd one: its replicas removed (``raftlet tablet
    remove-replica``), the config its peers run starts it."""
    path = data_dir / TABLES_FILE
    recorded = _recorded(path)
    forgotten = []
    for table in tables:
        was = recorded.get(table.name)
        if not isinstance(was, dict):
            continue
        partitions = was.get("partitions")
        if partitions == table.partitions and was.get("schema") == table.schema.describe():
            continue
        if not _replicas_of(data_dir, table.name, partitions):
            forgotten.append(table.name)
            continue
        remedy = (
            " (or, if it is this server's record that is the odd one -- its peers run this "
            "config -- remove its replicas of the table first, running its old config: "
            f"`raftlet tablet remove-replica {table.name}-pN SERVER --wait` for each; then "
            "this config starts it, and `add-replica` makes them again)"
        )
        if partitions != table.partitions:
            raise LayoutMismatch(
                f"table {table.name!r}: the config says {table.partitions} partitions, but "
                f"its replicas here were made for {partitions}; a table's "
                "partitioning cannot change under its rows (they would be sought in other "
                f"tablets): put partitions = {partitions} back{remedy}"
            )
        raise LayoutMismatch(
            f"table {table.name!r}: the config's schema ({table.schema.describe()}) is not "
            f"the one its replicas here were made with ({was.get('schema')}); a schema "
            f"cannot change: put it back{remedy}"
        )
    if forgotten:
        for name in forgotten:
            logger.warning(
                "table %r: recorded here as %s, the config has it otherwise; this server "
                "holds no replica of it, so it is taken as new to this server",
                name,
                recorded.pop(name),
            )
        replace_durably(path, json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    return frozenset(recorded)


def _replicas_of(data_dir: Path, table: str, partitions: object) -> list[str]:
    """The tablets of ``table`` with a replica (not deleted) in ``data_dir``."""
    count = partitions if isinstance(partitions, int) else 0
    return [
        tid
        for tid in (tablet_id(table, p) for p in range(count))
        if (data_dir / tid).is_dir() and not (data_dir / tid / "tombstone").exists()
    ]


class ConfigSource(Protocol):
    """A peer's tablet service, as much of it as ``peer_configs`` asks."""

    def get_cluster_config(self, timeout: float) -> tablet_pb2.GetClusterConfigResponse: ...


# What a peer of an older release answers a server that asks for its config: a release
# whose servers could not ask refuses a server's certificate; one before GetClusterConfig
# knows no such method.
_OLDER_RELEASE = {
    grpc.StatusCode.PERMISSION_DENIED: "refused to show this server its cluster config",
    grpc.StatusCode.UNIMPLEMENTED: "does not know the cluster-config call",
}


def peer_configs(
    peers: Mapping[str, ConfigSource], timeout_s: float
) -> dict[str, tablet_pb2.GetClusterConfigResponse]:
    """The cluster config of each of ``peers`` (server id to its service) that answers within
    ``timeout_s``; one that is down or busy is left out, and one of an older release is left
    out with a warning -- where the check once passed in silence (review r28a)."""
    answers = {}
    for sid, peer in peers.items():
        try:
            answers[sid] = peer.get_cluster_config(timeout_s)
        except grpc.RpcError as e:
            said = _OLDER_RELEASE.get(e.code())
            if said is not None:
                logger.warning(
                    "%s %s (an older release?): the schemas of tables new to this server "
                    "are not compared with %s's",
                    sid,
                    said,
                    sid,
                )
    return answers


def check_new_tables(
    tables: Sequence[TableConfig], peers: Mapping[str, tablet_pb2.GetClusterConfigResponse]
) -> None:
    """Refuse (``LayoutMismatch``) to make replicas of ``tables`` -- new to this server --
    with another schema or partitioning than a peer that answered (``peers``: server id to
    its config) has for the same table."""
    for table in tables:
        differ: dict[str, str] = {}
        for sid, config in sorted(peers.items()):
            theirs = next((t for t in config.tables if t.name == table.name), None)
            if theirs is None:
                continue
            try:
                schema = Schema.from_pb(theirs.schema)
            except SchemaError:
                continue  # a schema this version cannot read: not this check's to judge
            if schema.fingerprint != table.schema.fingerprint:
                differ[sid] = f"schema ({schema.describe()})"
            elif theirs.num_partitions != table.partitions:
                differ[sid] = f"{theirs.num_partitions} partitions"
        if differ:
            said = "; ".join(f"{sid} has {what}" for sid, what in differ.items())
            raise LayoutMismatch(
                f"table {table.name!r} is new to this server, and its config gives it "
                f"schema ({table.schema.describe()}) in {table.partitions} partitions, but "
                f"{said}: the servers of a cluster must agree on a table (replicas read one "
                "another's rows by it); make this server's cluster.toml agree with theirs"
            )


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
