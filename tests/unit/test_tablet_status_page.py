"""The tablet server's ``/tablets`` page: what each row says under ``leader_ready``."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import cast

import pytest

from raftlet.metrics.registry import MetricRegistry
from raftlet.metrics.status_server import StatusServer
from raftlet.tserver.failed_tablet import FailedTablet
from raftlet.tserver.status_pages import NOT_LEADER_CELL, register_tablet_pages
from raftlet.tserver.tablet_replica import TabletReplica

HOST = "127.0.0.1"


class _Published:
    """Stands in for a running replica: the pages read only ``published_status()``."""

    def __init__(self, **status: object) -> None:
        self.status = status

    def published_status(self) -> dict[str, object]:
        return dict(self.status)

    ready_status = published_status


def _row(tablet_id: str, role: str, leader: str, ready: bool) -> _Published:
    return _Published(
        tablet_id=tablet_id,
        table="kv",
        partition=1,
        state="RUNNING",
        role=role,
        term=4,
        leader=leader,
        leader_ready=ready,
        commit_index=9,
        applied_index=9,
        last_index=9,
        log_bytes=2048,
        store_bytes=47 << 20,
    )


@pytest.fixture
def server() -> Iterator[StatusServer]:
    s = StatusServer(MetricRegistry(), HOST, 0)
    replicas = {
        "kv-p0": _row("kv-p0", "LEADER", "ts2", True),
        "kv-p1": _row("kv-p1", "FOLLOWER", "ts3", False),
        "kv-p2": _row("kv-p2", "LEADER", "ts2", False),  # its no-op not yet committed
    }
    failed = {"kv-p3": FailedTablet("kv-p3", "kv", 3, ("ts1", "ts2"), Path("/x"), "bad")}
    register_tablet_pages(s, "ts2", cast(Mapping[str, TabletReplica], replicas), failed)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _get(server: StatusServer, path: str) -> str:
    conn = http.client.HTTPConnection(HOST, server.port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.read().decode()
    finally:
        conn.close()


def _cells(page: str) -> dict[str, dict[str, str]]:
    """Each row of the table, by tablet id: column name -> cell text."""
    head = re.findall(r"<th>(.*?)</th>", page)
    rows = {}
    for row in re.findall(r"<tr>(<td>.*?)</tr>", page):
        cells = dict(zip(head, re.findall(r"<td>(.*?)</td>", row), strict=True))
        rows[cells["tablet_id"]] = cells
    return rows


def test_leader_ready_is_blank_on_rows_of_replicas_that_do_not_lead(
    server: StatusServer,
) -> None:
    """r26c: every follower row read `FOLLOWER 4 ts3 False` while ts3 was a ready leader
    taking writes -- the field is "this replica is a ready leader", not "the leader is"."""
    rows = _cells(_get(server, "/tablets"))
    assert rows["kv-p1"]["leader"] == "ts3"
    assert rows["kv-p1"]["leader_ready"] == NOT_LEADER_CELL
    assert rows["kv-p3"]["leader_ready"] == NOT_LEADER_CELL
    # A leader's row still says whether it is ready.
    assert rows["kv-p0"]["leader_ready"] == "True"
    assert rows["kv-p2"]["leader_ready"] == "False"
    assert rows["kv-p0"]["log_bytes"] == "2.0 KiB"
    assert rows["kv-p0"]["store_bytes"] == "47.0 MiB"
    # A FAILED tablet's files are read from its directory (none here).
    assert (rows["kv-p3"]["log_bytes"], rows["kv-p3"]["store_bytes"]) == ("0 B", "0 B")


def test_the_json_page_keeps_the_bool_on_every_row(server: StatusServer) -> None:
    """/tablets.json is read by programs: the field keeps its type and meaning."""
    tablets = {t["tablet_id"]: t for t in json.loads(_get(server, "/tablets.json"))["tablets"]}
    assert tablets["kv-p1"]["leader_ready"] is False
    assert tablets["kv-p0"]["leader_ready"] is True
    assert tablets["kv-p1"]["log_bytes"] == 2048
    assert tablets["kv-p1"]["store_bytes"] == 47 << 20
    assert tablets["kv-p3"]["store_bytes"] == 0


def test_readyz_is_503_naming_each_replica_not_working_then_200() -> None:
    s = StatusServer(MetricRegistry(), HOST, 0)
    follower = _row("kv-p1", "FOLLOWER", "ts3", False)
    follower.status.update(
        voters=["ts1", "ts2", "ts3"], leader_commit=50_000, leader_commit_of="ts3"
    )
    copying = ["kv-p5"]
    unsettled = ["kv-p7: being installed or reopened"]
    register_tablet_pages(
        s,
        "ts2",
        cast(Mapping[str, TabletReplica], {"kv-p1": follower}),
        {},
        lambda: copying,
        lambda: unsettled,
    )
    s.start()
    try:
        conn = http.client.HTTPConnection(HOST, s.port, timeout=30)
        conn.request("GET", "/readyz")
        resp = conn.getresponse()
        assert (resp.status, resp.read().decode()) == (
            503,
            "not ready, 3 reason(s):\nkv-p7: being installed or reopened\n"
            "kv-p5: a tablet copy is under way\n"
            "kv-p1: catching up, 49,991 entries behind its leader ts3\n",
        )
        conn.close()
        copying.clear()
        unsettled.clear()
        follower.status["last_index"] = 50_000
        assert _get(s, "/readyz") == "ready\n"
    finally:
        s.stop()
