"""consensus/rpc/grpc_transport.py: the unary transport over real gRPC on loopback.

The transport's failure mapping against one replica behind a gRPC server, and three replicas
each behind its own gRPC server electing, replicating, failing over -- over one channel per
peer address.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from raftlet.client.channels import ChannelPool, channel_options
from raftlet.consensus.core import Message, MessageType, Role
from raftlet.consensus.raft_consensus import RaftConsensus
from raftlet.consensus.rpc.grpc_transport import GrpcTransport
from tests.unit.consensus_cluster import Replica, wait_for
from tests.unit.consensus_grpc_servers import (
    IDS,
    OPTIONS,
    TABLET,
    Server,
    lone_replica,
    open_replica,
    start_server,
    stop_replica,
)

# What a tablet server gives its peer channels.
PEER_OPTIONS = channel_options(max_message_bytes=16 << 20, keepalive=True)


@pytest.fixture
def served_lone(tmp_path: Path) -> Iterator[tuple[Replica, Server, ChannelPool]]:
    server = start_server("ts-b")
    pool = ChannelPool(channel_options(max_message_bytes=4 << 20, keepalive=True))
    try:
        with lone_replica(tmp_path / "b") as lone:
            server.replicas[TABLET] = lone.consensus
            yield lone, server, pool
    finally:
        pool.close()
        server.stop()


class Answers:
    """Collects on_response calls; ``wait`` for the n-th."""

    def __init__(self) -> None:
        self.got: list[Message | None] = []
        self._cond = threading.Condition()

    def __call__(self, answer: Message | None) -> None:
        with self._cond:
            self.got.append(answer)
            self._cond.notify_all()

    def wait(self, n: int = 1, timeout: float = 10.0) -> list[Message | None]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.got) >= n, timeout), "no answer"
            return list(self.got)


def _dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # closed again: connections are refused


def test_transport_answers_append_and_maps_failures_to_none(
    served_lone: tuple[Replica, Server, ChannelPool],
) -> None:
    _, server, pool = served_lone
    addresses = {"ts-b": server.addr, "ts-c": _dead_address()}
    transport = GrpcTransport(TABLET, addresses, pool, timeout_s=5.0)
    try:
        append = Message(MessageType.APPEND, "ts-a", "ts-b", 1, log_term=0, index=0, commit=0)
        answers = Answers()
        transport.send(append, answers)
        assert answers.wait() == [Message(MessageType.APPEND_RESPONSE, "ts-b", "ts-a", 1)]

        # Dropped by the replica (a vote from a past term): the error answer steps as None.
        dropped = Answers()
        transport.send(Message(MessageType.VOTE, "ts-c", "ts-b", 0), dropped)
        assert dropped.wait() == [None]

        # TIMEOUT_NOW's answer carries nothing for the core.
        tn = Answers()
        transport.send(Message(MessageType.TIMEOUT_NOW, "ts-a", "ts-b", 1), tn)
        assert tn.wait() == [None]

        for dst, why in (("ts-c", "nothing listens"), ("ts-z", "no address")):
            failed = Answers()
            transport.send(Message(MessageType.HEARTBEAT, "ts-a", dst, 1), failed)
            assert failed.wait() == [None], why
    finally:
        transport.close()
    closed = Answers()
    transport.send(Message(MessageType.HEARTBEAT, "ts-a", "ts-b", 1), closed)
    assert closed.wait() == [None]
    # Two addresses were reached (one of them dead): two channels, whatever the call count.
    assert pool.channels_created == 2


# --- end to end: three replicas, three gRPC servers -----------------------------------------


@dataclass
class Node:
    uuid: str
    server: Server
    pool: ChannelPool
    transport: GrpcTransport | None = None
    replica: Replica | None = None

    @property
    def consensus(self) -> RaftConsensus:
        assert self.replica is not None
        return self.replica.consensus

    def crash(self) -> None:
        """Stop serving and stop the replica; idempotent."""
        replica, self.replica = self.replica, None
        transport, self.transport = self.transport, None
        try:
            self.server.stop()
            if replica is not None:
                stop_replica(replica)
        finally:
            if transport is not None:
                transport.close()

    def close(self) -> None:
        try:
            self.crash()
        finally:
            self.pool.close()


@pytest.fixture
def grpc_cluster(tmp_path: Path) -> Iterator[dict[str, Node]]:
    nodes: dict[str, Node] = {}
    try:
        # Servers first: every replica needs every address before it starts.
        for uuid in IDS:
            nodes[uuid] = Node(uuid, start_server(uuid), ChannelPool(PEER_OPTIONS))
        addresses = {uuid: node.server.addr for uuid, node in nodes.items()}
        for uuid, node in nodes.items():
            node.transport = GrpcTransport(TABLET, addresses, node.pool, timeout_s=5.0)
            node.replica = open_replica(tmp_path / uuid, uuid, node.transport, OPTIONS)
            node.server.replicas[TABLET] = node.replica.consensus
        yield nodes
    finally:
        errors: list[BaseException] = []
        for node in nodes.values():  # every node, even if closing one of them fails
            try:
                node.close()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


def _leader(nodes: dict[str, Node]) -> Node | None:
    leaders = [
        n
        for n in nodes.values()
        if n.replica is not None
        and n.consensus.snapshot.role is Role.LEADER
        and n.consensus.snapshot.leader_ready
    ]
    return leaders[0] if len(leaders) == 1 else None


def _wait_leader(nodes: dict[str, Node]) -> Node:
    wait_for(lambda: _leader(nodes) is not None, timeout=15, what="one ready leader")
    leader = _leader(nodes)
    assert leader is not None
    return leader


def _write(leader: Node, rows: list[bytes]) -> None:
    term = leader.consensus.check_leadership_and_bind_term()
    for row in rows:
        leader.consensus.replicate([row], term)


def _wait_applied(node: Node, rows: list[bytes]) -> None:
    def applied() -> bool:
        return node.replica is not None and node.replica.data() == rows

    wait_for(applied, timeout=15, what=f"{node.uuid} applies {len(rows)} rows")


def test_three_servers_elect_replicate_and_fail_over(grpc_cluster: dict[str, Node]) -> None:
    nodes = grpc_cluster
    leader = _wait_leader(nodes)
    first = [b"row-%d" % i for i in range(30)]
    _write(leader, first)
    for node in nodes.values():
        _wait_applied(node, first)

    old, old_term = leader.uuid, leader.consensus.snapshot.term
    leader.crash()
    survivors = {u: n for u, n in nodes.items() if u != old}
    new_leader = _wait_leader(survivors)
    assert new_leader.uuid != old
    assert new_leader.consensus.snapshot.term > old_term
    more = [b"more-%d" % i for i in range(10)]
    _write(new_leader, more)
    for node in survivors.values():
        _wait_applied(node, first + more)

    # One channel per peer address, shared by every call the replica made, never one per
    # call.  Both leaders called both peers (the crashed one included); a follower that
    # never campaigned never called anyone.  Each leader made at least a vote, an append
    # and a commit-carrying append per live peer (9 calls at the least, 40-60 as a rule,
    # fewer when appends batch), over at most four channels.
    calls = sum(n.server.servicer.calls for n in nodes.values())
    channels = sum(n.pool.channels_created for n in nodes.values())
    assert calls > 2 * channels, (calls, channels)
    for uuid, node in nodes.items():
        peers = {n.server.addr for u, n in nodes.items() if u != uuid}
        assert node.pool.channels_created == len(node.pool.addresses()), uuid
        assert set(node.pool.addresses()) <= peers, uuid
    for uuid in (old, new_leader.uuid):
        assert nodes[uuid].pool.addresses() == sorted(
            n.server.addr for u, n in nodes.items() if u != uuid
        ), uuid
