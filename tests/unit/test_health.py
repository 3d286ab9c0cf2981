"""``client.health``'s verdict on a tablet's replicas from what their servers list."""

from __future__ import annotations

import pytest

from raftlet.client import health
from raftlet.proto import tablet_pb2
from raftlet.proto.consensus_pb2 import RaftRole
from tests.unit.health_fakes import IDS, checked


def _listed(node: str, **status: int) -> tablet_pb2.ListTabletsResponse:
    leader = status.pop("leader", 0)
    response = tablet_pb2.ListTabletsResponse(server_uuid=node)
    response.tablets.add(
        tablet_id="kv-p0",
        table_name="kv",
        role=RaftRole.LEADER if leader else RaftRole.FOLLOWER,
        term=2,
        leader_uuid="a",
        leader_ready=True,
        voters=IDS,
        **status,
    )
    return response


@pytest.mark.parametrize(
    ("applied", "applying", "lag", "state"),
    [
        (0, 150, 0, "OK"),  # holds all it has not applied: replicated, not behind
        (40, 50, 100, "OK"),  # at the tolerance
        (10, 30, 120, "LAGGING"),  # behind by more than what is on its way
        (30, 0, 120, "LAGGING"),  # nothing on its way (a failed replica reports 0)
        (150, 0, 0, "OK"),
    ],
)
def test_lag_counts_from_what_is_on_its_way_into_a_replicas_store(
    monkeypatch: pytest.MonkeyPatch, applied: int, applying: int, lag: int, state: str
) -> None:
    listed = {
        "a": _listed("a", leader=1, commit_index=150, applied_index=150),
        "b": _listed("b", commit_index=150, applied_index=applied, applying_index=applying),
        "c": _listed("c", commit_index=150, applied_index=150),
    }
    verdict = checked(listed, 100, monkeypatch)
    b = next(r for r in verdict.tablets[0].replicas if r.server == "b")
    assert (b.state, b.lag) == (state, lag)
    if state == "OK":
        assert verdict.severity is health.Severity.OK, verdict.issues
    else:
        assert verdict.severity is health.Severity.WARN
        on_its_way = f", applying to {applying}" if applying > applied else ""
        assert verdict.issues == [
            f"kv-p0: replica on b lags the leader by 120 entries "
            f"(applied {applied}{on_its_way}, leader committed 150)"
        ]
