"""A leader whose disk hangs: its followers need no disk to take its heartbeats, so
without a check it stays leader while it can make nothing durable (a reviewer froze a
leader's filesystem for three minutes and its tablets took no write all that time).

Every log sync of the leader's server is held for 10 s (``--log_inject_latency_ms``, the
most it takes, which keeps the appender inside its sync as a frozen disk would); with
``--log_stall_timeout_ms=1000`` the replica hands its leadership over once a write has
waited a second, the tablet takes writes on a replica with a working disk, and once the
log writes again the replica says so and may lead again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlet.proto import admin_pb2
from tests.integration.tserver_cluster import (
    Server,
    kv_op,
    running_cluster,
    wait_for,
    write_request,
    write_with_retry,
)

pytestmark = pytest.mark.integration

STALL_MS = 1000


def _set_latency(server: Server, ms: int) -> None:
    server.admin.SetFlag(
        admin_pb2.SetFlagRequest(name="log_inject_latency_ms", value=str(ms)), timeout=10
    )


def _logged(server: Server, text: str) -> bool:
    return text in server.log_path.read_text(errors="replace")


def test_a_leader_whose_log_hangs_hands_over_and_the_tablet_takes_writes(tmp_path: Path) -> None:
    flags = [f"--log_stall_timeout_ms={STALL_MS}"]
    with running_cluster(tmp_path, partitions=1, flags=flags) as cluster:
        (tablet,) = cluster.tablet_ids()
        old = cluster.leader_of(tablet)
        _set_latency(old, 10_000)
        try:
            # A write gives the hung log something to write: heartbeats write nothing.
            write_with_retry(cluster, write_request(tablet, [kv_op(1, "a")]), first=old.id)
            new = cluster.new_leader_of(tablet, old.id, timeout=30)
            wait_for(
                lambda: _logged(old, "has not become durable"),
                what="the stalled replica's warning",
            )
            answer = write_with_retry(cluster, write_request(tablet, [kv_op(2, "b")]), first=new.id)
            assert answer.server != old.id
        finally:
            _set_latency(old, 0)  # cuts the sleep under way short
        wait_for(lambda: _logged(old, "the log writes again"), what="the replica's recovery")
        cluster.wait_caught_up()
        for server in cluster.servers.values():
            assert set(server.scan_rows(tablet)) == {1, 2}
