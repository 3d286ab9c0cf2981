"""``cluster.digest``: what makes two servers' configs differ, and what does not."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from raftlet.cluster import ClusterConfig, RaftTimings, TableConfig
from raftlet.cluster.digest import SECTIONS, config_digests
from tests.unit.test_cluster_config import KEY_ONLY, cluster, servers


def _differ(a: ClusterConfig, b: ClusterConfig) -> set[str]:
    da, db = config_digests(a), config_digests(b)
    assert set(da) == set(db) == set(SECTIONS)
    return {k for k in da if da[k] != db[k]}


def test_what_is_each_servers_own_or_only_order_does_not_count() -> None:
    base = cluster(3, ("kv", 2, 3), ("logs", 1, 1))
    elsewhere = dataclasses.replace(base, servers=servers(3, Path("/other")))
    reordered = dataclasses.replace(
        base, servers=tuple(reversed(base.servers)), tables=tuple(reversed(base.tables))
    )
    same_number = dataclasses.replace(base, raft=RaftTimings(tick_interval_ms=100.0))
    assert _differ(base, elsewhere) == set()
    assert _differ(base, reordered) == set()
    assert _differ(base, same_number) == set()  # 100 in one file, 100.0 in another


def test_each_shared_part_is_its_own_digest() -> None:
    base = cluster(3, ("kv", 2, 3))
    assert _differ(base, dataclasses.replace(base, raft=RaftTimings(heartbeat_ticks=2))) == {"raft"}
    assert _differ(base, dataclasses.replace(base, name="other")) == {"name"}
    assert _differ(base, cluster(4, ("kv", 2, 3))) == {"servers"}
    assert _differ(base, cluster(3, ("kv", 4, 3))) == {"tables"}
    more = dataclasses.replace(base, tables=(*base.tables, TableConfig("t2", KEY_ONLY, 1, 1)))
    assert _differ(base, more) == {"tables"}
    first = dataclasses.replace(base.servers[0], rpc_addr="127.0.0.1:9")
    moved = dataclasses.replace(base, servers=(first, *base.servers[1:]))
    assert _differ(base, moved) == {"servers"}


def test_the_timings_a_server_runs_with_count_not_the_files() -> None:
    base = cluster(3, ("kv", 2, 3))
    flags = RaftTimings(election_ticks=40)  # --election_ticks 40 on one server
    assert config_digests(base, flags)["raft"] != config_digests(base)["raft"]
    assert config_digests(base, base.raft) == config_digests(base)
