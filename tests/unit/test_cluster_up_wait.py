"""`cluster up`'s wait for leaders: when none comes in time, what it says."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from raftlet.client.health import ClusterHealth, ServerHealth, Severity, TabletHealth
from raftlet.deploy.local import LauncherError, LocalCluster


def test_no_leader_in_time_names_the_servers_the_check_could_not_ask() -> None:
    """With certificates the check's connections refused, `cluster up` said only "no ready
    leader" -- the leaders were there; the check could not ask."""
    health = ClusterHealth(
        "c1",
        [
            ServerHealth("ts1", "a:1", "a:2", "UP"),
            ServerHealth("ts2", "b:1", "b:2", "DOWN", error="UNAVAILABLE: certificate has expired"),
        ],
        [TabletHealth("kv-p0", "kv", 0, [])],
        [],
        Severity.ERROR,
    )
    cluster = SimpleNamespace(health=lambda _options: health, data_dir="/d/c1")
    with pytest.raises(LauncherError) as failed:
        LocalCluster.wait_leaders(cluster, timeout=0)  # type: ignore[arg-type]
    assert "no ready leader within 0 s for kv-p0; ts2 did not answer the check: " in str(
        failed.value
    )
    assert "certificate has expired" in str(failed.value)
