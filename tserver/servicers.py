"""The tablet server's gRPC servicers: TabletService, ConsensusService and AdminService.

A servicer coroutine runs on the event loop (grpc.aio, the reactor) and does nothing but
hand its call to the service's pool (``rpc_dispatch.dispatch``) and await the answer; the
handler runs on a pool thread, and a write is answered from its tablet's apply thread.
Kept apart from the process (``tserver.server``: start, stop, the wiring) because this is
the RPC surface: what each method does with the server's replicas, consensus handler and
flags, and which errors become INVALID_ARGUMENT. Client write streams and peers' consensus
streams are tracked here so that shutdown can end them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import crc32c
import grpc

import raftlet
from raftlet.consensus.core import NO_NODE, ConfigChange, ConfigChangeType
from raftlet.proto import (
    admin_pb2,
    admin_pb2_grpc,
    consensus_pb2,
    consensus_pb2_grpc,
    tablet_copy_pb2,
    tablet_copy_pb2_grpc,
    tablet_pb2,
    tablet_pb2_grpc,
)
from raftlet.proto.common_pb2 import ServerErrorPB
from raftlet.tserver.admin_limits import StepDownLimiter, StepDownRefused
from raftlet.tserver.consensus_stream_server import StreamSession
from raftlet.tserver.errors import InvalidRequest
from raftlet.tserver.flag_spec import FlagError
from raftlet.tserver.grpc_limits import SCAN_METHOD
from raftlet.tserver.rpc_dispatch import abort_with, dispatch
from raftlet.tserver.security import (
    AuthError,
    SenderMismatch,
    caller_identity,
    check_sender_id,
    sender_check,
)
from raftlet.tserver.service_pool import InboundCall, ServicePool
from raftlet.tserver.status_pages import replica_disk_usage
from raftlet.tserver.tablet_replica import TabletReplica, WriteCallbacks
from raftlet.tserver.write_stream import StreamWindows, WriteStreamSession

if TYPE_CHECKING:
    from raftlet.tserver.server import TabletServer

__all__ = ["AdminServicer", "ConsensusServicer", "TabletCopyServicer", "TabletServicer"]

_ROLE_PB = {
    "FOLLOWER": consensus_pb2.FOLLOWER,
    "PRE_CANDIDATE": consensus_pb2.PRE_CANDIDATE,
    "CANDIDATE": consensus_pb2.CANDIDATE,
    "LEADER": consensus_pb2.LEADER,
}


def _run_sync(handler: Callable[[], object]) -> Callable[[InboundCall], None]:
    def run(call: InboundCall) -> None:
        call.respond(handler())

    return run


async def _dispatch_sync(
    server: TabletServer,
    pool: ServicePool,
    method: str,
    context: Any,
    fn: Callable[[], object],
    check: Callable[[], None] | None = None,
) -> Any:
    """Run ``check`` (whose errors are its own: a SenderMismatch is PERMISSION_DENIED) then
    ``fn`` on ``pool``, and answer with what ``fn`` returns; a ValueError it raises is
    INVALID_ARGUMENT, NOT_LEADER names the leader's address."""
    guarded = _invalid_on_value_error(fn)

    def run() -> object:
        if check is not None:
            check()
        return guarded()

    return await dispatch(
        pool, method, context, _run_sync(run), leader_addr_lookup=server.leader_addr
    )


class _StreamTasks:
    """The tasks serving a servicer's long-lived streams, so shutdown can end them: a
    stream never ends by itself, and the grace period would otherwise wait it out."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            yield
        finally:
            self._tasks.discard(task)

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()


class TabletServicer(tablet_pb2_grpc.TabletServiceServicer):
    """Writes, write streams, scans, and what a client needs to find tablets."""

    def __init__(self, server: TabletServer) -> None:
        self._s = server
        self._pool = server.pools["tablet"]
        self._streams = _StreamTasks()
        self._windows = StreamWindows()  # one per client connection, shared by its streams

    async def _dispatch(self, method: str, context: Any, run: Callable[[InboundCall], None]) -> Any:
        return await dispatch(
            self._pool, method, context, run, leader_addr_lookup=self._s.leader_addr
        )

    async def Write(self, request: tablet_pb2.WriteRequest, context: Any) -> Any:
        def run(call: InboundCall) -> None:
            replica = self._s.replica(request.tablet_id)
            replica.write(request, WriteCallbacks(call.respond, call.fail))

        return await self._dispatch("Write", context, run)

    async def WriteStream(self, request_iterator: Any, context: Any) -> None:
        with self._streams.serving(), self._windows.of(str(context.peer())) as window:
            session = WriteStreamSession(
                asyncio.get_running_loop(),
                self._pool,
                self._s.replica,
                self._s.leader_addr,
                max_frame_bytes=self._s.limits.client_bytes,
                window=window,
            )
            await session.serve(context)

    async def WriteEndpoint(self, request: Any, context: Any) -> Any:
        listener = self._s.write_listener
        return tablet_pb2.WriteEndpointResponse(
            port=listener.port if listener is not None else 0,
            advertised_address=self._s.advertised_address,
            max_frame_bytes=self._s.limits.client_bytes,
        )

    def end_streams(self) -> None:
        """Cancel every client's write stream (shutdown: clients retry elsewhere)."""
        self._streams.cancel_all()

    async def Scan(self, request: tablet_pb2.ScanRequest, context: Any) -> Any:
        remaining = context.time_remaining()
        deadline = None if remaining is None else time.monotonic() + remaining
        return await self._dispatch(
            "Scan",
            context,
            _run_sync(lambda: self._s.replica(request.tablet_id).scan(request, deadline)),
        )

    def response_dropped(self, method: str, request: Any, response: Any) -> None:
        """A response made and not sent (``tserver.grpc_limits``): the scan its page would
        have gone on with is released, its place free for another."""
        if method != SCAN_METHOD or not getattr(response, "scanner_id", b""):
            return
        replica = self._s.replicas.get(request.tablet_id)
        if replica is not None:
            replica.release_scan(response.scanner_id)

    async def ListTablets(self, request: tablet_pb2.ListTabletsRequest, context: Any) -> Any:
        return await self._dispatch(
            "ListTablets",
            context,
            _run_sync(functools.partial(self._list_tablets, request.with_disk_usage)),
        )

    def _list_tablets(self, with_disk_usage: bool = False) -> tablet_pb2.ListTabletsResponse:
        response = tablet_pb2.ListTabletsResponse(
            server_uuid=self._s.server_id,
            config_digests=self._s.config_digests,
            tls_cert_expiry_seconds=self._s.tls_expiry_seconds(),
            servers_heard_from=sorted(self._s.servers_heard.heard),
            waiting_for_peers=self._s.waiting_for_peers,
            wiped_at_start=self._s.wiped_at_start,
            server_version=raftlet.__version__,
            copying_tablets=self._s.copier.copies_under_way(),
        )
        for replica in self._s.replicas.values():
            snap = replica.consensus.snapshot
            why = replica.failure_reason()
            if why is not None:
                why = self._s.copier.failure_note(replica.tablet_id, why)
            status = response.tablets.add(
                tablet_id=replica.tablet_id,
                table_name=replica.table,
                partition=replica.partition,
                role=_ROLE_PB[snap.role.value],
                term=snap.term,
                leader_uuid=snap.leader_id,
                leader_ready=snap.leader_ready,
                commit_index=replica.commit_index_cached(),
                applied_index=replica.store.applied_index(),
                applying_index=replica.applying_index(),
                state=tablet_pb2.TABLET_STATE_FAILED
                if why is not None
                else tablet_pb2.TABLET_STATE_RUNNING,
                failure_reason=why or "",
                voters=replica.consensus.membership.voters,
                learners=replica.consensus.membership.learners,
            )
            if with_disk_usage:
                status.disk_bytes = replica_disk_usage(replica).total_bytes
        for failed in self._s.failed_tablets.values():
            status = response.tablets.add(
                tablet_id=failed.tablet_id,
                table_name=failed.table,
                partition=failed.partition,
                role=consensus_pb2.ROLE_UNKNOWN,
                state=tablet_pb2.TABLET_STATE_FAILED,
                failure_reason=self._s.copier.failure_note(failed.tablet_id, failed.reason),
            )
            if with_disk_usage:
                status.disk_bytes = replica_disk_usage(failed).total_bytes
        return response

    async def GetClusterConfig(
        self, request: tablet_pb2.GetClusterConfigRequest, context: Any
    ) -> Any:
        # The replicas of the tablets hosted here as their memberships are now.
        return await self._dispatch("GetClusterConfig", context, _run_sync(self._s.live_config))


class ConsensusServicer(consensus_pb2_grpc.ConsensusServiceServicer):
    """The Raft RPCs from peers, unary or on a stream, answered by the consensus handler."""

    def __init__(self, server: TabletServer) -> None:
        self._server = server
        self._h = server.consensus_handler
        self._max_frame_bytes = server.limits.peer_bytes
        self._pool = server.pools["consensus"]
        self._workers = server.workers
        self._auth = server.auth
        self._streams = _StreamTasks()

    def _sender_check(self, method: str) -> Callable[[object], None] | None:
        """With auth on, what refuses this call's requests that claim a sender other than
        the server its certificate names (the interceptor already let only servers in)."""
        return sender_check(self._auth, caller_identity(), method)

    async def Stream(self, request_iterator: Any, context: Any) -> None:
        with self._streams.serving():
            session = StreamSession(
                asyncio.get_running_loop(),
                self._workers,
                self._h,
                self._sender_check("Stream"),
                max_frame_bytes=self._max_frame_bytes,
            )
            await session.serve(context)

    async def PeerEndpoint(self, request: Any, context: Any) -> Any:
        listener = self._server.tcp_listener
        return consensus_pb2.PeerEndpointResponse(
            port=listener.port if listener is not None else 0,
            advertised_address=self._server.advertised_address,
        )

    def end_streams(self) -> None:
        """Cancel every peer's stream to this server (shutdown: the peers see it break)."""
        self._streams.cancel_all()

    async def _call(
        self, method: str, context: Any, fn: Callable[[], object], request: object = None
    ) -> Any:
        check = self._sender_check(method)
        if check is not None and request is not None:
            try:
                check(request)
            except SenderMismatch as e:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
        return await dispatch(self._pool, method, context, _run_sync(_invalid_on_value_error(fn)))

    async def UpdateConsensus(self, request: Any, context: Any) -> Any:
        return await self._call(
            "UpdateConsensus", context, lambda: self._h.update_consensus(request), request
        )

    async def RequestVote(self, request: Any, context: Any) -> Any:
        return await self._call(
            "RequestVote", context, lambda: self._h.request_vote(request), request
        )

    async def TimeoutNow(self, request: Any, context: Any) -> Any:
        return await self._call(
            "TimeoutNow", context, lambda: self._h.timeout_now(request), request
        )

    async def GetConsensusState(self, request: Any, context: Any) -> Any:
        return await self._call(
            "GetConsensusState", context, lambda: self._h.get_consensus_state(request)
        )


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    """Leadership moves, consensus status and runtime flags, for operators.

    Every request is validated before anything changes: SetFlag's name and value by the flag
    registry (unknown, read-only, too long, unparsable or out of range: INVALID_ARGUMENT),
    LeaderStepDown by the replica and its consensus, and at most one step-down per tablet
    per election timeout is accepted (``admin_limits``; RESOURCE_EXHAUSTED otherwise).
    """

    def __init__(self, server: TabletServer) -> None:
        self._s = server
        self._pool = server.pools["admin"]
        raft = server.settings.raft
        self._step_downs = StepDownLimiter(raft.election_ticks * raft.tick_interval_s)

    async def _call(self, method: str, context: Any, fn: Callable[[], object]) -> Any:
        return await _dispatch_sync(self._s, self._pool, method, context, fn)

    async def LeaderStepDown(self, request: admin_pb2.LeaderStepDownRequest, context: Any) -> Any:
        # The rate check runs here, on the loop, before the call takes a pool thread: a
        # flood of step-downs is refused for the price of a dictionary lookup. Only tablets
        # hosted here are checked (an unknown one is NOT_FOUND from the handler), so random
        # ids cannot grow the limiter's table.
        grant = None
        if request.tablet_id in self._s.replicas:
            verdict = self._step_downs.acquire(request.tablet_id)
            if isinstance(verdict, StepDownRefused):
                message = verdict.message()
                await abort_with(
                    context,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    message,
                    ServerErrorPB(code=ServerErrorPB.UNKNOWN, message=message),
                )
            grant = verdict

        def step_down() -> admin_pb2.LeaderStepDownResponse:
            try:
                new = [request.new_leader_uuid] if request.new_leader_uuid else []
                _check_ids(request.tablet_id, new)
                replica = self._s.replica(request.tablet_id)
                replica.consensus.step_down(request.new_leader_uuid or NO_NODE)
            except BaseException:
                if grant is not None:
                    self._step_downs.release(grant)  # nothing moved: no reason to hold others
                raise
            return admin_pb2.LeaderStepDownResponse()

        return await self._call("LeaderStepDown", context, step_down)

    async def GetConsensusStatus(self, request: Any, context: Any) -> Any:
        return await self._call(
            "GetConsensusStatus",
            context,
            lambda: self._s.consensus_handler.get_consensus_state(request),
        )

    async def GetFlags(self, request: admin_pb2.GetFlagsRequest, context: Any) -> Any:
        def get() -> admin_pb2.GetFlagsResponse:
            return admin_pb2.GetFlagsResponse(flags=self._s.flags.render(list(request.names)))

        return await self._call("GetFlags", context, get)

    async def SetFlag(self, request: admin_pb2.SetFlagRequest, context: Any) -> Any:
        def set_flag() -> admin_pb2.SetFlagResponse:
            try:
                old = self._s.flags.set(request.name, request.value)
            except FlagError as e:
                raise InvalidRequest(str(e)) from e
            return admin_pb2.SetFlagResponse(old_value=old)

        return await self._call("SetFlag", context, set_flag)

    async def ChecksumTablet(self, request: admin_pb2.ChecksumTabletRequest, context: Any) -> Any:
        def checksum() -> admin_pb2.ChecksumTabletResponse:
            timeout_ms = request.timeout_ms or _CHECKSUM_TIMEOUT_MS
            if timeout_ms > _MAX_CHECKSUM_TIMEOUT_MS:
                raise InvalidRequest(
                    f"timeout_ms {timeout_ms} is above the limit of {_MAX_CHECKSUM_TIMEOUT_MS}"
                )
            if request.index >= 2**63:
                raise InvalidRequest(f"index {request.index} is above 2^63-1")
            replica = self._s.replica(request.tablet_id)
            members: tuple[str, ...] = ()
            if request.index == 0:
                members = replica.consensus.membership.members()
                result = replica.place_checksum_point(timeout_ms / 1000)
            else:
                result = replica.checksum_at(request.index, timeout_ms / 1000)
            return admin_pb2.ChecksumTabletResponse(
                index=result.index,
                rows=result.rows,
                checksum=result.checksum,
                failure=result.failure,
                members=members,
            )

        return await self._call("ChecksumTablet", context, checksum)

    async def CreateReplica(self, request: admin_pb2.CreateReplicaRequest, context: Any) -> Any:
        def create() -> admin_pb2.CreateReplicaResponse:
            _check_ids(request.tablet_id, [*request.voters, *request.learners])
            self._s.create_replica(
                request.tablet_id, tuple(request.voters), tuple(request.learners)
            )
            return admin_pb2.CreateReplicaResponse()

        return await self._call("CreateReplica", context, create)

    async def ChangeConfig(self, request: admin_pb2.ChangeConfigRequest, context: Any) -> Any:
        def change() -> admin_pb2.ChangeConfigResponse:
            replica, config_change = self._config_change(request)
            cas = request.cas_config_index if request.HasField("cas_config_index") else None
            entry, membership = replica.consensus.change_config(config_change, cas)
            return admin_pb2.ChangeConfigResponse(
                index=entry.index, voters=membership.voters, learners=membership.learners
            )

        return await self._call("ChangeConfig", context, change)

    async def CheckConfigChange(self, request: admin_pb2.ChangeConfigRequest, context: Any) -> Any:
        def check() -> admin_pb2.ChangeConfigResponse:
            replica, change = self._config_change(request)
            membership = replica.consensus.check_config_change(change)
            return admin_pb2.ChangeConfigResponse(
                voters=membership.voters, learners=membership.learners
            )

        return await self._call("CheckConfigChange", context, check)

    def _config_change(
        self, request: admin_pb2.ChangeConfigRequest
    ) -> tuple[TabletReplica, ConfigChange]:
        kind = _CHANGE_TYPES.get(request.type)
        if kind is None:
            raise InvalidRequest(f"unknown config change type {request.type}")
        _check_ids(request.tablet_id, [request.server_uuid])
        if request.server_uuid not in self._s.config.server_ids:
            raise InvalidRequest(f"server {request.server_uuid!r} is not in the cluster config")
        return self._s.replica(request.tablet_id), ConfigChange(kind, request.server_uuid)

    async def DeleteReplica(self, request: admin_pb2.DeleteReplicaRequest, context: Any) -> Any:
        def delete() -> admin_pb2.DeleteReplicaResponse:
            _check_ids(request.tablet_id, [])
            self._s.delete_replica(request.tablet_id, force=request.force)
            return admin_pb2.DeleteReplicaResponse()

        return await self._call("DeleteReplica", context, delete)


_CHANGE_TYPES = {
    admin_pb2.CONFIG_CHANGE_ADD_LEARNER: ConfigChangeType.ADD_LEARNER,
    admin_pb2.CONFIG_CHANGE_PROMOTE: ConfigChangeType.PROMOTE,
    admin_pb2.CONFIG_CHANGE_REMOVE: ConfigChangeType.REMOVE,
}


def _check_ids(tablet_id: str, servers: list[str]) -> None:
    """Ids an admin request names must be there and short (they travel back in errors)."""
    if not tablet_id or len(tablet_id) > 256:
        raise InvalidRequest("tablet_id must be 1 to 256 characters")
    if any(not s or len(s) > 256 for s in servers):
        raise InvalidRequest("server ids must be 1 to 256 characters")


# A checksum waits on a pool thread for its point to be applied: bounded, so a stuck
# replica cannot hold the admin pool's few threads for long.
_CHECKSUM_TIMEOUT_MS = 10_000
_MAX_CHECKSUM_TIMEOUT_MS = 60_000


def _invalid_on_value_error(fn: Callable[[], object]) -> Callable[[], object]:
    """A malformed request (the codec raises ValueError) is INVALID_ARGUMENT, not INTERNAL."""

    def run() -> object:
        try:
            return fn()
        except ValueError as e:
            raise InvalidRequest(str(e)) from e

    return run


class TabletCopyServicer(tablet_copy_pb2_grpc.TabletCopyServiceServicer):
    """Tablet copy between servers (``tserver.tablet_copier``, ``tablet_copy_source``): a
    leader's request to copy, and the copying replica's session calls. With auth on, only
    servers may call (the interceptor), and only for themselves: the server a request names
    as its sender must be the one its certificate names (PERMISSION_DENIED, counted)."""

    def __init__(self, server: TabletServer) -> None:
        self._s = server
        self._pool = server.pools["tablet_copy"]

    async def _call(self, method: str, context: Any, claimed: str, fn: Callable[[], object]) -> Any:
        peer = caller_identity()

        def check() -> None:
            auth = self._s.auth
            if auth is None:
                return
            try:
                check_sender_id(claimed, peer)
            except SenderMismatch as e:
                auth.denied(AuthError.sender_mismatch(str(e)), method, str(peer))
                raise

        return await _dispatch_sync(self._s, self._pool, method, context, fn, check)

    async def StartTabletCopy(
        self, request: tablet_copy_pb2.StartTabletCopyRequest, context: Any
    ) -> Any:
        def start() -> tablet_copy_pb2.StartTabletCopyResponse:
            started, why = self._s.copier.copy_from(
                request.tablet_id, request.source_uuid, request.source_term
            )
            return tablet_copy_pb2.StartTabletCopyResponse(
                started=started, error=ServerErrorPB(message=why) if why else None
            )

        return await self._call("StartTabletCopy", context, request.source_uuid, start)

    async def BeginTabletCopySession(
        self, request: tablet_copy_pb2.BeginTabletCopySessionRequest, context: Any
    ) -> Any:
        def begin() -> tablet_copy_pb2.BeginTabletCopySessionResponse:
            s = self._s.copy_sessions.begin(request.tablet_id, request.requester_uuid)
            return tablet_copy_pb2.BeginTabletCopySessionResponse(
                session_id=s.session_id,
                snapshot_index=s.index,
                snapshot_term=s.term,
                store_bytes=s.size,
                store_crc32c=s.crc,
                source_term=s.source_term,
                voters=list(s.voters),
                learners=list(s.learners),
                config_index=s.config_index,
                idle_timeout_ms=int(self._s.copy_sessions.idle_timeout_s * 1000),
            )

        return await self._call("BeginTabletCopySession", context, request.requester_uuid, begin)

    async def FetchTabletCopyData(
        self, request: tablet_copy_pb2.FetchTabletCopyDataRequest, context: Any
    ) -> Any:
        def fetch() -> tablet_copy_pb2.FetchTabletCopyDataResponse:
            limit = min(request.max_bytes, self._s.limits.client_bytes // 2)
            data = self._s.copy_sessions.fetch(
                request.session_id, request.offset, limit, request.requester_uuid
            )
            return tablet_copy_pb2.FetchTabletCopyDataResponse(
                data=data, crc32c=crc32c.crc32c(data)
            )

        return await self._call("FetchTabletCopyData", context, request.requester_uuid, fetch)

    async def EndTabletCopySession(
        self, request: tablet_copy_pb2.EndTabletCopySessionRequest, context: Any
    ) -> Any:
        def end() -> tablet_copy_pb2.EndTabletCopySessionResponse:
            self._s.copy_sessions.end(
                request.session_id,
                request.success,
                request.requester_uuid,
                request.installed_index,
            )
            return tablet_copy_pb2.EndTabletCopySessionResponse()

        return await self._call("EndTabletCopySession", context, request.requester_uuid, end)
