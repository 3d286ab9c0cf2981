"""A server restarted on a copy of cluster.toml with other Raft timings: it runs, only not
as its peers expect, and the health check (``cluster status``) names it and what differs."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from raftlet.client.health import ClusterHealth, Severity, check_cluster
from raftlet.cluster import RaftTimings, write_cluster_config
from tests.integration.tserver_cluster import TserverCluster, running_cluster, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TserverCluster]:
    with running_cluster(tmp_path_factory.mktemp("agree"), partitions=1) as c:
        c.wait_leaders()
        yield c


def test_a_server_on_other_raft_timings_is_named_until_it_runs_the_shared_config(
    cluster: TserverCluster,
) -> None:
    wait_for(lambda: check_cluster(cluster.config).ok, 30, "the cluster healthy")
    raft = cluster.config.raft
    other = dataclasses.replace(
        cluster.config, raft=RaftTimings(raft.tick_interval_ms, raft.election_ticks * 2, 1)
    )
    stale = write_cluster_config(other, cluster.root / "stale.toml")
    ts3 = cluster.servers["ts3"]
    ts3.terminate()
    ts3.start(["--config", str(stale.path)])  # the last --config is the one taken
    seen: list[ClusterHealth] = []

    def ts3_differs() -> bool:
        seen[:] = [check_cluster(cluster.config)]
        return any(s.id == "ts3" and s.config_differs == ("raft",) for s in seen[0].servers)

    wait_for(ts3_differs, 30, "ts3 reported on another config")
    health = seen[0]
    assert health.severity >= Severity.WARN
    assert all(not s.config_differs for s in health.servers if s.id != "ts3")
    assert any(
        i.startswith("server ts3 runs another cluster config than ts1, ts2: its raft timings")
        for i in health.issues
    ), health.issues

    ts3.terminate()
    ts3.start()
    wait_for(lambda: check_cluster(cluster.config).ok, 30, "the cluster healthy again")
