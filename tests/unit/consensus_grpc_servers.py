"""Consensus replicas behind real gRPC servers on loopback, for the handler and transport
tests: a replica over a real log, and the smallest ConsensusService around a
``ConsensusRequestHandler``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from raftlet.client.channels import server_options
from raftlet.consensus.log import LogOptions, LogStorage, PersistentState
from raftlet.consensus.raft_consensus import ConsensusOptions, RaftConsensus
from raftlet.consensus.transport import InMemoryTransport
from raftlet.proto import consensus_pb2 as pb
from raftlet.proto import consensus_pb2_grpc
from raftlet.tserver.consensus_handler import ConsensusRequestHandler
from raftlet.tserver.errors import UnknownTablet
from tests.unit.consensus_cluster import Replica

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
        except UnknownTablet as exc:
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


@contextmanager
def lone_replica(directory: Path) -> Iterator[Replica]:
    """Replica ts-b of (ts-a, ts-b, ts-c), with no peer reachable and no election timeout."""
    transport = InMemoryTransport()
    replica = open_replica(directory, "ts-b", transport, QUIET)
    try:
        yield replica
    finally:
        try:
            stop_replica(replica)
        finally:
            transport.close()


def append_request(
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


def vote_request(term: int, caller: str = "ts-c", pre_vote: bool = False) -> pb.RequestVoteRequest:
    return pb.RequestVoteRequest(
        tablet_id=TABLET,
        candidate_uuid=caller,
        dest_uuid="ts-b",
        candidate_term=term,
        is_pre_vote=pre_vote,
    )
