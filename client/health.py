"""A ksck-style health check of a raftlet cluster (``raftlet cluster status``).

A client of every server's ``ListTablets``, so it lives in the client library; the CLI and
the local launcher (``deploy.local``) use it. Every server in the config is asked in
parallel, each with a short deadline, over one ``ChannelPool`` per round, so one hung server
costs the check one timeout, not one per server. From the answers:

- **servers**: UP (answered), BUSY (answered RESOURCE_EXHAUSTED: its tablet service queue is
  full, so it is alive but its replicas could not be listed), DENIED (answered, but refused
  the check's credentials), DOWN (no answer; with the local launcher's state, whether the
  process still exists tells "crashed" from "hung").
- **tablets**: the leader is the replica that reports itself LEADER with ``leader_ready``
  (the highest term wins if two do, as after a partition heals). A tablet's replicas are its
  leader's voters (memberships change: ``raftlet tablet move-replica``), or the config's
  placement while it has no leader. For every replica: its
  role, term, ``applied_index`` and ``applying_index``; its *lag* is the leader's
  ``commit_index`` minus the larger of the two. Entries up to ``applying_index`` are
  replicated and on their way into the store -- a follower holds committed entries back on
  purpose for one larger store transaction (up to 256, or ``--follower_apply_delay_ms``),
  or is writing them now -- so they are not lag; what piles up beyond that is.
- **verdict** per tablet and overall, like Kudu's ksck:
  ERROR: no ready leader, or fewer than a majority of replicas working (writes fail), or
  a replica (of the leader's group or not) that applied past the leader's commit: two
  groups claim the tablet, and no replica removal is advised.
  WARN: a server down, busy or denying the check, a replica missing or lagging more than ``max_lag``
  entries, a leader elected but not ready yet (writes wait for it; a leader stays so only while it
  cannot commit with a majority, so a WARN of this kind that lasts is an outage), a server running
  another cluster config than most (``ListTablets`` carries digests of its shared parts,
  ``cluster.digest``: cluster name, servers, tables, Raft timings), or the checker's own
  ``ClusterConfig`` differing from what most servers run in its name, servers or tables (a stale or
  edited copy of ``cluster.toml``; its Raft timings are not compared, as server flags may override
  the file's). A tablet of such a copy that no server hosts is a WARN saying so, not ERROR "no
  leader": the cluster is not what is wrong. OK otherwise.

With a bearer token and no client certificate (``tls.uses_token_ports``: ``ProbeOptions``'s
``token_ports``) every server is asked at its token port, as the client's meta cache does:
its RPC port requires a certificate.

The lag is measured across servers asked at slightly different moments, so under a write
load a few entries of lag are normal; ``max_lag`` is the tolerance before it is reported.
A replica past the leader's commit is checked against the leader's second answer
(``_ask_leaders_again``), which leaves no tolerance.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from raftlet.client.channels import ChannelPool, ResultFuture, channel_options
from raftlet.client.errors import InvalidArgument
from raftlet.client.retry import CREDENTIALS_REFUSED, closed_at_connect
from raftlet.cluster import ClusterConfig
from raftlet.cluster.digest import SECTIONS, config_digests
from raftlet.cluster.identity import EXPIRY_WARNING_DAYS
from raftlet.proto import tablet_pb2
from raftlet.proto.consensus_pb2 import RaftRole

__all__ = [
    "ClusterHealth",
    "ClusterLayout",
    "ProbeOptions",
    "ReplicaHealth",
    "ServerHealth",
    "Severity",
    "TabletHealth",
    "check_cluster",
    "probe_servers",
    "replica_present",
]


# What the check reads of a cluster config: ``ClusterConfig`` and its parts fit these, and
# so do a test's stand-ins. Only a real ``ClusterConfig`` is compared with the servers'.


class ServerEntry(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def rpc_addr(self) -> str: ...

    @property
    def http_addr(self) -> str: ...

    @property
    def token_rpc_addr(self) -> str: ...


class PlacementEntry(Protocol):
    @property
    def tablet_id(self) -> str: ...

    @property
    def table(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def replicas(self) -> Sequence[str]: ...


class ClusterLayout(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def servers(self) -> Sequence[ServerEntry]: ...

    def placements(self) -> Sequence[PlacementEntry]: ...


_CHECK_CHANNEL_OPTIONS = channel_options(max_reconnect_backoff_ms=500)


class Severity(enum.IntEnum):
    OK = 0
    WARN = 1
    ERROR = 2


@dataclass(frozen=True, slots=True)
class ProbeOptions:
    timeout_s: float = 3.0
    # grpc.ChannelCredentials for a TLS cluster (``tls.channel_credentials``); None: plaintext.
    credentials: Any = None
    # Dial each server's token port, not its RPC port (``tls.uses_token_ports``): credentials
    # with a bearer token and no client certificate, which the RPC port's handshake refuses.
    token_ports: bool = False
    # Entries a replica may trail the leader's commit index by, not counting those on their
    # way into its store, before it is reported as lagging (see the module docstring).
    max_lag: int = 100
    # Ask each server what its replicas' files take (a stat per file on the server): for
    # `raftlet cluster status`, not for the polls of `cluster up`.
    disk_usage: bool = False


@dataclass(slots=True)
class ServerHealth:
    id: str
    rpc_addr: str  # the address asked: its token port when ``ProbeOptions.token_ports``
    http_addr: str
    state: str  # "UP", "BUSY", "DOWN", "DENIED" (it refused the check's credentials)
    error: str = ""
    process_alive: bool | None = None  # None: not a local cluster, unknown
    tablets: int = 0  # replicas it reported
    # The parts of its cluster config (cluster.digest's section names) that differ from
    # what most servers run; empty when it agrees, or did not say.
    config_differs: tuple[str, ...] = ()
    # Seconds until its TLS certificate or that certificate's CA expires (negative:
    # expired); None without TLS, or when it did not say.
    cert_expiry_s: float | None = None
    # What its replicas' WAL and store files take (``ProbeOptions.disk_usage``); None when
    # not asked, or from a server too old to say.
    disk_bytes: int | None = None
    # The release it runs; "" from a server too old to say, None when it did not answer.
    version: str | None = None

    @property
    def release(self) -> str:
        """Its release as an operator reads it ("-" when it did not answer)."""
        if self.version is None:
            return "-"
        return self.version or f"before {_FIRST_TO_SAY_ITS_VERSION}"

    @property
    def severity(self) -> Severity:
        if self.cert_expired:
            return Severity.ERROR
        if self.state != "UP" or self.config_differs or self.cert_expires_soon:
            return Severity.WARN
        return Severity.OK

    @property
    def cert_expires_soon(self) -> bool:
        """Within ``EXPIRY_WARNING_DAYS``, or already expired."""
        if self.cert_expired:
            return True
        return self.cert_expiry_s is not None and self.cert_expiry_s < _EXPIRY_WARNING_S

    @property
    def cert_expired(self) -> bool:
        # Once it has expired, the check's own handshake is refused, with OpenSSL's words.
        if _HANDSHAKE_EXPIRED in self.error:
            return True
        return self.cert_expiry_s is not None and self.cert_expiry_s <= 0

    def cert_note(self) -> str:
        """What its certificate's expiry means for an operator; "" if nothing yet."""
        left = self.cert_expiry_s
        if not self.cert_expires_soon:
            return ""
        if self.cert_expired:
            when = f" {_duration(-left)} ago" if left is not None else ""
            return (
                f"its TLS certificate (or its CA) expired{when}: clients and peers that "
                "connect anew refuse it; renew its certificate and restart it"
            )
        assert left is not None
        return (
            f"its TLS certificate (or its CA) expires in {_duration(left)}: renew it and "
            "restart the server before then (README: TLS, renewing certificates)"
        )


@dataclass(slots=True)
class ReplicaHealth:
    server: str
    # "OK", "LAGGING", "AHEAD" (applied past the leader's commit), "FAILED" (the replica,
    # not its server), "DOWN", "UNKNOWN" (server busy or refusing us), "COPYING" (its server
    # is making it by tablet copy), "MISSING"
    state: str
    role: str = ""
    term: int = 0
    applied_index: int = 0
    commit_index: int = 0
    applying_index: int = 0  # entries up to here are on their way into its store
    lag: int | None = None
    disk_bytes: int | None = None  # its WAL and store files, when asked and said

    @property
    def present(self) -> bool:
        return replica_present(self.state)


# Replica states of no replica on a server that answers: its server is down, or answers
# without it, or is still copying it in.
_ABSENT = frozenset({"DOWN", "MISSING", "COPYING"})


def replica_present(state: str) -> bool:
    """Whether a replica in ``state`` exists on a server that answers (a FAILED or UNKNOWN
    one too)."""
    return state not in _ABSENT


@dataclass(slots=True)
class TabletHealth:
    tablet_id: str
    table: str
    partition: int
    replicas: list[ReplicaHealth]
    leader: str | None = None
    term: int = 0
    # None when the leader did not list itself (busy): its commit index is unknown.
    leader_commit: int | None = None
    issues: list[str] = field(default_factory=list)
    severity: Severity = Severity.OK
    # No leader, and a majority of its voters FAILED: it cannot elect one (nor wait for one).
    lost_majority: bool = False


@dataclass(slots=True)
class ClusterHealth:
    name: str
    servers: list[ServerHealth]
    tablets: list[TabletHealth]
    issues: list[str]
    severity: Severity

    @property
    def ok(self) -> bool:
        return self.severity is Severity.OK

    def releases(self) -> dict[str, list[str]]:
        """The releases the servers that answered run, each with its servers: more than one
        while a rolling upgrade (or rollback) is under way."""
        found: dict[str, list[str]] = {}
        for s in self.servers:
            if s.version is not None:
                found.setdefault(s.release, []).append(s.id)
        return found

    def summary(self) -> str:
        """The one-line verdict: ``OK: …``, ``WARN: …`` or ``ERROR: …``."""
        up = sum(s.state == "UP" for s in self.servers)
        led = sum(t.leader is not None for t in self.tablets)
        counts = (
            f"{up}/{len(self.servers)} servers up, {led}/{len(self.tablets)} tablets with a "
            "ready leader"
        )
        if self.severity is Severity.OK:
            return f"OK: {counts}"
        n = len(self.issues)
        return f"{self.severity.name}: {counts}; {n} issue{'s' * (n != 1)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.name,
            "status": self.severity.name,
            "summary": self.summary(),
            "issues": list(self.issues),
            "servers": [
                {
                    "id": s.id,
                    "rpc_addr": s.rpc_addr,
                    "http_addr": s.http_addr,
                    "state": s.state,
                    "error": s.error,
                    "process_alive": s.process_alive,
                    "replicas": s.tablets,
                    "config_differs": list(s.config_differs),
                    "tls_cert_expiry_seconds": s.cert_expiry_s,
                    "disk_bytes": s.disk_bytes,
                    "version": s.version,
                }
                for s in self.servers
            ],
            "tablets": [
                {
                    "tablet_id": t.tablet_id,
                    "table": t.table,
                    "partition": t.partition,
                    "leader": t.leader,
                    "term": t.term,
                    "commit_index": t.leader_commit,
                    "status": t.severity.name,
                    "issues": list(t.issues),
                    "replicas": [
                        {
                            "server": r.server,
                            "state": r.state,
                            "role": r.role,
                            "term": r.term,
                            "applied_index": r.applied_index,
                            "applying_index": r.applying_index,
                            "lag": r.lag,
                            "disk_bytes": r.disk_bytes,
                        }
                        for r in t.replicas
                    ],
                }
                for t in self.tablets
            ],
        }


@dataclass(slots=True)
class _Probe:
    response: tablet_pb2.ListTabletsResponse | None
    state: str
    error: str = ""


def _outcome(call: ResultFuture) -> _Probe:
    try:
        resp = call.result()
    except grpc.RpcError as e:
        code = e.code()
        details = " ".join(str(e.details() or "").split())
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return _Probe(None, "BUSY", f"RESOURCE_EXHAUSTED: {details}" if details else "busy")
        said = f"{code.name}: {details}" if details else code.name
        if code in CREDENTIALS_REFUSED:
            return _Probe(None, "DENIED", said)  # it answered: up, but not to these credentials
        return _Probe(None, "DOWN", said)
    return _Probe(resp, "UP")


_EXPIRY_WARNING_S = EXPIRY_WARNING_DAYS * 86400.0
# What a client's failed handshake says of a server whose certificate (or CA) has expired.
_HANDSHAKE_EXPIRED = "certificate has expired"
# The first release whose servers say which release they run (ListTablets.server_version).
_FIRST_TO_SAY_ITS_VERSION = "0.2.0"


def _duration(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f} hours"
    return f"{max(seconds, 0) / 60:.0f} minutes"


def server_addresses(config: ClusterLayout, token_ports: bool = False) -> dict[str, str]:
    """Server id -> the address the check asks it at: its RPC port, or with ``token_ports``
    its token port (``InvalidArgument`` naming the servers that have none)."""
    if not token_ports:
        return {s.id: s.rpc_addr for s in config.servers}
    lacking = [s.id for s in config.servers if not s.token_rpc_addr]
    if lacking:
        raise InvalidArgument(
            f"server(s) {', '.join(lacking)} have no token port (token_rpc_addr in the "
            "cluster config), so credentials with a token and no client certificate cannot "
            "reach them: give a client certificate (--tls-cert, --tls-key), or those servers "
            "a --token_rpc_addr and its token_rpc_addr in cluster.toml"
        )
    return {s.id: s.token_rpc_addr for s in config.servers}


def probe_servers(
    config: ClusterLayout,
    timeout_s: float = 3.0,
    credentials: Any = None,
    *,
    token_ports: bool = False,
    only: Collection[str] | None = None,
    disk_usage: bool = False,
) -> dict[str, tuple[tablet_pb2.ListTabletsResponse | None, str, str]]:
    """Server id -> (ListTablets answer or None, state, error), asked of all (or those in
    ``only``) in parallel, at the addresses ``server_addresses`` gives; ``disk_usage``: with
    each replica's ``disk_bytes``."""
    addresses = server_addresses(config, token_ports)
    if only is not None:
        addresses = {sid: addr for sid, addr in addresses.items() if sid in only}
    # Channels for this one round only, on a short reconnect backoff: a check must see each
    # server as it is now, not through a connection or backoff left from an earlier round.
    channels = ChannelPool(_CHECK_CHANNEL_OPTIONS, credentials=credentials)
    try:
        calls = {
            sid: channels.stub(addr).list_tablets_future(timeout_s, disk_usage=disk_usage)
            for sid, addr in addresses.items()
        }
        out = {}
        for sid, call in calls.items():
            p = _outcome(call)
            out[sid] = (p.response, p.state, p.error)
        return out
    finally:
        channels.close()


def check_cluster(
    config: ClusterLayout,
    options: ProbeOptions | None = None,
    *,
    processes: Mapping[str, bool] | None = None,
) -> ClusterHealth:
    """Probe every server of ``config`` and judge the cluster (see the module docstring).

    ``processes`` (server id -> process alive), from the local launcher, refines DOWN.
    """
    opts = options or ProbeOptions()
    addresses = server_addresses(config, opts.token_ports)
    probes = probe_servers(
        config,
        opts.timeout_s,
        opts.credentials,
        token_ports=opts.token_ports,
        disk_usage=opts.disk_usage,
    )
    issues: list[str] = []
    waiting = False  # a server that makes no replica until a peer answers it
    servers: list[ServerHealth] = []
    statuses: dict[str, dict[str, tablet_pb2.TabletStatusPB]] = {}
    for s in config.servers:
        resp, state, error = probes[s.id]
        alive = None if processes is None else processes.get(s.id)
        addr = addresses[s.id]
        health = ServerHealth(s.id, addr, s.http_addr, state, error, alive)
        if resp is not None:
            statuses[s.id] = {t.tablet_id: t for t in resp.tablets}
            health.tablets = len(resp.tablets)
            if opts.disk_usage and all(t.HasField("disk_bytes") for t in resp.tablets):
                health.disk_bytes = sum(t.disk_bytes for t in resp.tablets)
            if resp.HasField("tls_cert_expiry_seconds"):
                health.cert_expiry_s = resp.tls_cert_expiry_seconds
            health.version = resp.server_version
            if resp.waiting_for_peers:
                waiting = True
                issues.append(
                    f"server {s.id} started with an empty data directory and makes no "
                    "replica until other servers answer it (only they can tell a new "
                    "server from one whose data directory was wiped): start the others; "
                    "if they run, a majority of them was wiped too, and what is left may "
                    'lag (docs/ARCHITECTURE.md, "A tablet that lost a majority")'
                )
        servers.append(health)
        if note := health.cert_note():
            issues.append(f"server {s.id}: {note}")
        if state == "DOWN":
            why = "process not running" if alive is False else error
            if alive is not False and not health.cert_expired and closed_at_connect(error):
                # A review's wrong client certificate read as three servers down.
                why += (
                    " -- it closed the connection at the handshake, as a TLS server does to "
                    "a client certificate it does not accept (or to no TLS): check this "
                    "command's --tls-cert, --tls-key and --tls-ca"
                )
            issues.append(f"server {s.id} ({addr}) is down: {why}")
        elif state == "BUSY":
            issues.append(f"server {s.id} is overloaded: {error}")
        elif state == "DENIED":
            issues.append(
                f"server {s.id} refused this check's credentials ({error}): give a client "
                "certificate or token it accepts, of role reader or above"
            )

    reference = _majority_digests(servers, probes)
    issues += _compare_configs(servers, probes, reference)
    own_differs = _own_config_differs(config, reference)
    if own_differs:
        issues.append(
            f"this cluster.toml differs from what the servers run: its "
            f"{', '.join(SECTIONS[k] for k in own_differs)} differ (a stale or edited copy? "
            "check with the servers' own: `raftlet cluster status --servers HOST:PORT` "
            "reads it from them)"
        )
    stale_tables = "tables" in own_differs
    asked_again = _ask_leaders_again(config, statuses, opts)
    tablets = [
        _check_tablet(p, statuses, probes, opts, stale_tables, p.tablet_id in asked_again)
        for p in config.placements()
    ]
    for t in tablets:
        issues += [f"{t.tablet_id}: {i}" for i in t.issues]
    severity = max([Severity.OK, *(s.severity for s in servers), *(t.severity for t in tablets)])
    if own_differs or waiting:
        severity = max(severity, Severity.WARN)
    return ClusterHealth(config.name, servers, tablets, issues, severity)


# The parts of the checker's own config compared with the servers': not the Raft timings,
# which a server's flags may override (its digest is of the timings it runs with).
_OWN_SECTIONS = ("name", "servers", "tables")

_Digests = tuple[list[str], dict[str, str]]  # (servers reporting them, section -> digest)


def _majority_digests(
    servers: Sequence[ServerHealth],
    probes: Mapping[str, tuple[tablet_pb2.ListTabletsResponse | None, str, str]],
) -> _Digests | None:
    """The config digests most servers report (ties: the group of the server listed first),
    with those servers; None when none reported any."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for s in servers:
        resp = probes[s.id][0]
        if resp is not None and resp.config_digests:
            groups.setdefault(tuple(sorted(resp.config_digests.items())), []).append(s.id)
    if not groups:
        return None
    key = max(groups, key=lambda k: len(groups[k]))  # the first of the largest: dicts keep order
    return groups[key], dict(key)


def _own_config_differs(config: ClusterLayout, reference: _Digests | None) -> tuple[str, ...]:
    """The sections (of ``_OWN_SECTIONS``) in which the checker's own ``ClusterConfig``
    differs from what most servers run; () when it agrees or cannot be compared."""
    if reference is None or not isinstance(config, ClusterConfig) or config.path is None:
        return ()  # no file of its own: a config read from the servers is theirs
    mine = config_digests(config)
    theirs = reference[1]
    return tuple(k for k in _OWN_SECTIONS if k in theirs and mine[k] != theirs[k])


def _compare_configs(
    servers: Sequence[ServerHealth],
    probes: Mapping[str, tuple[tablet_pb2.ListTabletsResponse | None, str, str]],
    majority: _Digests | None,
) -> list[str]:
    """Mark each server whose config digests differ from those most servers report
    (``majority``), and say so."""
    if majority is None:
        return []
    common, reference = majority
    digests = {
        s.id: dict(resp.config_digests)
        for s in servers
        if (resp := probes[s.id][0]) is not None and resp.config_digests
    }
    issues = []
    for s in servers:
        mine = digests.get(s.id)
        if mine is None or s.id in common:
            continue
        s.config_differs = tuple(
            sorted(k for k in mine.keys() | reference.keys() if mine.get(k) != reference.get(k))
        )
        parts = ", ".join(SECTIONS.get(k, k) for k in s.config_differs)
        flags = (
            " and the same --tick_interval_ms, --election_ticks and --heartbeat_ticks, if given"
            if "raft" in s.config_differs
            else ""
        )
        issues.append(
            f"server {s.id} runs another cluster config than {', '.join(common)}: its {parts} "
            f"differ (start every server on the same cluster.toml{flags})"
        )
    return issues


def _ready_leader(
    everywhere: Mapping[str, tablet_pb2.TabletStatusPB],
) -> tuple[str, tablet_pb2.TabletStatusPB] | None:
    """A ready leader that says so itself; of two (a stale one behind a healed partition),
    the one of the higher term."""
    leaders = [
        (sid, st)
        for sid, st in everywhere.items()
        if st.role == RaftRole.LEADER and st.leader_uuid == sid and st.leader_ready
    ]
    return max(leaders, key=lambda pair: pair[1].term, default=None)


def _ask_leaders_again(
    config: ClusterLayout,
    statuses: dict[str, dict[str, tablet_pb2.TabletStatusPB]],
    opts: ProbeOptions,
) -> frozenset[str]:
    """The tablets whose leader was asked again, after every other replica had answered,
    because one of them applied past what the leader said it committed; its answer replaces
    the first when it still leads in the same term.

    The servers answer one round at different moments, so a follower's applied index may
    pass the commit index its leader gave a moment before: such a tablet was taken for
    healthy up to ``max_lag`` entries past it -- a replica that held ~95 acknowledged
    entries its group had lost read OK. A leader that still leads in the same term has
    committed, by its second answer, everything its followers applied before: past that,
    a replica holds entries the group does not."""
    suspects: dict[str, set[str]] = {}
    by_tablet: dict[str, dict[str, tablet_pb2.TabletStatusPB]] = {}
    for sid, by_id in statuses.items():
        for tid, st in by_id.items():
            by_tablet.setdefault(tid, {})[sid] = st
    for tid, everywhere in by_tablet.items():
        found = _ready_leader(everywhere)
        if found is None:
            continue
        leader_sid, leader = found
        if any(st.applied_index > leader.commit_index for st in everywhere.values()):
            suspects.setdefault(leader_sid, set()).add(tid)
    if not suspects:
        return frozenset()
    again = probe_servers(
        config, opts.timeout_s, opts.credentials, token_ports=opts.token_ports, only=suspects
    )
    asked: set[str] = set()
    for sid, tids in suspects.items():
        resp = again.get(sid, (None, "", ""))[0]
        if not isinstance(resp, tablet_pb2.ListTabletsResponse):
            continue
        fresh = {t.tablet_id: t for t in resp.tablets}
        for tid in tids:
            first, now = statuses[sid][tid], fresh.get(tid)
            if (
                now is not None
                and now.role == RaftRole.LEADER
                and now.leader_uuid == sid
                and now.leader_ready
                and now.term == first.term
            ):
                statuses[sid][tid] = now
                asked.add(tid)
    return frozenset(asked)


def _copying(listed: object, tablet_id: str) -> bool:
    """Whether a server's ListTablets answer says it is copying ``tablet_id`` now."""
    return isinstance(listed, tablet_pb2.ListTabletsResponse) and (
        tablet_id in listed.copying_tablets
    )


def _check_tablet(
    placement: PlacementEntry,
    statuses: Mapping[str, Mapping[str, tablet_pb2.TabletStatusPB]],
    probes: Mapping[str, tuple[object, str, str]],
    opts: ProbeOptions,
    stale_tables: bool = False,
    leader_asked_again: bool = False,
) -> TabletHealth:
    """``stale_tables``: the checker's config has other tables than the servers run.
    ``leader_asked_again``: the leader's answer came after every other replica's
    (``_ask_leaders_again``), so a replica applied past its commit holds entries the group
    does not; otherwise up to ``max_lag`` past it is taken for the round's own skew."""
    tid = placement.tablet_id
    everywhere = {sid: by_id[tid] for sid, by_id in statuses.items() if tid in by_id}
    if not everywhere and stale_tables:
        # A tablet of the checker's copy only: no replica to remove or add, no leader to
        # wait for -- the copy is what is wrong (said once, for the whole cluster).
        table_runs = any(
            st.table_name == placement.table for by_id in statuses.values() for st in by_id.values()
        )
        why = (
            f"table {placement.table}'s partitions or schema in this cluster.toml are not the "
            "ones the servers run"
            if table_runs
            else f"table {placement.table} is in this cluster.toml, not in the tables the "
            "servers run"
        )
        return TabletHealth(
            tid,
            placement.table,
            placement.partition,
            [
                ReplicaHealth(sid, "DOWN" if probes[sid][1] == "DOWN" else "MISSING")
                for sid in placement.replicas
                if sid in probes
            ],
            issues=[f"no server knows this tablet: {why}"],
            severity=Severity.WARN,
        )
    found = _ready_leader(everywhere)
    leader = found[1] if found is not None else None
    skew = 0 if leader_asked_again else opts.max_lag
    if leader is not None and leader.voters:
        voters, learner_ids = tuple(leader.voters), tuple(leader.learners)
    else:
        # No leader to ask: the membership its replicas report (moves have taken many a
        # group off its placement: judged by the placement, a group of four that lost its
        # majority read "under-replicated", and a server moved off was "missing" it).
        voters, learner_ids = _reported_membership(everywhere) or (tuple(placement.replicas), ())
    replicas = [sid for sid in voters if sid in probes]
    learners = [sid for sid in learner_ids if sid in probes]
    seen = {sid: st for sid, st in everywhere.items() if sid in replicas or sid in learners}
    tablet = TabletHealth(tid, placement.table, placement.partition, [])
    if leader is not None:
        tablet.leader = leader.leader_uuid
        tablet.term = leader.term
        tablet.leader_commit = leader.commit_index
    else:
        tablet.term = max((st.term for st in seen.values()), default=0)
    # Replicas (in the leader's group or not) that applied past anything the leader has
    # committed: another group claims the tablet, holding writes this one lacks (new servers
    # once formed one among their empty replicas). Then no replica is to be removed: the
    # advice below would have deleted the replicas that held the acknowledged rows.
    ahead = (
        {
            sid: st.applied_index
            for sid, st in everywhere.items()
            if st.applied_index > leader.commit_index + skew
        }
        if leader is not None
        else {}
    )
    reachable = 0
    for sid in [*replicas, *learners]:
        voter = sid in replicas
        state = probes[sid][1]
        st = seen.get(sid)
        if st is None:
            if state == "DOWN":
                tablet.replicas.append(ReplicaHealth(sid, "DOWN"))
                if not voter:
                    tablet.issues.append(
                        f"learner on {sid} is down (an add not finished: once it is back, "
                        f"`raftlet tablet add-replica {tid} {sid} --wait` finishes it; "
                        f"`raftlet tablet remove-replica {tid} {sid}` undoes it)"
                    )
            elif state in ("BUSY", "DENIED"):
                reachable += voter  # alive, just not listable (right now, or to us)
                tablet.replicas.append(ReplicaHealth(sid, "UNKNOWN"))
            elif _copying(probes[sid][0], tid):
                # Not working yet, and no advice: remove and add again would start over.
                tablet.replicas.append(ReplicaHealth(sid, "COPYING"))
                tablet.issues.append(
                    f"replica on {sid} is being made by a tablet copy from the leader"
                )
            else:
                tablet.replicas.append(ReplicaHealth(sid, "MISSING"))
                if leader is not None and not ahead:
                    tablet.issues.append(
                        f"server {sid} is up but does not host its replica (`raftlet tablet "
                        f"remove-replica {tid} {sid} --wait` then `add-replica {tid} {sid} "
                        "--wait` makes it again)"
                    )
                elif everywhere:
                    # No advice: both commands go through the group's leader, and it has
                    # none (or another group holds more than it).
                    tablet.issues.append(f"server {sid} is up but does not host its replica")
            continue
        if st.state == tablet_pb2.TABLET_STATE_FAILED:
            # Its server answers; the replica serves nothing and votes in no election.
            tablet.replicas.append(ReplicaHealth(sid, "FAILED"))
            under_way = "; a tablet copy is under way" if _copying(probes[sid][0], tid) else ""
            tablet.issues.append(f"replica on {sid} is FAILED: {st.failure_reason}{under_way}")
            continue
        role = RaftRole.Name(st.role) if voter else "LEARNER"
        r = ReplicaHealth(
            sid, "OK", role, st.term, st.applied_index, st.commit_index, st.applying_index
        )
        if st.HasField("disk_bytes"):
            r.disk_bytes = st.disk_bytes
        if not voter:
            # A replica being added (add-replica, move-replica) that was never promoted:
            # rerunning the command with --wait finishes it.
            tablet.issues.append(
                f"{sid} is a learner (added, not yet promoted to a voter; if it lasts, "
                f"`raftlet tablet add-replica {tid} {sid} --wait` finishes the add)"
            )
        reachable += voter
        if leader is not None:
            r.lag = max(0, leader.commit_index - max(st.applied_index, st.applying_index))
            if st.applied_index > leader.commit_index + skew:
                # Past anything the leader committed (beyond what commits between the two
                # servers' answers): entries this replica applied that the group does not
                # have -- it diverged.
                r.state = "AHEAD"
                tablet.issues.append(
                    f"replica on {sid} applied {st.applied_index}, past the leader's commit "
                    f"{leader.commit_index}: it holds entries the group does not (diverged)"
                )
            elif r.lag > opts.max_lag:
                r.state = "LAGGING"
                applying = (
                    f", applying to {st.applying_index}"
                    if st.applying_index > st.applied_index
                    else ""
                )
                tablet.issues.append(
                    f"replica on {sid} lags the leader by {r.lag} entries (applied "
                    f"{st.applied_index}{applying}, leader committed {leader.commit_index})"
                )
        tablet.replicas.append(r)
    if leader is not None:
        # Replicas that run outside the group: removed while their server was down, they
        # never heard of it (they campaign, and nobody answers).
        for sid in sorted(everywhere):
            if sid not in replicas and sid not in learners and not ahead:
                st = everywhere[sid]
                if st.state == tablet_pb2.TABLET_STATE_FAILED:
                    # A deletion that failed part way leaves one FAILED, its reason saying
                    # why (its server may never have been down).
                    remedy = (
                        ""
                        if "remove-replica" in st.failure_reason
                        else f"; `raftlet tablet remove-replica {tid} {sid}` deletes it"
                    )
                    tablet.issues.append(
                        f"{sid} holds a replica that is no member of the group, FAILED: "
                        f"{st.failure_reason}{remedy}"
                    )
                    continue
                tablet.issues.append(
                    f"{sid} runs a replica that is no member of the group (removed while it "
                    "was down, or a removal stopped before its deletion?): `raftlet tablet "
                    f"remove-replica {tid} {sid}` deletes it"
                )
            elif sid not in replicas and sid not in learners:
                tablet.issues.append(f"{sid} runs a replica that is no member of the group")
        factor = len(placement.replicas)
        if len(replicas) < factor:
            tablet.issues.append(
                f"under-replicated: {len(replicas)} voters, the table asks for {factor}"
            )
        elif len(replicas) > factor:
            # For a moment in every move (promoted, not yet removed); if it lasts, two
            # moves raced, or one stopped halfway.
            tablet.issues.append(
                f"over-replicated: {len(replicas)} voters, the table asks for {factor} "
                f"(if it lasts, `raftlet tablet remove-replica {tid} SERVER` drops one)"
            )
    if not everywhere and any(r.state == "MISSING" for r in tablet.replicas):
        # Not one replica anywhere: remove-replica and add-replica answer "unknown tablet".
        up = ", ".join(r.server for r in tablet.replicas if r.state == "MISSING")
        tablet.issues.append(f"no server knows this tablet ({up} answered, hosting none)")
    majority = len(replicas) // 2 + 1
    severity = Severity.OK
    if ahead:
        holders = ", ".join(f"{sid} (applied {i})" for sid, i in sorted(ahead.items()))
        tablet.issues.insert(
            0,
            f"two groups claim this tablet: leader {tablet.leader} (term {tablet.term}) "
            f"committed {tablet.leader_commit}, but {holders} hold more -- writes another "
            "group acknowledged are not in this one; remove no replica of it until the "
            "group holding them leads again",
        )
        severity = Severity.ERROR
    # Not reachable, or FAILED though its server answers: "reachable" said of both had an
    # operator look for a network fault where a disk was full.
    out = ", ".join(
        f"{r.server} {r.state}"
        for r in tablet.replicas
        if r.server in replicas and (r.state == "FAILED" or not r.present)
    )
    out = f" ({out})" if out else ""
    if reachable < majority:
        tablet.issues.insert(
            0,
            f"unavailable: {reachable} of {len(replicas)} replicas working{out}, "
            f"a majority is {majority}",
        )
        severity = Severity.ERROR
    elif reachable < len(replicas):
        # More voters than the factor (a move halfway) with one down still meets the
        # factor: "under-replicated" beside "over-replicated" read as a contradiction.
        factor = len(placement.replicas)
        said = "under-replicated" if reachable < factor else "a voter down"
        tablet.issues.insert(0, f"{said}: {reachable} of {len(replicas)} replicas working{out}")
    failed = [r.server for r in tablet.replicas if r.state == "FAILED" and r.server in replicas]
    full = [sid for sid in failed if sid in seen and _out_of_space(seen[sid].failure_reason)]
    if leader is None and failed and len(failed) >= majority and full == failed:
        # Disks that filled together (the usual case: the same data on each) lose no data:
        # the advice below read as a loss, and named no action that helps (review r34a).
        tablet.issues.insert(
            0,
            f"no leader: {len(failed)} of {len(replicas)} voters are FAILED for want of disk "
            f"space ({', '.join(failed)}). Free space on their servers: each opens such a "
            "replica again by itself once its data directory has room for two log segments "
            "(or restart it), and the tablet elects a leader; nothing acknowledged is lost",
        )
        severity = Severity.ERROR
    elif leader is None and failed and len(failed) >= majority:
        # Only a leader repairs a FAILED replica (by a copy), and FAILED ones elect none.
        tablet.lost_majority = True
        tablet.issues.insert(
            0,
            f"lost a majority of its replicas: {len(failed)} of {len(replicas)} voters are "
            f"FAILED ({', '.join(failed)}), so it has no leader and cannot elect one; no "
            "membership command (add-replica, remove-replica, move-replica, replace-server) "
            "can work without a leader. Restore the FAILED replicas' files (each one's reason "
            "says what failed) and restart their servers; lost for good, `raftlet "
            "tablet export` reads a surviving replica's rows from its stopped server: see "
            'docs/ARCHITECTURE.md, "A tablet that lost a majority"',
        )
    if leader is None:
        pending = [
            sid for sid, st in seen.items() if st.role == RaftRole.LEADER and st.leader_uuid == sid
        ]
        busy = _busy_leader(seen, probes)
        if pending:
            tablet.issues.insert(
                0,
                f"leader {pending[0]} is elected but not ready yet (its term's first entry "
                "is not committed; writes wait for it -- if this lasts, it cannot reach a "
                "majority)",
            )
            severity = max(severity, Severity.WARN)
        elif busy is not None:
            # Its server is alive but too busy to list its replicas; the followers that
            # answered name it. Writes queue or are refused as busy, and retried.
            tablet.leader, tablet.term = busy
            tablet.issues.insert(
                0, f"leader {busy[0]} (term {busy[1]}, as its followers say) is busy: not listed"
            )
            severity = max(severity, Severity.WARN)
        else:
            tablet.issues.insert(0, "no leader")
            severity = Severity.ERROR
    if any(r.state != "OK" for r in tablet.replicas):
        severity = max(severity, Severity.WARN)
    tablet.severity = max(severity, Severity.WARN if tablet.issues else Severity.OK)
    return tablet


def _reported_membership(
    everywhere: Mapping[str, tablet_pb2.TabletStatusPB],
) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(voters, learners) most of a tablet's replicas report (ties: the one a replica of
    the highest term reports); None if none reports one."""
    seen: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[int, int]] = {}
    for st in everywhere.values():
        if st.voters and st.state != tablet_pb2.TABLET_STATE_FAILED:
            key = (tuple(st.voters), tuple(st.learners))
            count, term = seen.get(key, (0, 0))
            seen[key] = (count + 1, max(term, st.term))
    return max(seen, key=lambda k: seen[k]) if seen else None


def _busy_leader(
    seen: Mapping[str, tablet_pb2.TabletStatusPB], probes: Mapping[str, tuple[object, str, str]]
) -> tuple[str, int] | None:
    """(leader, term) that the latest term's listed followers agree on, when that leader's
    server answered busy; None otherwise."""
    term = max((st.term for st in seen.values()), default=0)
    named = {st.leader_uuid for st in seen.values() if st.term == term and st.leader_uuid}
    if len(named) != 1:
        return None
    (uuid,) = named
    return (uuid, term) if uuid in probes and probes[uuid][1] == "BUSY" else None


# How a FAILED replica's reason says its disk was full (``consensus.describe_error``).
_NO_SPACE = ("ENOSPC", "EDQUOT", "SQLITE_FULL", "No space left", "disk is full")


def _out_of_space(reason: str) -> bool:
    return any(word in reason for word in _NO_SPACE)
