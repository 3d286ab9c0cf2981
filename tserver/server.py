"""The tablet server process: gRPC services over grpc.aio, service pools, tablet replicas,
the status server -- how they are built, started, wired together and stopped.

What each RPC does is in ``tserver.servicers``; what the status server shows about the
tablets (pages and Raft gauges) in ``tserver.status_pages``.

The event loop (grpc.aio) is the reactor: servicer coroutines only hand a call to the
service's pool (``dispatch``) and await its answer; every handler runs on a pool thread,
and a write is answered from its tablet's apply thread.  Three pools, so a storm of client
writes can never starve replication or administration:

    tablet      Write, Scan, ListTablets, GetClusterConfig   --rpc_service_queue_length
    consensus   UpdateConsensus, RequestVote, TimeoutNow,     --consensus_service_queue_length
                GetConsensusState
    admin       LeaderStepDown, GetConsensusStatus, flags,    --admin_service_queue_length
                checksums, CreateReplica, ChangeConfig,
                DeleteReplica

Which replicas a server opens at start: those the cluster config places on it (created
empty, with the placement as their membership, when their directory is new), and every
other replica directory under ``--data_dir`` that holds consensus metadata -- replicas
created later to join a group (``create_replica``, the CreateReplica RPC).  A directory with
a tombstone (``delete_replica``: a replica removed from its group and deleted) is skipped,
the placement's too.  Memberships change at run time, so each replica's transport can reach
every server of the cluster config, not only its placement's.

A tablet whose replica fails to open (damaged or missing files) is FAILED
(``tserver.failed_tablet``): the server starts and serves its other tablets, and every RPC
for the failed one is answered UNAVAILABLE "tablet failed: <why>".

Shutdown (SIGTERM): hand the tablets led here to followers that answer
(``tserver.leader_handover``), stop accepting RPCs, let in-flight ones finish within a grace
period, stop the pools, stop every replica (consensus first, then the apply path, then the
files), close channels, exit 0.  A restart recovers every replica from its directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import errno
import functools
import logging
import shutil
import ssl
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

import raftlet
from raftlet.client.aio_channels import AsyncChannelPool
from raftlet.client.channels import ChannelPool, channel_options, server_options
from raftlet.client.errors import InvalidArgument
from raftlet.client.tls import TlsOptions, channel_credentials, client_ssl_context
from raftlet.cluster import bare_host, parse_host_port
from raftlet.cluster.digest import config_digests
from raftlet.cluster.identity import AccessRole
from raftlet.cluster.placement import TabletPlacement
from raftlet.consensus.core import Membership
from raftlet.consensus.log import LogOptions
from raftlet.consensus.log.metadata import FILE_NAME as CONSENSUS_META_FILE
from raftlet.consensus.log.segment import fsync_dir, replace_durably
from raftlet.consensus.raft_consensus import describe_error, out_of_space
from raftlet.consensus.rpc.grpc_transport import GrpcTransport
from raftlet.consensus.rpc.receive_limits import receive_limits_for
from raftlet.consensus.rpc.stream_transport import StreamHub
from raftlet.consensus.rpc.tcp_transport import Endpoint, TcpHub
from raftlet.consensus.ticker import Ticker
from raftlet.consensus.transport import Transport
from raftlet.consensus.workers import WorkerPool
from raftlet.metrics import catalogue as cat
from raftlet.metrics import set_lock_contention_trace_threshold_ms
from raftlet.metrics.human import human_bytes
from raftlet.metrics.registry import MetricRegistry
from raftlet.metrics.status_server import StatusServer
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
from raftlet.tserver.bootstrap import TOMBSTONE_FILE
from raftlet.tserver.cert_check import ExpiryWatch, FilesRefused, check_server_tls
from raftlet.tserver.consensus_handler import ConsensusRequestHandler
from raftlet.tserver.consensus_tcp_server import CONSENSUS_TCP_METHOD, consensus_links
from raftlet.tserver.data_dir_lock import DataDirLock
from raftlet.tserver.empty_start import (
    NO_PEERS,
    PeersView,
    can_decide,
    gather_answers,
    read_peers,
)
from raftlet.tserver.errors import (
    FilesNotRemovable,
    InvalidRequest,
    ServiceUnavailable,
    UnknownTablet,
)
from raftlet.tserver.failed_tablet import FailedTablet, open_or_fail
from raftlet.tserver.flag_registry import FlagRegistry
from raftlet.tserver.grpc_limits import (
    MAX_CONCURRENT_RPCS,
    UnreadResponseBudget,
    server_limit_options,
)
from raftlet.tserver.hosted_tablets import HostedTablets
from raftlet.tserver.leader_handover import HANDOVER_WAIT_S, hand_over_leaderships
from raftlet.tserver.malformed import MalformedRequestInterceptor
from raftlet.tserver.message_limits import MessageLimits
from raftlet.tserver.peer_contact import CHECK_INTERVAL_S, PeerContact
from raftlet.tserver.remove_tree import remove_tree
from raftlet.tserver.replica_map import ReplicaMap
from raftlet.tserver.security import (
    Authenticator,
    AuthInterceptor,
    load_tokens_file,
    server_credentials,
    status_ssl_context,
    token_port_credentials,
)
from raftlet.tserver.servers_heard import SHARE_INTERVAL_S, ServersHeard
from raftlet.tserver.service_pool import ServicePool, ServicePoolMetrics
from raftlet.tserver.servicers import (
    AdminServicer,
    ConsensusServicer,
    TabletCopyServicer,
    TabletServicer,
)
from raftlet.tserver.settings import ServerSettings
from raftlet.tserver.status_pages import (
    register_disk_total_gauge,
    register_tablet_gauges,
    register_tablet_pages,
    tablet_statuses,
)
from raftlet.tserver.store_verifier import StoreVerifier
from raftlet.tserver.table_layout import (
    LayoutMismatch,
    check_new_tables,
    check_table_layout,
    peer_configs,
    record_table_layout,
)
from raftlet.tserver.tablet_copier import TabletCopier
from raftlet.tserver.tablet_copy_install import COPY_DIR, recover_interrupted_copies
from raftlet.tserver.tablet_copy_source import CopySessions
from raftlet.tserver.tablet_replica import ReplicaOptions, TabletReplica
from raftlet.tserver.tcp_admission import TcpAdmission, tcp_server_ssl_context
from raftlet.tserver.tcp_listener import TcpListener
from raftlet.tserver.worker_nice import nicer_thread_start
from raftlet.tserver.write_frame_guard import WriteFrameGuard
from raftlet.tserver.write_memory import WriteMemory
from raftlet.tserver.write_tcp_server import WRITE_TCP_METHOD, write_links

__all__ = ["TabletServer"]

# The gRPC service each service pool serves: its methods' overflow series exist from startup.
_POOL_SERVICES = {
    "tablet": tablet_pb2.DESCRIPTOR.services_by_name["TabletService"],
    "consensus": consensus_pb2.DESCRIPTOR.services_by_name["ConsensusService"],
    "admin": admin_pb2.DESCRIPTOR.services_by_name["AdminService"],
    "tablet_copy": tablet_copy_pb2.DESCRIPTOR.services_by_name["TabletCopyService"],
}

logger = logging.getLogger(__name__)

_SHUTDOWN_GRACE_S = 5.0
# A stop whose RPCs have not all ended by this long after the replicas stopped says why
# it waits on.
_QUIET_STOP_S = 0.5
# How long a server new to a cluster waits for each peer's list of tablets at start.
_ASK_PEERS_S = 2.0


# At most this many open tcp connections from peers (a peer server needs one) and from
# clients (one per client and server): more are closed as soon as they are accepted.
MAX_PEER_CONNECTIONS = 64
MAX_WRITE_CONNECTIONS = 1024


class TabletServer:
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = s = settings
        self.config = s.config
        # What ListTablets reports, so a check can tell a server on another config.
        self.config_digests = config_digests(s.config, s.raft)  # the timings it runs
        self.server_id = s.server_id
        self.flags = FlagRegistry.from_settings(s)
        self.registry = MetricRegistry()
        self.entity = self.registry.entity("server", s.server_id, {})
        # Every size limit, from --max_message_bytes (tserver/message_limits.py).
        self.limits = MessageLimits(s.max_message_bytes)
        # Peer channels carry replication messages: the peers' limit, which each peer's
        # gRPC server accepts.
        self.peer_channel_options = channel_options(
            max_message_bytes=self.limits.peer_bytes, keepalive=True
        )
        self.entity.gauge(cat.BUILD_INFO, version=raftlet.__version__).set(1)
        # When the first of its certificate and that certificate's CA expires; None: no TLS.
        self.tls_expires: datetime.datetime | None = None
        if s.tls:  # before anything listens: files that cannot work stop the server here
            host = bare_host(parse_host_port(self.config.server(s.server_id).rpc_addr)[0])
            expires = check_server_tls(s.tls_cert, s.tls_key, s.tls_ca, s.server_id, host=host)
            self.tls_expires = expires
            self.entity.function_gauge(cat.TLS_CERT_EXPIRY_SECONDS, lambda: _seconds_until(expires))
        # With TLS, peers are dialled with this server's own certificate as the client
        # certificate: that is how they know who sends them Raft messages.
        try:
            self.peer_credentials = (
                channel_credentials(TlsOptions(s.tls_ca, s.tls_cert, s.tls_key)) if s.tls else None
            )
        except InvalidArgument as e:  # a file that is missing or unreadable: one line
            raise OSError(str(e)) from None
        self.auth: Authenticator | None = None
        if s.tls:
            try:
                tokens = load_tokens_file(s.auth_tokens_file) if s.auth_tokens_file else None
            except ValueError as e:  # there, but not tokens: no restart mends it
                raise FilesRefused(f"--auth_tokens_file: {e}") from None
            self.auth = Authenticator(tokens, self.entity)
        self.channels = ChannelPool(self.peer_channel_options, credentials=self.peer_credentials)
        # Copy-on-write: replicas are created and deleted while the server runs.
        self.replicas: ReplicaMap[TabletReplica] = ReplicaMap()
        # The budget every replica's admitted writes share (tserver.write_memory).
        self.write_memory = WriteMemory(
            s.write_memory_limit_bytes, self.entity.counter(cat.WRITE_MEMORY_REFUSALS_TOTAL)
        )
        self.entity.function_gauge(cat.WRITE_MEMORY_HELD_BYTES, self.write_memory.held)
        self.log_options = LogOptions()
        # Tablet copy: the sessions this server serves as a source, and its copies.
        self.copy_sessions = CopySessions(
            s.data_dir,
            self.replica,
            idle_timeout_s=s.tablet_copy_session_timeout_s,
            on_ended=lambda outcome: self.entity.counter(
                cat.TABLET_COPY_SESSIONS_TOTAL, outcome=outcome
            ).increment(),
        )
        self.copier = TabletCopier(
            self,
            chunk_bytes=s.tablet_copy_chunk_bytes,
            repair_interval_s=s.tablet_copy_repair_interval_s,
        )
        self._data_dir_lock: DataDirLock | None = None  # held from start until stopped
        # Tablets placed here whose replica failed to open: answered, never served.
        self.failed_tablets: ReplicaMap[FailedTablet] = ReplicaMap()
        # Every tablet of the cluster, wherever it is placed: what a replica created here
        # later belongs to.
        self.tablets = {p.tablet_id: p for p in self.config.placements()}
        # Serializes creating and deleting replicas (and opening them at start).
        self._replicas_lock = threading.Lock()
        # Tablets whose replica a tablet copy is replacing (out of both maps meanwhile):
        # calls for them are answered "being installed", retriable, not "not found" -- an
        # add-replica waiting for its learner took NOT_FOUND for a deleted replica and asked
        # to create it again, which failed the add.
        self._installing: set[str] = set()
        # Tablets whose deletion failed part way (files that could not be removed): listed
        # FAILED until a rerun deletes them, and never repaired by a copy meanwhile.
        self._undeletable: set[str] = set()
        self._replica_options: ReplicaOptions | None = None
        self._peer_timeout_s = 0.0
        self.pools = {
            "tablet": self._pool("tablet", s.rpc_num_service_threads, s.rpc_service_queue_length),
            "consensus": self._pool(
                "consensus", s.consensus_num_service_threads, s.consensus_service_queue_length
            ),
            "admin": self._pool("admin", s.admin_num_service_threads, s.admin_service_queue_length),
            # Copies are few and their chunks large: a small pool of their own, so a copy
            # never queues behind (or holds up) Raft's messages.
            "tablet_copy": self._pool("tablet_copy", 2, 16),
        }
        # Every replica's worker, prepare and apply stages, and the peers' consensus
        # streams, run on this one pool; it and the WAL appenders below run --worker_nice
        # levels below the front door (tserver/worker_nice.py).
        pipeline_start = nicer_thread_start(s.worker_nice)
        self.workers = WorkerPool(
            "replica-worker",
            min_threads=s.replica_worker_min_threads,
            max_threads=s.replica_worker_max_threads,
            running_target=s.replica_worker_running_threads,
            thread_start=pipeline_start,
        )
        # Every replica's WAL writes and syncs on these: fsyncs release the GIL, so several
        # may run at once, but not one thread per tablet.
        self.log_appenders = WorkerPool(
            "log-appender",
            min_threads=1,
            max_threads=s.log_appender_threads,
            thread_start=pipeline_start,
        )
        self.consensus_handler = ConsensusRequestHandler(
            self._consensus_of, s.server_id, peers=self.config.server_ids
        )
        self.status = StatusServer(
            self.registry,
            *parse_host_port(s.http_addr),
            server_name=s.server_id,
            ssl_context=status_ssl_context(s.tls_cert, s.tls_key, s.tls_ca) if s.tls else None,
            guard=self.auth.check_page if self.auth is not None else None,
        )
        self._consensus_servicer = ConsensusServicer(self)
        self._tablet_servicer = TabletServicer(self)
        self.ticker: Ticker | None = None  # one thread ticks every replica (set in start)
        self.streams: StreamHub | None = None  # the consensus streams to peers, if used
        self.tcp_hub: TcpHub | None = None  # the tcp connections to peers, if used
        # Plain-TCP ports (TLS when the server runs it): peers' consensus traffic, clients'
        # write streams.
        self.tcp_listener: TcpListener | None = None
        self.write_listener: TcpListener | None = None
        # Where peers dial us; a peer that dials another address must not use our tcp port.
        self.advertised_address = self.config.server(s.server_id).rpc_addr
        self._stream_only_peers: set[str] = set()  # told once that they stay on the stream
        self.stream_channels: AsyncChannelPool | None = None  # the streams' channels
        self._grpc: grpc.aio.Server | None = None
        self._verifier: StoreVerifier | None = None
        self._health: health_async.HealthServicer | None = None
        self.rpc_port = 0
        # The other servers of the config: the peers this one dials and asks.
        self._others = tuple(sid for sid in self.config.server_ids if sid != s.server_id)
        self.servers_heard = ServersHeard(s.data_dir, self._others)
        self._sharing: asyncio.Future[None] | None = None
        # Says in the log which peers stopped answering (tserver.peer_contact).
        self.peer_contact = PeerContact({sid: s.peer_addr(sid) for sid in self._others})
        self._watching: asyncio.Future[None] | None = None
        # Opens the replicas once a peer answers, if none did at start (_ask_peers); stop
        # waits for an opening under way, and none begins after it (_late_open_lock).
        self._deciding: asyncio.Future[None] | None = None
        self._late_open_lock = threading.Lock()
        self._no_late_open = False
        # Read by ListTablets: no peer has answered this empty data directory yet.
        self.waiting_for_peers = False
        # Found at start that its data directory was wiped (ListTablets.wiped_at_start).
        self.wiped_at_start = False
        # Set by request_stop: ends the wait for peers at start, deciding nothing.
        self._stop_requested = threading.Event()

    def _pool(self, name: str, threads: int, queue_length: int) -> ServicePool:
        service = _POOL_SERVICES[name]
        return ServicePool(
            name,
            num_threads=threads,
            queue_length=queue_length,
            metrics=ServicePoolMetrics(self.entity, name, [m.name for m in service.methods]),
            yield_on_wake=self.settings.rpc_handoff_yield,
        )

    def _count_malformed(self, method: str) -> None:
        """Count an undecodable request of ``method`` (``/raftlet.TabletService/Write``) as
        its service pool counts the method's other failures."""
        service, _, name = method.lstrip("/").rpartition("/")
        for pool_name, descriptor in _POOL_SERVICES.items():
            if descriptor.full_name == service:
                failed = self.pools[pool_name].metrics.failed_for
                failed(name, "INVALID_ARGUMENT", "INVALID_ARGUMENT").increment()
                return

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        # Before anything under the data directory is read or written.
        self._data_dir_lock = DataDirLock.acquire(s.data_dir, s.server_id)
        self.servers_heard.load()
        set_lock_contention_trace_threshold_ms(s.lock_contention_trace_threshold_ms)
        self.flags.subscribe("lock_contention_trace_threshold_ms", self._on_trace_threshold)
        self.flags.subscribe("log_inject_latency_ms", self._on_log_latency)
        self.flags.subscribe("log_inject_latency_jitter_ms", self._on_log_latency)
        self.flags.subscribe("write_memory_limit_bytes", self._on_write_memory_limit)
        options = ReplicaOptions(
            consensus=dataclasses.replace(
                s.consensus_options(), max_size_per_msg=self.limits.append_batch_bytes
            ),
            log=s.log_options(),
            max_batch_rows=s.max_batch_rows,
            max_write_bytes=self.limits.write_bytes,
            scan_page_bytes=s.scan_page_bytes,
            log_gc_interval_s=s.log_gc_interval_s,
            follower_apply_delay_s=s.follower_apply_delay_ms / 1000,
            rounds_in_flight=s.write_rounds_in_flight,
            round_linger_s=s.write_round_linger_ms / 1000,
            log_max_segments_retained=s.log_max_segments_retained,
            scan_max_page_bytes=s.max_message_bytes // 2,
            scan_page_cap_bytes=self.limits.scan_page_cap_bytes,
            result_tracker_max_clients=s.result_tracker_max_clients,
            result_tracker_max_bytes=s.result_tracker_max_bytes,
            unsafe_leader_reads_without_quorum=s.unsafe_leader_reads_without_quorum,
            unsafe_ack_before_commit=s.unsafe_ack_before_commit,
        )
        unsafe = (
            "unsafe_leader_reads_without_quorum",
            "unsafe_leader_keeps_lost_quorum",
            "unsafe_ack_before_commit",
        )
        for name in unsafe:
            if getattr(s, name):
                logger.warning("--%s is set: this server breaks a guarantee on purpose", name)
        # Every heartbeat's worth of ticks at once: see consensus.ticker.
        self.ticker = Ticker(
            options.consensus.tick_interval_s,
            ticks_per_call=options.consensus.heartbeat_ticks,
            stall_margin_s=s.stall_margin_s(),
        )
        # A follower answers an append once it is durable: the deadline covers its fsync.
        peer_timeout_s = options.consensus.request_timeout_s + 5.0
        if s.consensus_transport in ("stream", "tcp"):
            self.stream_channels = AsyncChannelPool(
                self.peer_channel_options, credentials=self.peer_credentials
            )
            self.streams = StreamHub(
                asyncio.get_running_loop(),
                self.stream_channels,
                peer_timeout_s,
                max_frame_bytes=self.limits.peer_bytes,
            )
        # With TLS the tcp paths are TLS too, with the gRPC port's identity rules
        # (tserver.tcp_admission): peers dial with this server's certificate.
        server_tls = (
            tcp_server_ssl_context(s.tls_cert, s.tls_key, s.tls_ca)
            if self.auth is not None
            else None
        )
        if s.consensus_transport == "tcp" and self.streams is not None:
            self.tcp_hub = TcpHub(
                self.streams,
                self._tcp_endpoint,
                client_ssl_context(TlsOptions(s.tls_ca, s.tls_cert, s.tls_key)) if s.tls else None,
            )
            self.entity.function_gauge(
                cat.CONSENSUS_TCP_CONNECTIONS, self.tcp_hub.connections, direction="out"
            )
        host = parse_host_port(s.rpc_addr)[0]
        self.tcp_listener = TcpListener(
            "consensus",
            host,
            s.consensus_tcp_port,
            consensus_links(
                self.consensus_handler,
                max_frame_bytes=self.limits.peer_bytes,
                send_timeout_s=peer_timeout_s,
                auth=self.auth,
                receive_limits=receive_limits_for(self.limits.peer_bytes, s.tcp_frame_deadline_s),
            ),
            max_connections=MAX_PEER_CONNECTIONS,
            admission=self._admission(server_tls, AccessRole.SERVER, CONSENSUS_TCP_METHOD),
            refusals=self.entity.counter(cat.TCP_CONNECTIONS_REFUSED_TOTAL, port="consensus"),
        )
        self.entity.function_gauge(
            cat.CONSENSUS_TCP_CONNECTIONS, self.tcp_listener.connections, direction="in"
        )
        self.write_listener = TcpListener(
            "write",
            host,
            s.write_tcp_port,
            write_links(
                self.pools["tablet"],
                self.replica,
                self.leader_addr,
                max_frame_bytes=self.limits.client_bytes,
                send_timeout_s=peer_timeout_s,
                receive_limits=receive_limits_for(self.limits.client_bytes, s.tcp_frame_deadline_s),
            ),
            max_connections=MAX_WRITE_CONNECTIONS,
            admission=self._admission(server_tls, AccessRole.WRITER, WRITE_TCP_METHOD),
            refusals=self.entity.counter(cat.TCP_CONNECTIONS_REFUSED_TOTAL, port="write"),
        )
        self.entity.function_gauge(cat.WRITE_TCP_CONNECTIONS, self.write_listener.connections)
        self._replica_options = options
        self._peer_timeout_s = peer_timeout_s
        self.log_options = options.log
        # Before any replica is opened: a table repartitioned or reshaped under its rows,
        # or one new here that the servers running already have otherwise.
        known_tables = check_table_layout(s.data_dir, s.config.tables)
        new_tables = [t for t in s.config.tables if t.name not in known_tables]
        if new_tables and self._others:
            check_new_tables(new_tables, await asyncio.to_thread(self._peer_configs))
        restored = recover_interrupted_copies(s.data_dir)
        if restored:
            logger.warning("tablet copies interrupted by a crash undone: %s", ", ".join(restored))
        record = HostedTablets.load(s.data_dir)
        peers: PeersView | None = NO_PEERS
        if record.hosted is None and not self._replica_dirs():
            peers = await asyncio.to_thread(self._ask_peers)
            if self._stop_requested.is_set():
                # Stopped while it waited for its peers: nothing decided, nothing written,
                # so the next start asks them again. stop() closes what was opened so far.
                logger.info("stopped while waiting for peers: no replica made")
                return
        if peers is not None:
            self._open_replicas(record, known_tables, peers)
        for pool in self.pools.values():
            pool.start()
        # Authentication first: an unauthenticated caller learns nothing, not even that its
        # bytes do not decode. Then the hostile-client limits (streams per connection, unread
        # response bytes, calls in all): tserver/grpc_limits.py says what each bounds and why.
        interceptors: list[grpc.aio.ServerInterceptor] = [
            MalformedRequestInterceptor(self._count_malformed),
            UnreadResponseBudget(on_dropped=self._tablet_servicer.response_dropped),
            WriteFrameGuard(),  # a WriteStream message's writes counted before it is parsed
        ]
        if self.auth is not None:
            interceptors.insert(0, AuthInterceptor(self.auth))
        server = grpc.aio.server(
            # Peers and clients share the port: it takes what peers send (a client's write
            # over --max_message_bytes is refused by the replica, with the limit named).
            options=server_options(self.limits.peer_bytes) + server_limit_options(),
            interceptors=interceptors,
            maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
        )
        tablet_pb2_grpc.add_TabletServiceServicer_to_server(self._tablet_servicer, server)
        consensus_pb2_grpc.add_ConsensusServiceServicer_to_server(self._consensus_servicer, server)
        admin_pb2_grpc.add_AdminServiceServicer_to_server(AdminServicer(self), server)
        tablet_copy_pb2_grpc.add_TabletCopyServiceServicer_to_server(
            TabletCopyServicer(self), server
        )
        self._health = health_async.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        names = [
            tablet_pb2.DESCRIPTOR.services_by_name["TabletService"].full_name,
            consensus_pb2.DESCRIPTOR.services_by_name["ConsensusService"].full_name,
            admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
            tablet_copy_pb2.DESCRIPTOR.services_by_name["TabletCopyService"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ]
        reflection.enable_server_reflection(names, server)
        if s.tls:
            credentials = server_credentials(s.tls_cert, s.tls_key, s.tls_ca)
            self.rpc_port = _listen(
                lambda: server.add_secure_port(s.rpc_addr, credentials), "RPCs", s.rpc_addr
            )
        else:
            self.rpc_port = _listen(
                lambda: server.add_insecure_port(s.rpc_addr), "RPCs", s.rpc_addr
            )
        if s.token_rpc_addr:
            token_credentials = token_port_credentials(s.tls_cert, s.tls_key)
            _listen(
                lambda: server.add_secure_port(s.token_rpc_addr, token_credentials),
                "token RPCs",
                s.token_rpc_addr,
            )
        await server.start()
        self._grpc = server
        for listener in (self.tcp_listener, self.write_listener):
            if listener is not None:
                listener.start()
        for replica in self.replicas.values():
            replica.start()
        self.ticker.start()
        self.copier.start()
        self._sharing = asyncio.ensure_future(self._share_servers_heard())
        self._watching = asyncio.ensure_future(self._watch_peer_contact())
        if peers is None:
            self.waiting_for_peers = True
            self._deciding = asyncio.ensure_future(
                self._decide_when_a_peer_answers(record, known_tables)
            )
        if s.store_verify_interval_s > 0:
            self._verifier = StoreVerifier(
                lambda: list(self.replicas.values()), s.store_verify_interval_s
            )
            self._verifier.start()
        register_tablet_pages(
            self.status,
            self.server_id,
            self.replicas,
            self.failed_tablets,
            self.copier.copies_under_way,
            self._unsettled,
        )
        register_disk_total_gauge(
            self.entity, self.replicas, self.failed_tablets, s.data_dir / COPY_DIR
        )
        try:
            self.status.start()
        except OSError as e:
            if e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                raise
            raise OSError(_cannot_listen("status pages", s.http_addr)) from None
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        tcp_ports = ", ".join(
            f"{listener.what} tcp port {listener.port}"
            for listener in (self.tcp_listener, self.write_listener)
            if listener is not None
        )
        logger.info(
            "tablet server %s (raftlet %s) serving RPCs on %s (%s)%s, status on %s (%d tablets%s)",
            self.server_id,
            raftlet.__version__,
            s.rpc_addr,
            ("mutual TLS" if s.tls else "plaintext, no authentication")
            + (f"; bearer tokens on {s.token_rpc_addr}" if s.token_rpc_addr else ""),
            f", {tcp_ports} (same security)" if tcp_ports else "",
            self.status.url(),
            len(self.replicas),
            f"; FAILED: {', '.join(sorted(self.failed_tablets))}" if self.failed_tablets else "",
        )

    def request_stop(self) -> None:
        """A stop is coming (a signal): a start still waiting for its peers ends its wait
        and returns having made nothing (``start``)."""
        self._stop_requested.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested.is_set()

    def _admission(
        self, context: ssl.SSLContext | None, role: AccessRole, what: str
    ) -> TcpAdmission | None:
        """Who a tcp port admits under TLS; None without TLS (anyone, as the gRPC port)."""
        if context is None or self.auth is None:
            return None
        return TcpAdmission(context, self.auth, role, what)

    def _replica_dirs(self) -> set[str]:
        """The tablets with a replica (or a tombstone) in the data directory."""
        data_dir = self.settings.data_dir
        return {
            c.name
            for c in (data_dir.iterdir() if data_dir.is_dir() else ())
            if (c / CONSENSUS_META_FILE).is_file() or (c / TOMBSTONE_FILE).is_file()
        }

    def _ask_peers(self) -> PeersView | None:
        """What the other servers of the config say of this one's groups
        (``tserver.empty_start``); None if none answered within ``--empty_dir_wait_s``."""
        wait_s = self.settings.empty_dir_wait_s
        answers = gather_answers(
            self.server_id,
            self._others,
            self._peer_listings,
            wait_s,
            sleep=self._stop_requested.wait,
            stopped=self._stop_requested.is_set,
        )
        decided = can_decide(self.server_id, len(self._others), answers, waited=True)
        if self._others and not decided and wait_s > 0:
            return None
        placed = (p.tablet_id for p in self.settings.placements())
        return self._peers_read(read_peers(self.server_id, placed, answers))

    def _peers_read(self, peers: PeersView) -> PeersView:
        """Note whether ``peers`` found this server wiped, which its ListTablets says."""
        self.wiped_at_start = bool(peers.heard_by)
        return peers

    async def _decide_when_a_peer_answers(
        self, record: HostedTablets, known_tables: frozenset[str]
    ) -> None:
        """An empty data directory no peer answered for: ask again every second, serving
        meanwhile (so that the servers of a new cluster started together hear each other),
        and open the replicas as the first answers say (``tserver.empty_start``)."""
        placed = [p.tablet_id for p in self.settings.placements()]
        while True:
            await asyncio.sleep(1.0)
            answers = await asyncio.to_thread(self._peer_listings)
            if can_decide(self.server_id, len(self._others), answers.values(), waited=True):
                break
        peers = self._peers_read(read_peers(self.server_id, placed, answers.values()))
        self.waiting_for_peers = False
        logger.info("%s answered: the replicas of this server are opened", ", ".join(answers))
        try:
            await asyncio.to_thread(self._open_late, record, known_tables, peers)
        except Exception:
            logger.exception("opening the replicas once a peer answered failed")

    def _open_late(
        self, record: HostedTablets, known_tables: frozenset[str], peers: PeersView
    ) -> None:
        """``_open_replicas`` on a server that serves, unless it is stopping: a stop that
        began first opens nothing after it, and one that begins meanwhile waits for the
        replicas to be open (``_stop_blocking``), then stops them with the others."""
        with self._late_open_lock:
            if not self._no_late_open:
                self._open_replicas(record, known_tables, peers, start=True)

    def _open_replicas(
        self,
        record: HostedTablets,
        known_tables: frozenset[str],
        peers: PeersView,
        start: bool = False,
    ) -> None:
        """Open this server's replicas (``_tablets_to_open``), and ``start`` them (a server
        that already serves)."""
        s = self.settings
        with self._replicas_lock:
            opening = self._tablets_to_open(record, known_tables, peers)
            # Two steps (``tserver.hosted_tablets``): the replicas to make are recorded as
            # being made, and as hosted once made -- before this server serves anything,
            # so one killed in between has voted for and acknowledged nothing.
            self._placed = frozenset(p.tablet_id for p in s.placements())
            self._hosted = {p.tablet_id for p, must_exist in opening if must_exist}
            self._record_hosted(self._hosted, {p.tablet_id for p, m in opening if not m})
            record_table_layout(s.data_dir, s.config.tables)
            for placement, must_exist in opening:
                register_tablet_gauges(
                    self._tablet_entity(placement),
                    functools.partial(self.hosted, placement.tablet_id),
                )
                tid = placement.tablet_id
                replica = self._open(placement, must_exist=must_exist, voters=peers.voters.get(tid))
                if start and isinstance(replica, TabletReplica):
                    replica.start()
                self._place(tid, replica)
            self._record_hosted({p.tablet_id for p, _ in opening})
            self._check_members_listed()

    def _peer_configs(self) -> dict[str, tablet_pb2.GetClusterConfigResponse]:
        """The cluster config of each other server that answers at once (one that is down
        refuses the connection; one not serving yet is not asked again)."""
        stubs = {sid: self.channels.stub(self.settings.peer_addr(sid)) for sid in self._others}
        return peer_configs(stubs, _ASK_PEERS_S)

    def _peer_listings(
        self, peers: Collection[str] | None = None
    ) -> dict[str, tablet_pb2.ListTabletsResponse]:
        """``ListTablets`` of ``peers`` (default: every other server), asked of all at once,
        briefly; a peer that does not answer (down, busy) is left out."""
        if peers is None:
            peers = self._others
        calls = {
            sid: self.channels.stub(self.settings.peer_addr(sid)).list_tablets_future(_ASK_PEERS_S)
            for sid in peers
        }
        answers = {}
        for sid, call in calls.items():
            try:
                answers[sid] = call.result()
            except grpc.RpcError:
                continue
        return answers

    async def _share_servers_heard(self) -> None:
        """Take in the peers' records of the servers they heard from, every
        ``SHARE_INTERVAL_S`` (``tserver.servers_heard``)."""
        while True:
            await asyncio.sleep(SHARE_INTERVAL_S)
            try:
                listings = await asyncio.to_thread(self._peer_listings)
                for listed in listings.values():
                    await asyncio.to_thread(self.servers_heard.note_all, listed.servers_heard_from)
            except Exception:  # the next pass asks again; a server is not stopped for this
                logger.exception("taking in the peers' records of servers heard from")

    async def _watch_peer_contact(self) -> None:
        """Log which peers stopped answering (``tserver.peer_contact``), and a certificate
        about to expire or expired (``cert_check.ExpiryWatch``), every
        ``CHECK_INTERVAL_S``. Once it has expired, the tablets led here are handed to
        followers (``tserver.leader_handover``), again whenever one is led here: no new
        client can connect to this server, and a review's writes to a tablet it led waited
        out their whole timeout while its peers, over the connections they had, kept it
        leader."""
        expiry = None if self.tls_expires is None else ExpiryWatch(self.tls_expires)
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            try:
                self.peer_contact.check()
                if expiry is not None and expiry.check():
                    await hand_over_leaderships(
                        [r.consensus for r in list(self.replicas.values())],
                        self.settings.leader_handover_wait_s or HANDOVER_WAIT_S,
                        why="this server's TLS certificate expired",
                    )
            except Exception:  # the next pass looks again; a server is not stopped for this
                logger.exception("checking which peers answer")

    def _peer_heard(self, server_id: str) -> None:
        """A replica's hook for every peer message it receives (``on_peer_heard``)."""
        self.peer_contact.heard(server_id)
        self.servers_heard.note(server_id)

    def _tablets_to_open(
        self,
        record: HostedTablets,
        known_tables: frozenset[str] = frozenset(),
        peers: PeersView = NO_PEERS,
    ) -> list[tuple[TabletPlacement, bool]]:
        """The tablets to open, each with whether its replica must be there already: the
        placement's, every tablet ``record`` says is hosted here, and every other tablet
        with a replica directory here (created later), less the deleted ones (a tombstone,
        or placed here yet no longer hosted: ``tserver.hosted_tablets``).

        Replicas are made from the placement only for a table new to this server (not in
        ``known_tables``, those ``tables.json`` recorded), and by a new server not for the
        groups that run without it (``peers.without_me``): adding or removing servers moves
        the placement of every table, and replicas made for groups that existed formed
        groups of their own (``tserver.table_layout``).  An empty data directory that a
        peer heard from before (``peers.heard_by``) was wiped: none is made afresh, and
        every replica it held -- placed, or in a group that lists it -- must be there,
        so it opens FAILED for a tablet copy to repair (``tserver.empty_start``)."""
        data_dir = self.settings.data_dir
        hosted = record.hosted or frozenset()
        present = self._replica_dirs()
        # No record and no replica yet: a new server, which makes its placed replicas.
        # No record beside replicas (a server from before the record, or one whose record
        # was moved aside): the replicas there are opened, and nothing is made afresh.
        new_server = record.hosted is None and not present
        wiped = new_server and bool(peers.heard_by)
        chosen: dict[str, tuple[TabletPlacement, bool]] = {}
        for p in self.settings.placements():
            tid = p.tablet_id
            if new_server and tid in peers.without_me:
                continue  # its group runs without this server (_ask_peers says so)
            if new_server or tid in hosted:
                chosen[tid] = (p, not new_server or wiped)
            elif tid in record.creating:
                chosen[tid] = (p, False)  # being made when the server stopped: made again
            elif p.table in known_tables and record.placed is not None and tid not in record.placed:
                logger.info(
                    "tablet %s: placed here by this config, but its table existed before: "
                    "not made (replicas of a table that exists move by `raftlet tablet "
                    "move-replica` or `add-replica`)",
                    tid,
                )
            elif record.placed is not None and tid not in record.placed:
                chosen[tid] = (p, False)  # a table new to the config since the record
            elif record.hosted is None and tid not in present:
                args = f"{tid} {self.server_id}"
                logger.warning(
                    "tablet %s: placed here, but this server keeps no record of the tablets "
                    "it hosts and has no replica of it: not made afresh (if it belongs here, "
                    "`raftlet tablet remove-replica %s --wait` then `add-replica %s --wait` "
                    "makes it again)",
                    tid,
                    args,
                    args,
                )
            elif record.hosted is not None:
                logger.info("tablet %s: deleted from this server, not opened", tid)
        if wiped:
            hosted = hosted | peers.with_me
        for tid in sorted(hosted - chosen.keys()):
            placement = self.tablets.get(tid)
            if placement is None:
                logger.warning("tablet %s: hosted here, but no tablet of the cluster config", tid)
                continue
            chosen[tid] = (placement, True)
        for child in sorted(data_dir.iterdir()) if data_dir.is_dir() else []:
            if child.name in chosen or not (child / CONSENSUS_META_FILE).is_file():
                continue
            placement = self.tablets.get(child.name)
            if placement is None:
                logger.warning("%s: no tablet of the cluster config, not opened", child)
                continue
            chosen[child.name] = (placement, True)
        if wiped:
            _say_wiped(data_dir, peers.heard_by, sorted(chosen))
        return [c for tid, c in chosen.items() if not (data_dir / tid / TOMBSTONE_FILE).exists()]

    def _record_hosted(
        self, hosted: set[str], creating: set[str] | frozenset[str] = frozenset()
    ) -> None:
        """Durably note the tablets hosted here, and those being made (under
        ``_replicas_lock``)."""
        HostedTablets.save(self.settings.data_dir, hosted, self._placed, creating)
        self._hosted = hosted

    def _tablet_entity(self, placement: TabletPlacement) -> Any:
        return self.registry.entity(
            "tablet",
            placement.tablet_id,
            {"table": placement.table, "partition": str(placement.partition)},
        )

    def _new_replica(
        self,
        placement: TabletPlacement,
        voters: tuple[str, ...],
        learners: tuple[str, ...],
        *,
        create: bool = True,
    ) -> TabletReplica:
        """Open (or create, with ``voters`` + ``learners``) this server's replica of
        ``placement``'s tablet; not started."""
        s = self.settings
        table = self.config.table(placement.table)
        # Where we dial each peer: --peer_addresses (a proxy, NAT) or the config's -- every
        # server of the cluster, since a group's membership may come to include any of them.
        addresses = {sid: s.peer_addr(sid) for sid in self._others}
        transport: Transport
        if self.tcp_hub is not None:
            transport = self.tcp_hub.transport(placement.tablet_id, addresses)
        elif self.streams is not None:
            transport = self.streams.transport(placement.tablet_id, addresses)
        else:
            transport = GrpcTransport(
                placement.tablet_id, addresses, self.channels, timeout_s=self._peer_timeout_s
            )
        return TabletReplica(
            tablet_id=placement.tablet_id,
            table=placement.table,
            partition=placement.partition,
            num_partitions=table.partitions,
            server_id=self.server_id,
            voters=voters,
            learners=learners,
            peers=self.config.server_ids,
            directory=s.data_dir / placement.tablet_id,
            schema=table.schema,
            transport=transport,
            options=self._replica_options,
            metrics=self._tablet_entity(placement),
            ticker=self.ticker,
            workers=self.workers,
            log_appenders=self.log_appenders,
            request_copy=self.copier.request_copy,
            write_memory=self.write_memory,
            create=create,
            on_peer_heard=self._peer_heard,
            on_peer_asked=self.peer_contact.asked,
        )

    def _tcp_endpoint(self, addr: str) -> Endpoint | None:
        """The tcp hub's dial thread: where peer ``addr`` takes consensus frames over tcp, or
        None -- it has no tcp listener, or ``addr`` is not the address it advertises
        (something in between, which its tcp port would bypass), or it cannot be asked."""
        stub = consensus_pb2_grpc.ConsensusServiceStub(self.channels.channel(addr))
        try:
            answer = stub.PeerEndpoint(consensus_pb2.PeerEndpointRequest(), timeout=2.0)
        except grpc.RpcError as e:
            logger.debug("PeerEndpoint of %s: %s", addr, e)
            return None
        if answer.port == 0 or answer.advertised_address != addr:
            if addr in self._stream_only_peers:
                return None
            self._stream_only_peers.add(addr)
            logger.info(
                "consensus traffic to %s stays on the stream: %s",
                addr,
                "it has no tcp listener"
                if answer.port == 0
                else f"it advertises {answer.advertised_address}",
            )
            return None
        # An IPv6 literal without its brackets: the socket API looked "[::1]" up as a name.
        return Endpoint(bare_host(parse_host_port(addr)[0]), answer.port)

    # --- replicas created and deleted at run time (AdminService) ---------------------------

    def create_replica(
        self, tablet_id: str, voters: tuple[str, ...], learners: tuple[str, ...]
    ) -> TabletReplica:
        """Create an empty replica of ``tablet_id`` here, starting with the membership that
        adds it (its leader then catches it up), and start it."""
        placement = self.tablets.get(tablet_id)
        if placement is None:
            raise UnknownTablet(tablet_id, "no tablet of the cluster config")
        # Only as a learner: an empty replica that counted as a voter could elect itself, or
        # others, on a membership nobody else holds -- a second group of the same tablet.
        # The leader adds the learner (ADD_LEARNER) and promotes it once it caught up.
        if self.server_id not in learners or self.server_id in voters:
            raise InvalidRequest(
                f"server {self.server_id} must be a learner, and not a voter, of the "
                f"membership the replica is to join (voters {list(voters)}, learners "
                f"{list(learners)}): a new replica joins as a learner"
            )
        unknown = sorted((set(voters) | set(learners)) - set(self.config.server_ids))
        if unknown:
            raise InvalidRequest(f"servers {unknown} are not in the cluster config")
        # Checked before anything is written: a membership the replica could not open with
        # once left its files and a hosted record behind, and the server could not start.
        why = Membership(tuple(voters), tuple(learners)).problem()
        if why is not None:
            raise InvalidRequest(f"not a membership to join: {why}")
        with self._replicas_lock:
            if tablet_id in self._installing:
                raise self._being_installed(tablet_id)
            if tablet_id in self.replicas or tablet_id in self.failed_tablets:
                raise InvalidRequest(
                    f"server {self.server_id} already holds a replica of tablet {tablet_id}"
                )
            directory = self.settings.data_dir / tablet_id
            if (directory / TOMBSTONE_FILE).exists():
                shutil.rmtree(directory)  # a deleted replica's: this one starts afresh
            elif (directory / CONSENSUS_META_FILE).exists():
                raise InvalidRequest(
                    f"{directory} holds a replica's files already; delete it first"
                )
            # Being made until made: a server killed in between drops it at its next
            # start (the caller saw no answer), where hosted it would open FAILED.
            self._record_hosted(self._hosted, {tablet_id})
            try:
                replica = self._new_replica(placement, voters, learners)
            except BaseException:
                # Nothing half made: no files, no record, so a restart does not meet them.
                shutil.rmtree(directory, ignore_errors=True)
                self._record_hosted(self._hosted)
                raise
            self._record_hosted(self._hosted | {tablet_id})
            register_tablet_gauges(
                self._tablet_entity(placement), functools.partial(self.hosted, tablet_id)
            )
            self.replicas.put(tablet_id, replica)
            replica.start()
        logger.info(
            "created a replica of tablet %s (voters %s, learners %s)",
            tablet_id,
            ",".join(voters),
            ",".join(learners),
        )
        return replica

    def delete_replica(self, tablet_id: str, *, force: bool = False) -> None:
        """Stop this server's replica of ``tablet_id`` and remove its files, leaving a
        tombstone (so no restart opens it again).  Refused while the replica is a member of
        its group, unless ``force``.  Files that cannot be removed (``FilesNotRemovable``
        naming the file) leave it listed FAILED, and a rerun deletes what is left."""
        with self._replicas_lock:
            if tablet_id in self._installing:
                raise self._being_installed(tablet_id)
            replica = self.replicas.get(tablet_id)
            failed = self.failed_tablets.get(tablet_id)
            if replica is None and failed is None:
                raise UnknownTablet(tablet_id)
            placement = self.tablets[tablet_id]
            if replica is not None:
                if replica.is_member() and not force:
                    m = replica.consensus.membership
                    raise InvalidRequest(
                        f"the replica of {tablet_id} on {self.server_id} is still a member of "
                        f"its group (voters {list(m.voters)}, learners {list(m.learners)}): "
                        "remove it from the group first"
                    )
                voters = tuple(replica.consensus.membership.voters)
                self.replicas.pop(tablet_id)
                replica.stop()
            else:
                assert failed is not None
                voters = failed.voters
                self.failed_tablets.pop(tablet_id)
            directory = self.settings.data_dir / tablet_id
            try:
                _tombstone(directory)
            except OSError as e:
                # Half removed: listed again (FAILED, saying why) and still hosted, so status
                # shows it and a rerun finds it -- dropped, it was deleted by no command.
                what = f"could not remove {e.filename} ({e.strerror})" if e.filename else str(e)
                reason = (
                    f"deleting it failed part way ({what}); make that file removable, then "
                    f"run `raftlet tablet remove-replica {tablet_id} {self.server_id}` again"
                )
                self._undeletable.add(tablet_id)
                self.failed_tablets.put(
                    tablet_id,
                    FailedTablet(
                        tablet_id,
                        placement.table,
                        placement.partition,
                        voters,
                        directory,
                        reason,
                    ),
                )
                logger.error("tablet %s: %s", tablet_id, reason)
                raise FilesNotRemovable(
                    f"the replica of {tablet_id} on {self.server_id} was not deleted: {what}; "
                    "make it removable (`chattr -i` if it is immutable, "
                    "a read-write mount, permissions), then run `raftlet tablet remove-replica "
                    f"{tablet_id} {self.server_id}` again (it is listed FAILED until then)"
                ) from None
            self._undeletable.discard(tablet_id)
            self.registry.remove_entity("tablet", tablet_id)
            self._record_hosted(self._hosted - {tablet_id})
        logger.info("deleted the replica of tablet %s (%s)", tablet_id, directory)

    @staticmethod
    def _being_installed(tablet_id: str) -> ServiceUnavailable:
        return ServiceUnavailable(
            f"tablet {tablet_id}: a tablet copy is being installed in this server's replica; "
            "try again in a moment"
        )

    def _open(
        self,
        placement: TabletPlacement,
        *,
        must_exist: bool = True,
        voters: tuple[str, ...] | None = None,
    ) -> TabletReplica | FailedTablet:
        """This server's replica of ``placement``'s tablet from its directory (its metadata's
        membership stands once it exists), or FAILED; not started.  Created afresh only
        when not ``must_exist``: a hosted replica whose directory is gone is FAILED, for a
        tablet copy to repair (``tserver.hosted_tablets``) from ``voters`` (default: the
        placement's)."""
        return open_or_fail(
            functools.partial(
                self._new_replica, placement, placement.replicas, (), create=not must_exist
            ),
            tablet_id=placement.tablet_id,
            table=placement.table,
            partition=placement.partition,
            voters=voters or tuple(placement.replicas),
            directory=self.settings.data_dir / placement.tablet_id,
        )

    def _place(self, tablet_id: str, replica: TabletReplica | FailedTablet) -> None:
        if isinstance(replica, FailedTablet):
            self.failed_tablets.put(tablet_id, replica)
        else:
            self.replicas.put(tablet_id, replica)

    # --- replicas replaced by a tablet copy (tserver.tablet_copier) -------------------------

    def hosted(self, tablet_id: str) -> TabletReplica | FailedTablet | None:
        """This server's replica of ``tablet_id``, running or FAILED; None if none."""
        return self.replicas.get(tablet_id) or self.failed_tablets.get(tablet_id)

    def take_replica(self, tablet_id: str) -> TabletReplica | FailedTablet | None:
        """Stop serving ``tablet_id`` and close its files (a copy is about to replace them);
        calls for it meanwhile are answered "being installed" (UNAVAILABLE, retriable)
        until ``reopen_replica``."""
        with self._replicas_lock:
            # Marked first: lookups read the maps without the lock.
            self._installing.add(tablet_id)
            replica = self.replicas.pop(tablet_id) or self.failed_tablets.pop(tablet_id)
        if isinstance(replica, TabletReplica):
            replica.stop()
        return replica

    def reopen_replica(self, tablet_id: str) -> TabletReplica | FailedTablet:
        """Open ``tablet_id`` from its directory again and serve it (or list it FAILED)."""
        placement = self.tablets[tablet_id]
        with self._replicas_lock:
            try:
                replica = self._open(placement)
                if isinstance(replica, TabletReplica) and self._grpc is not None:
                    replica.start()
                self._place(tablet_id, replica)
            finally:
                self._installing.discard(tablet_id)
        return replica

    def _check_members_listed(self) -> None:
        """Refuse (``LayoutMismatch``) a config without a server that is a member of a
        tablet group here: removed from the file while it held replicas, it stayed a voter
        nobody could reach or remove (`remove-replica` knew no such server), and status,
        which counts configured servers, said OK while any one failure stopped the tablet."""
        known = set(self.config.server_ids)
        groups: dict[str, tuple[str, ...]] = {
            t: tuple(f.voters) for t, f in self.failed_tablets.items()
        }
        for tablet_id, replica in self.replicas.items():
            m = replica.consensus.membership
            groups[tablet_id] = (*m.voters, *m.learners)
        for tablet_id, members in sorted(groups.items()):
            missing = sorted(set(members) - known)
            if missing:
                raise LayoutMismatch(
                    f"tablet {tablet_id}'s group has {', '.join(missing)} as a member, which "
                    "the config no longer lists: put it back, move its replicas off with "
                    f"`raftlet cluster replace-server {missing[0]}`, then remove it"
                )

    def _unsettled(self) -> list[str]:
        """Why the replicas this server runs are not all there to be judged (``/readyz``):
        one being installed or reopened is in neither map, and a server with an empty data
        directory makes none until its peers answer -- it had nothing, so it was "ready"."""
        out = [f"{t}: being installed or reopened" for t in sorted(self._installing)]
        if self.waiting_for_peers:
            out.append("waiting for its peers to say which replicas it holds (empty data dir)")
        return out

    def reopen_logs_failed_for_space(self) -> list[str]:
        """Open again, as a restart would, every replica whose log failed for want of disk
        space, or that failed to open for it, once the data directory has room for two
        segments; the ids reopened.

        A log that failed fails for good (what it holds past the failure is uncertain), and
        waits for a tablet copy from its leader. When the disks of a majority filled
        together -- the usual case, their data being the same -- there was no leader to
        copy from, and the tablet stayed down after space was freed until someone restarted
        the servers (review r34a). Reopening reads the log from disk, cutting a torn tail,
        exactly as a restart does."""
        room = 2 * self.log_options.segment_size_bytes
        reopened = []
        short: list[tuple[str, TabletReplica | FailedTablet, str]] = [
            (t, f, f.reason) for t, f in self.failed_tablets.items() if f.out_of_space
        ]
        for t, r in self.replicas.items():
            failure = r.consensus.log_failure()
            if failure is not None and out_of_space(failure):
                short.append((t, r, describe_error(failure)))
        for tablet_id, replica, why in short:
            try:
                free = shutil.disk_usage(replica.directory).free
            except OSError:
                continue
            if free < room:
                continue
            # No copy installs meanwhile, and no stop passes by it (a replica opened once
            # the others stopped would run on).
            with self.copier.holding(tablet_id) as free_of_copies, self._late_open_lock:
                if not free_of_copies or self._no_late_open:
                    continue
                if self.hosted(tablet_id) is not replica:
                    continue  # replaced meanwhile
                logger.warning(
                    "%s: it failed for want of space (%s); %s free now: reopening it",
                    tablet_id,
                    why,
                    human_bytes(free),
                )
                self.take_replica(tablet_id)
                self.reopen_replica(tablet_id)
                self.copier.forget_failure(tablet_id)
                reopened.append(tablet_id)
        return reopened

    def tablets_needing_repair(self) -> list[tuple[str, tuple[str, ...]]]:
        """(tablet, peers to copy from) of every tablet FAILED here that a copy may repair:
        one that failed to open, or whose store was found damaged or whose log failed."""
        # Files of a newer release are left alone: a copy would replace them.
        out = [(t, f.voters) for t, f in self.failed_tablets.items() if f.repairable]
        for t, r in self.replicas.items():
            if r.needs_repair():
                out.append((t, tuple(r.consensus.membership.voters)))
        # A half-deleted replica is no member any more: only a rerun of its deletion ends it.
        return [(t, v) for t, v in out if not self.copier.copying(t) and t not in self._undeletable]

    async def stop(self, grace_s: float = _SHUTDOWN_GRACE_S) -> None:
        """Stop accepting RPCs, answer what is in flight, then close everything.

        gRPC stops accepting at once and waits ``grace_s`` for running RPCs.  Meanwhile the
        pools fail queued calls and the replicas stop, failing writes still waiting for a
        commit with UNAVAILABLE -- answers the grace period lets out, so clients retry
        elsewhere (with the same request id) instead of seeing their calls cancelled."""
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        # While peers still hear from us: the tablets led here elect no leader for an
        # election timeout otherwise (tserver.leader_handover).
        if self.settings.leader_handover_wait_s > 0:
            await hand_over_leaderships(
                [r.consensus for r in list(self.replicas.values())],
                self.settings.leader_handover_wait_s,
            )
        for task in (self._sharing, self._watching, self._deciding):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        grpc_stopped = None
        # Peers' streams to us never end by themselves: end them, or the grace period
        # would always run out waiting for them.
        self._consensus_servicer.end_streams()
        if self._grpc is not None:
            grpc_stopped = asyncio.ensure_future(self._grpc.stop(grace_s))
            graced_until = time.monotonic() + grace_s
        loop = asyncio.get_running_loop()
        if self.tcp_listener is not None:
            await loop.run_in_executor(None, self.tcp_listener.close)
        # Blocking joins and fsyncs: off the event loop, which must keep sending answers.
        await loop.run_in_executor(None, self._stop_blocking)
        # Clients' write streams end once the replicas have answered what was in flight.
        self._tablet_servicer.end_streams()
        if self.write_listener is not None:
            await loop.run_in_executor(None, self.write_listener.close)
        if grpc_stopped is not None:
            done, _ = await asyncio.wait({grpc_stopped}, timeout=_QUIET_STOP_S)
            if not done:
                # Else the log went quiet for seconds after the handover (review r34b).
                logger.info(
                    "waiting up to %.1f s more for the RPCs still open to end: a caller that "
                    "reads no answers (a paused peer or client) holds its call open until then",
                    max(0.0, graced_until - time.monotonic()),
                )
            await grpc_stopped
        if self.tcp_hub is not None:
            await self.tcp_hub.close()  # and the streams it falls back on
        elif self.streams is not None:
            await self.streams.close()
        if self.stream_channels is not None:
            await self.stream_channels.close()
        self.channels.close()
        self.status.stop()
        if self._data_dir_lock is not None:  # last: nothing of this server touches it now
            self._data_dir_lock.release()

    def _stop_blocking(self) -> None:
        with self._late_open_lock:  # replicas opened late are all in the maps by now
            self._no_late_open = True
        # First: a copy must not swap a replica in while the others stop.
        self.copier.stop()
        self.copy_sessions.close()
        if self._verifier is not None:
            self._verifier.stop()
        if self.ticker is not None:
            self.ticker.stop()
        for pool in self.pools.values():
            pool.stop(timeout=10)
        for replica in self.replicas.values():
            try:
                replica.stop()
            except Exception:
                logger.exception("stopping tablet %s failed", replica.tablet_id)
        self.workers.stop()
        self.log_appenders.stop()

    async def wait(self) -> None:
        if self._grpc is not None:
            await self._grpc.wait_for_termination()

    # --- lookups -------------------------------------------------------------------------

    def replica(self, tablet_id: str) -> TabletReplica:
        replica = self.replicas.get(tablet_id)
        if replica is None:
            failed = self.failed_tablets.get(tablet_id)
            raise failed.error() if failed is not None else UnknownTablet(tablet_id)
        return replica

    def _consensus_of(self, tablet_id: str) -> Any:
        replica = self.replicas.get(tablet_id)
        if replica is None:
            failed = self.failed_tablets.get(tablet_id)
            if failed is not None:
                raise failed.error()  # it has no consensus: it never votes or campaigns
            if tablet_id in self._installing:
                raise self._being_installed(tablet_id)
            return None
        return replica.consensus

    def live_config(self) -> tablet_pb2.GetClusterConfigResponse:
        """The cluster config, and for every tablet hosted here its replicas as this
        replica's membership has them (``TabletPB.voters``: where clients go now)."""
        response = self.config.to_pb()
        replicas = self.replicas
        for tablet in response.tablets:
            replica = replicas.get(tablet.tablet_id)
            if replica is not None and replica.is_member():
                tablet.voters.extend(replica.consensus.membership.voters)
        return response

    def tls_expiry_seconds(self) -> float | None:
        """Seconds until its certificate or that certificate's CA expires; None: no TLS."""
        return None if self.tls_expires is None else _seconds_until(self.tls_expires)

    def leader_addr(self, server_id: str) -> str:
        try:
            return self.config.server(server_id).rpc_addr if server_id else ""
        except Exception:
            return ""

    def tablet_statuses(self) -> list[dict[str, object]]:
        """Every replica's published status (``status_pages.tablet_statuses``)."""
        return tablet_statuses(self.replicas.values(), self.failed_tablets.values())

    # --- runtime flags ----------------------------------------------------------------------

    def _on_trace_threshold(self, value: Any) -> None:
        set_lock_contention_trace_threshold_ms(float(value))

    def _on_write_memory_limit(self, value: Any) -> None:
        self.write_memory.limit_bytes = int(value)

    def _on_log_latency(self, _value: Any) -> None:
        latency = float(self.flags.get("log_inject_latency_ms"))
        jitter = float(self.flags.get("log_inject_latency_jitter_ms"))
        for replica in self.replicas.values():
            log = replica.consensus_log()
            # The appender reads its options at every sync: one assignment takes effect.
            log.options = dataclasses.replace(
                log.options, inject_latency_ms=latency, inject_latency_jitter_ms=jitter
            )


def _say_wiped(data_dir: Path, heard_by: frozenset[str], tablets: list[str]) -> None:
    """An empty data directory a peer heard from before (``tserver.empty_start``)."""
    heard = f"the data directory {data_dir} holds nothing, yet {', '.join(sorted(heard_by))} "
    if not tablets:
        logger.warning(
            "%sheard from this server before: it was wiped or replaced, and is a member of "
            "no tablet group now (a new server would start so too)",
            heard,
        )
        return
    logger.error(
        "%sheard from this server before: it was wiped or replaced, this is no new server. "
        "Its replicas (%s) open FAILED, none afresh (they would have forgotten their votes "
        "and the entries they acknowledged), and each is repaired by a tablet copy from its "
        "leader",
        heard,
        ", ".join(tablets),
    )


def _tombstone(directory: Path) -> None:
    """Empty ``directory`` but for a tombstone file; an ``OSError`` names the whole path of
    what could not be removed (``remove_tree``)."""
    if directory.exists():
        remove_tree(directory)
    directory.mkdir(parents=True)
    # Durable, directory entries too: a tombstone lost to a power cut left the replica
    # directory empty, and the replica was opened again (`_tablets_to_open`).
    replace_durably(directory / TOMBSTONE_FILE, "deleted from its group\n")
    fsync_dir(directory.parent)


def _listen(add_port: Callable[[], int], what: str, address: str) -> int:
    """The port ``add_port`` bound, or OSError naming the address: older grpcio returned 0
    for an address it could not bind, newer raises RuntimeError, and either way the
    operator should read one line (``tserver.main``), not a traceback."""
    try:
        port = add_port()
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(_cannot_listen(what, address))
    return port


def _cannot_listen(what: str, address: str) -> str:
    # Launchers that picked the port themselves look for these words and pick another.
    return f"cannot listen for {what} on {address}: in use, or not an address of this host"


def _seconds_until(moment: datetime.datetime) -> float:
    return (moment - datetime.datetime.now(datetime.UTC)).total_seconds()
