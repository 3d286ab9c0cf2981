"""Reads on a real 3-server cluster with ``--leader_read_mode=lease``: bounded-staleness
follower reads (``min_index`` = a write's ``op_index``) always see the write, from every
follower; leader reads under the lease see every acknowledged write, and the lease serves
them (counted on the leader's status page)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raftlet.client import Client, Predicate, ReadMode
from tests.integration.tserver_cluster import TserverCluster, running_cluster, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TserverCluster]:
    root = tmp_path_factory.mktemp("reads")
    with running_cluster(root, partitions=2, flags=["--leader_read_mode=lease"]) as c:
        c.wait_leaders()
        yield c


@pytest.fixture
def client(cluster: TserverCluster) -> Iterator[Client]:
    with Client([s.rpc_addr for s in cluster.config.servers], timeout_s=30.0) as c:
        yield c


def test_a_follower_read_at_the_writes_op_index_always_sees_the_write(
    cluster: TserverCluster, client: Client
) -> None:
    session = client.new_session()
    for key in range(40):
        result = session.insert("kv", {"key": key, "value": f"v{key}"})
        assert result is not None
        tablet = cluster.tablet_for_key(key)
        leader = cluster.leaders()[tablet]
        for follower in (s for s in cluster.servers if s != leader):
            rows = list(
                client.scan_tablet(
                    tablet,
                    predicates=[Predicate.equals("key", key)],
                    read_mode=ReadMode.FOLLOWER_APPLIED,
                    replica=follower,
                    min_index=result.op_index,
                )
            )
            assert rows == [{"key": key, "value": f"v{key}"}], (key, follower)
    session.close()


def test_leader_reads_under_the_lease_see_every_acknowledged_write(
    cluster: TserverCluster, client: Client
) -> None:
    session = client.new_session()
    for key in range(1000, 1040):
        session.insert("kv", {"key": key, "value": "x"})
        rows = list(client.scan("kv", predicates=[Predicate.equals("key", key)]))
        assert rows == [{"key": key, "value": "x"}]
    session.close()

    def served(kind: str) -> int:
        return sum(int(t.get(kind, 0)) for s in cluster.servers.values() for t in s.tablets_json())

    # Every read is counted on its leader.  A read that finds the lease lapsed -- its ticker
    # ran late, or no heartbeat round came back in time, as on a loaded machine -- is
    # served by a ReadIndex round instead, rightly; most must be the lease's.
    wait_for(
        lambda: served("lease_reads") + served("read_index_reads") >= 40,
        what="the leaders' reads",
    )
    assert served("lease_reads") >= 20
