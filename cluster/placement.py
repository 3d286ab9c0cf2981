"""Where each tablet lives: a pure function of the server ids and the tables.

Every server and every client derives the same placement from the config, so there is no
master. Tablet ``<table>-p<partition>`` gets ``replication_factor`` consecutive servers of the
ring of servers sorted by id, starting at ``(crc32(table name) + partition) % len(servers)``.
Consecutive partitions start one server further on, so replicas (and, since every replica is
equally likely to win an election, leaders) spread evenly; the per-table hash offset keeps
partition 0 of every table from landing on the same servers. CRC-32, never ``hash()``, which
is salted per process. Sorting by id makes the order of ``[[servers]]`` in the file
irrelevant. ``tests/unit/test_cluster_config.py`` pins a golden placement: changing this
function re-homes every tablet of every existing cluster.

The placement is where each tablet *starts*: a replica directory records its membership
when it is created, and from then on that membership (changed at run time, one server at a
time: ``consensus.core.membership``, ``raftlet tablet move-replica``) is authoritative.
Adding or removing a ``[[servers]]`` entry changes the placement of tablets whose replicas
exist already, so a server makes replicas from the placement only for tables new to it,
and a server new to a running cluster none for groups that run without it
(``TabletServer._tablets_to_open``): a new server starts empty, and replicas move onto it
by membership changes.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raftlet.cluster.model import TableConfig

__all__ = ["TabletPlacement", "place", "tablet_id"]


def tablet_id(table: str, partition: int) -> str:
    """The id of partition ``partition`` of ``table``: ``<table>-p<partition>``.

    Unique across tables: the suffix after the last ``-p`` is all digits, so the table name
    and partition can be read back unambiguously even if the table name contains ``-p``.
    """
    return f"{table}-p{partition}"


@dataclass(frozen=True, slots=True)
class TabletPlacement:
    """Where one tablet lives. ``replicas`` are server ids, sorted: the Raft voters, in the
    same order on every server (the order carries no meaning, e.g. no preferred leader)."""

    tablet_id: str
    table: str
    partition: int
    replicas: tuple[str, ...]


def place(server_ids: Iterable[str], tables: Iterable[TableConfig]) -> list[TabletPlacement]:
    """Every tablet of ``tables`` and its replicas, tables in the order given, partitions
    ascending (see the module docstring for the rule)."""
    ring = sorted(server_ids)
    n = len(ring)
    out: list[TabletPlacement] = []
    for t in tables:
        base = zlib.crc32(t.name.encode("utf-8"))
        for p in range(t.partitions):
            start = (base + p) % n
            chosen = sorted(ring[(start + i) % n] for i in range(t.replication_factor))
            out.append(TabletPlacement(tablet_id(t.name, p), t.name, p, tuple(chosen)))
    return out
