"""The ``raftlet tserver`` flags and the settings they resolve to.

``FLAGS`` is the one table of flag definitions (``flag_spec.FlagSpec``: name, help group,
text converter, range check, whether it may change at runtime) behind the command line
(``cli.tserver_args``), the settings' validation and the runtime registry
(``flag_registry``). Names are Kudu's (``--rpc_num_service_threads``).

``ServerSettings.from_args(args, config)`` resolves parsed flags against the cluster config:
the server's addresses, data dir and Raft timings come from ``config`` unless a flag
overrides them. ``ServerSettings`` is frozen and validates itself, so a test may build one
directly.

Defaults live in one place, the ``ServerSettings`` field defaults; the help texts and the
registry read them from there (the WAL ones from ``LogOptions``).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftlet.cluster import (
    ClusterConfig,
    ClusterConfigError,
    RaftTimings,
    ServerConfig,
    TabletPlacement,
    is_loopback_addr,
    parse_host_port,
)
from raftlet.cluster.validate import (
    MAX_ELECTION_SPAN_MS,
    MAX_ELECTION_TICKS,
    MAX_TICK_INTERVAL_MS,
    MIN_TICK_INTERVAL_MS,
)
from raftlet.consensus.log.options import MAX_INJECT_LATENCY_MS, LogOptions
from raftlet.consensus.raft_consensus import ConsensusOptions, LeaderReadMode, TermCheckMode
from raftlet.consensus.rpc.receive_limits import FRAME_DEADLINE_S
from raftlet.consensus.workers import STALL_S
from raftlet.tserver.cpu_affinity import check_cpu_affinity
from raftlet.tserver.flag_spec import (
    FlagError,
    FlagSpec,
    at_least,
    bool_value,
    float_value,
    int_in_range,
    int_value,
    is_bool,
    off_or_in_range,
)
from raftlet.tserver.message_limits import MAX_CLIENT_MESSAGE_BYTES, PEER_FRAMING_BYTES

__all__ = ["FLAGS", "GROUP_HELP", "ServerSettings"]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
# Clients a replica's result tracker may remember at most: a million, some 400 MiB.
_MAX_TRACKED_CLIENTS = 1_000_000
_LOG_DEFAULTS = LogOptions()
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# gRPC message limits are C ints.
_MAX_GRPC_MESSAGE = 2**31 - 1
# A typo like 10000 threads would exhaust the process before it served anything.
_MAX_THREADS = 1024
# Runtime flags are reachable by anyone who can call AdminService.SetFlag, so each has an
# upper bound (docs/ARCHITECTURE.md, "Runtime flags"). A wait of an hour on a lock is worth
# a trace whatever the threshold, so a larger one would mean nothing but "never".
_MAX_TRACE_THRESHOLD_MS = 3_600_000.0
# Each new segment reserves this much disk up front (a typo of 1 TiB filled the machine's
# disk) and the log reads a whole segment into memory when it opens. 1 GiB is 128x the
# default, far past where bigger segments save anything. (A reservation the disk cannot
# hold is given back whole: consensus/log/prealloc.py.)
MAX_LOG_SEGMENT_BYTES = GiB
# More than the machines a server runs on have: the limit is there to refuse before the
# process is killed for memory, not to be tuned past it.
_MAX_WRITE_MEMORY_BYTES = 1024 * GiB


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Everything a tablet server process is configured with, resolved and validated.

    ``rpc_addr`` and ``http_addr`` are the addresses to *listen* on; peers and clients dial
    the ones in ``config`` (they differ only when a flag overrides them, e.g. to bind
    0.0.0.0 in a container). ``peer_addresses`` is the other way round: where *this* server
    dials some of its peers, instead of their ``rpc_addr`` in ``config`` (a proxy or NAT
    between servers); stored read-only, so the frozen settings cannot change under a
    running server.
    """

    server_id: str
    config: ClusterConfig
    data_dir: Path
    rpc_addr: str
    http_addr: str
    raft: RaftTimings = field(default_factory=RaftTimings)
    rpc_service_queue_length: int = 50
    rpc_num_service_threads: int = 10
    consensus_service_queue_length: int = 100
    consensus_num_service_threads: int = 4
    admin_service_queue_length: int = 20
    admin_num_service_threads: int = 2
    replica_worker_min_threads: int = 2
    replica_worker_max_threads: int = 32
    replica_worker_running_threads: int = 2
    log_appender_threads: int = 8
    term_check_mode: TermCheckMode = TermCheckMode.LOCKFREE
    leader_read_mode: LeaderReadMode = LeaderReadMode.READ_INDEX
    lease_clock_drift: float = 0.1
    consensus_transport: str = "tcp"
    consensus_tcp_port: int = 0
    write_tcp_port: int = 0
    tcp_frame_deadline_s: float = FRAME_DEADLINE_S
    log_inject_latency_ms: float = _LOG_DEFAULTS.inject_latency_ms
    log_inject_latency_jitter_ms: float = _LOG_DEFAULTS.inject_latency_jitter_ms
    log_stall_timeout_ms: float = 5000.0
    group_commit_queue_size_bytes: int = _LOG_DEFAULTS.group_commit_queue_size_bytes
    log_segment_size_bytes: int = _LOG_DEFAULTS.segment_size_bytes
    log_gc_interval_s: float = 10.0
    follower_apply_delay_ms: float = 500.0
    write_rounds_in_flight: int = 1
    write_round_linger_ms: float = 5.0
    store_verify_interval_s: float = 3600.0
    log_max_segments_retained: int = 64
    tablet_copy_chunk_bytes: int = MiB
    tablet_copy_session_timeout_s: float = 60.0
    tablet_copy_repair_interval_s: float = 10.0
    empty_dir_wait_s: float = 30.0
    leader_handover_wait_s: float = 3.0
    lock_contention_trace_threshold_ms: float = 100.0
    max_message_bytes: int = 16 * MiB
    max_batch_rows: int = 10_000
    scan_page_bytes: int = MiB
    result_tracker_max_clients: int = 4096
    result_tracker_max_bytes: int = 8 * MiB
    write_memory_limit_bytes: int = GiB
    log_level: str = "INFO"
    cpu_affinity: str = ""
    sched_batch: bool = True
    worker_nice: int = 10
    rpc_handoff_yield: bool = True
    peer_addresses: Mapping[str, str] = field(default_factory=dict)
    unsafe_leader_reads_without_quorum: bool = False
    unsafe_leader_keeps_lost_quorum: bool = False
    unsafe_ack_before_commit: bool = False
    # Transport security (tserver.security): "" = not given.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    auth_tokens_file: str = ""
    umask: str = "077"  # octal, as written
    insecure: bool = False
    # The token port (TLS, no client certificate asked for); "" = none.
    token_rpc_addr: str = ""

    def __post_init__(self) -> None:
        try:
            self.config.server(self.server_id)
        except ClusterConfigError as e:
            raise FlagError(f"--server_id: {e.reason}") from None
        if isinstance(self.peer_addresses, Mapping):
            frozen = types.MappingProxyType(dict(self.peer_addresses))
            object.__setattr__(self, "peer_addresses", frozen)
        if not isinstance(self.data_dir, Path):
            raise FlagError(f"--data_dir: must be a Path, got {self.data_dir!r}")
        if not isinstance(self.raft, RaftTimings):
            raise FlagError(f"raft: must be RaftTimings, got {type(self.raft).__name__}")
        for spec in FLAGS:
            if spec.name in _SETTINGS_FIELDS:
                value = getattr(self, spec.name)
                try:
                    spec.check(value)
                except ValueError as e:
                    raise FlagError(f"--{spec.name}: {e}") from None
        if self.unsafe_leader_keeps_lost_quorum and self.leader_read_mode is LeaderReadMode.LEASE:
            raise FlagError(
                "--unsafe_leader_keeps_lost_quorum: not with --leader_read_mode=lease (a "
                "lease holds only while a leader steps down when it loses its quorum)"
            )
        try:
            self.consensus_options().validate()
        except ValueError as e:
            raise FlagError(f"--leader_read_mode: {e}") from None
        if self.replica_worker_max_threads < self.replica_worker_min_threads:
            raise FlagError(
                f"--replica_worker_max_threads ({self.replica_worker_max_threads}) is below "
                f"--replica_worker_min_threads ({self.replica_worker_min_threads})"
            )
        self._check_peer_ids()
        self._check_security()

    def _check_peer_ids(self) -> None:
        """Every ``--peer_addresses`` id must be another server of the config: a typo would
        otherwise leave that peer dialled at its config address, silently bypassing the
        proxy the operator meant to put in between."""
        for sid in self.peer_addresses:
            if sid == self.server_id:
                raise FlagError(
                    f"--peer_addresses: {sid!r} is this server itself (a server never dials "
                    "itself; name only its peers)"
                )
            try:
                self.config.server(sid)
            except ClusterConfigError as e:
                raise FlagError(f"--peer_addresses: {e.reason}") from None

    @property
    def tls(self) -> bool:
        """TLS on (and with it authentication of every RPC): all three files given."""
        return bool(self.tls_cert)

    def _check_security(self) -> None:
        """TLS takes all three files or none; tokens need TLS (they would cross the
        network in clear, and peers could not be told from clients); and plaintext only on
        loopback, unless --insecure says the operator means it."""
        given = [n for n in ("tls_cert", "tls_key", "tls_ca") if getattr(self, n)]
        if given and len(given) != 3:
            missing = sorted({"tls_cert", "tls_key", "tls_ca"} - set(given))
            raise FlagError(
                f"--{missing[0]}: TLS needs --tls_cert, --tls_key and --tls_ca together "
                "(raftlet certs create makes them)"
            )
        if self.auth_tokens_file and not self.tls:
            raise FlagError(
                "--auth_tokens_file: bearer tokens need TLS (--tls_cert, --tls_key, --tls_ca)"
            )
        if self.token_rpc_addr and not (self.tls and self.auth_tokens_file):
            raise FlagError(
                "--token_rpc_addr: a token port takes bearer tokens over TLS, so it needs "
                "--tls_cert, --tls_key, --tls_ca and --auth_tokens_file"
            )
        if self.tls or self.insecure:
            return
        risks = {
            "rpc_addr": "write, step leaders down or forge Raft messages",
            "http_addr": "read every metric and page, /stacks included",
        }
        for flag, addr in (("rpc_addr", self.rpc_addr), ("http_addr", self.http_addr)):
            if not is_loopback_addr(addr):
                raise FlagError(
                    f"--{flag}: {addr} is not a loopback address and TLS is off, so anyone "
                    f"who can reach it could {risks[flag]}; give --tls_cert, --tls_key and "
                    "--tls_ca (raftlet certs create), or --insecure to serve plaintext anyway"
                )

    @classmethod
    def from_args(cls, args: argparse.Namespace, config: ClusterConfig) -> ServerSettings:
        """Resolve parsed flags against ``config``; ``FlagError`` (one line) if they conflict.

        Attributes missing from ``args`` (or None) take their default, so a test can pass
        ``argparse.Namespace(server_id="ts1")``.
        """
        server_id = getattr(args, "server_id", None)
        if not server_id:
            raise FlagError("--server_id is required")
        try:
            server = config.server(server_id)
        except ClusterConfigError as e:
            raise FlagError(f"--server_id: {e.reason}") from None

        def given(name: str) -> Any:
            return getattr(args, name, None)

        data_dir = given("data_dir")
        raft_values = {
            name: given(name) if given(name) is not None else getattr(config.raft, name)
            for name in ("tick_interval_ms", "election_ticks", "heartbeat_ticks")
        }
        try:
            raft = RaftTimings(**raft_values)
        except ClusterConfigError as e:
            # The flag names, not the config's: this combination came (partly) from flags.
            reason = e.reason.replace("heartbeat_ticks (", "--heartbeat_ticks (")
            source = "--" if given(e.field) is not None else "[raft] "
            raise FlagError(f"{source}{e.field}: {reason}") from None
        tunables = {
            name: given(name)
            for name in _SETTINGS_FIELDS
            if name not in _RESOLVED_ELSEWHERE and given(name) is not None
        }
        return cls(
            server_id=server.id,
            config=config,
            # A flag's relative path is relative to the working directory, as on any command
            # line; made absolute now so a later chdir cannot move the data.
            data_dir=Path(data_dir).absolute() if data_dir is not None else server.data_dir,
            rpc_addr=given("rpc_addr") or server.rpc_addr,
            http_addr=given("http_addr") or server.http_addr,
            token_rpc_addr=given("token_rpc_addr") or server.token_rpc_addr,
            raft=raft,
            **tunables,
        )

    @property
    def server(self) -> ServerConfig:
        """This server's entry in the config (its advertised addresses)."""
        return self.config.server(self.server_id)

    def peer_addr(self, server_id: str) -> str:
        """The address this server dials to reach peer ``server_id``: its
        ``--peer_addresses`` entry if it has one, else its ``rpc_addr`` in the config."""
        override = self.peer_addresses.get(server_id)
        return override if override is not None else self.config.server(server_id).rpc_addr

    def placements(self) -> list[TabletPlacement]:
        """The tablets this server hosts a replica of."""
        return self.config.placements_for(self.server_id)

    def log_options(self) -> LogOptions:
        """The WAL options of every replica's log, as the flags set them at start."""
        return LogOptions(
            segment_size_bytes=self.log_segment_size_bytes,
            group_commit_queue_size_bytes=self.group_commit_queue_size_bytes,
            inject_latency_ms=self.log_inject_latency_ms,
            inject_latency_jitter_ms=self.log_inject_latency_jitter_ms,
        )

    def consensus_options(self) -> ConsensusOptions:
        """The Raft driver options of every replica (timings and the term-check mode)."""
        return ConsensusOptions(
            tick_interval_s=self.raft.tick_interval_s,
            election_ticks=self.raft.election_ticks,
            heartbeat_ticks=self.raft.heartbeat_ticks,
            term_check_mode=self.term_check_mode,
            leader_read_mode=self.leader_read_mode,
            lease_clock_drift=self.lease_clock_drift,
            log_stall_s=self.log_stall_timeout_ms / 1000.0,
            check_quorum=not self.unsafe_leader_keeps_lost_quorum,
        )

    def stall_margin_s(self) -> float | None:
        """How late the ticker's wake-up may be before it counts as a stall: with leases,
        the lease's slack (``lease_clock_drift`` of the span plus one tick), so a pause
        that even a clock could miss is either within the slack or ends the lease; else
        None, the ticker's default (one heartbeat interval)."""
        if self.leader_read_mode is not LeaderReadMode.LEASE:
            return None
        opts = self.consensus_options()
        span = (opts.election_ticks - opts.heartbeat_ticks) * opts.tick_interval_s
        return span * opts.lease_clock_drift + opts.tick_interval_s


# --- the flag table ----------------------------------------------------------------------


def _addr_check(value: Any) -> None:
    parse_host_port(value)


def _optional_addr_check(value: Any) -> None:
    if value:
        parse_host_port(value)


def _term_check_mode(text: str) -> TermCheckMode:
    try:
        return TermCheckMode(text.strip().lower())
    except ValueError:
        choices = ", ".join(m.value for m in TermCheckMode)
        raise ValueError(f"expected one of {choices}, got {text!r}") from None


def _leader_read_mode(text: str) -> LeaderReadMode:
    try:
        return LeaderReadMode(text.strip().lower())
    except ValueError:
        choices = ", ".join(m.value for m in LeaderReadMode)
        raise ValueError(f"expected one of {choices}, got {text!r}") from None


def _read_mode_check(value: Any) -> None:
    if not isinstance(value, LeaderReadMode):
        raise ValueError(f"expected a LeaderReadMode, got {value!r}")


def _drift_check(value: Any) -> None:
    if not 0 <= value < 0.5:
        raise ValueError(f"must be in [0, 0.5), got {value}")


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


def _log_level_check(value: Any) -> None:
    if value not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {value!r}")


def _peer_addresses(text: str) -> dict[str, str]:
    """``ID=HOST:PORT[,ID=HOST:PORT...]`` as ``{id: addr}``; empty text is no override.
    Duplicates are refused here, since the dict would keep only the last one."""
    out: dict[str, str] = {}
    if not text.strip():
        return out
    for item in (part.strip() for part in text.split(",")):
        sid, sep, addr = (half.strip() for half in item.partition("="))
        if not sep or not sid:
            raise ValueError(f"{item!r} is not ID=HOST:PORT (e.g. ts2=127.0.0.1:17052)")
        if sid in out:
            raise ValueError(f"server id {sid!r} is given twice")
        out[sid] = addr
    _peer_addresses_check(out)
    return out


def _peer_addresses_check(value: Any) -> None:
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping of server id to HOST:PORT, got {value!r}")
    for sid, addr in value.items():
        if not isinstance(sid, str) or not sid:
            raise ValueError(f"a server id must be a non-empty string, got {sid!r}")
        try:
            parse_host_port(addr)
        except ValueError as e:
            raise ValueError(f"{sid}: {e}") from None


CONSENSUS_TRANSPORTS = ("tcp", "stream", "unary")


def _consensus_transport(text: str) -> str:
    value = text.strip().lower()
    if value not in CONSENSUS_TRANSPORTS:
        raise ValueError(f"expected one of {', '.join(CONSENSUS_TRANSPORTS)}, got {text!r}")
    return value


def _transport_check(value: Any) -> None:
    if value not in CONSENSUS_TRANSPORTS:
        raise ValueError(f"expected one of {', '.join(CONSENSUS_TRANSPORTS)}, got {value!r}")


def _mode_check(value: Any) -> None:
    if not isinstance(value, TermCheckMode):
        raise ValueError(f"expected a TermCheckMode, got {value!r}")


def _default(name: str) -> Any:
    return next(f.default for f in dataclasses.fields(ServerSettings) if f.name == name)


def _check_octal(value: Any) -> None:
    if not isinstance(value, str) or re.fullmatch(r"0?[0-7]{1,3}", value) is None:
        raise ValueError(f"expected an octal mask such as 077, got {value!r}")


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n} bytes"


_CLUSTER = "cluster"
_RAFT = "Raft timings (default: the [raft] table of --config)"
_POOLS = "service pools"
_CONSENSUS = "consensus"
_WAL = "write-ahead log"
_LIMITS = "limits and diagnostics"
_UNSAFE = "unsafe switches (negative controls for tests)"
_SECURITY = "transport security and access control"

GROUP_HELP = {
    _CLUSTER: "Which cluster this server belongs to, and which of its servers it is.",
    _RAFT: "How wall time becomes Raft ticks. Every server of a cluster should use the same.",
    _POOLS: (
        "Each gRPC service has its own bounded queue feeding its own worker threads, so a "
        "storm of client calls can never starve replication. A call that finds its queue "
        "full is answered RESOURCE_EXHAUSTED at once (clients back off and retry)."
    ),
    _CONSENSUS: None,
    _WAL: "The per-replica Raft log and its group commit.",
    _LIMITS: None,
    _UNSAFE: (
        "Each one breaks a guarantee on purpose, so that a chaos run (raftlet chaos --unsafe) "
        "can show its checker catches the violation. Never set them where data matters."
    ),
    _SECURITY: (
        "With --tls_cert/--tls_key/--tls_ca every gRPC call needs a client certificate from "
        "the CA (mutual TLS) and is checked against its role; the status server serves "
        "HTTPS. Without them the server serves plaintext, to anyone, and only on loopback "
        "unless --insecure."
    ),
}

_D = _default

# fmt: off
FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec(
        "config", _CLUSTER, "PATH",
        "The cluster config (TOML): the servers, the tables and, derived from both, where "
        "every tablet lives. Give every server of a cluster the same file. Relative data_dir "
        "paths in it are relative to its directory.",
        convert=str, required=True, sensitive=True,
    ),
    FlagSpec(
        "server_id", _CLUSTER, "ID",
        "Which [[servers]] entry of --config this process is. Its addresses and data dir "
        "come from that entry unless overridden below.",
        convert=str, required=True,
    ),
    FlagSpec(
        "data_dir", _CLUSTER, "DIR",
        "Where this server keeps its tablet replicas (WAL, consensus metadata, SQLite "
        "store). Default: the server's data_dir in --config. Relative to the working "
        "directory. Must survive restarts: it is what a restarted server recovers from.",
        convert=str, sensitive=True,
    ),
    FlagSpec(
        "empty_dir_wait_s", _CLUSTER, "S",
        f"How long a server whose data directory is empty waits for the other servers to "
        f"answer before it starts serving (default {_D('empty_dir_wait_s'):g}; 0 to 3600). "
        f"Its peers tell a wiped server (a replaced disk) from a new one: a wiped one's "
        f"replicas open FAILED and are copied back, where made afresh they would be voters "
        f"that forgot their votes. The wait ends as soon as every peer or a majority of "
        f"them answered, or one says the server ran before; if none answered, the server "
        f"serves with no replica of its own and decides once one does. So the servers of a "
        f"new cluster, which answer nobody until then, each wait it out on their first "
        f"start ('raftlet cluster up' passes 0 when it makes a new cluster: it takes the "
        f"server for new at once).",
        convert=float_value, check=at_least(0, 3600),
    ),
    FlagSpec(
        "leader_handover_wait_s", _CLUSTER, "S",
        f"On SIGTERM, how long a server waits for the tablets it leads to be taken over by "
        f"followers it asked (TIMEOUT_NOW to the most caught-up voter that answered the last "
        f"heartbeats) before it stops anyway (default {_D('leader_handover_wait_s'):g}; 0 to "
        f"60; 0: no hand-over, and the tablets elect a leader after an election timeout, as "
        f"after a crash).",
        convert=float_value, check=at_least(0, 60),
    ),
    FlagSpec(
        "rpc_addr", _CLUSTER, "HOST:PORT",
        "Address the gRPC server listens on. Default: the server's rpc_addr in --config. "
        "Peers and clients always dial the config's address, so override only to bind "
        "differently (e.g. 0.0.0.0:7051 in a container).",
        convert=str, check=_addr_check,
    ),
    FlagSpec(
        "http_addr", _CLUSTER, "HOST:PORT",
        "Address of the HTTP status server (/metrics, /tablets, /stacks, /healthz, /readyz). "
        "Default: the server's http_addr in --config.",
        convert=str, check=_addr_check,
    ),
    FlagSpec(
        "peer_addresses", _CLUSTER, "ID=HOST:PORT[,ID=HOST:PORT...]",
        "Where this server dials the named peers, instead of their rpc_addr in --config: for "
        "a proxy or NAT between servers, e.g. the per-link proxies with which 'raftlet chaos' "
        "cuts the network between two servers without root (chaos/link_proxy.py). Peers not "
        "named are dialled at their config address; clients, and leader hints given to "
        "clients, always use the config's. Each ID must be another server of --config. "
        "Read at startup only.",
        convert=_peer_addresses, check=_peer_addresses_check,
    ),
    FlagSpec(
        "tick_interval_ms", _RAFT, "MS",
        f"Wall-clock length of one Raft tick (config default {RaftTimings().tick_interval_ms}; "
        f"{MIN_TICK_INTERVAL_MS:g} to {MAX_TICK_INTERVAL_MS:g}). Lower it in tests for faster "
        "failover; raise it on a slow or loaded network.",
        convert=float_value, check=at_least(MIN_TICK_INTERVAL_MS, MAX_TICK_INTERVAL_MS),
    ),
    FlagSpec(
        "election_ticks", _RAFT, "N",
        f"A follower that hears no leader for a random [N, 2N) ticks starts an election "
        f"(config default {RaftTimings().election_ticks}; at most {MAX_ELECTION_TICKS}). Must "
        f"exceed --heartbeat_ticks, and N x --tick_interval_ms must be at most "
        f"{MAX_ELECTION_SPAN_MS / 60_000:g} minutes. Raise it if leaders flap under load (long "
        "pauses look like a dead leader).",
        convert=int_value, check=int_in_range(2, MAX_ELECTION_TICKS),
    ),
    FlagSpec(
        "heartbeat_ticks", _RAFT, "N",
        f"A leader sends heartbeats every N ticks (config default "
        f"{RaftTimings().heartbeat_ticks}; below --election_ticks).",
        convert=int_value, check=int_in_range(1, MAX_ELECTION_TICKS - 1),
    ),
    FlagSpec(
        "rpc_service_queue_length", _POOLS, "N",
        f"Tablet service (Write, Scan, ListTablets, GetClusterConfig) calls that may wait for "
        f"a worker (default {_D('rpc_service_queue_length')}). Beyond it calls are rejected "
        "with 'service queue full' and counted in rpcs_queue_overflow. Larger absorbs bursts "
        "at the cost of queueing latency; 1 makes overflow easy to provoke in tests.",
        convert=int_value, check=int_in_range(1),
    ),
    FlagSpec(
        "rpc_num_service_threads", _POOLS, "N",
        f"Worker threads of the tablet service (default {_D('rpc_num_service_threads')}). "
        "Workers only validate and hand writes to the tablet's prepare queue, so a few go "
        "a long way.",
        convert=int_value, check=int_in_range(1, _MAX_THREADS),
    ),
    FlagSpec(
        "consensus_service_queue_length", _POOLS, "N",
        f"Consensus service (UpdateConsensus, RequestVote) calls that may wait for a worker "
        f"(default {_D('consensus_service_queue_length')}). Only unary calls wait here "
        "(--consensus_transport=unary): the tcp and stream transports step peers' messages "
        "on the replica workers. An overflow delays replication and can cost a leader its "
        "lease; keep it above the peers' in-flight appends.",
        convert=int_value, check=int_in_range(1),
    ),
    FlagSpec(
        "consensus_num_service_threads", _POOLS, "N",
        f"Worker threads of the consensus service (default "
        f"{_D('consensus_num_service_threads')}); they serve unary consensus calls only.",
        convert=int_value, check=int_in_range(1, _MAX_THREADS),
    ),
    FlagSpec(
        "admin_service_queue_length", _POOLS, "N",
        f"Admin service (LeaderStepDown, GetFlags, SetFlag) calls that may wait for a worker "
        f"(default {_D('admin_service_queue_length')}). Its own pool keeps an overloaded "
        "server inspectable.",
        convert=int_value, check=int_in_range(1),
    ),
    FlagSpec(
        "admin_num_service_threads", _POOLS, "N",
        f"Worker threads of the admin service (default {_D('admin_num_service_threads')}).",
        convert=int_value, check=int_in_range(1, _MAX_THREADS),
    ),
    FlagSpec(
        "replica_worker_min_threads", _POOLS, "N",
        f"Threads the replica worker pool keeps, idle or not (default "
        f"{_D('replica_worker_min_threads')}). One pool runs every replica's Raft worker, "
        "prepare and apply stages, whatever the number of tablets.",
        convert=int_value, check=int_in_range(1, _MAX_THREADS),
    ),
    FlagSpec(
        "replica_worker_max_threads", _POOLS, "N",
        f"Threads the replica worker pool may grow to while replicas wait on their locks "
        f"or disks (default {_D('replica_worker_max_threads')}); each blocked replica "
        "holds at most three.",
        convert=int_value, check=int_in_range(1, _MAX_THREADS),
    ),
    FlagSpec(
        "replica_worker_running_threads", _POOLS, "N",
        f"Threads of the replica worker pool woken for ready work at most (default "
        f"{_D('replica_worker_running_threads')}): while that many are awake, a ready "
        f"replica waits for one of them, unless none finishes a pass for {STALL_S * 1000:g} ms "
        "(blocked: another is woken, up to --replica_worker_max_threads). 0: one thread for "
        "every ready replica. Threads that only run share the GIL, and waking one per tablet "
        "costs more than it runs.",
        convert=int_value, check=int_in_range(0, _MAX_THREADS),
    ),
    FlagSpec(
        "cpu_affinity", _POOLS, "{auto,CPUS}",
        "Bind the server's threads to CPUs: auto picks one of the CPUs this process may run "
        "on by the server's position in --config (servers of one cluster on one machine "
        "spread round-robin), or a list such as 0 or 2-3,6 (default empty: not bound, the "
        "OS places them). One CPU per server saves the cost of waking a thread on another "
        "CPU at every hand-off of a write; the GIL leaves little parallelism to lose. "
        "Read at startup only.",
        convert=str, check=check_cpu_affinity,
    ),
    FlagSpec(
        "sched_batch", _POOLS, "BOOL",
        "Run the server's threads under Linux's SCHED_BATCH policy (default true): a thread "
        "woken by another does not preempt it, so it does not wake only to find the GIL "
        "still held by its waker, which saves two context switches at a hand-off. Otherwise "
        "ordinary time sharing. Ignored, with a log line, where the platform lacks it. Read "
        "at startup only.",
        convert=bool_value, check=is_bool,
    ),
    FlagSpec(
        "rpc_handoff_yield", _POOLS, "BOOL",
        "The event loop or a write connection's reader yields its CPU whenever it wakes an "
        "idle service thread for a call (default true), so the call starts at once instead "
        "of after whatever else the waker has at hand (under SCHED_BATCH a woken thread "
        "does not preempt its waker): the KUDU-2727 scenario's lock-free p99 queue time "
        "fell about fourfold. Read at startup only.",
        convert=bool_value, check=is_bool,
    ),
    FlagSpec(
        "worker_nice", _POOLS, "N",
        "Nice levels the write pipeline's threads (the replica worker pool: prepare, Raft "
        "and apply stages; the WAL appenders) run below the rest of the server (default "
        f"{_D('worker_nice')}; 0 to 19, capped at 19 in all): a woken service thread, tcp "
        "reader or ticker then runs before them, so a busy server still takes RPCs off its "
        "queues at once. Orders the server's own threads where each service has its own "
        "scheduling group (autogroups, cgroups); set 0 where the server shares one with "
        "unrelated CPU-bound work. Linux only; read at startup only.",
        convert=int_value, check=int_in_range(0, 19),
    ),
    FlagSpec(
        "log_appender_threads", _POOLS, "N",
        f"Threads that write and fsync the tablets' WALs, shared by all of a server's "
        f"tablets (default {_D('log_appender_threads')}): at most this many fsyncs run at "
        "once; a tablet with nothing to write holds none.",
        convert=int_value, check=int_in_range(1, _MAX_THREADS),
    ),
    FlagSpec(
        "term_check_mode", _CONSENSUS, "{lockfree,locked}",
        "How a write checks leadership and binds its term. lockfree (default) reads an "
        "immutable snapshot the Raft driver publishes, never taking the consensus lock (the "
        "KUDU-2727 fix); locked takes the lock for every write, the old behaviour, kept so "
        "tests and benchmarks can compare the two.",
        convert=_term_check_mode, check=_mode_check,
    ),
    FlagSpec(
        "leader_read_mode", _CONSENSUS, "{read_index,lease}",
        "How a leader confirms a linearizable (leader-latest) read. read_index (default): "
        "each read waits for a round of heartbeats a majority answers (reads arriving "
        "meanwhile share the next round); no clock is trusted. lease: while a majority has "
        "answered a heartbeat sent less than a lease ago, reads are served at once, with no "
        "round; the lease is (election_ticks - heartbeat_ticks) ticks times (1 - "
        "--lease_clock_drift), less one tick, and ends at any stall of the process "
        "(SIGSTOP, a paused VM). It assumes every server has the same Raft timings and that "
        "clocks run at rates within --lease_clock_drift of each other.",
        convert=_leader_read_mode, check=_read_mode_check,
    ),
    FlagSpec(
        "lease_clock_drift", _CONSENSUS, "FRACTION",
        f"With --leader_read_mode=lease: by how much, as a fraction, two servers' clocks may "
        f"disagree about a length of time (default {_D('lease_clock_drift'):g}). The lease is "
        "shortened by it. Real clock rates differ by well under 0.001 (NTP slews at most "
        "500 ppm); the default's extra room covers scheduling noise.",
        convert=float_value, check=_drift_check,
    ),
    FlagSpec(
        "consensus_transport", _CONSENSUS, "{tcp,stream,unary}",
        "How replicas reach their peers. tcp (default): one plain TCP connection per pair of "
        "servers carries every tablet's messages, sent and read by plain threads (TLS with "
        "this server's certificate when --tls_cert is set); a peer that cannot take it (it "
        "is dialed through a proxy or NAT: --peer_addresses differs from its own address) "
        "is reached on the stream. stream: "
        "one long-lived bidirectional gRPC stream per pair of servers, batched. Either way a "
        "follower answers from its durability callback. unary: one UpdateConsensus / "
        "RequestVote call per message, the round-1 path, kept for comparison.",
        convert=_consensus_transport, check=_transport_check,
    ),
    FlagSpec(
        "consensus_tcp_port", _CONSENSUS, "PORT",
        "The port this server takes peers' consensus traffic on over plain TCP, on the "
        "host of --rpc_addr (default 0: a free port below the kernel's ephemeral range; "
        "peers ask for it over RPC). With TLS "
        "it is TLS too and admits only server certificates, each request's sender checked "
        "against the certificate as on the gRPC port.",
        convert=int_value, check=int_in_range(0, 65535),
    ),
    FlagSpec(
        "write_tcp_port", _CLUSTER, "PORT",
        "The port this server takes clients' write streams on over plain TCP, on the host "
        "of --rpc_addr (default 0: a free port below the kernel's ephemeral range; the "
        "asyncio client asks for it over RPC "
        "and uses it instead of the gRPC WriteStream). With TLS it is TLS too and admits "
        "client certificates with the writer role or above (no bearer tokens: a client "
        "with a token stays on gRPC).",
        convert=int_value, check=int_in_range(0, 65535),
    ),
    FlagSpec(
        "tcp_frame_deadline_s", _CLUSTER, "S",
        f"On the tcp consensus and write ports, a message that has begun to arrive must "
        f"arrive whole within this many seconds, or its connection is closed (default "
        f"{_D('tcp_frame_deadline_s'):g}; 0.1 to 3600). A connection idle between messages "
        f"is not affected. Large messages also wait for room in the port's byte budget "
        f"(four of --max_message_bytes, at least 64 MiB) before the rest is read.",
        convert=float_value, check=at_least(0.1, 3600),
    ),
    FlagSpec(
        "log_inject_latency_ms", _WAL, "MS",
        f"Sleep this long after every WAL fsync, to reproduce a slow disk (default 0: off; "
        f"0..{int(MAX_INJECT_LATENCY_MS)}). With a full group-commit queue, the consensus lock "
        "holder waits on it: the KUDU-2727 scenario. Settable at runtime (admin SetFlag); a "
        "lower value cuts short a sleep already under way.",
        convert=float_value, check=at_least(0, MAX_INJECT_LATENCY_MS), runtime=True,
    ),
    FlagSpec(
        "log_inject_latency_jitter_ms", _WAL, "MS",
        f"Add a uniformly random 0..MS milliseconds to each injected sleep (default 0; "
        f"0..{int(MAX_INJECT_LATENCY_MS)}). Settable at runtime (admin SetFlag).",
        convert=float_value, check=at_least(0, MAX_INJECT_LATENCY_MS), runtime=True,
    ),
    FlagSpec(
        "log_stall_timeout_ms", _WAL, "MS",
        f"A replica whose WAL write has not become durable after this long -- a hung or "
        f"failing disk -- hands its leadership to a caught-up follower and does not "
        f"campaign until its log writes again, so a leader on a frozen disk does not keep "
        f"its tablets from taking writes (default {_D('log_stall_timeout_ms'):g}; 0: "
        f"never; at most an hour). Time in --log_inject_latency_ms counts.",
        convert=float_value, check=at_least(0, 3_600_000),
    ),
    FlagSpec(
        "group_commit_queue_size_bytes", _WAL, "BYTES",
        f"Bytes of log batches waiting for the WAL's appender thread (default "
        f"{_size(_D('group_commit_queue_size_bytes'))}). When it is full, appending blocks "
        "(under the consensus lock) until the disk catches up: back-pressure instead of "
        "unbounded memory. Smaller shows a slow disk's effect sooner.",
        convert=int_value, check=int_in_range(1),
    ),
    FlagSpec(
        "log_segment_size_bytes", _WAL, "BYTES",
        f"A WAL segment file is rolled over past this size (default "
        f"{_size(_D('log_segment_size_bytes'))}). Segments are the unit of log garbage "
        "collection; small ones in tests exercise rollover and GC. Each new segment "
        "reserves this much disk space up front, so a filling disk fails the store "
        "(which recovers) before the log (which needs a restart). At most "
        f"{MAX_LOG_SEGMENT_BYTES // GiB} GiB.",
        convert=int_value, check=int_in_range(1, MAX_LOG_SEGMENT_BYTES),
    ),
    FlagSpec(
        "follower_apply_delay_ms", _CONSENSUS, "MS",
        f"While more commits are on their way, a follower applies committed entries to "
        f"its store at most this long after the first of them (default "
        f"{_D('follower_apply_delay_ms'):g}), or at 256: fewer, larger store transactions. "
        "A follower at rest and a leader apply at once; a follower read that waits for an "
        "index (min_applied_index) has it applied at once; 0: every round applies.",
        convert=float_value, check=at_least(0, 1000),
    ),
    FlagSpec(
        "write_rounds_in_flight", _CONSENSUS, "N",
        f"A leader replicates at most this many rounds of writes of a tablet at once "
        f"(default {_D('write_rounds_in_flight')}); writes that come meanwhile wait for "
        "one to be applied and go together in the next. Every round costs each replica a "
        "pass through its stages, so fewer, fuller rounds take less CPU per write under "
        "load; a writer alone never waits. 0: no cap, every batch the prepare stage takes "
        "is a round of its own. At most 1000.",
        convert=int_value, check=int_in_range(0, 1000),
    ),
    FlagSpec(
        "write_round_linger_ms", _CONSENSUS, "MS",
        f"When a tablet's round of writes ends with fewer writes waiting than its rounds "
        f"carried lately, they wait for the rest at most this long (default "
        f"{_D('write_round_linger_ms'):g}), and never longer than the last round took, "
        "then go as the next round. Writers answered together come back apart: with "
        "several tablets, rounds that go at once stay small and cost more CPU per write. "
        "A writer alone never waits; a linger that runs out lowers what is expected. 0: "
        "never (the next round goes as soon as the last is applied). At most 1000.",
        convert=float_value, check=at_least(0, 1000),
    ),
    FlagSpec(
        "log_gc_interval_s", _WAL, "S",
        f"How often a replica discards WAL segments whose entries every voter holds and its "
        f"store has made durable (default {_D('log_gc_interval_s'):g}; 0 never discards, "
        f"at most 3600). Each run fsyncs the store. A voter that is down holds back GC on "
        f"every replica of its tablet until it returns.",
        convert=float_value, check=at_least(0, 3600),
    ),
    FlagSpec(
        "store_verify_interval_s", _WAL, "S",
        f"How often one thread checks every replica's store file with SQLite's quick_check "
        f"(default {_D('store_verify_interval_s'):g}; 0 never, else 1 to 604800, a week); a "
        f"store is also checked when its replica opens. A damaged one fails its replica "
        f"for good (it hands its leadership over). About 0.25 s per 100 MiB of store; a "
        f"pass waits at least as long as the last one took before it starts.",
        convert=float_value, check=off_or_in_range(1, 604800),
    ),
    FlagSpec(
        "log_max_segments_retained", _WAL, "N",
        f"A replica's log keeps at most this many segments for a lagging voter (default "
        f"{_D('log_max_segments_retained')}; 0: no cap, a voter that is down holds the log "
        f"back for as long as it is down). Past the cap, log GC goes on without that voter, "
        f"which is then brought up by a tablet copy instead of the log. GC runs as soon as "
        f"the log rolls over past the cap, not only every --log_gc_interval_s; the log holds "
        f"one segment more until the next applied batch, and more only while its store has "
        f"not applied the entries of the newest N segments (a restart replays them).",
        convert=int_value, check=int_in_range(0),
    ),
    FlagSpec(
        "tablet_copy_chunk_bytes", _WAL, "BYTES",
        f"Bytes per chunk of a tablet copy (default {_size(_D('tablet_copy_chunk_bytes'))}, "
        f"at most 8 MiB); every chunk is checksummed and fetched again if damaged or lost.",
        convert=int_value, check=int_in_range(4096, 8 * MiB),
    ),
    FlagSpec(
        "tablet_copy_session_timeout_s", _WAL, "S",
        f"A tablet copy session that sees no call for this long ends as failed, and its "
        f"snapshot file is removed (default {_D('tablet_copy_session_timeout_s'):g}; 1 to "
        f"3600).",
        convert=float_value, check=at_least(1, 3600),
    ),
    FlagSpec(
        "tablet_copy_repair_interval_s", _WAL, "S",
        f"How often a tablet FAILED on this server (unreadable at open, damaged store, failed "
        f"log) is repaired by copying it from its leader, the first time a second after the "
        f"server starts (default {_D('tablet_copy_repair_interval_s'):g}; 0 never, else 1 to "
        f"3600). Checked once a second, so it is rounded up to whole seconds.",
        convert=float_value, check=off_or_in_range(1, 3600),
    ),
    FlagSpec(
        "lock_contention_trace_threshold_ms", _LIMITS, "MS",
        f"A thread that waits longer than this for a profiled lock (e.g. 'consensus') logs a "
        f"WARNING with the holder's acquisition site (its own stack at DEBUG), at most one "
        f"report per 10 s for the whole process, counting the waits it held back (default "
        f"{_D('lock_contention_trace_threshold_ms'):g}; 0 traces every "
        f"contended acquire; at most {int(_MAX_TRACE_THRESHOLD_MS)}, an hour). Settable at runtime "
        "(admin SetFlag).",
        convert=float_value, check=at_least(0, _MAX_TRACE_THRESHOLD_MS), runtime=True,
    ),
    FlagSpec(
        "max_message_bytes", _LIMITS, "BYTES",
        f"Largest message a client may send (default {_size(_D('max_message_bytes'))}, "
        f"{KiB}..{MAX_CLIENT_MESSAGE_BYTES}): a larger write is INVALID_ARGUMENT before it "
        f"is replicated, one over this plus {PEER_FRAMING_BYTES // KiB} KiB is refused by "
        "gRPC (RESOURCE_EXHAUSTED). Servers accept and send each other messages up to this "
        "plus that framing margin, so every server of a cluster needs the same value; scan "
        "pages are at most half of it. Raise it for very large write batches or rows; "
        "lowered, a row stored under the larger value that is over the new one can no "
        "longer be scanned.",
        convert=int_value, check=int_in_range(KiB, MAX_CLIENT_MESSAGE_BYTES),
    ),
    FlagSpec(
        "max_batch_rows", _LIMITS, "N",
        f"Most row operations one Write may carry (default {_D('max_batch_rows')}); more is "
        "INVALID_ARGUMENT. Bounds one request's row locks and log entry size.",
        convert=int_value, check=int_in_range(1),
    ),
    FlagSpec(
        "scan_page_bytes", _LIMITS, "BYTES",
        f"Bytes of rows in a scan page when the request does not say (default "
        f"{_size(_D('scan_page_bytes'))}): a page ends with the row that reaches it, or "
        "before a row that would take it past --max_message_bytes. A request may ask for up "
        "to half of --max_message_bytes.",
        convert=int_value, check=int_in_range(KiB, _MAX_GRPC_MESSAGE),
    ),
    FlagSpec(
        "result_tracker_max_clients", _LIMITS, "N",
        f"Clients whose write outcomes each tablet replica remembers in memory, for "
        f"exactly-once retries (default {_D('result_tracker_max_clients')}, 1 to "
        f"{_MAX_TRACKED_CLIENTS}). Past it the least recently used client is forgotten; "
        "its retries are then answered from the tablet's durable request records.",
        convert=int_value, check=int_in_range(1, _MAX_TRACKED_CLIENTS),
    ),
    FlagSpec(
        "result_tracker_max_bytes", _LIMITS, "BYTES",
        f"Memory each tablet replica's result tracker may hold for remembered write "
        f"outcomes (default {_size(_D('result_tracker_max_bytes'))}, 64 KiB to 1 GiB); past "
        "it least recently used clients are forgotten, as for --result_tracker_max_clients.",
        convert=int_value, check=int_in_range(64 * KiB, GiB),
    ),
    FlagSpec(
        "write_memory_limit_bytes", _LIMITS, "BYTES",
        f"Memory this server's admitted writes may hold until they are answered, across its "
        f"tablets and clients (default {_size(_D('write_memory_limit_bytes'))}, 1 MiB to "
        f"{_MAX_WRITE_MEMORY_BYTES >> 40} TiB): each is charged its size plus 2 KiB. Past it a "
        "write is refused RESOURCE_EXHAUSTED (MEMORY_LIMIT) before anything of it is kept, "
        "and clients back off and retry. Settable at runtime (admin SetFlag).",
        convert=int_value, check=int_in_range(MiB, _MAX_WRITE_MEMORY_BYTES), runtime=True,
    ),
    FlagSpec(
        "log_level", _LIMITS, "LEVEL",
        f"Logging threshold: one of {', '.join(LOG_LEVELS)} (default {_D('log_level')}).",
        convert=_log_level, check=_log_level_check,
    ),
    FlagSpec(
        "unsafe_leader_reads_without_quorum", _UNSAFE, "BOOL",
        "true: a leader-latest read is served from the leader's own state without asking a "
        "quorum (no ReadIndex round), so a deposed leader that has not noticed yet serves "
        "stale rows (default false).",
        convert=bool_value, check=is_bool,
    ),
    FlagSpec(
        "unsafe_leader_keeps_lost_quorum", _UNSAFE, "BOOL",
        "true: a leader that has heard from no majority for an election timeout keeps "
        "leading (no check-quorum) until a message of a later term reaches it, so a leader "
        "cut off from its peers believes it leads for as long as the cut lasts; with "
        "--unsafe_leader_reads_without_quorum it serves stale rows all that time (default "
        "false; not with --leader_read_mode=lease).",
        convert=bool_value, check=is_bool,
    ),
    FlagSpec(
        "unsafe_ack_before_commit", _UNSAFE, "BOOL",
        "true: a write is acknowledged as soon as the leader has appended it to its own log, "
        "before a majority has it, so a leader that crashes or is cut off loses acknowledged "
        "writes (default false).",
        convert=bool_value, check=is_bool,
    ),
    FlagSpec(
        "tls_cert", _SECURITY, "PATH",
        "This server's certificate (PEM), e.g. server-<id>.crt from 'raftlet certs create': "
        "presented to clients and, as a client certificate, to peers. Its subjectAltName "
        "URI raftlet://server/<id> is how peers know it is this server (default none: TLS off).",
        convert=str,
    ),
    FlagSpec(
        "tls_key", _SECURITY, "PATH",
        "The private key of --tls_cert (PEM). Keep it readable by this server only "
        "(default none).",
        convert=str,
    ),
    FlagSpec(
        "tls_ca", _SECURITY, "PATH",
        "The cluster's CA certificate (PEM): client and peer certificates must be signed "
        "by it, and peers' server certificates are checked against it (default none).",
        convert=str,
    ),
    FlagSpec(
        "umask", _SECURITY, "OCTAL",
        f"File mode creation mask of the server process, in octal (default {_D('umask')}): "
        "the rows, "
        "write-ahead logs and metadata it writes are its own user's alone, whatever the "
        "shell's umask -- roles guard the RPCs, not the files. 027 lets the group read them "
        "(a backup user, say). Read at startup only.",
        convert=str, check=_check_octal,
    ),
    FlagSpec(
        "auth_tokens_file", _SECURITY, "PATH",
        "Bearer tokens, one 'TOKEN ROLE NAME' per line (roles reader, writer, admin; # "
        "comments). A call with 'authorization: Bearer TOKEN' acts as that NAME and ROLE. "
        "Needs TLS. Read at startup (default none: certificates only).",
        convert=str,
    ),
    FlagSpec(
        "token_rpc_addr", _SECURITY, "HOST:PORT",
        "A second gRPC port for clients that have a bearer token but no certificate: TLS "
        "that asks for no client certificate, so every call must carry a token; Raft "
        "messages are refused there (they need a server certificate). Needs TLS and "
        "--auth_tokens_file. Taken from the server's token_rpc_addr in --config if it has "
        "one (default none: no token port); clients without a certificate dial the "
        "config's address.",
        convert=str, check=_optional_addr_check,
    ),
    FlagSpec(
        "insecure", _SECURITY, "BOOL",
        "Serve plaintext on a non-loopback --rpc_addr/--http_addr (default false: such a "
        "server refuses to start without TLS). No authentication then: anyone who reaches "
        "the port may do anything.",
        convert=bool_value, check=is_bool,
    ),
)
# fmt: on

_SETTINGS_FIELDS = frozenset(f.name for f in dataclasses.fields(ServerSettings)) & frozenset(
    s.name for s in FLAGS
)
# Flags whose value from_args derives from the config rather than copying as is.
_RESOLVED_ELSEWHERE = frozenset(
    {"server_id", "config", "data_dir", "rpc_addr", "http_addr", "token_rpc_addr"}
    | {"tick_interval_ms", "election_ticks", "heartbeat_ticks"}
)
