"""The client's map of the cluster: tables → tablets → replicas → addresses, and leaders.

There is no master: every tablet server answers ``GetClusterConfig`` (servers, tables with
their schemas, and where every tablet's replicas are: the voters of the server's own replica
where it has one, else the placement), so ``load`` asks the seed addresses — then any server
it already knows — until one answers. That is fetched once per client, and again only when
it proves out of date (``table_view_stale``): a table asked for that it does not list (one
added by a rolling restart since), or a call a server refused as made for another schema of
its table (the cluster made again with a column changed). Replicas move (membership
changes: ``raftlet tablet move-replica``), and the cache follows them:

- every ``ListTablets`` answer (``refresh_leaders``, below) carries each replica's membership;
  the voters of the replica that claims leadership (highest term) become the tablet's
  replicas;
- a server that answers TABLET_NOT_FOUND for a tablet (it has no replica, or its replica was
  removed from the group) makes the call look the tablet up again before it tries further,
  and a call fails with ``TabletNotFound`` only once every replica of the fresh list said so.

Leaders are learned lazily and cheaply:

- from ``NOT_LEADER`` answers, which carry the leader the refusing replica believes in
  (``set_leader`` with the hint);
- when no hint helps, from ``refresh_leaders``: ``ListTablets`` on every server at once, where
  only a replica that reports *itself* leader is believed (a follower's ``leader_uuid`` may
  still name a dead leader until its election timeout), the highest term winning if two claim
  it. Refreshes are serialized and rate-limited (``leader_refresh_interval_s``), so a storm of
  failing writes costs one round of ``ListTablets``, not one per write; a refresh for one
  tablet is done once a majority of its replicas settled who leads (``leader_settled``), or
  soon after they answered without settling it (``leader_heard``).

A server whose call failed at the transport level is *down* for ``down_ttl_s``: routing
prefers other replicas meanwhile (but still tries it when nothing else is left). So is one
whose reads or ``ListTablets`` calls have run out of time for ``SILENCE_S`` with no answer to
any call in between (``timed_out``): one short deadline passing says nothing about the server.
A leader silent that long is not marked down but *in doubt* (``doubt_leader``): the next call
to its tablet looks the leader up first, and goes back to it if it still leads (``rpc``); so
does a call still in flight to it (``quiet_left``), which is cut short if another leads.

The state (view, leaders, servers down) and the decisions on it are ``MetaState``, free of
I/O; ``MetaCache`` adds the blocking RPCs and ``aio_meta.AsyncMetaCache`` the asyncio ones.

Routing a row is ``schema.partition_for_key`` on its key columns — the same function the
server uses to place and check rows — mapped to the tablet of that partition.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import grpc

from raftlet.client.channels import ResultFuture, StubProvider
from raftlet.client.errors import InvalidArgument, RaftletError, RemoteError, TabletNotFound
from raftlet.client.retry import (
    Action,
    Cause,
    ConfigFetchRefusals,
    RetriableFailure,
    RpcFailure,
    classify,
    fatal_error,
    run_with_retries,
)
from raftlet.client.stats import StatsRecorder
from raftlet.metrics.human import cut
from raftlet.proto import consensus_pb2, tablet_pb2
from raftlet.schema.keys import KeyEncodeError
from raftlet.schema.partition import key_router
from raftlet.schema.schema import Schema, SchemaError

__all__ = ["ClusterView", "MetaCache", "MetaState", "ServerInfo", "TableInfo", "TabletInfo"]

# ListTablets and GetClusterConfig are cheap in-memory answers; a server that takes longer is
# as good as down (for this call), and the next server is asked.
LIST_TABLETS_TIMEOUT_S = 2.0
CONFIG_TIMEOUT_S = 3.0
# How long a server must answer nothing, its calls timing out, before it is taken for gone
# (marked down, or its leaderships in doubt): longer than a leader's fsync or GC stall,
# shorter than an election.
SILENCE_S = 0.5
# The config is fetched again at most this often when it proves out of date.
_RELOAD_INTERVAL_S = 1.0
# Addresses of unlisted leaders kept to ask for the config first.
_MAX_HINTED = 4
# How long a look-up for one tablet waits for the rest once a majority of its replicas
# answered without settling who leads: long enough for a busy leader's answer, short enough
# that the next look-up, after an election, is not held up.
STRAGGLER_S = 0.05
# How long past its own deadline a look-up waits for a gRPC call that has not ended.
_STUCK_CALL_MARGIN_S = 5.0

# Each server's ``ListTablets`` answer, or why it gave none, by uuid.
Answers = dict[str, tablet_pb2.ListTabletsResponse | RpcFailure]


@dataclass(frozen=True)
class ServerInfo:
    uuid: str
    rpc_addr: str
    http_addr: str


@dataclass(frozen=True)
class TableInfo:
    name: str
    schema: Schema
    num_partitions: int
    replication_factor: int
    # The tablet of partition p is tablet_ids[p].
    tablet_ids: tuple[str, ...]


@dataclass(frozen=True)
class TabletInfo:
    tablet_id: str
    table: str
    partition: int
    # Server uuids (sorted, as the server sends them: order carries no meaning).
    replicas: tuple[str, ...]


@dataclass(frozen=True)
class ClusterView:
    servers: Mapping[str, ServerInfo]
    tables: Mapping[str, TableInfo]
    tablets: Mapping[str, TabletInfo]

    @classmethod
    def from_pb(
        cls, pb: tablet_pb2.GetClusterConfigResponse, *, token_ports: bool = False
    ) -> ClusterView:
        """Validate a server's answer enough that routing cannot go wrong on it.
        ``token_ports``: this client has a bearer token and no certificate, so it dials each
        server's token port instead of its RPC port (``InvalidArgument`` if one has none)."""
        if token_ports:
            lacking = sorted(s.uuid for s in pb.servers if not s.token_rpc_addr)
            if lacking:
                # Clients learn token ports from here, and it serves cluster.toml's: a port
                # opened by a server's --token_rpc_addr flag alone is one they never hear of.
                raise InvalidArgument(
                    f"server(s) {', '.join(lacking)} have no token port (token_rpc_addr), so "
                    "a client without a certificate cannot reach them: give the client a "
                    'certificate, or add token_rpc_addr = "HOST:PORT" to each [[servers]] '
                    "entry of cluster.toml (the address clients dial; a server's "
                    "--token_rpc_addr flag only changes where it listens, e.g. 0.0.0.0:PORT) "
                    "and restart the servers"
                )
        servers = {
            s.uuid: ServerInfo(s.uuid, s.token_rpc_addr if token_ports else s.rpc_addr, s.http_addr)
            for s in pb.servers
        }
        if not servers:
            raise RemoteError("GetClusterConfig answered with no servers")
        tablets: dict[str, TabletInfo] = {}
        by_table: dict[str, dict[int, str]] = {}
        for t in pb.tablets:
            unknown = [r for r in t.replica_uuids if r not in servers]
            if unknown or not t.replica_uuids:
                raise RemoteError(
                    f"GetClusterConfig: tablet {t.tablet_id} has replicas {list(t.replica_uuids)} "
                    f"but the servers are {sorted(servers)}"
                )
            # Where the replicas are now if the server knows (its own replica's membership),
            # else where the tablet was placed.
            now = [r for r in t.voters if r in servers]
            tablets[t.tablet_id] = TabletInfo(
                t.tablet_id, t.table_name, t.partition, tuple(now or t.replica_uuids)
            )
            by_table.setdefault(t.table_name, {})[t.partition] = t.tablet_id
        tables: dict[str, TableInfo] = {}
        for tb in pb.tables:
            try:
                schema = Schema.from_pb(tb.schema)
            except SchemaError as e:
                raise RemoteError(f"GetClusterConfig: table {tb.name!r}: {e}") from None
            parts = by_table.get(tb.name, {})
            if sorted(parts) != list(range(tb.num_partitions)):
                raise RemoteError(
                    f"GetClusterConfig: table {tb.name!r} has {tb.num_partitions} partitions "
                    f"but tablets for partitions {sorted(parts)}"
                )
            tables[tb.name] = TableInfo(
                tb.name,
                schema,
                tb.num_partitions,
                tb.replication_factor,
                tuple(parts[p] for p in range(tb.num_partitions)),
            )
        return cls(servers, tables, tablets)


class MetaState:
    """The pure part of the meta cache, shared by ``MetaCache`` (threads) and
    ``aio_meta.AsyncMetaCache`` (asyncio): the installed cluster view, the leaders learned
    so far and the servers marked down. No I/O; every method is quick and thread-safe."""

    def __init__(
        self,
        seeds: Sequence[str],
        stats: StatsRecorder,
        *,
        down_ttl_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        token_ports: bool = False,
    ) -> None:
        self.seeds = list(seeds)
        # A client with a token and no certificate dials the servers' token ports.
        self.token_ports = token_ports
        self._stats = stats
        self._down_ttl_s = down_ttl_s
        self._clock = clock
        self._view: ClusterView | None = None
        self._lock = threading.Lock()
        self._leaders: dict[str, str] = {}
        # Tablets whose cached leader let a call run out of time (``doubt_leader``).
        self._in_doubt: set[str] = set()
        self._down_until: dict[str, float] = {}
        # When each server last answered a call (``mark_up``), by uuid.
        self._answered_at: dict[str, float] = {}
        # The earliest send of the calls that timed out since the server's last answer.
        self._unanswered_since: dict[str, float] = {}
        # Replicas learned since the view was installed (a moved tablet), by tablet.
        self._replicas: dict[str, tuple[str, ...]] = {}
        # A server refused a call as made for another schema, or named a leader the view
        # does not list: fetch the config again.
        self._stale = False
        self._last_load = float("-inf")
        # Where leaders the view does not list were said to be (``leader_unlisted``).
        self._hinted: list[str] = []

    def config_addresses(self) -> list[str]:
        """Where to ask for the config: leaders the view does not list, the seeds, then
        every server already known."""
        known = [s.rpc_addr for s in self._view.servers.values()] if self._view else []
        return list(dict.fromkeys([*self._hinted, *self.seeds, *known]))

    def leader_unlisted(self, address: str) -> None:
        """A replica named, at ``address``, a leader of its tablet that the view does not
        list: the view is out of date -- a seed running an older cluster.toml gave it, and
        a review's client, told of the new leader by every other server, wrote nothing for
        ten minutes. The next look-up fetches the config again, from there first."""
        with self._lock:
            if address:
                self._hinted = list(dict.fromkeys([address, *self._hinted]))[:_MAX_HINTED]
            self._stale = True

    def view_outdated(self) -> bool:
        """Whether a look-up should fetch the config again first (``leader_unlisted``)."""
        return self._stale and bool(self._hinted) and self.may_fetch_again()

    # --- the config ------------------------------------------------------------------------

    def install(self, pb: tablet_pb2.GetClusterConfigResponse) -> ClusterView:
        view = ClusterView.from_pb(pb, token_ports=self.token_ports)
        with self._lock:
            self._view = view
            self._replicas = {}
            self._stale = False
            self._last_load = self._clock()
        return view

    def mark_stale(self) -> None:
        """A server refused a call as made for another schema of its table."""
        self._stale = True

    def fingerprint_of(self, table: str) -> int | None:
        """The fingerprint of ``table``'s schema in the view (None: no such table)."""
        info = self._view.tables.get(table) if self._view is not None else None
        return info.schema.fingerprint if info is not None else None

    def may_fetch_again(self) -> bool:
        """Whether a fetch of the config is allowed now (``_RELOAD_INTERVAL_S`` since the
        last)."""
        return self._clock() - self._last_load >= _RELOAD_INTERVAL_S

    def table_view_stale(self, name: str) -> bool:
        """Whether the config should be fetched again before ``table(name)``: it was found
        out of date, or does not list the table -- at most once every
        ``_RELOAD_INTERVAL_S``, so a loop over a name that is no table costs no fetch a
        call."""
        view = self._view
        if view is None or not (self._stale or name not in view.tables):
            return False
        return self.may_fetch_again()

    @property
    def view(self) -> ClusterView:
        view = self._view
        if view is None:
            raise InvalidArgument(
                "the client has not fetched the cluster config yet: connect with "
                "`await AsyncClient.connect(...)` (or `async with` the client, or `await "
                "client.load()`) before using it"
            )
        return view

    def table(self, name: str) -> TableInfo:
        tables = self.view.tables
        info = tables.get(name)
        if info is None:
            known = ", ".join(sorted(tables))
            raise InvalidArgument(f"unknown table {cut(name)!r} (tables: {known})")
        return info

    def tablet(self, tablet_id: str) -> TabletInfo:
        info = self.view.tablets.get(tablet_id)
        if info is None:
            raise TabletNotFound(f"unknown tablet {tablet_id!r}")
        moved = self._replicas.get(tablet_id)
        if moved is not None and moved != info.replicas:
            return TabletInfo(info.tablet_id, info.table, info.partition, moved)
        return info

    def set_replicas(self, tablet_id: str, replicas: Sequence[str]) -> None:
        """Where ``tablet_id``'s replicas are now (servers of the view only)."""
        known = self.view.servers
        servers = tuple(sorted(r for r in replicas if r in known))
        if servers:
            with self._lock:
                self._replicas[tablet_id] = servers

    def address(self, server_uuid: str) -> str:
        server = self.view.servers.get(server_uuid)
        if server is None:
            raise TabletNotFound(f"unknown server {server_uuid!r}")
        return server.rpc_addr

    def tablet_for(self, table: str, row: Mapping[str, object]) -> str:
        """The tablet that holds ``row`` (a mapping with at least the key columns)."""
        return self.route(table, row)[0]

    def route(self, table: str, row: Mapping[str, object]) -> tuple[str, bytes]:
        """The tablet that holds ``row``, and the row's encoded key."""
        return self.route_in(self.table(table), row)

    @staticmethod
    def route_in(info: TableInfo, row: Mapping[str, object]) -> tuple[str, bytes]:
        """``route`` for a table already looked up."""
        table = info.name
        try:
            partition, encoded = key_router(info.schema, info.num_partitions)(row)
        except (KeyEncodeError, ValueError, TypeError) as e:
            key = {c.name: row.get(c.name) for c in info.schema.key_columns}
            raise InvalidArgument(f"table {table!r}: bad key {key!r}: {e}") from None
        return info.tablet_ids[partition], encoded

    # --- leaders and health ----------------------------------------------------------------

    def leader(self, tablet_id: str) -> str | None:
        with self._lock:
            return self._leaders.get(tablet_id)

    def set_leader(self, tablet_id: str, server_uuid: str) -> None:
        with self._lock:
            self._leaders[tablet_id] = server_uuid
            self._in_doubt.discard(tablet_id)

    def doubt_leader(self, tablet_id: str, server_uuid: str) -> None:
        """A call to ``server_uuid``, the cached leader, ran out of time: the next call to the
        tablet, from any thread, looks the leader up first (``leader_in_doubt``), and goes
        back to it unless the look-up finds another. (A paused leader was otherwise asked
        by every call until it woke, each taking its whole timeout.)"""
        with self._lock:
            if self._leaders.get(tablet_id) == server_uuid:
                self._in_doubt.add(tablet_id)

    def leader_in_doubt(self, tablet_id: str) -> bool:
        return tablet_id in self._in_doubt

    def forget_leader(self, tablet_id: str, server_uuid: str | None = None) -> None:
        """Forget the cached leader (only if it is ``server_uuid``, when given)."""
        with self._lock:
            if server_uuid is None or self._leaders.get(tablet_id) == server_uuid:
                self._leaders.pop(tablet_id, None)

    def mark_down(self, server_uuid: str) -> None:
        with self._lock:
            self._down_until[server_uuid] = self._clock() + self._down_ttl_s
            for tablet, leader in list(self._leaders.items()):
                if leader == server_uuid:
                    del self._leaders[tablet]

    def mark_up(self, server_uuid: str) -> None:
        now = self._clock()
        with self._lock:
            self._answered_at[server_uuid] = now
            self._unanswered_since.pop(server_uuid, None)
            self._down_until.pop(server_uuid, None)

    def now(self) -> float:
        """The clock that ``silent``'s ``sent_at`` is read from."""
        return self._clock()

    def silent(self, server_uuid: str, sent_at: float) -> bool:
        """A call sent to the server at ``sent_at`` got no answer before its deadline: True
        once the server has answered nothing for ``SILENCE_S`` -- counted from its last
        answer, or from the first call since then that timed out, whichever came later;
        False before that: slow, not gone. (A short deadline of the caller's says nothing
        about the server; nor does a first call after a long idle time.)"""
        now = self._clock()
        with self._lock:
            since = min(self._unanswered_since.get(server_uuid, sent_at), sent_at)
            self._unanswered_since[server_uuid] = since
            quiet_from = max(since, self._answered_at.get(server_uuid, float("-inf")))
            return now - quiet_from >= SILENCE_S

    def quiet_left(self, server_uuid: str, sent_at: float) -> float:
        """How long until the server, with a call out since ``sent_at``, has been silent for
        ``SILENCE_S`` as ``silent`` counts it (0 or less: it has been) -- without noting the
        call as unanswered: it is still out, and may yet be answered."""
        now = self._clock()
        with self._lock:
            since = min(self._unanswered_since.get(server_uuid, sent_at), sent_at)
            quiet_from = max(since, self._answered_at.get(server_uuid, float("-inf")))
        return quiet_from + SILENCE_S - now

    def timed_out(self, server_uuid: str, sent_at: float) -> bool:
        """As ``silent``, and a silent server is marked down (True). (Marked down at its
        first timeout, a busy server sent every thread of the process to the others for
        ``down_ttl_s``: 32 writers with a 30 ms timeout wrote a fifth of what they could.)"""
        if not self.silent(server_uuid, sent_at):
            return False
        self.mark_down(server_uuid)
        return True

    def is_down(self, server_uuid: str) -> bool:
        with self._lock:
            until = self._down_until.get(server_uuid)
        return until is not None and self._clock() < until

    def leader_settled(
        self, tablet_id: str, answers: Mapping[str, tablet_pb2.ListTabletsResponse | RpcFailure]
    ) -> bool:
        """Whether the ``ListTablets`` answers so far settle ``tablet_id``'s leader, so a
        look-up need not wait for the rest: a replica claims leadership at term T, and a
        majority of the tablet's voters answered, none at a term past T. (A leader of a
        later term needs the votes of a majority, which would include one of these; a look-
        up had waited its whole 2 s for a paused server after the others had elected.)"""
        claim: tuple[int, tuple[str, ...]] | None = None
        terms: dict[str, int] = {}
        for uuid, answer in answers.items():
            if isinstance(answer, RpcFailure):
                continue
            for t in answer.tablets:
                if t.tablet_id != tablet_id:
                    continue
                terms[uuid] = t.term
                claims_it = t.role == consensus_pb2.LEADER and t.leader_uuid == uuid
                if claims_it and (claim is None or t.term > claim[0]):
                    claim = (t.term, tuple(t.voters))
        if claim is None:
            return False
        term, voters = claim
        voters = voters or self.tablet(tablet_id).replicas
        answered = [u for u in voters if u in terms]
        return len(answered) > len(voters) // 2 and all(terms[u] <= term for u in answered)

    def unanswered_doubt(self, tablet_id: str, answers: Mapping[str, object]) -> None:
        """After a look-up for ``tablet_id``: a leader in doubt that did not answer it either
        is marked down, so the next attempts go to the others, whose NOT_LEADER answers name
        the leader they elect. (Kept, it was asked again by every call, each waiting out its
        whole timeout, until it woke.)"""
        with self._lock:
            leader = self._leaders.get(tablet_id)
            if tablet_id not in self._in_doubt or leader is None:
                return
        if not isinstance(answers.get(leader), tablet_pb2.ListTabletsResponse):
            self.mark_down(leader)

    def leader_heard(
        self, tablet_id: str, answers: Mapping[str, tablet_pb2.ListTabletsResponse | RpcFailure]
    ) -> bool:
        """Whether a majority of ``tablet_id``'s replicas answered a look-up: if none of them
        claims it, the others are not waited for long (``STRAGGLER_S``) -- a paused leader's
        answer never comes, and a look-up started during an election had waited for it
        after the others had elected."""
        replicas = self.tablet(tablet_id).replicas
        heard = 0
        for uuid in replicas:
            answer = answers.get(uuid)
            if isinstance(answer, tablet_pb2.ListTabletsResponse) and any(
                t.tablet_id == tablet_id for t in answer.tablets
            ):
                heard += 1
        return heard > len(replicas) // 2

    def learn_leaders(
        self,
        answers: Mapping[str, tablet_pb2.ListTabletsResponse | RpcFailure],
        sent_at: float = float("-inf"),
    ) -> None:
        """Take in the ``ListTablets`` answers of servers asked at ``sent_at`` (or why they
        gave none): servers that could not be reached are marked down, or ran out of time
        (by ``timed_out``), those that answered are up, and each tablet's leader is the
        replica that claims leadership *itself* (highest term wins); tablets nobody claims
        keep what is cached."""
        claims: dict[str, tuple[int, str, tuple[str, ...]]] = {}
        for uuid, answer in answers.items():
            if isinstance(answer, RpcFailure):
                if answer.cause is Cause.UNAVAILABLE:
                    self.mark_down(uuid)
                elif answer.cause is Cause.DEADLINE_EXCEEDED:
                    self.timed_out(uuid, sent_at)
                continue
            self.mark_up(uuid)
            for t in answer.tablets:
                if t.role == consensus_pb2.LEADER and t.leader_uuid == uuid:
                    best = claims.get(t.tablet_id)
                    if best is None or t.term > best[0]:
                        claims[t.tablet_id] = (t.term, uuid, tuple(t.voters))
        with self._lock:
            for tablet, (_, uuid, _voters) in claims.items():
                self._leaders[tablet] = uuid
                self._in_doubt.discard(tablet)
        for tablet, (_, _, voters) in claims.items():
            if voters and self._view is not None and tablet in self._view.tablets:
                self.set_replicas(tablet, voters)


class MetaCache(MetaState):
    """``MetaState`` with blocking gRPC I/O: ``load`` and ``refresh_leaders`` (threads)."""

    def __init__(
        self,
        seeds: Sequence[str],
        stubs: StubProvider,
        stats: StatsRecorder,
        *,
        rpc_timeout_s: float = 10.0,
        down_ttl_s: float = 1.0,
        leader_refresh_interval_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        token_ports: bool = False,
    ) -> None:
        super().__init__(seeds, stats, down_ttl_s=down_ttl_s, clock=clock, token_ports=token_ports)
        self._stubs = stubs
        self._rpc_timeout_s = rpc_timeout_s
        self._refresh_interval_s = leader_refresh_interval_s
        self._refresh_lock = threading.Lock()
        self._last_refresh = float("-inf")
        self._load_lock = threading.Lock()  # one fetch of the config again at a time

    def table(self, name: str) -> TableInfo:
        """``MetaState.table``, with the config fetched again first when it proved out of
        date (``table_view_stale``); a fetch that fails keeps the view there is."""
        view = self._view
        if view is not None and not self._stale:  # every row's look-up: the short way
            info = view.tables.get(name)
            if info is not None:
                return info
        if self.table_view_stale(name):
            with self._load_lock:
                if self.table_view_stale(name):
                    self._fetch_again()
        return super().table(name)

    def table_changed(self, table: str) -> bool:
        """Fetch the config again (at most once a ``_RELOAD_INTERVAL_S``) and say whether
        ``table``'s schema changed: a row the client refused by its schema may fit the
        table's new one -- with a cluster made again with a column changed, every write
        failed in the client, which never asked a server and so never learned."""
        with self._load_lock:
            if not self.may_fetch_again():
                return False
            before = self.fingerprint_of(table)
            return self._fetch_again() and self.fingerprint_of(table) != before

    def _fetch_again(self) -> bool:
        """Fetch the config once more, briefly; whether it came (a fetch that fails keeps
        the view there is, and is not tried again for ``_RELOAD_INTERVAL_S``)."""
        try:
            self.load(self._clock() + CONFIG_TIMEOUT_S, CONFIG_TIMEOUT_S)
        except RaftletError:
            self._last_load = self._clock()
            return False
        return True

    def load(self, deadline: float, timeout_s: float) -> ClusterView:
        """Fetch the cluster config from the seeds (then any known server), retrying until
        ``deadline``; raises ``Timeout`` if none answers."""

        refusals = ConfigFetchRefusals()

        def attempt(_n: int, attempt_timeout: float) -> ClusterView:
            end = self._clock() + attempt_timeout
            last: RpcFailure | None = None
            addresses = self.config_addresses()
            refusals.new_round(len(addresses))
            for addr in addresses:
                left = end - self._clock()
                if left <= 0:
                    break
                try:
                    pb = self._stubs.stub(addr).get_cluster_config(
                        min(left, self._rpc_timeout_s, CONFIG_TIMEOUT_S)
                    )
                except grpc.RpcError as e:
                    last = classify(e, address=addr)
                    if refusals.final(last):
                        # Not retried until the deadline (30 s of "invalid bearer token").
                        raise fatal_error(last, "fetching the cluster config") from None
                    continue
                self._stats.config_fetch()
                return self.install(pb)
            assert last is not None or not self.seeds
            raise RetriableFailure(
                last or RpcFailure(Cause.UNAVAILABLE, Action.NEXT_REPLICA, "", "no seed address")
            )

        if not self.seeds:
            raise InvalidArgument("a client needs at least one server address")
        return run_with_retries(
            attempt,
            what=f"fetching the cluster config from {', '.join(self.seeds)}",
            deadline=deadline,
            timeout_s=timeout_s,
            clock=self._clock,
            on_retry=lambda f: self._stats.retry(f.cause),
        )

    def list_tablets(
        self,
        timeout: float,
        enough: Callable[[Answers], bool] | None = None,
        nearly: Callable[[Answers], bool] | None = None,
    ) -> Answers:
        """``ListTablets`` on every server at once: uuid → its answer, or why it gave none.
        Once the answers so far are ``enough``, or ``nearly`` so and ``STRAGGLER_S`` has
        passed since, the calls still out are left out."""
        out: Answers = {}
        pending: dict[str, ResultFuture] = {}
        ended: queue.SimpleQueue[str] = queue.SimpleQueue()
        for uuid, server in self.view.servers.items():
            try:
                fut = self._stubs.stub(server.rpc_addr).list_tablets_future(timeout)
            except grpc.RpcError as e:
                out[uuid] = classify(e, uuid, server.rpc_addr)
                continue
            pending[uuid] = fut
            fut.add_done_callback(partial(_report_ended, ended, uuid))
        # Every call ends by its own gRPC deadline; the margin is for a stuck one.
        wait_until = time.monotonic() + timeout + _STUCK_CALL_MARGIN_S
        cut = False
        while pending and not (enough is not None and enough(out)):
            if not cut and nearly is not None and nearly(out):
                cut = True
                wait_until = min(wait_until, time.monotonic() + STRAGGLER_S)
            try:
                uuid = ended.get(timeout=max(0.0, wait_until - time.monotonic()))
            except queue.Empty:
                break
            fut = pending.pop(uuid)
            try:
                out[uuid] = fut.result()
            except grpc.RpcError as e:
                out[uuid] = classify(e, uuid, self.view.servers[uuid].rpc_addr)
        # The calls still out end by their own deadlines, unread (as the asyncio client's:
        # a grpc.aio call cancelled kept its connection open past the client's close).
        return out

    def refresh_leaders(
        self, deadline: float, *, force: bool = False, tablet_id: str | None = None
    ) -> None:
        """Learn every tablet's leader from the servers' own claims (see the module
        docstring); with ``tablet_id``, without waiting for more answers once that tablet's
        are settled (``leader_settled``). Returns early — keeping what is cached — when
        another thread refreshed within ``leader_refresh_interval_s`` or the deadline is
        too close."""
        left = deadline - self._clock()
        if left <= 0 or not self._refresh_lock.acquire(timeout=left):
            return
        try:
            if self.view_outdated():
                with self._load_lock:
                    if self.view_outdated():
                        self._fetch_again()
            now = self._clock()
            if not force and now - self._last_refresh < self._refresh_interval_s:
                return
            left = deadline - now
            if left <= 0:
                return
            sent_at = self._clock()
            answers = self.list_tablets(
                min(left, LIST_TABLETS_TIMEOUT_S, self._rpc_timeout_s),
                None if tablet_id is None else partial(self.leader_settled, tablet_id),
                None if tablet_id is None else partial(self.leader_heard, tablet_id),
            )
            self._stats.leader_refresh()
            self.learn_leaders(answers, sent_at)
            if tablet_id is not None:
                self.unanswered_doubt(tablet_id, answers)
            self._last_refresh = self._clock()
        finally:
            self._refresh_lock.release()


def _report_ended(ended: queue.SimpleQueue[str], uuid: str, _future: object) -> None:
    ended.put(uuid)
