"""``client.health``'s verdict on a tablet's replicas from what their servers list."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from raftlet.client import health
from raftlet.client.errors import InvalidArgument
from raftlet.cluster import ClusterConfig, RaftTimings, TableConfig
from raftlet.cluster.digest import config_digests
from raftlet.proto import tablet_pb2
from raftlet.proto.consensus_pb2 import RaftRole
from tests.unit.health_fakes import IDS, LAYOUT, checked
from tests.unit.test_cluster_config import KEY_ONLY, cluster


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
        assert verdict.severity is health.Severity.ERROR
        assert verdict.issues == [
            "kv-p0: two groups claim this tablet: leader a (term 2) committed 150, but b "
            "(applied 251) hold more -- writes another group acknowledged are not in this "
            "one; remove no replica of it until the group holding them leads again",
            "kv-p0: replica on b applied 251, past the leader's commit 150: it holds entries "
            "the group does not (diverged)",
        ]
    else:
        assert verdict.severity is health.Severity.WARN
        on_its_way = f", applying to {applying}" if applying > applied else ""
        assert verdict.issues == [
            f"kv-p0: replica on b lags the leader by 120 entries "
            f"(applied {applied}{on_its_way}, leader committed 150)"
        ]


@pytest.mark.parametrize(
    ("leader_commit_then", "state"),
    [
        (150, "AHEAD"),  # it still says 150: b holds 50 entries the group does not
        (210, "OK"),  # it committed on meanwhile: the round's own skew
    ],
)
def test_a_replica_a_little_past_the_leaders_commit_is_checked_against_a_later_answer(
    monkeypatch: pytest.MonkeyPatch, leader_commit_then: int, state: str
) -> None:
    """Anything up to ``max_lag`` past the leader's commit was taken for the skew of one
    round (the servers answer at different moments): a replica holding ~95 acknowledged
    entries its group had lost read OK. The leader is asked again once the others have
    answered; if it still leads in the same term, nothing past its commit is skew."""
    commit = leader_commit_then
    again = _listed("a", leader=1, commit_index=commit, applied_index=commit)
    verdict = _b_50_past_a_leader_asked_again(monkeypatch, again)
    b = next(r for r in verdict.tablets[0].replicas if r.server == "b")
    assert b.state == state
    if state == "AHEAD":
        assert verdict.severity is health.Severity.ERROR
        assert (
            "kv-p0: replica on b applied 200, past the leader's commit 150: it holds entries "
            "the group does not (diverged)"
        ) in verdict.issues
    else:
        assert verdict.severity is health.Severity.OK, verdict.issues


def test_a_leader_that_changed_before_it_was_asked_again_leaves_the_skew_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its second answer is of another term (or it no longer leads): nothing can be said
    of the first round's skew, so ``max_lag`` stands."""
    verdict = _b_50_past_a_leader_asked_again(
        monkeypatch, _listed("a", commit_index=150, leader_uuid="b")
    )
    b = next(r for r in verdict.tablets[0].replicas if r.server == "b")
    assert b.state == "OK"


def _b_50_past_a_leader_asked_again(
    monkeypatch: pytest.MonkeyPatch, again: tablet_pb2.ListTabletsResponse
) -> health.ClusterHealth:
    """The verdict when b applied 200 and leader a said it committed 150, then ``again``."""
    first = {
        "a": _listed("a", leader=1, commit_index=150, applied_index=150),
        "b": _listed("b", commit_index=200, applied_index=200),
        "c": _listed("c", commit_index=150, applied_index=150),
    }
    rounds = iter([first, dict(first, a=again)])
    monkeypatch.setattr(
        health,
        "probe_servers",
        lambda *_a, **_k: {n: (r, "UP", "") for n, r in next(rounds).items()},
    )
    return health.check_cluster(LAYOUT, health.ProbeOptions(max_lag=100))


def test_a_server_waiting_for_its_peers_says_why_it_hosts_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its replica read MISSING, and "hosting none": the reason was only in its log."""
    listed = {
        "a": _listed("a", leader=1, commit_index=150, applied_index=150),
        "b": _listed("b", commit_index=150, applied_index=150),
        "c": tablet_pb2.ListTabletsResponse(server_uuid="c", waiting_for_peers=True),
    }
    verdict = checked(listed, 100, monkeypatch)
    assert verdict.severity is health.Severity.WARN
    assert (
        "server c started with an empty data directory and makes no replica until other "
        "servers answer it (only they can tell a new server from one whose data directory "
        "was wiped): start the others; if they run, a majority of them was wiped too, and "
        'what is left may lag (docs/ARCHITECTURE.md, "A tablet that lost a majority")'
    ) in verdict.issues


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
        "kv-p0: under-replicated: 2 of 3 replicas working (b FAILED)",
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
        "kv-p0: c is a learner (added, not yet promoted to a voter; if it lasts, `raftlet "
        "tablet add-replica kv-p0 c --wait` finishes the add)",
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
        "kv-p0: c runs a replica that is no member of the group (removed while it was down, "
        "or a removal stopped before its deletion?): "
        "`raftlet tablet remove-replica kv-p0 c` deletes it",
        "kv-p0: under-replicated: 2 voters, the table asks for 3",
    ]
    # One whose deletion failed part way is FAILED, and says why (the file to fix) and
    # what then -- not that its server was down, which it need not have been.
    listed["c"] = _listed(
        "c",
        (),
        state=tablet_pb2.TABLET_STATE_FAILED,
        failure_reason="deleting it failed part way (/d/c/kv-p0/wal/1: Operation not "
        "permitted); make that file removable, then run `raftlet tablet remove-replica "
        "kv-p0 c` again",
    )
    verdict = checked(listed, 100, monkeypatch)
    assert verdict.issues[0] == (
        "kv-p0: c holds a replica that is no member of the group, FAILED: deleting it failed "
        "part way (/d/c/kv-p0/wal/1: Operation not permitted); make that file removable, "
        "then run `raftlet tablet remove-replica kv-p0 c` again"
    )
    # FAILED for another reason: the remedy is said.
    listed["c"] = _listed(
        "c", (), state=tablet_pb2.TABLET_STATE_FAILED, failure_reason="the store is damaged"
    )
    assert checked(listed, 100, monkeypatch).issues[0] == (
        "kv-p0: c holds a replica that is no member of the group, FAILED: the store is "
        "damaged; `raftlet tablet remove-replica kv-p0 c` deletes it"
    )


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
        "(start every server on the same cluster.toml and the same --tick_interval_ms, "
        "--election_ticks and --heartbeat_ticks, if given)"
    ) in verdict.issues
    assert verdict.to_json()["servers"][2]["config_differs"] == ["raft", "tables"]
    # A server that reports no digests (older than them) is not compared.
    listed["c"].config_digests.clear()
    assert checked(listed, 100, monkeypatch).severity is health.Severity.OK


@pytest.mark.parametrize(
    ("left_s", "severity", "said"),
    [
        (None, health.Severity.OK, None),  # plaintext, or older than the field
        (31 * 86400.0, health.Severity.OK, None),
        (12 * 86400.0, health.Severity.WARN, "expires in 12 days: renew it and restart"),
        (5 * 3600.0, health.Severity.WARN, "expires in 5 hours"),
        (-3 * 86400.0, health.Severity.ERROR, "expired 3 days ago"),
    ],
)
def test_a_certificate_near_its_end_is_named_before_clients_refuse_it(
    monkeypatch: pytest.MonkeyPatch, left_s: float | None, severity: health.Severity, said: str
) -> None:
    """Only the server's start-up WARNING and a gauge said a certificate would expire; the
    check an operator runs said OK up to the moment connections were refused."""
    listed = {n: _listed(n, leader=int(n == "a"), commit_index=9) for n in IDS}
    if left_s is not None:
        listed["b"].tls_cert_expiry_seconds = left_s
    verdict = checked(listed, 100, monkeypatch)
    assert verdict.severity is severity
    notes = [i for i in verdict.issues if "TLS certificate" in i]
    if said is None:
        assert notes == []
    else:
        (note,) = notes
        assert note.startswith("server b: ")
        assert said in note
    assert verdict.to_json()["servers"][1]["tls_cert_expiry_seconds"] == left_s


def test_each_servers_release_is_shown_and_two_at_once_are_no_issue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rolling upgrade runs two releases side by side (review r28a: every server said
    0.1.0, and nothing told which one ran what): the check names each server's release, one
    too old to say as such, and judges the cluster by its replicas alone."""
    listed = {n: _listed(n, leader=int(n == "a"), commit_index=9) for n in IDS}
    listed["a"].server_version = "0.3.0"
    listed["b"].server_version = "0.2.0"  # c says nothing: a release before the field
    verdict = checked(listed, 100, monkeypatch)
    assert verdict.severity is health.Severity.OK, verdict.issues
    assert [s.release for s in verdict.servers] == ["0.3.0", "0.2.0", "before 0.2.0"]
    assert verdict.releases() == {"0.3.0": ["a"], "0.2.0": ["b"], "before 0.2.0": ["c"]}
    assert [s["version"] for s in verdict.to_json()["servers"]] == ["0.3.0", "0.2.0", ""]
    assert health.ServerHealth("d", "d", "d", "DOWN").release == "-"


def test_a_server_whose_certificate_expired_is_an_error_that_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Expired, a server's certificate fails the check's own handshake, so it never says how
    long it has left: status showed one server DOWN among others, a warning."""
    listed = {n: _listed(n, leader=int(n == "a"), commit_index=9) for n in ("a", "c")}
    refused = (
        "UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: ipv4:b: Tls "
        "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL "
        "routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: certificate has expired"
    )
    probes = {n: (r, "UP", "") for n, r in listed.items()} | {"b": (None, "DOWN", refused)}
    monkeypatch.setattr(health, "probe_servers", lambda *_a, **_k: probes)
    verdict = health.check_cluster(LAYOUT, health.ProbeOptions())
    assert verdict.severity is health.Severity.ERROR
    assert (
        "server b: its TLS certificate (or its CA) expired: clients and peers that connect "
        "anew refuse it; renew its certificate and restart it"
    ) in verdict.issues


@pytest.mark.parametrize(
    ("error", "hinted"),
    [
        ("UNAVAILABLE: failed to connect to all addresses; last error: UNAVAILABLE: "
         "ipv4:127.0.0.1:7050: Socket closed", True),
        ("UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: "
         "ipv4:127.0.0.1:7050: Failed to connect to remote host: Connection refused", False),
    ],
)  # fmt: skip
def test_a_server_that_closes_the_handshake_is_down_with_a_hint_at_the_certificate(
    monkeypatch: pytest.MonkeyPatch, error: str, hinted: bool
) -> None:
    """Review r27a: a client certificate the servers refuse read as three servers down."""
    listed = {n: _listed(n, leader=int(n == "a"), commit_index=9) for n in ("a", "c")}
    probes = {n: (r, "UP", "") for n, r in listed.items()} | {"b": (None, "DOWN", error)}
    monkeypatch.setattr(health, "probe_servers", lambda *_a, **_k: probes)
    verdict = health.check_cluster(LAYOUT, health.ProbeOptions())
    (down,) = [i for i in verdict.issues if i.startswith("server b ")]
    assert ("closed the connection at the handshake" in down) is hinted
    assert ("check this command's --tls-cert, --tls-key and --tls-ca" in down) is hinted


# --- the checker's own copy of cluster.toml --------------------------------------------------

TS = ("ts1", "ts2", "ts3")


def _from_a_file(config: ClusterConfig) -> ClusterConfig:
    """``config`` as read from an operator's cluster.toml (only such a copy is compared)."""
    return dataclasses.replace(config, path=Path("/etc/raftlet/cluster.toml"))


def _run_by_servers(
    config: ClusterConfig, monkeypatch: pytest.MonkeyPatch
) -> dict[str, tuple[tablet_pb2.ListTabletsResponse, str, str]]:
    """Servers ts1..ts3 running ``config`` (kv-p0 led by ts1), as ``probe_servers`` says."""
    probes = {}
    for n in TS:
        listed = _listed(n, voters=TS, leader=int(n == "ts1"), leader_uuid="ts1", commit_index=9)
        listed.config_digests.update(config_digests(config))
        probes[n] = (listed, "UP", "")
    monkeypatch.setattr(health, "probe_servers", lambda *_a, **_k: probes)
    return probes


def test_a_copy_of_cluster_toml_with_a_table_the_servers_lack_says_so_and_no_repair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An operator's stale copy had a table the servers do not: ERROR with "remove-replica
    extra-p0 ts1 then add-replica", which fails ("unknown tablet")."""
    running = _from_a_file(cluster(3, ("kv", 1, 3)))
    _run_by_servers(running, monkeypatch)
    stale = dataclasses.replace(
        running, tables=(*running.tables, TableConfig("extra", KEY_ONLY, 1, 3))
    )
    verdict = health.check_cluster(stale, health.ProbeOptions())
    assert verdict.severity is health.Severity.WARN
    assert verdict.issues == [
        "this cluster.toml differs from what the servers run: its tables differ (a stale or "
        "edited copy? check with the servers' own: `raftlet cluster status --servers "
        "HOST:PORT` reads it from them)",
        "extra-p0: no server knows this tablet: table extra is in this cluster.toml, not in "
        "the tables the servers run",
    ]
    extra = next(t for t in verdict.tablets if t.tablet_id == "extra-p0")
    assert extra.severity is health.Severity.WARN
    assert [r.state for r in extra.replicas] == ["MISSING"] * 3
    # The same copy, agreeing: nothing to say.
    assert health.check_cluster(running, health.ProbeOptions()).ok


def test_a_copy_with_other_servers_is_named_but_not_one_with_other_raft_timings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    running = _from_a_file(cluster(3, ("kv", 1, 3)))
    _run_by_servers(running, monkeypatch)
    # Flags may override the file's timings on every server: the file's are not compared.
    slower = dataclasses.replace(running, raft=RaftTimings(heartbeat_ticks=2))
    assert health.check_cluster(slower, health.ProbeOptions()).ok
    moved = dataclasses.replace(running.servers[2], rpc_addr="127.0.0.1:9")
    other = dataclasses.replace(running, name="old", servers=(*running.servers[:2], moved))
    verdict = health.check_cluster(other, health.ProbeOptions())
    assert verdict.severity is health.Severity.WARN
    assert verdict.issues[0].startswith(
        "this cluster.toml differs from what the servers run: its cluster name, servers differ"
    )


def test_no_replica_repair_is_advised_for_a_tablet_without_a_leader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """remove-replica and add-replica go through the group's leader: with none (or with no
    server knowing the tablet at all) the advice could only fail."""
    probes = {
        "a": (_listed("a", leader_ready=False, commit_index=9), "UP", ""),
        "b": (_listed("b", leader_ready=False, commit_index=9), "UP", ""),
        "c": (tablet_pb2.ListTabletsResponse(server_uuid="c"), "UP", ""),
    }
    monkeypatch.setattr(health, "probe_servers", lambda *_a, **_k: probes)
    verdict = health.check_cluster(LAYOUT, health.ProbeOptions())
    assert verdict.severity is health.Severity.ERROR
    assert "kv-p0: server c is up but does not host its replica" in verdict.issues
    assert not any("remove-replica" in i for i in verdict.issues), verdict.issues
    # Known to no server, while this copy agrees with theirs (or they do not say).
    probes["a"] = (tablet_pb2.ListTabletsResponse(server_uuid="a"), "UP", "")
    probes["b"] = (tablet_pb2.ListTabletsResponse(server_uuid="b"), "UP", "")
    verdict = health.check_cluster(LAYOUT, health.ProbeOptions())
    assert verdict.severity is health.Severity.ERROR
    assert "kv-p0: no server knows this tablet (a, b, c answered, hosting none)" in verdict.issues
    assert not any("remove-replica" in i for i in verdict.issues), verdict.issues
    # With a leader, the repair works and is advised.
    probes["a"] = (_listed("a", leader=1, commit_index=9), "UP", "")
    probes["b"] = (_listed("b", commit_index=9), "UP", "")
    verdict = health.check_cluster(LAYOUT, health.ProbeOptions())
    # Both with --wait: a removal without it leaves the replica, an add a learner for good.
    assert (
        "kv-p0: server c is up but does not host its replica (`raftlet tablet remove-replica "
        "kv-p0 c --wait` then `add-replica kv-p0 c --wait` makes it again)"
    ) in verdict.issues


def test_a_replica_being_copied_is_said_to_be_and_no_repair_is_advised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica on its way by tablet copy read MISSING, with the advice to remove and add
    it again -- which would start the copy over (review r33a)."""
    copying = tablet_pb2.ListTabletsResponse(server_uuid="c", copying_tablets=["kv-p0"])
    probes = {
        "a": (_listed("a", leader=1, commit_index=9), "UP", ""),
        "b": (_listed("b", commit_index=9), "UP", ""),
        "c": (copying, "UP", ""),
    }
    monkeypatch.setattr(health, "probe_servers", lambda *_a, **_k: probes)
    verdict = health.check_cluster(LAYOUT, health.ProbeOptions())
    (tablet,) = verdict.tablets
    assert [r.state for r in tablet.replicas if r.server == "c"] == ["COPYING"]
    assert "kv-p0: replica on c is being made by a tablet copy from the leader" in verdict.issues
    assert not any("remove-replica" in i for i in verdict.issues), verdict.issues
    assert verdict.severity is health.Severity.WARN
    assert any("c COPYING" in i for i in verdict.issues), verdict.issues
    # A wiped replica is listed FAILED while the copy that repairs it runs: said too.
    failed = tablet_pb2.ListTabletsResponse(server_uuid="c", copying_tablets=["kv-p0"])
    failed.tablets.add(
        tablet_id="kv-p0",
        table_name="kv",
        state=tablet_pb2.TABLET_STATE_FAILED,
        failure_reason="ReplicaOpenError: wiped",
    )
    probes["c"] = (failed, "UP", "")
    verdict = health.check_cluster(LAYOUT, health.ProbeOptions())
    assert (
        "kv-p0: replica on c is FAILED: ReplicaOpenError: wiped; a tablet copy is under way"
    ) in verdict.issues


def _two_of_three_failed(reason: str) -> dict[str, tablet_pb2.ListTabletsResponse]:
    """What the servers list when b's and c's replicas are FAILED for ``reason``."""
    failed = {"state": tablet_pb2.TABLET_STATE_FAILED, "failure_reason": reason}
    return {
        "a": _listed("a", leader_ready=False, leader_uuid="", commit_index=9, applied_index=9),
        "b": _listed("b", leader_ready=False, leader_uuid="", **failed),
        "c": _listed("c", leader_ready=False, leader_uuid="", **failed),
    }


def test_a_tablet_whose_majority_is_failed_says_it_lost_it_and_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two of three replicas FAILED: no leader can come (a FAILED replica never votes, and
    only a leader repairs one), and the membership commands waited out their timeouts."""
    listed = _two_of_three_failed("OSError: [Errno 1]")
    verdict = checked(listed, 100, monkeypatch)
    assert verdict.severity is health.Severity.ERROR
    lost = [i for i in verdict.issues if "lost a majority" in i]
    assert lost == [
        "kv-p0: lost a majority of its replicas: 2 of 3 voters are FAILED (b, c), so it has "
        "no leader and cannot elect one; no membership command (add-replica, remove-replica, "
        "move-replica, replace-server) can work without a leader. Restore the FAILED "
        "replicas' files (each one's reason says what failed) and restart their servers; "
        "lost for good, `raftlet tablet export` reads a surviving replica's rows from its "
        'stopped server: see docs/ARCHITECTURE.md, "A tablet that lost a majority"'
    ]
    # One FAILED of three: the others elect a leader, which repairs it; nothing of the kind.
    listed["b"] = _listed("b", leader=1, leader_uuid="b", commit_index=9, applied_index=9)
    listed["a"] = _listed("a", leader_uuid="b", commit_index=9, applied_index=9)
    verdict = checked(listed, 100, monkeypatch)
    assert not any("lost a majority" in i for i in verdict.issues), verdict.issues


def test_a_majority_failed_for_want_of_space_is_told_to_free_space_not_restore_files(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review r34a: two servers' disks filled together; status said the replicas were
    lost, advising restored files and `tablet export`, where freeing space was all it
    took."""
    listed = _two_of_three_failed(
        "the log failed: ENOSPC: log /d/kv-p0/wal: [Errno 28] No space left"
    )
    verdict = checked(listed, 100, monkeypatch)
    assert verdict.severity is health.Severity.ERROR
    assert not any("lost a majority" in i for i in verdict.issues), verdict.issues
    assert (
        "kv-p0: no leader: 2 of 3 voters are FAILED for want of disk space (b, c). Free space "
        "on their servers: each opens such a replica again by itself once its data directory "
        "has room for two log segments (or restart it), and the tablet elects a leader; "
        "nothing acknowledged is lost"
    ) in verdict.issues
    assert not verdict.tablets[0].lost_majority


# --- a bearer token and no client certificate -----------------------------------------------


class _Pool:
    """A ``ChannelPool`` whose servers answer ``ListTablets`` at ``answering`` only."""

    def __init__(self, answering: set[str]) -> None:
        self.answering = answering
        self.dialed: list[str] = []

    def __call__(self, *_a: object, **_k: object) -> _Pool:
        return self

    def stub(self, addr: str) -> SimpleNamespace:
        self.dialed.append(addr)
        return SimpleNamespace(
            list_tablets_future=lambda _timeout, **_k: _Answer(addr in self.answering)
        )

    def close(self) -> None:
        pass


class _Refused(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "Socket closed"


class _Answer:
    def __init__(self, ok: bool) -> None:
        self.ok = ok

    def result(self) -> tablet_pb2.ListTabletsResponse:
        if not self.ok:
            raise _Refused()
        return tablet_pb2.ListTabletsResponse()


def _token_layout(token_addrs: tuple[str, ...]) -> SimpleNamespace:
    return SimpleNamespace(
        name="t",
        servers=[
            SimpleNamespace(id=n, rpc_addr=f"{n}:1", http_addr=n, token_rpc_addr=t)
            for n, t in zip(IDS, token_addrs, strict=True)
        ],
        placements=list,
    )


def test_credentials_without_a_certificate_ask_every_server_at_its_token_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every server's RPC port requires a client certificate: `cluster status` with a token
    alone called a healthy TLS cluster all DOWN ("Socket closed")."""
    token = tuple(f"{n}:2" for n in IDS)
    pool = _Pool(set(token))  # as a TLS cluster: only the token ports take a token alone
    monkeypatch.setattr(health, "ChannelPool", pool)
    verdict = health.check_cluster(_token_layout(token), health.ProbeOptions(token_ports=True))
    assert pool.dialed == list(token)
    assert [(s.state, s.rpc_addr) for s in verdict.servers] == [("UP", t) for t in token]
    assert verdict.ok
    # A certificate: the RPC ports, as before.
    pool.answering = {f"{n}:1" for n in IDS}
    pool.dialed.clear()
    assert health.check_cluster(_token_layout(token), health.ProbeOptions()).ok
    assert pool.dialed == [f"{n}:1" for n in IDS]


def test_a_server_without_a_token_port_is_named_when_credentials_need_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = _Pool(set())
    monkeypatch.setattr(health, "ChannelPool", pool)
    layout = _token_layout(("a:2", "", ""))
    with pytest.raises(InvalidArgument, match=r"server\(s\) b, c have no token port"):
        health.check_cluster(layout, health.ProbeOptions(token_ports=True))
    assert pool.dialed == []


def test_a_second_group_holding_more_than_the_leaders_is_an_error_with_no_removal_advised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two servers added to a cluster once formed a group of their own among empty replicas:
    status showed its leader, called the server holding the rows "diverged", and advised
    remove-replica for the real group's replicas."""
    rival = ("b", "c")
    listed = {
        "a": _listed("a", commit_index=250, applied_index=250, leader_uuid=""),
        "b": _listed("b", voters=rival, leader=1, commit_index=1, applied_index=1, leader_uuid="b"),
        "c": _listed("c", voters=rival, commit_index=1, applied_index=1, leader_uuid="b"),
    }
    verdict = checked(listed, 100, monkeypatch)
    assert verdict.severity is health.Severity.ERROR
    (tablet,) = verdict.tablets
    assert tablet.issues[0].startswith(
        "two groups claim this tablet: leader b (term 2) committed 1, but a (applied 250)"
    ), tablet.issues
    assert not any("remove-replica" in i for i in verdict.issues), verdict.issues


def test_a_config_read_from_the_servers_is_theirs_and_not_compared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`cluster status --servers ADDR` names the config it fetched "via ADDR": that name
    differed from the servers' and every healthy cluster was a WARN."""
    running = cluster(3, ("kv", 1, 3))
    _run_by_servers(running, monkeypatch)
    fetched = dataclasses.replace(running, name="via 127.0.0.1:7051")
    assert fetched.path is None
    assert health.check_cluster(fetched, health.ProbeOptions()).ok


def test_a_copy_with_a_table_partitioned_otherwise_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    running = _from_a_file(cluster(3, ("kv", 1, 3)))
    _run_by_servers(running, monkeypatch)
    wider = dataclasses.replace(
        running, tables=(dataclasses.replace(running.tables[0], partitions=2),)
    )
    verdict = health.check_cluster(wider, health.ProbeOptions())
    assert (
        "kv-p1: no server knows this tablet: table kv's partitions or schema in this "
        "cluster.toml are not the ones the servers run"
    ) in verdict.issues


def test_other_raft_timings_name_the_flags_too(monkeypatch: pytest.MonkeyPatch) -> None:
    listed = {n: _listed(n, leader=int(n == "a"), commit_index=9) for n in IDS}
    for n in IDS:
        listed[n].config_digests.update(name="n", servers="s", tables="t", raft="r1")
    listed["c"].config_digests["raft"] = "r2"
    verdict = checked(listed, 100, monkeypatch)
    assert (
        "server c runs another cluster config than a, b: its raft timings differ (start "
        "every server on the same cluster.toml and the same --tick_interval_ms, "
        "--election_ticks and --heartbeat_ticks, if given)"
    ) in verdict.issues


def test_a_server_refusing_the_checks_credentials_is_not_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bad token had every server reported DOWN, and the tablets unavailable."""
    probes = dict.fromkeys(IDS, (None, "DENIED", "UNAUTHENTICATED: invalid bearer token"))
    monkeypatch.setattr(health, "probe_servers", lambda *_a, **_k: probes)
    verdict = health.check_cluster(LAYOUT, health.ProbeOptions())
    assert [s.state for s in verdict.servers] == ["DENIED"] * 3
    assert verdict.issues[0] == (
        "server a refused this check's credentials (UNAUTHENTICATED: invalid bearer token): "
        "give a client certificate or token it accepts, of role reader or above"
    )
    assert not any("down" in i or "unavailable" in i for i in verdict.issues), verdict.issues


def test_an_answer_refusing_credentials_is_denied() -> None:
    class Refused(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAUTHENTICATED

        def details(self) -> str:
            return "invalid bearer token"

    class Call:
        def result(self) -> None:
            raise Refused()

    probe = health._outcome(Call())  # type: ignore[arg-type]
    assert (probe.state, probe.error) == ("DENIED", "UNAUTHENTICATED: invalid bearer token")


FOUR = ("a", "b", "c", "d")
FOUR_LAYOUT = SimpleNamespace(
    name="t",
    servers=[SimpleNamespace(id=n, rpc_addr=n, http_addr=n, token_rpc_addr="") for n in FOUR],
    placements=lambda: [SimpleNamespace(tablet_id="kv-p0", table="kv", partition=0, replicas=IDS)],
)


def test_with_no_leader_a_tablet_is_judged_by_the_membership_its_replicas_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A group of four (d added while c was down) that lost d too was judged by its
    placement: "under-replicated: 2 of 3 reachable", d not listed at all."""
    probes: dict[str, tuple[tablet_pb2.ListTabletsResponse | None, str, str]] = {
        n: (_listed(n, voters=FOUR, leader_ready=False, leader_uuid=""), "UP", "") for n in "ab"
    }
    probes |= dict.fromkeys("cd", (None, "DOWN", "UNAVAILABLE"))
    monkeypatch.setattr(health, "probe_servers", lambda *_a, **_k: probes)
    (tablet,) = health.check_cluster(FOUR_LAYOUT, health.ProbeOptions()).tablets
    assert [(r.server, r.state) for r in tablet.replicas][2:] == [("c", "DOWN"), ("d", "DOWN")]
    assert "unavailable: 2 of 4 replicas working (c DOWN, d DOWN), a majority is 3" in tablet.issues
    assert tablet.severity is health.Severity.ERROR


def test_a_learner_whose_server_is_down_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    probes: dict[str, tuple[tablet_pb2.ListTabletsResponse | None, str, str]] = {
        n: (_listed(n, learners=("d",), leader=int(n == "a"), commit_index=9), "UP", "")
        for n in IDS
    }
    probes["d"] = (None, "DOWN", "UNAVAILABLE")
    monkeypatch.setattr(health, "probe_servers", lambda *_a, **_k: probes)
    verdict = health.check_cluster(FOUR_LAYOUT, health.ProbeOptions())
    assert any(
        i.startswith("kv-p0: learner on d is down (an add not finished") for i in verdict.issues
    )


def test_cluster_up_names_each_failed_replica_with_its_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cluster restarted on a full disk came up by its leaders alone, its FAILED replicas
    unmentioned until someone ran `cluster status`."""
    from raftlet.cli.cluster_cmd import failed_replica_lines

    why = "StoreError: disk I/O error (the filesystem has 0 bytes free)"
    listed = {
        "a": _listed("a", leader=1, commit_index=150, applied_index=150),
        "b": _listed("b", state=tablet_pb2.TABLET_STATE_FAILED, failure_reason=why),
        "c": _listed("c", commit_index=150, applied_index=150),
    }
    assert failed_replica_lines(checked(listed, 100, monkeypatch)) == [
        f"  FAILED    kv-p0 on b: {why}"
    ]
    listed["b"] = _listed("b", commit_index=150, applied_index=150)
    assert failed_replica_lines(checked(listed, 100, monkeypatch)) == []


def test_disk_usage_is_asked_for_only_when_wanted_and_summed_per_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`cluster status` shows what each server's replicas take on disk; `cluster up`'s
    polls do not ask (a stat per file on every server).  A server too old to say shows
    none, rather than 0."""
    listed = {
        "a": _listed("a", leader=1, commit_index=5, applied_index=5, disk_bytes=1500),
        "b": _listed("b", commit_index=5, applied_index=5, disk_bytes=700),
        "c": _listed("c", commit_index=5, applied_index=5),  # older: no field
    }
    asked: list[bool] = []

    def probe(*_a: object, disk_usage: bool = False, **_k: object) -> dict[str, object]:
        asked.append(disk_usage)
        return {n: (r, "UP", "") for n, r in listed.items()}

    monkeypatch.setattr(health, "probe_servers", probe)
    verdict = health.check_cluster(LAYOUT, health.ProbeOptions(disk_usage=True))
    assert asked == [True]
    assert [s.disk_bytes for s in verdict.servers] == [1500, 700, None]
    assert [r.disk_bytes for r in verdict.tablets[0].replicas] == [1500, 700, None]
    doc = verdict.to_json()
    assert [s["disk_bytes"] for s in doc["servers"]] == [1500, 700, None]
    assert doc["tablets"][0]["replicas"][0]["disk_bytes"] == 1500
    plain = health.check_cluster(LAYOUT, health.ProbeOptions())
    assert asked == [True, False]
    assert [s.disk_bytes for s in plain.servers] == [None, None, None]


def test_status_names_the_releases_only_when_servers_run_more_than_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from raftlet.cli.cluster_cmd import _print_status

    listed = {n: _listed(n, leader=int(n == "a"), commit_index=9) for n in IDS}
    for n in IDS:
        listed[n].server_version = "0.2.0"
    _print_status(checked(listed, 100, monkeypatch), {}, "here", lambda a, p: a + p)
    assert "releases" not in capsys.readouterr().out
    listed["a"].server_version = "0.3.0"
    _print_status(checked(listed, 100, monkeypatch), {}, "here", lambda a, p: a + p)
    out = capsys.readouterr().out
    assert "servers run 2 releases: 0.2.0 on b, c; 0.3.0 on a\n" in out
    assert out.rstrip().endswith("OK: 3/3 servers up, 1/1 tablets with a ready leader")


def test_stopping_a_server_that_holds_a_tablets_last_majority_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`cluster down --server` refuses what would leave a tablet without a majority of
    answering voters (review r30a), and only that: a server already silent changes nothing."""
    from raftlet.cli.cluster_cmd import majority_lost_without

    listed = {n: _listed(n, leader=int(n == "a"), commit_index=9) for n in IDS}
    healthy = checked(listed, 100, monkeypatch)
    assert [majority_lost_without(healthy, n) for n in IDS] == [[], [], []]
    probes = {n: (listed[n], "UP", "") for n in ("a", "b")}
    probes["c"] = (None, "DOWN", "UNAVAILABLE: failed to connect")
    monkeypatch.setattr(health, "probe_servers", lambda *_a, **_k: probes)
    one_down = health.check_cluster(LAYOUT, health.ProbeOptions())
    said = ["kv-p0: voters a, b, c; c not answering"]
    assert [majority_lost_without(one_down, n) for n in IDS] == [said, said, []]
    # With two of three silent, the tablet has no majority to lose: the survivor may stop.
    probes["b"] = (None, "DOWN", "UNAVAILABLE: failed to connect")
    two_down = health.check_cluster(LAYOUT, health.ProbeOptions())
    assert [majority_lost_without(two_down, n) for n in IDS] == [[], [], []]


def test_four_voters_with_one_down_still_meet_a_factor_of_three(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review r30a: "under-replicated: 3 of 4 replicas working" stood beside
    "over-replicated: 4 voters, the table asks for 3"."""
    probes: dict[str, tuple[tablet_pb2.ListTabletsResponse | None, str, str]] = {
        n: (_listed(n, voters=FOUR, leader=int(n == "a"), commit_index=9), "UP", "") for n in IDS
    }
    probes["d"] = (None, "DOWN", "UNAVAILABLE")
    monkeypatch.setattr(health, "probe_servers", lambda *_a, **_k: probes)
    (tablet,) = health.check_cluster(FOUR_LAYOUT, health.ProbeOptions()).tablets
    assert tablet.issues[0] == "a voter down: 3 of 4 replicas working (d DOWN)"
    assert not any("under-replicated" in i for i in tablet.issues)
    assert any(i.startswith("over-replicated: 4 voters") for i in tablet.issues)
