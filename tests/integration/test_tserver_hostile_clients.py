"""A tablet server under clients that take its resources and do not give them back (issue #15).

- A client that opens many Scan calls on one connection and never reads the answers (HTTP/2
  window 0: ``tests.hostile_h2.StuckCaller``). Scans are unary here, so each stuck call is
  a whole scan page the server has produced and cannot send. The server refuses streams
  beyond ``MAX_CONCURRENT_STREAMS`` and drops pages beyond the connection's unread-bytes
  budget (``tserver.grpc_limits``): its RSS stays bounded and other clients are served.
- LeaderStepDown in a loop: at most one per tablet per election timeout is accepted.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from raftlet.proto import admin_pb2, tablet_pb2
from raftlet.tserver.grpc_limits import MAX_CONCURRENT_STREAMS, PER_CONNECTION_UNREAD_BYTES
from tests.hostile_h2 import StuckCaller
from tests.integration.tserver_cluster import (
    harness_timings,
    kv_op,
    running_cluster,
    wait_for,
    write_request,
    write_with_retry,
)

pytestmark = pytest.mark.integration

MiB = 1 << 20
PAGE = MiB
CALLS = 200
ROWS = 3000  # ~3 MiB of values: every scan page is a full PAGE


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_client_that_never_reads_its_scans_pins_bounded_memory(tmp_path: Path) -> None:
    with running_cluster(tmp_path, n_servers=1, partitions=1) as cluster:
        (tablet,) = cluster.tablet_ids()
        cluster.wait_leaders()
        value = "v" * 1000
        for start in range(0, ROWS, 500):
            ops = [kv_op(k, value) for k in range(start, start + 500)]
            write_with_retry(cluster, write_request(tablet, ops))
        server = cluster.servers["ts1"]
        before = _rss_mib(server.pid)
        request = tablet_pb2.ScanRequest(tablet_id=tablet, batch_size_bytes=PAGE)
        port = int(server.config.rpc_addr.rsplit(":", 1)[1])
        stuck = StuckCaller("127.0.0.1", port)
        try:
            for _ in range(CALLS):
                stuck.call("/raftlet.TabletService/Scan", request.SerializeToString())
            # Streams over the cap are refused at once; of the admitted ones, pages beyond
            # the connection's budget are dropped (RESOURCE_EXHAUSTED trailers). What is
            # left held is about budget / page calls. A stream ended that way while the
            # calls were still going out frees its slot for a later call, so on a loaded
            # machine fewer than CALLS - MAX_CONCURRENT_STREAMS may be refused: every call
            # is refused, ended, or among the few held.
            held_at_most = PER_CONNECTION_UNREAD_BYTES // PAGE + 1
            wait_for(
                lambda: stuck.refused + stuck.finished >= CALLS - held_at_most,
                what=f"calls refused or ended (refused {stuck.refused}, ended {stuck.finished})",
            )
            assert stuck.refused >= CALLS - MAX_CONCURRENT_STREAMS - stuck.finished
            assert stuck.finished >= MAX_CONCURRENT_STREAMS - held_at_most
            # A page dropped over the budget released the scan it would have gone on with:
            # only the pages still waiting to be read hold one (the dropped ones held every
            # place, and other clients' scans were refused).
            assert server.metric("scans_held") <= held_at_most
            during = _rss_mib(server.pid)
            # Unbounded, these 200 calls held ~800 MiB (each page is in memory ~3 times).
            # Bounded: 16 MiB of pages, ~100 MiB of RSS; 250 leaves room for a noisy box.
            assert during - before < 250, (before, during)
            # Everyone else is still served, promptly.
            t0 = time.monotonic()
            page = server.tablet.Scan(
                tablet_pb2.ScanRequest(tablet_id=tablet, limit=10), timeout=10
            )
            assert len(page.rows) == 10
            write_with_retry(cluster, write_request(tablet, [kv_op(ROWS, "after")]), timeout=10)
            assert time.monotonic() - t0 < 5
            assert not stuck.goaway
        finally:
            stuck.close()
        # Gone with its connection: the budget is free again, so this connection can scan
        # (and sees the last write once its store transaction, which follows its answer,
        # commits).
        wait_for(lambda: len(server.scan_rows(tablet)) == ROWS + 1, what="the last write")


def test_leader_step_down_is_refused_more_than_once_per_election_timeout(
    tmp_path: Path,
) -> None:
    # Elections after 2-4 s, so the interval the server enforces (an election timeout) is
    # 2 s: the repeats below must come inside it, which a loaded machine can stretch past
    # the harness's 0.5 s.
    with running_cluster(tmp_path, n_servers=3, partitions=1, raft=harness_timings(40)) as cluster:
        (tablet,) = cluster.tablet_ids()
        leader = cluster.leader_of(tablet)
        target = next(sid for sid in cluster.servers if sid != leader.id)
        # Before the call: the server's grant is no earlier, so the interval it enforces is
        # measured from no earlier than this (after the answer would be too late on a
        # loaded machine, and make the check below fail though the server is right).
        accepted_at = time.monotonic()
        leader.admin.LeaderStepDown(
            admin_pb2.LeaderStepDownRequest(tablet_id=tablet, new_leader_uuid=target), timeout=10
        )
        # At once again, on the same server: refused before it takes a thread, whatever
        # the replica's role now.
        refusals = 0
        for _ in range(20):
            with pytest.raises(grpc.RpcError) as exc:
                leader.admin.LeaderStepDown(
                    admin_pb2.LeaderStepDownRequest(tablet_id=tablet), timeout=10
                )
            if exc.value.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
                break  # the interval passed on a slow box: NOT_LEADER or the like
            refusals += 1
            assert "at most one per tablet every 2.00 s" in (exc.value.details() or "")
        assert refusals > 0
        # An unknown tablet is NOT_FOUND, not rate limited (and adds nothing to the table).
        with pytest.raises(grpc.RpcError) as exc:
            leader.admin.LeaderStepDown(
                admin_pb2.LeaderStepDownRequest(tablet_id="no-such-tablet"), timeout=10
            )
        assert exc.value.code() is grpc.StatusCode.NOT_FOUND

        # Once an election timeout has passed, the server takes step-downs again: this one
        # reaches the consensus (this server is no longer the leader: NOT_LEADER).
        def past_the_interval() -> bool:
            try:
                leader.admin.LeaderStepDown(
                    admin_pb2.LeaderStepDownRequest(tablet_id=tablet), timeout=10
                )
            except grpc.RpcError as e:
                return e.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED
            return True

        wait_for(past_the_interval, what="a step-down accepted after the interval")
        assert time.monotonic() - accepted_at >= 2.0
