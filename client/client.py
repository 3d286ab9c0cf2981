"""``Client``: the entry point — a cluster's map, shared channels, sessions and scans.

One ``Client`` per process (or per independent user) is the intended use: it owns

- the ``MetaCache`` (fetched from any seed at construction; leaders learned as it goes),
- one gRPC channel per server address (``ChannelPool``), shared by all its sessions and
  scanners,
- one ``RequestTracker`` (``client_id`` + seq_no for exactly-once writes) shared by all its
  sessions,
- a small thread pool that sends the per-tablet batches of a flush in parallel,
- its ``ClientStats``.

It is thread-safe; sessions are meant to be used by one thread at a time (as in Kudu), but
guard their own state. ``close()`` closes the sessions (flushing them), then the pool and the
channels. The client speaks only the wire protocol (``proto``) and shares ``schema`` and the
cluster config model (``cluster``, for ``from_config``) with the server; it never imports
``tserver`` or ``consensus`` (docs/ARCHITECTURE.md, "Layout").
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Concatenate, ParamSpec, TypeVar

import grpc
from tenacity.wait import wait_base

from raftlet.client.arguments import check_timeout
from raftlet.client.channels import CHANNEL_OPTIONS, ChannelPool, ServerStub
from raftlet.client.checksum import ReplicaChecksum, TabletChecksum
from raftlet.client.client_base import ClientBase
from raftlet.client.errors import InvalidArgument
from raftlet.client.meta_cache import MetaCache, ServerInfo
from raftlet.client.request_tracker import RequestTracker
from raftlet.client.retry import DEFAULT_POLICIES, Cause, RpcFailure
from raftlet.client.rpc import RpcContext, call_tablet
from raftlet.client.scanner import ReadMode, RowFormat, Scanner, check_predicates
from raftlet.client.session import (
    DEFAULT_BATCHES_IN_FLIGHT,
    DEFAULT_MAX_BATCH_BYTES,
    FlushMode,
    Session,
)
from raftlet.client.stats import StatsRecorder
from raftlet.client.tls import TlsOptions, channel_credentials, uses_token_ports
from raftlet.cluster import ClusterConfig, ClusterConfigError, load_cluster_config
from raftlet.proto import admin_pb2, admin_pb2_grpc, tablet_pb2
from raftlet.schema.partition import partitions_for_predicates
from raftlet.schema.predicates import Predicate

__all__ = ["Client", "parse_seeds", "seeds_from_config", "seeds_of_config"]

logger = logging.getLogger(__name__)

# Clients not closed yet, for the check at exit (weak: a client dropped unclosed is gone).
_OPEN_CLIENTS: weakref.WeakSet[Client] = weakref.WeakSet()


@atexit.register
def _say_unwritten_rows() -> None:
    """At exit, name each client whose sessions still hold rows. A background session's
    flusher is a daemon thread, so a process that ends without closing it (or its client)
    drops what it buffered -- a reviewer's 3,000 rows went without a word. Said, not
    flushed: a flush at exit against a cluster that does not answer would hang the exit
    for the whole deadline."""
    for client in list(_OPEN_CLIENTS):
        rows = client.unwritten_rows()
        if rows:
            logger.warning(
                "%r: the process is exiting with %d row%s its sessions have not written; "
                "they are lost. Close the sessions or the client (or use `with`) to write "
                "them first.",
                client,
                rows,
                "s" * (rows != 1),
            )


def parse_seeds(seeds: str | Sequence[str]) -> list[str]:
    given: object = seeds  # callers without types pass anything
    if isinstance(given, bytes | bytearray) or not isinstance(given, str | Iterable):
        raise InvalidArgument(
            "server addresses are 'host:port' strings (a list, or one comma-separated "
            f"string), got {type(seeds).__name__} {seeds!r:.60}"
        )
    items = seeds.split(",") if isinstance(seeds, str) else list(seeds)
    wrong = next((s for s in items if not isinstance(s, str)), None)
    if wrong is not None:
        raise InvalidArgument(
            f"a server address is a string 'host:port', got {type(wrong).__name__} {wrong!r}"
        )
    out = [s.strip() for s in items if s.strip()]
    if not out:
        raise InvalidArgument(f"no server address given (got {seeds!r}); expected host:port")
    for addr in out:
        if "://" in addr:
            # gRPC would take it as a host name and retry its resolution until the timeout.
            raise InvalidArgument(
                f"server address {addr!r}: give host:port, without a scheme (e.g. 127.0.0.1:7051)"
            )
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise InvalidArgument(f"server address {addr!r} is not host:port")
        # gRPC takes a port modulo 65536 (and 0 as "any"): 70000 reached port 4464.
        if not (port.isascii() and 1 <= int(port) <= 65535):
            raise InvalidArgument(f"server address {addr!r}: port must be 1 to 65535")
    return out


def seeds_from_config(path: str | os.PathLike[str], *, token_ports: bool = False) -> list[str]:
    """The RPC addresses of the servers of a ``cluster.toml`` -- their token ports with
    ``token_ports`` -- read and validated by ``raftlet.cluster`` exactly as the servers read
    it (``InvalidArgument`` if it is not a valid config)."""
    try:
        config = load_cluster_config(path)
    except ClusterConfigError as e:
        raise InvalidArgument(str(e)) from None
    return seeds_of_config(config, token_ports=token_ports, where=str(path))


def seeds_of_config(
    config: ClusterConfig, *, token_ports: bool = False, where: str = ""
) -> list[str]:
    """``seeds_from_config`` of a config read already (a pipe is read once)."""
    if not token_ports:
        return [s.rpc_addr for s in config.servers]
    seeds = [s.token_rpc_addr for s in config.servers if s.token_rpc_addr]
    if not seeds:
        raise InvalidArgument(f"{where or 'the cluster config'}: no server has a token_rpc_addr")
    return seeds


R = TypeVar("R")
# A client class's constructor keywords, which from_config passes on (typed as them).
P = ParamSpec("P")
C = TypeVar("C")

# A checksum waits on the server for its point to be applied; the server's own limit.
_MAX_CHECKSUM_WAIT_MS = 60_000


def _replica_checksum(uuid: str, pb: admin_pb2.ChecksumTabletResponse) -> ReplicaChecksum:
    if pb.failure or not pb.checksum:
        return ReplicaChecksum(uuid, pb.rows, "", pb.failure or "no checksum")
    return ReplicaChecksum(uuid, pb.rows, pb.checksum)


class Client(ClientBase[MetaCache]):
    """A connection to a raftlet cluster for threaded code: ``new_session()`` to write,
    ``scan()`` to read, safe to share between threads; close it (or use ``with``) when
    done (a process that exits without closing it loses the rows its sessions buffered,
    with a warning). Errors and retries: ``raftlet.client.errors`` and
    ``raftlet.client.retry``; sessions and flush modes: ``raftlet.client.session``."""

    def __init__(
        self,
        seeds: str | Sequence[str],
        *,
        timeout_s: float = 30.0,
        rpc_timeout_s: float = 10.0,
        flush_threads: int = 4,
        retry_policies: Mapping[Cause, wait_base] | None = None,
        channel_options: Sequence[tuple[str, int]] | None = None,
        tls: TlsOptions | None = None,
        token: str | None = None,
    ) -> None:
        """Connect to a cluster through ``seeds`` ("host:port" strings, or one string of
        them comma-separated) and fetch its config, retrying for up to ``timeout_s``
        (``Timeout`` if no seed answers). ``timeout_s`` is also the default deadline of
        every operation; ``rpc_timeout_s`` caps one attempt (a follower read's first gets at
        most half the time left, so a paused replica leaves time for another). ``tls`` (the
        CA, and this client's certificate and key) and ``token`` (a bearer token) for a TLS
        cluster (``client.tls``); without them the channels are plaintext. With a token and
        no certificate the client dials the servers' token ports (``seeds`` are token ports
        too). ``flush_threads`` is how many batches all of this client's sessions have in
        flight at once, whatever their ``max_batches_in_flight``: size it to what they ask
        together (`raftlet write` gives twice its threads, up to 64)."""
        check_timeout(timeout_s)
        check_timeout(rpc_timeout_s, "rpc_timeout_s")
        if flush_threads < 1:
            raise InvalidArgument(f"flush_threads must be at least 1, got {flush_threads}")
        self.timeout_s = float(timeout_s)
        self._seeds = parse_seeds(seeds)
        self._stats = StatsRecorder()
        self._channels = ChannelPool(
            options=list(channel_options) if channel_options is not None else CHANNEL_OPTIONS,
            on_created=lambda _addr: self._stats.channel_created(),
            credentials=channel_credentials(tls, token),
        )
        self._meta = MetaCache(
            self._seeds,
            self._channels,
            self._stats,
            rpc_timeout_s=rpc_timeout_s,
            token_ports=uses_token_ports(tls),
        )
        self._rpc = RpcContext(
            meta=self._meta,
            stubs=self._channels,
            stats=self._stats,
            attempt_timeout_s=rpc_timeout_s,
            policies=dict(retry_policies if retry_policies is not None else DEFAULT_POLICIES),
        )
        self._tracker = RequestTracker()
        self._executor = ThreadPoolExecutor(flush_threads, thread_name_prefix="raftlet-client")
        self._lock = threading.Lock()
        self._sessions: set[Session] = set()
        self._closed = False
        _OPEN_CLIENTS.add(self)
        try:
            self._meta.load(time.monotonic() + self.timeout_s, self.timeout_s)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(
        cls: Callable[Concatenate[str | Sequence[str], P], C],
        path: str | os.PathLike[str],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> C:
        """A client for the cluster described by a ``cluster.toml`` (its servers' RPC
        addresses are the seeds; everything else is fetched from them). The keywords are the
        constructor's (typed as them: a misspelt one is a type checker's error)."""
        token_ports = uses_token_ports(kwargs.get("tls"))
        return cls(seeds_from_config(path, token_ports=token_ports), *args, **kwargs)

    # --- the cluster (client_id, seeds, tables, schema, tablets, tablet_for: client_base) --

    def replicas(self, tablet_id: str) -> tuple[str, ...]:
        """The uuids of the servers hosting ``tablet_id``."""
        return self._meta.tablet(tablet_id).replicas

    def servers(self) -> dict[str, ServerInfo]:
        return dict(self._meta.view.servers)

    def leader_of(self, tablet_id: str, *, refresh: bool = False) -> str | None:
        """The cached leader of ``tablet_id`` (after asking every server if ``refresh`` or
        none is cached); None if no replica claims it, or no server answered
        (``list_tablets`` says which answer)."""
        self._check_open()
        self._meta.tablet(tablet_id)
        if refresh or self._meta.leader(tablet_id) is None:
            self._meta.refresh_leaders(
                time.monotonic() + self.timeout_s, force=True, tablet_id=tablet_id
            )
        return self._meta.leader(tablet_id)

    def list_tablets(
        self, timeout_s: float | None = None
    ) -> dict[str, tablet_pb2.ListTabletsResponse]:
        """Every reachable server's ``ListTablets`` answer, by server uuid (servers that did
        not answer are left out; compare with ``servers()``)."""
        self._check_open()
        answers = self._meta.list_tablets(self._timeout(timeout_s))
        return {
            uuid: answer for uuid, answer in answers.items() if not isinstance(answer, RpcFailure)
        }

    # --- writing and reading ---------------------------------------------------------------

    def new_session(
        self,
        flush_mode: FlushMode = FlushMode.AUTO_FLUSH_SYNC,
        *,
        timeout_s: float | None = None,
        max_batch_rows: int = 1000,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        max_batches_in_flight: int = DEFAULT_BATCHES_IN_FLIGHT,
        flush_interval_s: float = 0.05,
        max_buffered_rows: int | None = None,
        packed_rows: bool = True,
        max_buffered_bytes: int | None = None,
    ) -> Session:
        """A session (see ``client.session``); ``timeout_s`` (default the client's) bounds
        each write, retries included. A batch holds at most ``max_batch_rows`` rows and
        ``max_batch_bytes`` bytes; each tablet has at most ``max_batches_in_flight`` of a
        session's batches in flight -- within the client's ``flush_threads``, which every
        session's batches share (4 by default: raise it for more in flight). In
        ``AUTO_FLUSH_BACKGROUND`` a call blocks while
        ``max_buffered_rows`` rows (default twice the batches in flight's rows) or
        ``max_buffered_bytes`` (default twice their bytes) are unacknowledged.
        ``packed_rows=False`` sends rows in the per-cell form
        (one ``RowOperationPB`` per row) instead of a packed row block: the older wire form,
        kept for servers and comparisons that need it. The client keeps every session until
        it is closed (``close()``, or ``with client.new_session() as s:``), an
        ``AUTO_FLUSH_SYNC`` one too: a session per request must be closed."""
        with self._lock:
            self._check_open()
            session = Session(
                self._rpc,
                self._tracker,
                self._executor,
                flush_mode=flush_mode,
                timeout_s=self._timeout(timeout_s),
                max_batch_rows=max_batch_rows,
                max_batch_bytes=max_batch_bytes,
                max_batches_in_flight=max_batches_in_flight,
                flush_interval_s=flush_interval_s,
                max_buffered_rows=max_buffered_rows,
                max_buffered_bytes=max_buffered_bytes,
                packed_rows=packed_rows,
                on_close=self._session_closed,
            )
            self._sessions.add(session)
            return session

    def _session_closed(self, session: Session) -> None:
        with self._lock:
            self._sessions.discard(session)

    def scan(
        self,
        table: str,
        projection: Sequence[str] | None = None,
        predicates: Sequence[Predicate] = (),
        limit: int | None = None,
        read_mode: ReadMode = ReadMode.LEADER_LATEST,
        batch_size_rows: int = 0,
        *,
        batch_size_bytes: int = 0,
        row_format: RowFormat = RowFormat.PACKED,
        timeout_s: float | None = None,
        min_index: int | Mapping[str, int] = 0,
    ) -> Scanner:
        """An iterator over the table's rows (dicts), tablet by tablet (see
        ``client.scanner``: pages, bounded by rows and bytes, 0 leaving it to the server;
        their row form). ``projection``: the columns, in order (None or empty: every
        column). ``timeout_s`` (default the client's) bounds each page.
        ``min_index``, ``{tablet_id: index}`` (a ``WriteResult``'s ``tablet_id`` and
        ``op_index``, say): each page of a tablet named comes from a replica that has
        applied at least that Raft index -- with FOLLOWER_APPLIED, bounded staleness.  A
        plain index only for a scan that visits one tablet (the key fixed by predicates)."""
        self._check_open()
        info = self._meta.table(table)
        check_predicates(predicates)
        # A scan that fixes the whole key visits only the tablets those keys live in.
        pruned = partitions_for_predicates(info.schema, predicates, info.num_partitions)
        tablets = info.tablet_ids if pruned is None else [info.tablet_ids[p] for p in pruned]
        return Scanner(
            self._rpc,
            info,
            tablets,
            projection=projection,
            predicates=predicates,
            limit=limit,
            read_mode=read_mode,
            batch_size_rows=batch_size_rows,
            batch_size_bytes=batch_size_bytes,
            row_format=row_format,
            timeout_s=self._timeout(timeout_s),
            min_index=min_index,
        )

    def scan_tablet(
        self,
        tablet_id: str,
        projection: Sequence[str] | None = None,
        predicates: Sequence[Predicate] = (),
        limit: int | None = None,
        read_mode: ReadMode = ReadMode.LEADER_LATEST,
        batch_size_rows: int = 0,
        *,
        replica: str | None = None,
        batch_size_bytes: int = 0,
        row_format: RowFormat = RowFormat.PACKED,
        timeout_s: float | None = None,
        min_index: int | Mapping[str, int] = 0,
    ) -> Scanner:
        """Like ``scan`` but of one tablet; with FOLLOWER_APPLIED, ``replica`` (a server
        uuid) is read first."""
        self._check_open()
        tablet = self._meta.tablet(tablet_id)
        if replica is not None and replica not in self._meta.view.servers:
            raise InvalidArgument(
                f"replica {replica!r} is not a server of the cluster "
                f"({', '.join(sorted(self._meta.view.servers))})"
            )
        return Scanner(
            self._rpc,
            self._meta.table(tablet.table),
            [tablet_id],
            projection=projection,
            predicates=predicates,
            limit=limit,
            read_mode=read_mode,
            batch_size_rows=batch_size_rows,
            batch_size_bytes=batch_size_bytes,
            row_format=row_format,
            timeout_s=self._timeout(timeout_s),
            replica=replica,
            min_index=min_index,
        )

    # --- admin -----------------------------------------------------------------------------

    def leader_step_down(
        self, tablet_id: str, new_leader: str = "", *, timeout_s: float | None = None
    ) -> str:
        """Ask the leader of ``tablet_id`` to hand leadership to ``new_leader`` (a server
        uuid), or to its most caught-up follower among those that answer -- a named one must
        answer the leader too (retried until the timeout while it, or any, does not); returns
        the uuid of the server that stepped down. The new leader is found by the next
        operation on the tablet."""
        self._check_open()
        if new_leader and new_leader not in self._meta.tablet(tablet_id).replicas:
            raise InvalidArgument(f"{new_leader!r} hosts no replica of tablet {tablet_id}")
        timeout = self._timeout(timeout_s)
        request = admin_pb2.LeaderStepDownRequest(tablet_id=tablet_id, new_leader_uuid=new_leader)
        _, server = self._on_leader(
            tablet_id,
            lambda stub, timeout: stub.leader_step_down(request, timeout),
            what=f"leader step-down of tablet {tablet_id}",
            timeout_s=timeout,
        )
        self._meta.forget_leader(tablet_id)
        return server

    def admin_stub(self, server_uuid: str) -> admin_pb2_grpc.AdminServiceStub:
        """The AdminService of one server (membership changes: ``client.membership``)."""
        self._check_open()
        return admin_pb2_grpc.AdminServiceStub(
            self._channels.channel(self._meta.address(server_uuid))
        )

    def on_leader(
        self,
        tablet_id: str,
        call: Callable[[admin_pb2_grpc.AdminServiceStub, float], R],
        *,
        what: str,
        timeout_s: float | None = None,
    ) -> tuple[R, str]:
        """An AdminService call on the leader of ``tablet_id``, found and retried as a
        write's would be (NOT_LEADER follows the hint); its answer and the leader's uuid."""
        self._check_open()
        return self._on_leader(
            tablet_id,
            lambda stub, timeout: call(
                admin_pb2_grpc.AdminServiceStub(self._channels.channel(stub.address)), timeout
            ),
            what=what,
            timeout_s=self._timeout(timeout_s),
        )

    def checksum(
        self, tablet_id: str, *, timeout_s: float | None = None, refresh: bool = True
    ) -> TabletChecksum:
        """Compare the rows of every replica of ``tablet_id`` at one log index (needs the
        admin role): the leader places a checksum point, each replica checksums its rows
        when it applies it. A replica that cannot answer is in the result with its error,
        not raised: telling which replica is wrong is the point. ``refresh=False``: the
        caller has just learned the replicas (``leader_of(..., refresh=True)``), as one
        checking many tablets at once does -- each refresh waits for every server."""
        self._check_open()
        timeout = self._timeout(timeout_s)
        if refresh:
            # Its replicas as they are now (they may have moved since the client started).
            self._meta.refresh_leaders(time.monotonic() + timeout, force=True)
        wait_ms = max(1, min(int(timeout * 1000), _MAX_CHECKSUM_WAIT_MS))
        place = admin_pb2.ChecksumTabletRequest(tablet_id=tablet_id, timeout_ms=wait_ms)
        first, leader = self._on_leader(
            tablet_id,
            lambda stub, timeout: stub.checksum_tablet(place, timeout),
            what=f"checksum point of tablet {tablet_id}",
            timeout_s=timeout,
        )
        results = {leader: _replica_checksum(leader, first)}
        at = admin_pb2.ChecksumTabletRequest(
            tablet_id=tablet_id, index=first.index, timeout_ms=wait_ms
        )
        # The leader's members: after a move, the client's list (the placement, for a tablet
        # the server it asked does not host) left the new replica unchecked and asked the
        # old one, NOT_FOUND (review r30a). An older leader names none.
        members = list(first.members) or self._meta.tablet(tablet_id).replicas
        others = [r for r in members if r != leader]
        futures = {
            uuid: self._executor.submit(self._checksum_at, uuid, at, timeout) for uuid in others
        }
        for uuid, future in futures.items():
            results[uuid] = future.result()
        return TabletChecksum(tablet_id, first.index, tuple(results[r] for r in sorted(results)))

    def _on_leader(
        self,
        tablet_id: str,
        call: Callable[[ServerStub, float], R],
        *,
        what: str,
        timeout_s: float,
    ) -> tuple[R, str]:
        """One admin call on the leader of ``tablet_id``, found and retried as a write's
        would be; its answer and the uuid of the server that gave it."""
        return call_tablet(
            self._rpc,
            tablet_id,
            lambda stub, timeout, _attempt: call(stub, timeout),
            what=what,
            deadline=time.monotonic() + timeout_s,
            timeout_s=timeout_s,
        )

    def _checksum_at(
        self, uuid: str, request: admin_pb2.ChecksumTabletRequest, timeout: float
    ) -> ReplicaChecksum:
        try:
            stub = self._channels.stub(self._meta.address(uuid))
            return _replica_checksum(uuid, stub.checksum_tablet(request, timeout))
        except grpc.RpcError as e:
            return ReplicaChecksum(uuid, error=f"{e.code().name}: {e.details()}")

    # --- lifecycle -------------------------------------------------------------------------

    # stats, closed and _check_open: inherited (client_base)

    def close(self) -> None:
        """Close every session (flushing it), then the thread pool and the channels."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sessions = list(self._sessions)
        _OPEN_CLIENTS.discard(self)
        try:
            for session in sessions:
                session.close()
        finally:
            self._executor.shutdown(wait=True)
            self._channels.close()

    def unwritten_rows(self) -> int:
        """Rows given to this client's open sessions that have no outcome yet (buffered,
        or in flight)."""
        with self._lock:
            sessions = list(self._sessions)
        return sum(session.pending for session in sessions)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<raftlet Client {self.client_id[:8]} seeds={','.join(self._seeds)} {state}>"
