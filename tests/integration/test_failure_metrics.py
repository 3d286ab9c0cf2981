"""Failed writes show on the servers' metrics: a call answered with an error in
``rpcs_failed_total`` (by service, method and status), a row refused inside a write that
succeeded in ``write_row_errors_total`` (by code). A reviewer sent writes to a follower,
duplicate keys and bad rows, and only an all-calls latency histogram moved."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests.integration.tserver_cluster import (
    kv_op,
    running_cluster,
    write_request,
    write_with_retry,
)

pytestmark = pytest.mark.integration


def test_refused_calls_and_refused_rows_are_counted(tmp_path: Path) -> None:
    with running_cluster(tmp_path, partitions=1) as cluster:
        (tablet,) = cluster.tablet_ids()
        leader = cluster.leader_of(tablet)
        follower = cluster.follower_of(tablet)
        # Labelled as the redirect it is, which `raftlet metrics` keeps off its error row.
        failed = {
            "service": "tablet",
            "method": "Write",
            "code": "FAILED_PRECONDITION",
            "error": "NOT_LEADER",
        }
        before = follower.metric("rpcs_failed_total", **failed)
        with pytest.raises(grpc.RpcError) as info:
            follower.tablet.Write(write_request(tablet, [kv_op(1, "a")]), timeout=10)
        assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION  # NOT_LEADER
        assert follower.metric("rpcs_failed_total", **failed) == before + 1

        write_with_retry(cluster, write_request(tablet, [kv_op(1, "a")]), first=leader.id)
        again = write_with_retry(
            cluster, write_request(tablet, [kv_op(1, "b"), kv_op(2, "c")]), first=leader.id
        )
        assert [e.row_index for e in again.response.row_errors] == [0]
        counted = cluster.servers[again.server].metric(
            "write_row_errors_total", tablet=tablet, code="KEY_EXISTS"
        )
        assert counted == 1
