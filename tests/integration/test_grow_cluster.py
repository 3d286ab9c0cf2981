"""Servers added to cluster.toml of a cluster that holds rows (down, edit, up): adding them
moves every table's placement, and the replicas the new placement asked for -- empty ones
on the old servers, and on the new servers, two of which are a majority of a three-server
placement -- formed groups of their own, which elected leaders, hid acknowledged rows and
took new writes beside the real groups. Now a table that existed gets no replica from the
placement: the new servers start empty, every row stays, and replicas move onto them by
membership changes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raftlet.client import Client
from raftlet.client.health import check_cluster
from tests.integration.tserver_cluster import Server, TserverCluster, running_cluster, wait_for

pytestmark = pytest.mark.integration

ROWS = 400


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TserverCluster]:
    with running_cluster(tmp_path_factory.mktemp("grow"), partitions=8) as c:
        c.wait_leaders()
        yield c


def _keys(cluster: TserverCluster) -> set[int]:
    with Client([s.rpc_addr for s in cluster.config.servers], timeout_s=30.0) as c:
        return {int(str(r["key"])) for r in c.scan("kv", ["key"])}


def _hosted(server: Server) -> set[str]:
    return set(server.list_tablets())


def test_servers_added_to_the_config_start_empty_and_every_row_stays(
    cluster: TserverCluster,
) -> None:
    with Client([s.rpc_addr for s in cluster.config.servers], timeout_s=30.0) as c:
        session = c.new_session()
        for key in range(ROWS):
            session.insert("kv", {"key": key, "value": "v"})
        session.flush()
    before = {sid: _hosted(s) for sid, s in cluster.servers.items()}
    cluster.stop()

    was = {p.tablet_id: p.replicas for p in cluster.config.placements()}
    cluster.add_servers(2)
    assert {p.tablet_id: p.replicas for p in cluster.config.placements()} != was  # moved
    cluster.start()

    cluster.wait_leaders()
    assert {sid: _hosted(cluster.servers[sid]) for sid in before} == before
    assert _hosted(cluster.servers["ts4"]) == _hosted(cluster.servers["ts5"]) == set()
    assert _keys(cluster) == set(range(ROWS))
    wait_for(lambda: check_cluster(cluster.config).ok, 30, "status OK on the grown cluster")
