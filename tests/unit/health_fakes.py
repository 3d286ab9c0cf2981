"""``cluster status``'s verdict on a one-tablet cluster (``kv-p0`` on servers a, b, c) whose
servers answered ``ListTablets`` with given responses, no gRPC involved."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from raftlet.client import health
from raftlet.proto import tablet_pb2

IDS = ("a", "b", "c")
LAYOUT = SimpleNamespace(
    name="t",
    servers=[SimpleNamespace(id=n, rpc_addr=n, http_addr=n) for n in IDS],
    placements=lambda: [SimpleNamespace(tablet_id="kv-p0", table="kv", partition=0, replicas=IDS)],
)


def checked(
    listed: dict[str, tablet_pb2.ListTabletsResponse],
    max_lag: int,
    monkeypatch: pytest.MonkeyPatch,
) -> health.ClusterHealth:
    """The verdict on servers that answered ``listed`` (server id -> response)."""
    monkeypatch.setattr(
        health, "probe_servers", lambda *_a, **_k: {n: (r, "UP", "") for n, r in listed.items()}
    )
    return health.check_cluster(LAYOUT, health.ProbeOptions(max_lag=max_lag))
