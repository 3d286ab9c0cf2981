"""A real server refuses a WriteStream message of more than ``MAX_WRITES_PER_MESSAGE``
writes: the stream ends with INVALID_ARGUMENT naming the limit, counted in
``rpcs_failed_total``, and the server goes on serving writes. One 4 MB message of ~2
million empty writes took a server from 208 MB to 1.33 GB, its ticks 143 s late; refused
after gRPC had parsed it, eight 16 MB ones still took it to 1.2 GB."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from raftlet.proto import MAX_WRITES_PER_MESSAGE, tablet_pb2
from tests.integration.tserver_cluster import kv_op, running_cluster, write_request

pytestmark = pytest.mark.integration


def _empty_writes(n: int) -> tablet_pb2.WriteStreamRequestPB:
    return tablet_pb2.WriteStreamRequestPB(
        items=[tablet_pb2.WriteStreamItemPB(id=i) for i in range(n)]
    )


def test_a_message_of_too_many_writes_is_refused_and_the_server_serves_on(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path, partitions=1) as cluster:
        cluster.wait_leaders()
        tablet = cluster.tablet_ids()[0]
        leader = cluster.leader_of(tablet)
        refused = {"service": "tablet", "method": "WriteStream", "code": "INVALID_ARGUMENT"}
        before = leader.metric("rpcs_failed_total", **refused)

        over = MAX_WRITES_PER_MESSAGE + 904  # 5,000 writes of 2 bytes each
        with pytest.raises(grpc.RpcError) as caught:
            list(leader.tablet.WriteStream(iter([_empty_writes(over)]), timeout=30))
        error = caught.value
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        details = error.details()  # type: ignore[attr-defined]
        # Counted before it was parsed (tserver.write_frame_guard): 16 MB of such writes
        # decoded to ~140 MB of protobuf objects before the refusal.
        assert f"more than {MAX_WRITES_PER_MESSAGE} writes" in details
        assert f"at most {MAX_WRITES_PER_MESSAGE}" in details
        assert leader.metric("rpcs_failed_total", **refused) == before + 1

        # At the limit the message is served: each (empty, so tablet-less) write answered
        # on its own, as the unary call would answer it.
        got: dict[int, tablet_pb2.WriteStreamResultPB] = {}
        at_limit = _empty_writes(MAX_WRITES_PER_MESSAGE)
        for response in leader.tablet.WriteStream(iter([at_limit]), timeout=30):
            for result in response.results:
                assert result.id not in got
                got[result.id] = result
        assert set(got) == set(range(MAX_WRITES_PER_MESSAGE))
        assert {r.status_code for r in got.values()} == {grpc.StatusCode.NOT_FOUND.value[0]}

        # And writes go on, on a new stream of the same connection.
        write = write_request(tablet, [kv_op(7, "seven")], "limit", 1)
        frame = tablet_pb2.WriteStreamRequestPB(
            items=[tablet_pb2.WriteStreamItemPB(id=1, request=write)]
        )
        (response,) = list(leader.tablet.WriteStream(iter([frame]), timeout=30))
        (result,) = response.results
        assert result.status_code == 0
        assert result.response.op_index > 0
        cluster.wait_converged(tablet, {7: "seven"}, timeout=30)
        assert leader.metric("rpcs_failed_total", **refused) == before + 1
