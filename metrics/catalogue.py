"""Every metric raftlet exports, declared once.

Components instantiate these on their entity — `entity.counter(RPCS_QUEUE_OVERFLOW,
service="tablet")` — and never declare metrics of their own elsewhere, so this file is the
list a dashboard author reads. Names are bare (no `raftlet_` prefix) and identical in JSON and
Prometheus, except that the Prometheus text format gives every counter a `_total` suffix (see
docs/ARCHITECTURE.md, "metrics").

To add a metric: add a prototype here, add it to `ALL_PROTOTYPES`, and document it in
docs/ARCHITECTURE.md. Changing `entity_type` or `label_names` of an existing one changes the
exported series; check the dashboards.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from raftlet.metrics.registry import MetricPrototype, MetricType

__all__ = [
    "ALL_PROTOTYPES",
    "BUILD_INFO",
    "CONSENSUS_LOCK_CONTENTION_TIME_US",
    "CONSENSUS_LOCK_WAIT_TIME_US",
    "CONSENSUS_TCP_CONNECTIONS",
    "HANDLER_LATENCY_US",
    "LEADER_ELECTIONS_TOTAL",
    "LOG_APPEND_LATENCY_US",
    "LOG_GC_SEGMENTS_DELETED_TOTAL",
    "LOG_GROUP_COMMIT_ENTRIES",
    "LOG_SYNC_LATENCY_US",
    "OP_APPLY_RUN_TIME_US",
    "OP_PREPARE_RUN_TIME_US",
    "PROCESS_CPU_SECONDS",
    "PROCESS_MAX_FDS",
    "PROCESS_OPEN_FDS",
    "PROCESS_PROTOTYPES",
    "PROCESS_RESIDENT_MEMORY_BYTES",
    "PROCESS_START_TIME_SECONDS",
    "RAFT_APPLIED_INDEX",
    "RAFT_COMMIT_INDEX",
    "RAFT_ROLE",
    "RAFT_ROLE_VALUES",
    "RAFT_TERM",
    "RESULT_TRACKER_CLIENTS",
    "RESULT_TRACKER_EVICTIONS_TOTAL",
    "RESULT_TRACKER_MEMORY_BYTES",
    "RESULT_TRACKER_REPLAYS_TOTAL",
    "ROWS_DELETED_TOTAL",
    "ROWS_INSERTED_TOTAL",
    "ROWS_UPDATED_TOTAL",
    "ROWS_UPSERTED_TOTAL",
    "RPCS_FAILED",
    "RPCS_QUEUE_OVERFLOW",
    "RPCS_TIMED_OUT_IN_QUEUE",
    "RPC_INCOMING_QUEUE_TIME_US",
    "SCANS_HELD",
    "SCANS_REFUSED_TOTAL",
    "TABLETS_DISK_BYTES",
    "TABLET_COPIES_INSTALLED_TOTAL",
    "TABLET_COPY_DISK_BYTES",
    "TABLET_COPY_SESSIONS_TOTAL",
    "TABLET_FAILED",
    "TABLET_LOG_BYTES",
    "TABLET_LOG_SEGMENTS",
    "TABLET_STORE_BYTES",
    "TCP_CONNECTIONS_REFUSED_TOTAL",
    "TERM_CHECKS_TOTAL",
    "TLS_CERT_EXPIRY_SECONDS",
    "WRITE_MEMORY_HELD_BYTES",
    "WRITE_MEMORY_REFUSALS_TOTAL",
    "WRITE_OPS_TOTAL",
    "WRITE_ROW_ERRORS_TOTAL",
    "WRITE_TCP_CONNECTIONS",
    "by_name",
]

COUNTER = MetricType.COUNTER
GAUGE = MetricType.GAUGE
HISTOGRAM = MetricType.HISTOGRAM

# The numeric encoding of `raft_role`, by consensus.core.types.Role member name. Spelled out
# here rather than imported because metrics imports nothing of the project (consensus depends
# on metrics, not the reverse); a test in the consensus driver's issue should pin the mapping.
RAFT_ROLE_VALUES: Mapping[str, int] = MappingProxyType(
    {"FOLLOWER": 0, "PRE_CANDIDATE": 1, "CANDIDATE": 2, "LEADER": 3}
)

# --- RPC layer (server entity, one series per service pool) -------------------------------

RPCS_QUEUE_OVERFLOW = MetricPrototype(
    "rpcs_queue_overflow",
    COUNTER,
    "requests",
    "Requests rejected with RESOURCE_EXHAUSTED because the service queue was full (each "
    "write of a write stream's frame counts)",
    label_names=("service", "method"),
    entity_type="server",
)
RPCS_FAILED = MetricPrototype(
    "rpcs_failed",
    COUNTER,
    "requests",
    "Calls answered with an error, by gRPC status code (NOT_LEADER is FAILED_PRECONDITION, a "
    "full queue RESOURCE_EXHAUSTED, a failed tablet UNAVAILABLE, bad input INVALID_ARGUMENT) "
    "and by the ServerErrorPB code the answer carries (error; empty when none): "
    "error=NOT_LEADER and error=LEADER_NOT_READY are answers of leadership moving, which a "
    "client retries at the (next) leader, not failures it sees; TABLET_NOT_FOUND stays a "
    "failure: a stale location after a replica moved gets it, as a wrong tablet id does. "
    "Each write of a WriteStream or of the tcp write port counts as a call. Rows refused "
    "inside a write that succeeded are write_row_errors_total",
    label_names=("service", "method", "code", "error"),
    entity_type="server",
)
WRITE_ROW_ERRORS_TOTAL = MetricPrototype(
    "write_row_errors_total",
    COUNTER,
    "rows",
    "Rows of writes this replica led that were refused one by one (KEY_EXISTS, "
    "KEY_NOT_FOUND, INVALID_ROW...), by code",
    label_names=("code",),
    entity_type="tablet",
)
RPC_INCOMING_QUEUE_TIME_US = MetricPrototype(
    "rpc_incoming_queue_time_us",
    HISTOGRAM,
    "microseconds",
    "Time an RPC waited in its service queue before a service thread picked it up",
    label_names=("service",),
    entity_type="server",
)
RPCS_TIMED_OUT_IN_QUEUE = MetricPrototype(
    "rpcs_timed_out_in_queue",
    COUNTER,
    "requests",
    "RPCs whose deadline passed while they waited in the service queue (never run)",
    label_names=("service",),
    entity_type="server",
)
HANDLER_LATENCY_US = MetricPrototype(
    "handler_latency_us",
    HISTOGRAM,
    "microseconds",
    "Time a service thread spent in an RPC handler, per service and method",
    label_names=("service", "method"),
    entity_type="server",
)

# --- Consensus (tablet entity) -------------------------------------------------------------

CONSENSUS_LOCK_CONTENTION_TIME_US = MetricPrototype(
    "consensus_lock_contention_time_us",
    COUNTER,
    "microseconds",
    "Total time threads spent waiting for the consensus lock (contended acquires only)",
    entity_type="tablet",
)
CONSENSUS_LOCK_WAIT_TIME_US = MetricPrototype(
    "consensus_lock_wait_time_us",
    HISTOGRAM,
    "microseconds",
    "Wait of each contended acquire of the consensus lock",
    entity_type="tablet",
)
TERM_CHECKS_TOTAL = MetricPrototype(
    "term_checks_total",
    COUNTER,
    "checks",
    "Leadership/term checks made by write RPCs, by --term_check_mode (lockfree or locked); "
    "a write refused by the check (on a follower, say) counts too",
    label_names=("mode",),
    entity_type="tablet",
)
RAFT_TERM = MetricPrototype(
    "raft_term",
    GAUGE,
    "term",
    "Current Raft term of this replica",
    entity_type="tablet",
)
RAFT_ROLE = MetricPrototype(
    "raft_role",
    GAUGE,
    "state",
    "Raft role of this replica: 0 follower, 1 pre-candidate, 2 candidate, 3 leader",
    entity_type="tablet",
)
RAFT_COMMIT_INDEX = MetricPrototype(
    "raft_commit_index",
    GAUGE,
    "index",
    "Highest log index known to be committed on this replica",
    entity_type="tablet",
)
RAFT_APPLIED_INDEX = MetricPrototype(
    "raft_applied_index",
    GAUGE,
    "index",
    "Highest log index applied to this replica's row store",
    entity_type="tablet",
)
TABLET_FAILED = MetricPrototype(
    "tablet_failed",
    GAUGE,
    "state",
    "1 while this replica is FAILED (it did not open, or its log or store failed), else 0; "
    "the reason is on /tablets",
    entity_type="tablet",
)
LEADER_ELECTIONS_TOTAL = MetricPrototype(
    "leader_elections_total",
    COUNTER,
    "elections",
    "Elections this replica won: terms in which it became the tablet's leader",
    entity_type="tablet",
)

# --- Write path (tablet entity) ------------------------------------------------------------

OP_PREPARE_RUN_TIME_US = MetricPrototype(
    "op_prepare_run_time_us",
    HISTOGRAM,
    "microseconds",
    "Time the prepare worker spent on one batch of write ops (row locks, replicate)",
    entity_type="tablet",
)
OP_APPLY_RUN_TIME_US = MetricPrototype(
    "op_apply_run_time_us",
    HISTOGRAM,
    "microseconds",
    "Time the apply worker spent applying one batch of committed ops to the row store",
    entity_type="tablet",
)
WRITE_OPS_TOTAL = MetricPrototype(
    "write_ops_total",
    COUNTER,
    "operations",
    "Write operations (one per client Write request) applied on this replica",
    entity_type="tablet",
)
LOG_GC_SEGMENTS_DELETED_TOTAL = MetricPrototype(
    "log_gc_segments_deleted_total",
    COUNTER,
    "segments",
    "WAL segments this replica deleted because every voter holds their entries and the "
    "store is durable past them (log GC)",
    entity_type="tablet",
)
TABLET_COPIES_INSTALLED_TOTAL = MetricPrototype(
    "tablet_copies_installed_total",
    COUNTER,
    "copies",
    "Tablet copies this server installed, replacing its replica of a tablet with a copy "
    "of the leader's (a follower the log could not catch up, or a FAILED replica repaired)",
    entity_type="server",
)
TABLET_COPY_SESSIONS_TOTAL = MetricPrototype(
    "tablet_copy_sessions_total",
    COUNTER,
    "sessions",
    "Tablet copy sessions this server served as the source, by how they ended",
    entity_type="server",
    label_names=("outcome",),
)
CONSENSUS_TCP_CONNECTIONS = MetricPrototype(
    "consensus_tcp_connections",
    GAUGE,
    "connections",
    "Open tcp consensus connections (--consensus_transport=tcp): out, to peers this server "
    "sends its tablets' requests to; in, from peers that send theirs here",
    entity_type="server",
    label_names=("direction",),
)
WRITE_TCP_CONNECTIONS = MetricPrototype(
    "write_tcp_connections",
    GAUGE,
    "connections",
    "Open client connections to this server's tcp write port (the asyncio client's writes "
    "outside gRPC)",
    entity_type="server",
)
TCP_CONNECTIONS_REFUSED_TOTAL = MetricPrototype(
    "tcp_connections_refused_total",
    COUNTER,
    "connections",
    "Connections a tcp port closed as soon as it accepted them because it had as many open "
    "as it takes (consensus: 64 from peers; write: 1,024 from clients), or closed in their "
    "TLS handshake to make room for a newer one (16 and 64 may wait in it); its log says so "
    "at most once a minute",
    entity_type="server",
    label_names=("port",),
)
BUILD_INFO = MetricPrototype(
    "build_info",
    GAUGE,
    "state",
    "Always 1; its version label is the raftlet release this server runs (a rolling upgrade "
    "shows two across a cluster)",
    label_names=("version",),
    entity_type="server",
)
TLS_CERT_EXPIRY_SECONDS = MetricPrototype(
    "tls_cert_expiry_seconds",
    GAUGE,
    "seconds",
    "Seconds until the first of this server's certificate and its CA expires (negative once "
    "it has: no peer or client can then connect); present only with TLS",
    entity_type="server",
)
WRITE_MEMORY_HELD_BYTES = MetricPrototype(
    "write_memory_held_bytes",
    GAUGE,
    "bytes",
    "What this server's admitted writes not answered yet are charged against "
    "--write_memory_limit_bytes (their bytes and a fixed overhead each)",
    entity_type="server",
)
WRITE_MEMORY_REFUSALS_TOTAL = MetricPrototype(
    "write_memory_refusals_total",
    COUNTER,
    "requests",
    "Writes refused with RESOURCE_EXHAUSTED (MEMORY_LIMIT) because admitting them would pass "
    "--write_memory_limit_bytes",
    entity_type="server",
)
_EVERY_REPLICA = (
    " (every replica counts the rows it applies, so a table's rate is one replica's, not the "
    "sum over replicas)"
)
ROWS_INSERTED_TOTAL = MetricPrototype(
    "rows_inserted_total",
    COUNTER,
    "rows",
    "Rows inserted (INSERT) into this replica's row store" + _EVERY_REPLICA,
    entity_type="tablet",
)
ROWS_UPSERTED_TOTAL = MetricPrototype(
    "rows_upserted_total",
    COUNTER,
    "rows",
    "Rows upserted (UPSERT: inserted, or written over) in this replica's row store"
    + _EVERY_REPLICA,
    entity_type="tablet",
)
ROWS_UPDATED_TOTAL = MetricPrototype(
    "rows_updated_total",
    COUNTER,
    "rows",
    "Rows updated (UPDATE) in this replica's row store" + _EVERY_REPLICA,
    entity_type="tablet",
)
ROWS_DELETED_TOTAL = MetricPrototype(
    "rows_deleted_total",
    COUNTER,
    "rows",
    "Rows deleted (DELETE) from this replica's row store" + _EVERY_REPLICA,
    entity_type="tablet",
)
RESULT_TRACKER_REPLAYS_TOTAL = MetricPrototype(
    "result_tracker_replays_total",
    COUNTER,
    "requests",
    "Retried write requests answered from the result tracker instead of being applied again",
    entity_type="tablet",
)
RESULT_TRACKER_EVICTIONS_TOTAL = MetricPrototype(
    "result_tracker_evictions_total",
    COUNTER,
    "clients",
    "Clients the result tracker forgot, least recently used first, to stay within "
    "--result_tracker_max_clients and --result_tracker_max_bytes (their retries are then "
    "answered from the store's request records)",
    entity_type="tablet",
)
RESULT_TRACKER_CLIENTS = MetricPrototype(
    "result_tracker_clients",
    GAUGE,
    "clients",
    "Clients whose completed requests the result tracker remembers",
    entity_type="tablet",
)
RESULT_TRACKER_MEMORY_BYTES = MetricPrototype(
    "result_tracker_memory_bytes",
    GAUGE,
    "bytes",
    "Estimated memory of the result tracker's remembered responses and clients",
    entity_type="tablet",
)
SCANS_HELD = MetricPrototype(
    "scans_held",
    GAUGE,
    "scans",
    "Scans the replica holds open between their pages, each one read of the tablet",
    entity_type="tablet",
)
SCANS_REFUSED_TOTAL = MetricPrototype(
    "scans_refused_total",
    COUNTER,
    "scans",
    "Scans whose first page the replica refused as busy (RESOURCE_EXHAUSTED) because every "
    "place for a held scan was taken by a scan read within the last second",
    entity_type="tablet",
)

# --- Durable log (tablet entity) -----------------------------------------------------------

LOG_APPEND_LATENCY_US = MetricPrototype(
    "log_append_latency_us",
    HISTOGRAM,
    "microseconds",
    "Time the log appender spent writing one group of entries to the segment file (no fsync)",
    entity_type="tablet",
)
LOG_SYNC_LATENCY_US = MetricPrototype(
    "log_sync_latency_us",
    HISTOGRAM,
    "microseconds",
    "Duration of each fsync of a log segment (with --log_inject_latency_ms, the injected "
    "delay included)",
    entity_type="tablet",
)
LOG_GROUP_COMMIT_ENTRIES = MetricPrototype(
    "log_group_commit_entries",
    HISTOGRAM,
    "entries",
    "Log entries made durable by one fsync (group-commit batch size)",
    entity_type="tablet",
)

# --- Disk (read at scrape time: one stat per file, nothing on the write path) ------------

TABLET_LOG_BYTES = MetricPrototype(
    "tablet_log_bytes",
    GAUGE,
    "bytes",
    "Bytes of this replica's WAL segment files (/tablets log_bytes). Log GC deletes only "
    "segments every voter holds, so a voter that lags or is down makes it grow, up to "
    "--log_max_segments_retained segments; the segment being written also has up to "
    "--log_segment_size_bytes reserved on disk, not counted",
    entity_type="tablet",
)
TABLET_LOG_SEGMENTS = MetricPrototype(
    "tablet_log_segments",
    GAUGE,
    "segments",
    "WAL segment files this replica holds, the one being written included",
    entity_type="tablet",
)
TABLET_STORE_BYTES = MetricPrototype(
    "tablet_store_bytes",
    GAUGE,
    "bytes",
    "Bytes of this replica's SQLite row store: the main file, its -wal and its -shm "
    "(/tablets store_bytes)",
    entity_type="tablet",
)
TABLET_COPY_DISK_BYTES = MetricPrototype(
    "tablet_copy_disk_bytes",
    GAUGE,
    "bytes",
    "Bytes in the server's tablet-copy area (<data_dir>/.tablet-copy): copies being received, "
    "store snapshots being sent to other servers, and a replaced replica kept until its copy "
    "is in -- none of them in tablets_disk_bytes; 0 when no copy runs",
    entity_type="server",
)
TABLETS_DISK_BYTES = MetricPrototype(
    "tablets_disk_bytes",
    GAUGE,
    "bytes",
    "Bytes of the WAL segments and row stores of every replica this server hosts, running or "
    "FAILED: the sum of tablet_log_bytes and tablet_store_bytes over its tablets (the data "
    "directory's small metadata files are not counted, nor copies in progress: "
    "tablet_copy_disk_bytes)",
    entity_type="server",
)

# --- Process (read by the status server at scrape time, not instantiated on an entity) ----

PROCESS_CPU_SECONDS = MetricPrototype(
    "process_cpu_seconds",
    COUNTER,
    "seconds",
    "CPU time (user + system, all threads) this server process has used since it started",
    entity_type="server",
)
PROCESS_START_TIME_SECONDS = MetricPrototype(
    "process_start_time_seconds",
    GAUGE,
    "seconds",
    "When this server process started (Unix time): a new value is a restart, after which "
    "its counters start again from zero",
    entity_type="server",
)
PROCESS_RESIDENT_MEMORY_BYTES = MetricPrototype(
    "process_resident_memory_bytes",
    GAUGE,
    "bytes",
    "Memory of this server process resident in RAM (RSS)",
    entity_type="server",
)
PROCESS_OPEN_FDS = MetricPrototype(
    "process_open_fds",
    GAUGE,
    "files",
    "File descriptors this server process holds open (WAL segments, stores, sockets)",
    entity_type="server",
)
PROCESS_MAX_FDS = MetricPrototype(
    "process_max_fds",
    GAUGE,
    "files",
    "The process's open-file limit (RLIMIT_NOFILE, soft): at it, new connections and files fail",
    entity_type="server",
)
RPC_AUTH_DENIALS = MetricPrototype(
    "rpc_auth_denials",
    COUNTER,
    "requests",
    "RPCs and status pages refused by authentication (UNAUTHENTICATED) or authorization "
    "(PERMISSION_DENIED), by reason: no_credentials, invalid_token, no_identity, "
    "role_too_low, sender_mismatch, tls_handshake (a tcp port's handshake refused a "
    "certificate: expired, another CA's; gRPC's own handshakes are not counted)",
    label_names=("reason",),
    entity_type="server",
)
# Not in ALL_PROTOTYPES (what components instantiate): `metrics.process`
# reads these from the OS whenever /metrics is scraped.
PROCESS_PROTOTYPES: tuple[MetricPrototype, ...] = (
    PROCESS_CPU_SECONDS,
    PROCESS_START_TIME_SECONDS,
    PROCESS_RESIDENT_MEMORY_BYTES,
    PROCESS_OPEN_FDS,
    PROCESS_MAX_FDS,
)

ALL_PROTOTYPES: tuple[MetricPrototype, ...] = (
    RPCS_QUEUE_OVERFLOW,
    RPCS_FAILED,
    RPC_INCOMING_QUEUE_TIME_US,
    RPCS_TIMED_OUT_IN_QUEUE,
    HANDLER_LATENCY_US,
    CONSENSUS_LOCK_CONTENTION_TIME_US,
    CONSENSUS_LOCK_WAIT_TIME_US,
    TERM_CHECKS_TOTAL,
    OP_PREPARE_RUN_TIME_US,
    OP_APPLY_RUN_TIME_US,
    LOG_APPEND_LATENCY_US,
    LOG_SYNC_LATENCY_US,
    LOG_GROUP_COMMIT_ENTRIES,
    RAFT_TERM,
    RAFT_ROLE,
    RAFT_COMMIT_INDEX,
    RAFT_APPLIED_INDEX,
    TABLET_FAILED,
    LEADER_ELECTIONS_TOTAL,
    WRITE_OPS_TOTAL,
    WRITE_ROW_ERRORS_TOTAL,
    ROWS_INSERTED_TOTAL,
    ROWS_UPSERTED_TOTAL,
    ROWS_UPDATED_TOTAL,
    ROWS_DELETED_TOTAL,
    RESULT_TRACKER_REPLAYS_TOTAL,
    RESULT_TRACKER_EVICTIONS_TOTAL,
    RESULT_TRACKER_CLIENTS,
    RESULT_TRACKER_MEMORY_BYTES,
    SCANS_HELD,
    SCANS_REFUSED_TOTAL,
    RPC_AUTH_DENIALS,
    LOG_GC_SEGMENTS_DELETED_TOTAL,
    TABLET_COPIES_INSTALLED_TOTAL,
    TABLET_COPY_SESSIONS_TOTAL,
    CONSENSUS_TCP_CONNECTIONS,
    WRITE_TCP_CONNECTIONS,
    TCP_CONNECTIONS_REFUSED_TOTAL,
    WRITE_MEMORY_HELD_BYTES,
    WRITE_MEMORY_REFUSALS_TOTAL,
    TLS_CERT_EXPIRY_SECONDS,
    BUILD_INFO,
    TABLET_LOG_BYTES,
    TABLET_LOG_SEGMENTS,
    TABLET_STORE_BYTES,
    TABLETS_DISK_BYTES,
    TABLET_COPY_DISK_BYTES,
)

_BY_NAME: Mapping[str, MetricPrototype] = MappingProxyType({p.name: p for p in ALL_PROTOTYPES})


def by_name(name: str) -> MetricPrototype:
    """The prototype called `name` (KeyError if the catalogue has none)."""
    return _BY_NAME[name]
