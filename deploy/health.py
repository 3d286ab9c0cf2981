"""A ksck-style health check of a raftlet cluster (``raftlet cluster status``).

Every server in the config is asked ``ListTablets`` in parallel, each with a short deadline,
so one hung server costs the check one timeout, not one per server. From the answers:

- **servers**: UP (answered), BUSY (answered RESOURCE_EXHAUSTED: its tablet service queue is
  full, so it is alive but its replicas could not be listed), DOWN (no answer; with the
  local launcher's state, whether the process still exists tells "crashed" from "hung").
- **tablets**: the leader is the replica that reports itself LEADER with ``leader_ready``
  (the highest term wins if two do, as after a partition heals). For every replica: its
  role, term and ``applied_index``; its *lag* is the leader's ``commit_index`` minus that.
- **verdict** per tablet and overall, like Kudu's ksck:
  ERROR: no ready leader, or fewer than a majority of replicas reachable (writes fail).
  WARN: a server down or busy, a replica missing or lagging more than ``max_lag`` entries,
  a leader elected but not ready yet (writes wait, then succeed).
  OK otherwise.

The lag is measured across servers asked at slightly different moments, so under a write
load a few entries of lag are normal; ``max_lag`` is the tolerance before it is reported.
"""

from __future__ import annotations

import concurrent.futures
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from raftlet.cluster import ClusterConfig
from raftlet.proto import tablet_pb2, tablet_pb2_grpc
from raftlet.proto.consensus_pb2 import RaftRole

__all__ = [
    "ClusterHealth",
    "ProbeOptions",
    "ReplicaHealth",
    "ServerHealth",
    "Severity",
    "TabletHealth",
    "check_cluster",
    "probe_servers",
]

# Loopback and private addresses must never go through a proxy from the environment, and a
# status check should not sit in gRPC's reconnect backoff.
CHANNEL_OPTIONS = [
    ("grpc.enable_http_proxy", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]


class Severity(enum.IntEnum):
    OK = 0
    WARN = 1
    ERROR = 2


@dataclass(frozen=True, slots=True)
class ProbeOptions:
    timeout_s: float = 3.0
    # Entries a replica's applied index may trail the leader's commit index before it is
    # reported as lagging (see the module docstring).
    max_lag: int = 100


@dataclass(slots=True)
class ServerHealth:
    id: str
    rpc_addr: str
    http_addr: str
    state: str  # "UP", "BUSY", "DOWN"
    error: str = ""
    process_alive: bool | None = None  # None: not a local cluster, unknown
    tablets: int = 0  # replicas it reported

    @property
    def severity(self) -> Severity:
        return Severity.OK if self.state == "UP" else Severity.WARN


@dataclass(slots=True)
class ReplicaHealth:
    server: str
    state: str  # "OK", "LAGGING", "DOWN", "UNKNOWN" (server busy), "MISSING"
    role: str = ""
    term: int = 0
    applied_index: int = 0
    commit_index: int = 0
    lag: int | None = None


@dataclass(slots=True)
class TabletHealth:
    tablet_id: str
    table: str
    partition: int
    replicas: list[ReplicaHealth]
    leader: str | None = None
    term: int = 0
    leader_commit: int = 0
    issues: list[str] = field(default_factory=list)
    severity: Severity = Severity.OK


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
                            "lag": r.lag,
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


def _probe(addr: str, timeout_s: float) -> _Probe:
    channel = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
    try:
        stub = tablet_pb2_grpc.TabletServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            resp = stub.ListTablets(tablet_pb2.ListTabletsRequest(), timeout=timeout_s)
        except grpc.RpcError as e:
            code = e.code()
            details = " ".join(str(e.details() or "").split())
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return _Probe(None, "BUSY", f"service queue full: {details}")
            return _Probe(None, "DOWN", f"{code.name}: {details}" if details else code.name)
        return _Probe(resp, "UP")
    finally:
        channel.close()


def probe_servers(
    config: ClusterConfig, timeout_s: float = 3.0
) -> dict[str, tuple[tablet_pb2.ListTabletsResponse | None, str, str]]:
    """Server id -> (ListTablets answer or None, state, error), asked of all in parallel."""
    ids = [s.id for s in config.servers]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(ids))) as pool:
        futures = {sid: pool.submit(_probe, config.server(sid).rpc_addr, timeout_s) for sid in ids}
        out = {}
        for sid, fut in futures.items():
            p = fut.result()
            out[sid] = (p.response, p.state, p.error)
    return out


def check_cluster(
    config: ClusterConfig,
    options: ProbeOptions | None = None,
    *,
    processes: Mapping[str, bool] | None = None,
) -> ClusterHealth:
    """Probe every server of ``config`` and judge the cluster (see the module docstring).

    ``processes`` (server id -> process alive), from the local launcher, refines DOWN.
    """
    opts = options or ProbeOptions()
    probes = probe_servers(config, opts.timeout_s)
    issues: list[str] = []
    servers: list[ServerHealth] = []
    statuses: dict[str, dict[str, tablet_pb2.TabletStatusPB]] = {}
    for s in config.servers:
        resp, state, error = probes[s.id]
        alive = None if processes is None else processes.get(s.id)
        health = ServerHealth(s.id, s.rpc_addr, s.http_addr, state, error, alive)
        if resp is not None:
            statuses[s.id] = {t.tablet_id: t for t in resp.tablets}
            health.tablets = len(resp.tablets)
        servers.append(health)
        if state == "DOWN":
            why = "process not running" if alive is False else error
            issues.append(f"server {s.id} ({s.rpc_addr}) is down: {why}")
        elif state == "BUSY":
            issues.append(f"server {s.id} is overloaded: {error}")

    tablets = [_check_tablet(p, statuses, probes, opts) for p in config.placements()]
    for t in tablets:
        issues += [f"{t.tablet_id}: {i}" for i in t.issues]
    severity = max([Severity.OK, *(s.severity for s in servers), *(t.severity for t in tablets)])
    return ClusterHealth(config.name, servers, tablets, issues, severity)


def _check_tablet(
    placement: Any,
    statuses: Mapping[str, Mapping[str, tablet_pb2.TabletStatusPB]],
    probes: Mapping[str, tuple[object, str, str]],
    opts: ProbeOptions,
) -> TabletHealth:
    tid = placement.tablet_id
    seen = {sid: statuses[sid][tid] for sid in placement.replicas if tid in statuses.get(sid, {})}
    # A ready leader that says so itself; of two (a stale one behind a healed partition),
    # the higher term is the real one.
    leaders = [
        st
        for sid, st in seen.items()
        if st.role == RaftRole.LEADER and st.leader_uuid == sid and st.leader_ready
    ]
    leader = max(leaders, key=lambda st: st.term, default=None)
    tablet = TabletHealth(tid, placement.table, placement.partition, [])
    if leader is not None:
        tablet.leader = leader.leader_uuid
        tablet.term = leader.term
        tablet.leader_commit = leader.commit_index
    else:
        tablet.term = max((st.term for st in seen.values()), default=0)
    reachable = 0
    for sid in placement.replicas:
        state = probes[sid][1]
        st = seen.get(sid)
        if st is None:
            if state == "DOWN":
                tablet.replicas.append(ReplicaHealth(sid, "DOWN"))
            elif state == "BUSY":
                reachable += 1  # alive, just not listable right now
                tablet.replicas.append(ReplicaHealth(sid, "UNKNOWN"))
            else:
                tablet.replicas.append(ReplicaHealth(sid, "MISSING"))
                tablet.issues.append(f"server {sid} is up but does not host its replica")
            continue
        reachable += 1
        r = ReplicaHealth(
            sid,
            "OK",
            RaftRole.Name(st.role),
            st.term,
            st.applied_index,
            st.commit_index,
        )
        if leader is not None:
            r.lag = max(0, leader.commit_index - st.applied_index)
            if r.lag > opts.max_lag:
                r.state = "LAGGING"
                tablet.issues.append(
                    f"replica on {sid} lags the leader by {r.lag} entries "
                    f"(applied {st.applied_index}, leader committed {leader.commit_index})"
                )
        tablet.replicas.append(r)
    majority = len(placement.replicas) // 2 + 1
    severity = Severity.OK
    if reachable < majority:
        tablet.issues.insert(
            0,
            f"unavailable: {reachable} of {len(placement.replicas)} replicas reachable, "
            f"a majority is {majority}",
        )
        severity = Severity.ERROR
    elif reachable < len(placement.replicas):
        tablet.issues.insert(
            0, f"under-replicated: {reachable} of {len(placement.replicas)} replicas reachable"
        )
    if leader is None:
        pending = [
            sid for sid, st in seen.items() if st.role == RaftRole.LEADER and st.leader_uuid == sid
        ]
        if pending:
            tablet.issues.insert(0, f"leader {pending[0]} is elected but not ready yet")
            severity = max(severity, Severity.WARN)
        else:
            tablet.issues.insert(0, "no leader")
            severity = Severity.ERROR
    if any(r.state != "OK" for r in tablet.replicas):
        severity = max(severity, Severity.WARN)
    tablet.severity = max(severity, Severity.WARN if tablet.issues else Severity.OK)
    return tablet
