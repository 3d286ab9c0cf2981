"""``client.health``'s verdict on a tablet's replicas from what their servers list."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from raftlet.client import health
from raftlet.proto import tablet_pb2
from raftlet.proto.consensus_pb2 import RaftRole
from tests.unit.health_fakes import IDS, LAYOUT, checked


def _listed(
    node: str,
    voters: tuple[str, ...] = IDS,
    learners: tuple[str, ...] = (),
    **status: int | str,
) -> tablet_pb2.ListTabletsResponse:
    leader = status.pop("leader", 0)
    status.setdefault("leader_ready", True)
    status.setdefault("leader_uuid", "a")
    response = tablet_pb2.ListTabletsResponse(server_uuid=node)
    response.tablets.add(
        tablet_id="kv-p0",
        table_name="kv",
        role=RaftRole.LEADER if leader else RaftRole.FOLLOWER,
        term=2,
        voters=voters,
        learners=learners,
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
        (251, 0, 0, "AHEAD"),  # past anything the leader committed: diverged
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
    elif state == "AHEAD":
        assert verdict.severity is health.Severity.WARN
        assert verdict.issues == [
            "kv-p0: replica on b applied 251, past the leader's commit 150: it holds entries "
            "the group does not (diverged)"
        ]
    else:
        assert verdict.severity is health.Severity.WARN
        on_its_way = f", applying to {applying}" if applying > applied else ""
        assert verdict.issues == [
            f"kv-p0: replica on b lags the leader by 120 entries "
            f"(applied {applied}{on_its_way}, leader committed 150)"
        ]


def test_a_failed_replica_is_reported_with_its_reason_and_counts_for_no_majority(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its server answers, so it was shown as a replica lagging (or even OK); it serves
    nothing and votes in no election: FAILED, with the reason its server gives."""
    listed = {
        "a": _listed("a", leader=1, commit_index=150, applied_index=150),
        "b": _listed(
            "b",
            state=tablet_pb2.TABLET_STATE_FAILED,
            failure_reason="StoreError: database disk image is malformed",
        ),
        "c": _listed("c", commit_index=150, applied_index=150),
    }
    verdict = checked(listed, 100, monkeypatch)
    (tablet,) = verdict.tablets
    assert [(r.server, r.state) for r in tablet.replicas] == [
        ("a", "OK"),
        ("b", "FAILED"),
        ("c", "OK"),
    ]
    assert verdict.severity is health.Severity.WARN
    assert verdict.issues == [
        "kv-p0: under-replicated: 2 of 3 replicas reachable",
        "kv-p0: replica on b is FAILED: StoreError: database disk image is malformed",
    ]


def test_a_learner_is_listed_and_flagged_until_promoted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A move that stopped half way leaves a learner: shown, not counted as a voter."""
    voters, learners = ("a", "b"), ("c",)
    listed = {
        "a": _listed("a", voters, learners, leader=1, commit_index=150, applied_index=150),
        "b": _listed("b", voters, learners, commit_index=150, applied_index=150),
        "c": _listed("c", voters, learners, commit_index=150, applied_index=150),
    }
    verdict = checked(listed, 100, monkeypatch)
    (tablet,) = verdict.tablets
    assert [(r.server, r.role) for r in tablet.replicas] == [
        ("a", "LEADER"),
        ("b", "FOLLOWER"),
        ("c", "LEARNER"),
    ]
    assert verdict.severity is health.Severity.WARN
    assert verdict.issues == [
        "kv-p0: c is a learner (added, not yet promoted to a voter)",
        "kv-p0: under-replicated: 2 voters, the table asks for 3",
    ]


def test_a_replica_outside_the_group_and_too_few_voters_are_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """c was removed while it was down: it still runs its replica, which no status listed
    (and which served stale follower reads); the group left has two voters where the table
    asks for three, which status called OK until the next failure stopped all writes."""
    listed = {
        "a": _listed("a", ("a", "b"), leader=1, commit_index=150, applied_index=150),
        "b": _listed("b", ("a", "b"), commit_index=150, applied_index=150),
        "c": _listed("c", commit_index=90, applied_index=90),  # its old membership
    }
    verdict = checked(listed, 100, monkeypatch)
    assert verdict.severity is health.Severity.WARN
    assert verdict.issues == [
        "kv-p0: c runs a replica that is no member of the group (removed while it was down?): "
        "`raftlet tablet remove-replica kv-p0 c` deletes it",
        "kv-p0: under-replicated: 2 voters, the table asks for 3",
    ]


def test_a_leader_not_ready_is_a_warning_that_says_what_lasting_means(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listed = {
        "a": _listed("a", leader=1, leader_ready=False, commit_index=9),
        "b": _listed("b", leader_ready=False, commit_index=9),
        "c": _listed("c", leader_ready=False, commit_index=9),
    }
    verdict = checked(listed, 100, monkeypatch)
    assert verdict.severity is health.Severity.WARN
    assert verdict.issues[0].startswith("kv-p0: leader a is elected but not ready yet")
    assert "cannot reach a majority" in verdict.issues[0]
    listed["a"] = _listed("a", leader_ready=False, commit_index=9)
    assert checked(listed, 100, monkeypatch).severity is health.Severity.ERROR


def test_a_busy_leader_that_its_followers_name_is_a_warning_not_no_leader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its tablet service queue is full, so it cannot list its replicas; the followers
    still name it in the current term, and writes go on (queued, or refused and retried)."""
    probes = {
        "a": (None, "BUSY", "RESOURCE_EXHAUSTED: service queue full"),
        "b": (_listed("b", commit_index=9), "UP", ""),
        "c": (_listed("c", commit_index=9), "UP", ""),
    }
    monkeypatch.setattr(health, "probe_servers", lambda *_a, **_k: probes)
    verdict = health.check_cluster(LAYOUT, health.ProbeOptions())
    assert verdict.severity is health.Severity.WARN
    (tablet,) = verdict.tablets
    assert (tablet.leader, tablet.term, tablet.leader_commit) == ("a", 2, None)  # not listed
    assert verdict.issues == [
        "server a is overloaded: RESOURCE_EXHAUSTED: service queue full",
        "kv-p0: leader a (term 2, as its followers say) is busy: not listed",
    ]
    # Followers that disagree (or a busy server no follower names) prove nothing.
    probes["c"] = (_listed("c", commit_index=9, leader_uuid="b"), "UP", "")
    verdict = health.check_cluster(LAYOUT, health.ProbeOptions())
    assert verdict.severity is health.Severity.ERROR
    assert "kv-p0: no leader" in verdict.issues


def test_more_voters_than_the_table_asks_for_is_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two moves of one replica at once left four voters; status said OK."""
    four = ("a", "b", "c", "d")
    layout = SimpleNamespace(
        name="t",
        servers=[SimpleNamespace(id=n, rpc_addr=n, http_addr=n) for n in four],
        placements=lambda: [
            SimpleNamespace(tablet_id="kv-p0", table="kv", partition=0, replicas=IDS)
        ],
    )
    probes = {
        n: (_listed(n, voters=four, leader=int(n == "a"), commit_index=9), "UP", "") for n in four
    }
    monkeypatch.setattr(health, "probe_servers", lambda *_a, **_k: probes)
    verdict = health.check_cluster(layout, health.ProbeOptions())
    assert verdict.severity is health.Severity.WARN
    assert any("over-replicated: 4 voters, the table asks for 3" in i for i in verdict.issues)


def test_a_server_on_another_cluster_config_is_named_with_what_differs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each server reads its own cluster.toml: one left on other Raft timings worked, only
    not as its peers expected, and status said OK."""
    same = {"name": "n1", "servers": "s1", "tables": "t1", "raft": "r1"}
    listed = {n: _listed(n, leader=int(n == "a"), commit_index=9) for n in IDS}
    for n in IDS:
        listed[n].config_digests.update(same)
    listed["c"].config_digests.update(raft="r2", tables="t2")
    verdict = checked(listed, 100, monkeypatch)
    assert verdict.severity is health.Severity.WARN
    c = next(s for s in verdict.servers if s.id == "c")
    assert c.config_differs == ("raft", "tables")
    assert c.severity is health.Severity.WARN
    assert (
        "server c runs another cluster config than a, b: its raft timings, tables differ "
        "(start every server on the same cluster.toml)"
    ) in verdict.issues
    assert verdict.to_json()["servers"][2]["config_differs"] == ["raft", "tables"]
    # A server that reports no digests (older than them) is not compared.
    listed["c"].config_digests.clear()
    assert checked(listed, 100, monkeypatch).severity is health.Severity.OK
