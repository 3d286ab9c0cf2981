"""tserver/readiness.py: a server is ready once every replica of it that a group counts on
is working -- led here, or following a leader it heard from and holding its log to within
READY_LAG_ENTRIES of that leader's commit (review r34b: /healthz said "OK" while replicas
were still catching up, and a rolling update moved on)."""

from __future__ import annotations

from typing import Any

from raftlet.tserver.readiness import READY_LAG_ENTRIES, not_ready


def _replica(tid: str, **given: Any) -> dict[str, object]:
    status: dict[str, object] = {
        "tablet_id": tid,
        "failed": False,
        "failure": "",
        "role": "FOLLOWER",
        "leader": "ts1",
        "leader_ready": False,
        "leader_commit": 500,
        "leader_commit_of": "ts1",
        "last_index": 500,
        "voters": ["ts1", "ts2", "ts3"],
        "learners": [],
    }
    return status | given


def test_caught_up_followers_and_ready_leaders_make_a_ready_server() -> None:
    statuses = [
        _replica("kv-p0"),
        _replica("kv-p1", last_index=500 - READY_LAG_ENTRIES),  # a busy follower's lag
        _replica("kv-p2", role="LEADER", leader="ts2", leader_ready=True),
        _replica("kv-p3", voters=["ts1", "ts3", "ts4"]),  # a leftover: no group's
        _replica("kv-p4", leader_commit=0),  # a leader that predates the field
        _replica("kv-p6", voters=["ts1", "ts3"], failed=True),  # a FAILED leftover
    ]
    assert not_ready("ts2", statuses) == []


def test_each_replica_not_working_is_named_with_why() -> None:
    statuses = [
        _replica("kv-p0", last_index=499 - READY_LAG_ENTRIES, leader_commit=20_000),
        _replica("kv-p1", leader="", role="PRE_CANDIDATE"),
        _replica("kv-p2", role="LEADER", leader="ts2"),
        _replica("kv-p3", failed=True, failure="WAL segment /data/x damaged"),
        _replica("kv-p4", leader="ts3", leader_commit_of="ts1"),  # a new leader, not heard
        _replica(
            "kv-p5", learners=["ts2"], voters=["ts1", "ts3"], last_index=1, leader_commit=9000
        ),
    ]
    assert not_ready("ts2", statuses, copying=["kv-p9"]) == [
        "kv-p9: a tablet copy is under way",
        f"kv-p0: catching up, {19_501 + READY_LAG_ENTRIES:,} entries behind its leader ts1",
        "kv-p1: no leader known (PRE_CANDIDATE)",
        "kv-p2: leads, but has not yet committed an entry of its term",
        "kv-p3: FAILED (/tablets says why)",  # not the path: the page is open to anyone
        "kv-p4: has not yet heard how far its leader ts3 has committed",
        "kv-p5: catching up, 8,999 entries behind its leader ts1",
    ]
