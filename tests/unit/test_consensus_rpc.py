"""tserver/consensus_rpc.py: consensus over real gRPC on loopback.

The handler against a real RaftConsensus (accepts, rejects, drops, refuses garbage), the
transport's failure mapping, and three replicas each behind its own gRPC server electing,
replicating, failing over -- over one channel per peer address.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from raftlet.consensus.core import Message, MessageType, Role
from raftlet.consensus.log import LogOptions, LogStorage, PersistentState
from raftlet.consensus.raft_consensus import ConsensusOptions, RaftConsensus
from raftlet.consensus.transport import InMemoryTransport
from raftlet.proto import common_pb2, consensus_pb2_grpc
from raftlet.proto import consensus_pb2 as pb
from raftlet.tserver.consensus_codec import MalformedRequest, WrongServerUuid
from raftlet.tserver.consensus_rpc import (
    ChannelPool,
    ConsensusRequestHandler,
    GrpcTransport,
    server_options,
)
from raftlet.tserver.errors import TabletNotFound
from tests.unit.consensus_cluster import Replica, wait_for

TABLET = "tablet-1"
IDS = ("ts-a", "ts-b", "ts-c")
# Ticks of 50 ms: elections in 0.5-1 s, slow enough for gRPC on two shared cores.
OPTIONS = ConsensusOptions(
    tick_interval_s=0.05, election_ticks=10, heartbeat_ticks=1, request_timeout_s=5.0
)
# A replica that never campaigns by itself, for handler tests that script its inputs.
QUIET = ConsensusOptions(tick_interval_s=0.05, election_ticks=10_000, request_timeout_s=5.0)

Req = TypeVar("Req")
Resp = TypeVar("Resp")


def open_replica(
    directory: Path, node_id: str, transport: Any, options: ConsensusOptions
) -> Replica:
    """A RaftConsensus over a real log with an applier thread, as consensus_cluster does."""
    storage = LogStorage.open(directory, LogOptions(segment_size_bytes=1 << 20))
    if storage.metadata.fresh:
        storage.save_metadata(PersistentState(voters=IDS))
    holder: list[Replica] = []
    consensus = RaftConsensus(
        group_id=TABLET,
        node_id=node_id,
        storage=storage,
        transport=transport,
        apply_committed=lambda entries: holder[0]._queue.put(list(entries)),
        options=options,
    )
    replica = Replica(node_id, directory, storage, consensus)
    holder.append(replica)
    replica.start()
    return replica


def stop_replica(replica: Replica) -> None:
    try:
        replica.stop()
    finally:
        # The applier is a non-daemon thread: if stop() failed half-way, still release it,
        # or the test process would hang at exit instead of reporting the failure.
        replica._queue.put(None)


class Servicer(consensus_pb2_grpc.ConsensusServiceServicer):
    """The smallest service around the handler: typed errors to gRPC status, as the real
    server's dispatch does (it adds service pools; this runs on gRPC's own threads)."""

    def __init__(self, handler: ConsensusRequestHandler) -> None:
        self.handler = handler
        self.calls = 0
        self._lock = threading.Lock()

    def _serve(self, method: Callable[[Req], Resp], request: Req, context: Any) -> Resp:
        with self._lock:
            self.calls += 1
        try:
            return method(request)
        except TabletNotFound as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        raise AssertionError("unreachable: abort raises")

    def UpdateConsensus(self, request: Any, context: Any) -> Any:
        return self._serve(self.handler.update_consensus, request, context)

    def RequestVote(self, request: Any, context: Any) -> Any:
        return self._serve(self.handler.request_vote, request, context)

    def TimeoutNow(self, request: Any, context: Any) -> Any:
        return self._serve(self.handler.timeout_now, request, context)

    def GetConsensusState(self, request: Any, context: Any) -> Any:
        return self._serve(self.handler.get_consensus_state, request, context)


@dataclass
class Server:
    uuid: str
    addr: str
    grpc_server: grpc.Server
    servicer: Servicer
    replicas: dict[str, RaftConsensus]

    def stop(self) -> None:
        self.grpc_server.stop(grace=None).wait(10)


def start_server(uuid: str) -> Server:
    """A gRPC server on an ephemeral loopback port; replicas are added to ``replicas``."""
    replicas: dict[str, RaftConsensus] = {}
    servicer = Servicer(ConsensusRequestHandler(replicas.get, uuid))
    server = grpc.server(ThreadPoolExecutor(max_workers=8), options=server_options())
    consensus_pb2_grpc.add_ConsensusServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return Server(uuid, f"127.0.0.1:{port}", server, servicer, replicas)


# --- the handler, against one real replica ---------------------------------------------------


@pytest.fixture
def lone(tmp_path: Path) -> Iterator[Replica]:
    """Replica ts-b of (ts-a, ts-b, ts-c), with no peer reachable and no election timeout."""
    transport = InMemoryTransport()
    replica = open_replica(tmp_path / "b", "ts-b", transport, QUIET)
    try:
        yield replica
    finally:
        try:
            stop_replica(replica)
        finally:
            transport.close()


def _append(
    term: int, prev: int, prev_term: int, n: int, commit: int = 0
) -> pb.UpdateConsensusRequest:
    return pb.UpdateConsensusRequest(
        tablet_id=TABLET,
        caller_uuid="ts-a",
        dest_uuid="ts-b",
        caller_term=term,
        prev_log_index=prev,
        prev_log_term=prev_term,
        entries=[
            pb.EntryPB(term=term, index=prev + 1 + i, type=pb.NORMAL, payload=b"e%d" % i)
            for i in range(n)
        ],
        committed_index=commit,
    )


def _vote(term: int, caller: str = "ts-c", pre_vote: bool = False) -> pb.RequestVoteRequest:
    return pb.RequestVoteRequest(
        tablet_id=TABLET,
        candidate_uuid=caller,
        dest_uuid="ts-b",
        candidate_term=term,
        is_pre_vote=pre_vote,
    )


def test_handler_appends_heartbeats_and_reports_state(lone: Replica) -> None:
    handler = ConsensusRequestHandler({TABLET: lone.consensus}.get, "ts-b")

    resp = handler.update_consensus(_append(term=1, prev=0, prev_term=0, n=2))
    assert not resp.HasField("error")
    assert (resp.responder_uuid, resp.responder_term, resp.rejected) == ("ts-b", 1, False)
    assert resp.last_log_index == 2
    assert not resp.is_heartbeat

    # A probe (APPEND, no entries) whose prev does not match is rejected with a hint...
    probe = handler.update_consensus(_append(term=1, prev=5, prev_term=1, n=0))
    assert probe.rejected
    assert (probe.last_log_index, probe.conflict_index, probe.conflict_term) == (5, 2, 1)
    # ...while a heartbeat has no log check and just moves the commit index.
    hb = handler.update_consensus(
        pb.UpdateConsensusRequest(
            tablet_id=TABLET,
            caller_uuid="ts-a",
            dest_uuid="ts-b",
            caller_term=1,
            committed_index=2,
            is_heartbeat=True,
        )
    )
    assert hb.is_heartbeat
    assert not hb.rejected
    wait_for(lambda: lone.data() == [b"e0", b"e1"], what="both entries applied")

    state = handler.get_consensus_state(pb.GetConsensusStateRequest(tablet_id=TABLET)).state
    assert state.tablet_id == TABLET
    assert (state.current_term, state.role, state.leader_uuid) == (1, pb.FOLLOWER, "ts-a")
    assert (state.commit_index, state.last_log_index) == (2, 2)
    assert list(state.voters) == list(IDS)
    assert not state.leader_ready

    # Same term, but b already follows ts-a: the vote is refused -- an answer, not an error.
    denied = handler.request_vote(_vote(term=1))
    assert not denied.HasField("error")
    assert (denied.responder_term, denied.vote_granted) == (1, False)


def test_a_dropped_request_is_answered_with_an_error_not_silence(lone: Replica) -> None:
    handler = ConsensusRequestHandler({TABLET: lone.consensus}.get, "ts-b")
    handler.update_consensus(_append(term=3, prev=0, prev_term=0, n=0))

    # The core ignores a vote from a past term and sends nothing back.
    stale = handler.request_vote(_vote(term=2))
    assert stale.HasField("error")
    assert stale.error.code == common_pb2.ServerErrorPB.UNKNOWN
    assert "dropped VOTE of term 2" in stale.error.message
    assert (stale.responder_uuid, stale.responder_term, stale.vote_granted) == ("ts-b", 3, False)

    # A stale leader's heartbeat IS answered by the core (with the newer term), no error.
    old = handler.update_consensus(
        pb.UpdateConsensusRequest(
            tablet_id=TABLET, caller_uuid="ts-c", dest_uuid="ts-b", caller_term=2, is_heartbeat=True
        )
    )
    assert not old.HasField("error")
    assert old.responder_term == 3

    lone.consensus.stop()  # a stopping replica drops everything
    gone = handler.update_consensus(_append(term=3, prev=0, prev_term=0, n=1))
    assert gone.HasField("error")
    assert gone.rejected
    assert gone.responder_term == 3
    assert "stopping" in gone.error.message


def test_handler_refuses_misaddressed_and_unknown(lone: Replica) -> None:
    handler = ConsensusRequestHandler({TABLET: lone.consensus}.get, "ts-b")
    with pytest.raises(TabletNotFound) as missing:
        handler.update_consensus(
            pb.UpdateConsensusRequest(tablet_id="nope", caller_uuid="ts-a", dest_uuid="ts-b")
        )
    assert missing.value.tablet_id == "nope"
    with pytest.raises(TabletNotFound):
        handler.get_consensus_state(pb.GetConsensusStateRequest(tablet_id="nope"))
    with pytest.raises(MalformedRequest, match="'ts-x' is not a voter of tablet"):
        handler.request_vote(_vote(term=1, caller="ts-x"))
    with pytest.raises(WrongServerUuid):
        ConsensusRequestHandler({TABLET: lone.consensus}.get, "ts-c").update_consensus(
            _append(term=1, prev=0, prev_term=0, n=1)
        )
    bad = _append(term=1, prev=0, prev_term=0, n=1)
    bad.entries[0].type = pb.CONFIG_CHANGE
    with pytest.raises(ValueError, match="unsupported type CONFIG_CHANGE"):
        handler.update_consensus(bad)
    with pytest.raises(ValueError, match="tablet_id is missing"):
        handler.get_consensus_state(pb.GetConsensusStateRequest())
    assert lone.consensus.snapshot.term == 0, "nothing malformed reached the core"


def test_timeout_now_makes_the_follower_campaign_at_once(lone: Replica) -> None:
    handler = ConsensusRequestHandler({TABLET: lone.consensus}.get, "ts-b")
    handler.update_consensus(_append(term=1, prev=0, prev_term=0, n=1))
    resp = handler.timeout_now(
        pb.TimeoutNowRequest(tablet_id=TABLET, caller_uuid="ts-a", dest_uuid="ts-b", caller_term=1)
    )
    assert not resp.HasField("error")
    # No pre-vote for a transfer: straight to a real candidacy in the next term.
    wait_for(
        lambda: (
            lone.consensus.snapshot.role is Role.CANDIDATE and lone.consensus.snapshot.term == 2
        ),
        what="ts-b campaigns in term 2",
    )


# --- the transport ---------------------------------------------------------------------------


@pytest.fixture
def served_lone(lone: Replica) -> Iterator[tuple[Replica, Server, ChannelPool]]:
    server = start_server("ts-b")
    server.replicas[TABLET] = lone.consensus
    pool = ChannelPool(max_message_bytes=4 << 20)
    try:
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


def test_status_codes_over_the_wire_and_the_server_survives_garbage(
    served_lone: tuple[Replica, Server, ChannelPool],
) -> None:
    _, server, pool = served_lone
    channel = pool.get(server.addr)
    stub = consensus_pb2_grpc.ConsensusServiceStub(channel)  # type: ignore[no-untyped-call]

    def code_of(call: Callable[[], object]) -> grpc.StatusCode:
        with pytest.raises(grpc.RpcError) as info:
            call()
        return info.value.code()

    bad = _append(term=1, prev=0, prev_term=0, n=2)
    bad.entries[1].index = 7
    assert code_of(lambda: stub.UpdateConsensus(bad, timeout=5)) is grpc.StatusCode.INVALID_ARGUMENT
    wrong = _vote(term=1)
    wrong.dest_uuid = "ts-c"
    assert code_of(lambda: stub.RequestVote(wrong, timeout=5)) is grpc.StatusCode.INVALID_ARGUMENT
    unknown = _append(term=1, prev=0, prev_term=0, n=0)
    unknown.tablet_id = "nope"
    assert code_of(lambda: stub.UpdateConsensus(unknown, timeout=5)) is grpc.StatusCode.NOT_FOUND

    raw = channel.unary_unary("/raftlet.ConsensusService/UpdateConsensus")
    assert code_of(lambda: raw(b"\xff\xff\xff garbage", timeout=5)) is not grpc.StatusCode.OK

    state = stub.GetConsensusState(pb.GetConsensusStateRequest(tablet_id=TABLET), timeout=5)
    assert state.state.current_term == 0, "nothing reached the replica, and it still serves"
    assert pool.channels_created == 1


def test_channel_pool_keeps_one_channel_per_address() -> None:
    pool = ChannelPool()
    try:
        a = pool.get("127.0.0.1:1")
        assert pool.get("127.0.0.1:1") is a
        assert pool.get("127.0.0.1:2") is not a
        assert pool.channels_created == 2
        assert pool.addresses() == ["127.0.0.1:1", "127.0.0.1:2"]
        assert ("grpc.max_receive_message_length", 64 << 20) in pool.options
    finally:
        pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.get("127.0.0.1:1")


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
            nodes[uuid] = Node(uuid, start_server(uuid), ChannelPool())
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

    # One channel per peer address, shared by every call the replica made (hundreds of
    # heartbeats and appends), never one per call.  Both leaders called both peers (the
    # crashed one included); a follower that never campaigned never called anyone.
    calls = sum(n.server.servicer.calls for n in nodes.values())
    assert calls > 50
    for uuid, node in nodes.items():
        peers = {n.server.addr for u, n in nodes.items() if u != uuid}
        assert node.pool.channels_created == len(node.pool.addresses()), uuid
        assert set(node.pool.addresses()) <= peers, uuid
    for uuid in (old, new_leader.uuid):
        assert nodes[uuid].pool.addresses() == sorted(
            n.server.addr for u, n in nodes.items() if u != uuid
        ), uuid
