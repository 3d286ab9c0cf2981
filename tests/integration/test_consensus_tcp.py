"""The plain-TCP ports -- consensus and writes -- against hostile or broken callers, on a
real plaintext loopback 3-server cluster under write load.

Whatever arrives on a server's tcp consensus port -- a length over the peers' limit, bytes
that do not decode, items with no request, requests for tablets it does not host, more
connections than it takes -- is refused (the connection closed, or the item answered with
``failed``), and the cluster goes on: the write load keeps being acknowledged, and every
acknowledged write ends up on every replica.  On the write port the same; and a write sent
there is answered as on the gRPC WriteStream.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlet.proto import common_pb2, tablet_pb2
from raftlet.proto import consensus_pb2 as pb
from tests.integration.raw_frames import closed_by_server, read_frame, send_frame
from tests.integration.tserver_cluster import (
    Server,
    TserverCluster,
    WriteLoad,
    kv_op,
    running_cluster,
    wait_for,
    write_request,
)

pytestmark = pytest.mark.integration

TABLET = "kv-p0"
MAX_CONNECTIONS = 64  # tserver.consensus_tcp_server's default


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TserverCluster]:
    root: Path = tmp_path_factory.mktemp("tcp")
    with running_cluster(root, partitions=1) as c:  # stops every server by PID at the end
        c.wait_leaders()
        yield c


def _endpoint(server: Server) -> tuple[str, int]:
    answer = server.consensus.PeerEndpoint(pb.PeerEndpointRequest(), timeout=10)
    assert answer.port > 0
    assert answer.advertised_address == server.config.rpc_addr
    return server.config.rpc_addr.rsplit(":", 1)[0], answer.port


def _dial(server: Server) -> socket.socket:
    sock = socket.create_connection(_endpoint(server), timeout=10)
    sock.settimeout(10)
    return sock


def _dial_writes(server: Server) -> socket.socket:
    answer = server.tablet.WriteEndpoint(tablet_pb2.WriteEndpointRequest(), timeout=10)
    assert answer.port > 0
    assert answer.max_frame_bytes > 0
    host = server.config.rpc_addr.rsplit(":", 1)[0]
    sock = socket.create_connection((host, answer.port), timeout=10)
    sock.settimeout(10)
    return sock


_loads = iter(range(1, 100))
# Every row the module's loads had acknowledged: what each replica must hold in the end.
_acked: dict[int, str] = {}


def _load(cluster: TserverCluster, name: str) -> WriteLoad:
    """A write load with client ids and keys of its own (the cluster is the module's)."""
    return WriteLoad(cluster, n_writers=2, key_base=next(_loads) * 10_000_000, name=name)


def _converged(cluster: TserverCluster, load: WriteLoad) -> None:
    _acked.update(load.expected(TABLET))
    cluster.wait_converged(TABLET, dict(_acked), timeout=30)


def _answers_still_flow(load: WriteLoad) -> None:
    load.wait_acked(20, timeout=30, after=time.monotonic())


def test_the_start_line_names_both_tcp_ports(cluster: TserverCluster) -> None:
    """An operator checking what a server listens on (and whether it is secured) found
    only the gRPC and status ports in its log."""
    server = cluster.servers["ts1"]
    write_port = server.tablet.WriteEndpoint(tablet_pb2.WriteEndpointRequest(), timeout=10).port
    line = next(x for x in server.log_path.read_text().splitlines() if "serving RPCs on" in x)
    assert (
        f"(plaintext, no authentication), consensus tcp port {_endpoint(server)[1]}, "
        f"write tcp port {write_port} (same security), status on"
    ) in line, line


def test_a_frame_over_the_limit_closes_the_connection(cluster: TserverCluster) -> None:
    with _load(cluster, "oversize") as load, _dial(cluster.leader_of(TABLET)) as sock:
        sock.sendall(struct.pack(">I", 0xFFFF_FFFF))
        assert closed_by_server(sock)
        _answers_still_flow(load)
    _converged(cluster, load)


def test_bytes_that_do_not_decode_close_the_connection(cluster: TserverCluster) -> None:
    with _load(cluster, "garbage") as load:
        for server in cluster.servers.values():
            with _dial(server) as sock:
                send_frame(sock, b"\xff" * 64)
                assert closed_by_server(sock)
        _answers_still_flow(load)
    _converged(cluster, load)


def test_items_without_a_request_or_for_unknown_tablets_are_answered_failed(
    cluster: TserverCluster,
) -> None:
    leader = cluster.leader_of(TABLET)
    follower = next(s for s in cluster.servers.values() if s is not leader)
    # One item per frame, as peers send them (a frame of several is closed unanswered).
    items = pb.ConsensusFramePB(
        items=[
            pb.ConsensusItemPB(seq=7),  # no request at all
            pb.ConsensusItemPB(seq=8, update_response=pb.UpdateConsensusResponse()),
            pb.ConsensusItemPB(
                seq=9,
                update=pb.UpdateConsensusRequest(
                    tablet_id="no-such-tablet",
                    # Another server than the one dialed (which may be ts1): a request
                    # from a server to itself is refused before its tablet is looked up.
                    caller_uuid=leader.id,
                    dest_uuid=follower.id,
                    caller_term=1,
                ),
            ),
        ]
    )
    with _dial(follower) as sock:
        for item in items.items:
            send_frame(sock, pb.ConsensusFramePB(items=[item]).SerializeToString())
        answers: dict[int, pb.ConsensusItemPB] = {}
        while len(answers) < 3:
            for item in pb.ConsensusFramePB.FromString(read_frame(sock)).items:
                answers[item.seq] = item
    assert all(a.WhichOneof("kind") == "failed" for a in answers.values())
    invalid = common_pb2.ServerErrorPB.INVALID_ARGUMENT
    assert answers[7].failed.code == invalid
    assert answers[8].failed.code == invalid
    assert "no-such-tablet" in answers[9].failed.message


def test_connections_beyond_the_cap_are_refused_and_the_cluster_goes_on(
    cluster: TserverCluster,
) -> None:
    target = cluster.leader_of(TABLET)
    socks: list[socket.socket] = []
    try:
        with _load(cluster, "cap") as load:
            for _ in range(MAX_CONNECTIONS + 4):
                socks.append(_dial(target))
            # The last ones were over the cap (the peers hold two of its 64): closed at once.
            assert closed_by_server(socks[-1])
            _answers_still_flow(load)
    finally:
        for s in socks:
            s.close()
    wait_for(
        lambda: target.metric("consensus_tcp_connections", direction="in") <= 2,
        30,
        "the closed connections forgotten",
    )
    _converged(cluster, load)


def test_the_write_port_closes_on_garbage_and_oversize_frames(cluster: TserverCluster) -> None:
    leader = cluster.leader_of(TABLET)
    with _load(cluster, "write-garbage") as load:
        with _dial_writes(leader) as sock:
            sock.sendall(struct.pack(">I", 0xFFFF_FFFF))
            assert closed_by_server(sock)
        with _dial_writes(leader) as sock:
            send_frame(sock, b"\xff" * 64)
            assert closed_by_server(sock)
        _answers_still_flow(load)
    _converged(cluster, load)


def test_a_write_on_the_write_port_is_answered_like_the_stream(cluster: TserverCluster) -> None:
    leader = cluster.leader_of(TABLET)
    follower = next(s for s in cluster.servers.values() if s is not leader)
    key = 90_000_001
    request = write_request(TABLET, [kv_op(key, "raw")], "raw-writer", 1)
    frame = tablet_pb2.WriteStreamRequestPB(
        items=[tablet_pb2.WriteStreamItemPB(id=5, request=request)]
    )
    with _dial_writes(leader) as sock:
        send_frame(sock, frame.SerializeToString())
        (result,) = tablet_pb2.WriteStreamResponsePB.FromString(read_frame(sock)).results
    assert (result.id, result.status_code) == (5, 0)
    assert result.response.op_index > 0
    _acked[key] = "raw"
    # A follower refuses it as the unary call would: FAILED_PRECONDITION, NOT_LEADER.
    with _dial_writes(follower) as sock:
        send_frame(sock, frame.SerializeToString())
        (result,) = tablet_pb2.WriteStreamResponsePB.FromString(read_frame(sock)).results
    assert result.status_code == 9  # FAILED_PRECONDITION
    assert result.error.code == result.error.NOT_LEADER
