"""Reads on a real 3-server cluster with ``--leader_read_mode=lease``: bounded-staleness
follower reads (``min_index`` = a write's ``op_index``) always see the write, from every
follower; leader reads under the lease see every acknowledged write, and the lease serves
them (counted on the leader's status page)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raftlet.client import Client, InvalidArgument, Predicate, ReadMode
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


def test_a_follower_scan_of_the_table_with_each_tablets_index_sees_every_write(
    cluster: TserverCluster, client: Client
) -> None:
    """A Raft index is one tablet's: a whole-table scan bounded per tablet by the writes'
    results sees every one of them from any replica.  One index for every tablet once
    made the tablets with shorter logs wait out every replica and the scan time out: it is
    refused before any call now."""
    session = client.new_session()
    bounds: dict[str, int] = {}
    keys = range(2000, 2040)
    for key in keys:
        result = session.insert("kv", {"key": key, "value": "b"})
        assert result is not None
        assert result.tablet_id == cluster.tablet_for_key(key)
        bounds[result.tablet_id] = max(bounds.get(result.tablet_id, 0), result.op_index)
    session.close()
    assert len(bounds) == 2  # the keys landed in both tablets
    rows = client.scan(
        "kv",
        predicates=[Predicate.range("key", keys.start, keys.stop)],
        read_mode=ReadMode.FOLLOWER_APPLIED,
        min_index=bounds,
    )
    assert sorted(r["key"] for r in rows) == list(keys)
    with pytest.raises(InvalidArgument, match="visits 2 tablets"):
        client.scan("kv", read_mode=ReadMode.FOLLOWER_APPLIED, min_index=max(bounds.values()))


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
