"""The ``raftlet tserver`` flags, the settings they resolve to, and the runtime flag registry.

Three layers, one table of flag definitions (``FLAGS``) behind all of them:

- ``add_tserver_arguments(parser)`` adds the flags to an ``argparse`` parser. Names are
  Kudu's (``--rpc_num_service_threads``), each with its dashed alias
  (``--rpc-num-service-threads``). A value out of range is an argparse error: exit status 2
  and one line naming the flag (``OneLineArgumentParser`` keeps argparse's usage dump out of
  it, so the cause is the last line of a supervisor's log).
- ``ServerSettings.from_args(args, config)`` resolves them against the cluster config: the
  server's addresses, data dir and Raft timings come from ``config`` unless a flag overrides
  them. ``ServerSettings`` is frozen and validates itself, so a test may build one directly.
- ``FlagRegistry`` holds the flags' values for the admin service's ``GetFlags`` (every flag)
  and ``SetFlag`` (only those marked runtime-settable, for fault injection in tests: WAL
  latency, the lock-contention trace threshold). Listeners apply a change, e.g. the server
  replaces each log's ``options`` with the new ``inject_latency_ms``. The registry, not the
  frozen settings, is the live value of a runtime-settable flag.

Defaults live in one place, the ``ServerSettings`` field defaults; the help texts and the
registry read them from there (the WAL ones from ``LogOptions``).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import math
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from raftlet.cluster import (
    ClusterConfig,
    RaftTimings,
    ServerConfig,
    TabletPlacement,
    load_cluster_config,
    parse_host_port,
)

# Under its former name, so the rename to ClusterConfigError changed only imports here.
from raftlet.cluster import ClusterConfigError as ConfigError
from raftlet.consensus.log.options import LogOptions
from raftlet.consensus.raft_consensus import ConsensusOptions, TermCheckMode

__all__ = [
    "FLAGS",
    "FlagError",
    "FlagRegistry",
    "FlagSpec",
    "OneLineArgumentParser",
    "ServerSettings",
    "add_tserver_arguments",
    "build_tserver_parser",
    "parse_tserver_args",
    "render_flag_value",
    "settings_from_args",
]

logger = logging.getLogger(__name__)

KiB = 1 << 10
MiB = 1 << 20
_LOG_DEFAULTS = LogOptions()
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# gRPC message limits are C ints.
_MAX_GRPC_MESSAGE = 2**31 - 1
# A typo like 10000 threads would exhaust the process before it served anything.
_MAX_THREADS = 1024


class FlagError(ValueError):
    """A flag is unknown, read-only at runtime, or its value is invalid. One line."""


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Everything a tablet server process is configured with, resolved and validated.

    ``rpc_addr`` and ``http_addr`` are the addresses to *listen* on; peers and clients dial
    the ones in ``config`` (they differ only when a flag overrides them, e.g. to bind
    0.0.0.0 in a container).
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
    log_appender_threads: int = 8
    term_check_mode: TermCheckMode = TermCheckMode.LOCKFREE
    consensus_transport: str = "stream"
    log_inject_latency_ms: float = _LOG_DEFAULTS.inject_latency_ms
    log_inject_latency_jitter_ms: float = _LOG_DEFAULTS.inject_latency_jitter_ms
    group_commit_queue_size_bytes: int = _LOG_DEFAULTS.group_commit_queue_size_bytes
    log_segment_size_bytes: int = _LOG_DEFAULTS.segment_size_bytes
    lock_contention_trace_threshold_ms: float = 100.0
    max_message_bytes: int = 16 * MiB
    max_batch_rows: int = 10_000
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        try:
            self.config.server(self.server_id)
        except ConfigError as e:
            raise FlagError(f"--server_id: {e.reason}") from None
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
        if self.replica_worker_max_threads < self.replica_worker_min_threads:
            raise FlagError(
                f"--replica_worker_max_threads ({self.replica_worker_max_threads}) is below "
                f"--replica_worker_min_threads ({self.replica_worker_min_threads})"
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
        except ConfigError as e:
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
        except ConfigError as e:
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
            raft=raft,
            **tunables,
        )

    @property
    def server(self) -> ServerConfig:
        """This server's entry in the config (its advertised addresses)."""
        return self.config.server(self.server_id)

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
        )


# --- the flag table ----------------------------------------------------------------------


def _no_check(value: object) -> None:
    pass


@dataclass(frozen=True, slots=True)
class FlagSpec:
    """One flag: how to parse it from text, its range, and what to tell the user.

    ``convert`` turns the text into a value and ``check`` validates a value; both raise
    ValueError with a reason that reads well after ``--name:``. ``runtime`` flags may be
    changed through the admin service's ``SetFlag`` while the server runs.
    """

    name: str
    group: str
    metavar: str
    help: str
    convert: Callable[[str], Any]
    check: Callable[[Any], None] = _no_check
    required: bool = False
    runtime: bool = False

    def parse(self, text: str) -> Any:
        value = self.convert(text)
        self.check(value)
        return value

    @property
    def option_strings(self) -> list[str]:
        dashed = self.name.replace("_", "-")
        return [f"--{self.name}"] + ([f"--{dashed}"] if dashed != self.name else [])


def _int(text: str) -> int:
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def _at_least(lo: float, hi: float | None = None) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {value!r}")
        if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
            bound = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
            raise ValueError(f"must be {bound}, got {value}")

    return check


def _positive(value: Any) -> None:
    _at_least(0)(value)
    if value <= 0:
        raise ValueError(f"must be > 0, got {value}")


def _int_check(lo: int, hi: int | None = None) -> Callable[[Any], None]:
    bounded = _at_least(lo, hi)

    def check(value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        bounded(value)

    return check


def _addr_check(value: Any) -> None:
    parse_host_port(value)


def _term_check_mode(text: str) -> TermCheckMode:
    try:
        return TermCheckMode(text.strip().lower())
    except ValueError:
        choices = ", ".join(m.value for m in TermCheckMode)
        raise ValueError(f"expected one of {choices}, got {text!r}") from None


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


def _log_level_check(value: Any) -> None:
    if value not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {value!r}")


CONSENSUS_TRANSPORTS = ("stream", "unary")


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


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n} bytes"


_CLUSTER = "cluster"
_RAFT = "Raft timings (default: the [raft] table of --config)"
_POOLS = "service pools"
_CONSENSUS = "consensus"
_WAL = "write-ahead log"
_LIMITS = "limits and diagnostics"

_GROUP_HELP = {
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
}

_D = _default

# fmt: off
FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec(
        "config", _CLUSTER, "PATH",
        "The cluster config (TOML): the servers, the tables and, derived from both, where "
        "every tablet lives. Give every server of a cluster the same file. Relative data_dir "
        "paths in it are relative to its directory.",
        convert=str, required=True,
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
        convert=str,
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
        "Address of the HTTP status server (/metrics, /tablets, /stacks, /healthz). "
        "Default: the server's http_addr in --config.",
        convert=str, check=_addr_check,
    ),
    FlagSpec(
        "tick_interval_ms", _RAFT, "MS",
        f"Wall-clock length of one Raft tick (config default {RaftTimings().tick_interval_ms}). "
        "Lower it in tests for faster failover; raise it on a slow or loaded network.",
        convert=_float, check=_positive,
    ),
    FlagSpec(
        "election_ticks", _RAFT, "N",
        f"A follower that hears no leader for a random [N, 2N) ticks starts an election "
        f"(config default {RaftTimings().election_ticks}). Must exceed --heartbeat_ticks. "
        "Raise it if leaders flap under load (long pauses look like a dead leader).",
        convert=_int, check=_int_check(2),
    ),
    FlagSpec(
        "heartbeat_ticks", _RAFT, "N",
        f"A leader sends heartbeats every N ticks (config default "
        f"{RaftTimings().heartbeat_ticks}).",
        convert=_int, check=_int_check(1),
    ),
    FlagSpec(
        "rpc_service_queue_length", _POOLS, "N",
        f"Tablet service (Write, Scan, ListTablets, GetClusterConfig) calls that may wait for "
        f"a worker (default {_D('rpc_service_queue_length')}). Beyond it calls are rejected "
        "with 'service queue full' and counted in rpcs_queue_overflow. Larger absorbs bursts "
        "at the cost of queueing latency; 1 makes overflow easy to provoke in tests.",
        convert=_int, check=_int_check(1),
    ),
    FlagSpec(
        "rpc_num_service_threads", _POOLS, "N",
        f"Worker threads of the tablet service (default {_D('rpc_num_service_threads')}). "
        "Workers only validate and hand writes to the tablet's prepare queue, so a few go "
        "a long way.",
        convert=_int, check=_int_check(1, _MAX_THREADS),
    ),
    FlagSpec(
        "consensus_service_queue_length", _POOLS, "N",
        f"Consensus service (UpdateConsensus, RequestVote) calls that may wait for a worker "
        f"(default {_D('consensus_service_queue_length')}). An overflow here delays "
        "replication and can cost a leader its lease; keep it above the peers' in-flight "
        "appends.",
        convert=_int, check=_int_check(1),
    ),
    FlagSpec(
        "consensus_num_service_threads", _POOLS, "N",
        f"Worker threads of the consensus service (default "
        f"{_D('consensus_num_service_threads')}).",
        convert=_int, check=_int_check(1, _MAX_THREADS),
    ),
    FlagSpec(
        "admin_service_queue_length", _POOLS, "N",
        f"Admin service (LeaderStepDown, GetFlags, SetFlag) calls that may wait for a worker "
        f"(default {_D('admin_service_queue_length')}). Its own pool keeps an overloaded "
        "server inspectable.",
        convert=_int, check=_int_check(1),
    ),
    FlagSpec(
        "admin_num_service_threads", _POOLS, "N",
        f"Worker threads of the admin service (default {_D('admin_num_service_threads')}).",
        convert=_int, check=_int_check(1, _MAX_THREADS),
    ),
    FlagSpec(
        "replica_worker_min_threads", _POOLS, "N",
        f"Threads the replica worker pool keeps, idle or not (default "
        f"{_D('replica_worker_min_threads')}). One pool runs every replica's Raft worker, "
        "prepare and apply stages, whatever the number of tablets.",
        convert=_int, check=_int_check(1, _MAX_THREADS),
    ),
    FlagSpec(
        "replica_worker_max_threads", _POOLS, "N",
        f"Threads the replica worker pool may grow to while replicas wait on their locks "
        f"or disks (default {_D('replica_worker_max_threads')}); each blocked replica "
        "holds at most three.",
        convert=_int, check=_int_check(1, _MAX_THREADS),
    ),
    FlagSpec(
        "log_appender_threads", _POOLS, "N",
        f"Threads that write and fsync the tablets' WALs, shared by all of a server's "
        f"tablets (default {_D('log_appender_threads')}): at most this many fsyncs run at "
        "once; a tablet with nothing to write holds none.",
        convert=_int, check=_int_check(1, _MAX_THREADS),
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
        "consensus_transport", _CONSENSUS, "{stream,unary}",
        "How replicas reach their peers. stream (default): one long-lived bidirectional "
        "stream per pair of servers carries every tablet's messages, batched, and a "
        "follower answers from its durability callback. unary: one UpdateConsensus / "
        "RequestVote call per message, the round-1 path, kept for comparison.",
        convert=_consensus_transport, check=_transport_check,
    ),
    FlagSpec(
        "log_inject_latency_ms", _WAL, "MS",
        "Sleep this long after every WAL fsync, to reproduce a slow disk (default 0: off). "
        "With a full group-commit queue, the consensus lock holder waits on it: the "
        "KUDU-2727 scenario. Settable at runtime (admin SetFlag).",
        convert=_float, check=_at_least(0), runtime=True,
    ),
    FlagSpec(
        "log_inject_latency_jitter_ms", _WAL, "MS",
        "Add a uniformly random 0..MS milliseconds to each injected sleep (default 0). "
        "Settable at runtime (admin SetFlag).",
        convert=_float, check=_at_least(0), runtime=True,
    ),
    FlagSpec(
        "group_commit_queue_size_bytes", _WAL, "BYTES",
        f"Bytes of log batches waiting for the WAL's appender thread (default "
        f"{_size(_D('group_commit_queue_size_bytes'))}). When it is full, appending blocks "
        "(under the consensus lock) until the disk catches up: back-pressure instead of "
        "unbounded memory. Smaller shows a slow disk's effect sooner.",
        convert=_int, check=_int_check(1),
    ),
    FlagSpec(
        "log_segment_size_bytes", _WAL, "BYTES",
        f"A WAL segment file is rolled over past this size (default "
        f"{_size(_D('log_segment_size_bytes'))}). Segments are the unit of log garbage "
        "collection; small ones in tests exercise rollover and GC.",
        convert=_int, check=_int_check(1),
    ),
    FlagSpec(
        "lock_contention_trace_threshold_ms", _LIMITS, "MS",
        f"A thread that waits longer than this for a profiled lock (e.g. 'consensus') logs a "
        f"WARNING with its stack and the holder's acquisition site, at most once a second "
        f"per lock (default {_D('lock_contention_trace_threshold_ms'):g}; 0 traces every "
        "contended acquire). Settable at runtime (admin SetFlag).",
        convert=_float, check=_at_least(0), runtime=True,
    ),
    FlagSpec(
        "max_message_bytes", _LIMITS, "BYTES",
        f"Largest gRPC message this server receives or sends (default "
        f"{_size(_D('max_message_bytes'))}); gRPC rejects larger ones with "
        "RESOURCE_EXHAUSTED. Raise it for very large write batches or scan pages.",
        convert=_int, check=_int_check(KiB, _MAX_GRPC_MESSAGE),
    ),
    FlagSpec(
        "max_batch_rows", _LIMITS, "N",
        f"Most row operations one Write may carry (default {_D('max_batch_rows')}); more is "
        "INVALID_ARGUMENT. Bounds one request's row locks and log entry size.",
        convert=_int, check=_int_check(1),
    ),
    FlagSpec(
        "log_level", _LIMITS, "LEVEL",
        f"Logging threshold: one of {', '.join(LOG_LEVELS)} (default {_D('log_level')}).",
        convert=_log_level, check=_log_level_check,
    ),
)
# fmt: on

_SETTINGS_FIELDS = frozenset(f.name for f in dataclasses.fields(ServerSettings)) & frozenset(
    s.name for s in FLAGS
)
# Flags whose value from_args derives from the config rather than copying as is.
_RESOLVED_ELSEWHERE = frozenset(
    {"server_id", "config", "data_dir", "rpc_addr", "http_addr"}
    | {"tick_interval_ms", "election_ticks", "heartbeat_ticks"}
)


# --- argparse ----------------------------------------------------------------------------


_ALIAS_IN_ERROR = re.compile(r"argument (--[A-Za-z0-9_]+)/--[A-Za-z0-9-]+:")


class OneLineArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``prog: error: ... (see --help)``), exit 2.

    argparse prints the usage block first by default; under systemd or ``kubectl logs`` the
    cause should be the one line at the end, not buried under 30 flags.
    """

    def error(self, message: str) -> NoReturn:
        one_line = " ".join(message.split())
        # "argument --x_y/--x-y: ..." names the flag twice; once is clearer.
        one_line = _ALIAS_IN_ERROR.sub(r"argument \1:", one_line)
        self.exit(2, f"{self.prog}: error: {one_line} (see --help)\n")


def _argparse_type(spec: FlagSpec) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return spec.parse(text)
        except ValueError as e:
            # ArgumentTypeError's message is printed as is ("argument --x: <message>").
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = spec.name
    return convert


def add_tserver_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every ``raftlet tserver`` flag to ``parser``, in help groups.

    Defaults of the parsed namespace are None (= "not given") for every flag except
    ``--config`` and ``--server_id``, which are required; ``ServerSettings.from_args``
    fills in the config's values and the built-in defaults.
    """
    groups: dict[str, argparse._ArgumentGroup] = {}
    for spec in FLAGS:
        if spec.group not in groups:
            groups[spec.group] = parser.add_argument_group(spec.group, _GROUP_HELP[spec.group])
        groups[spec.group].add_argument(
            *spec.option_strings,
            dest=spec.name,
            metavar=spec.metavar,
            type=_argparse_type(spec),
            required=spec.required,
            default=None,
            help=spec.help,
        )


_DESCRIPTION = (
    "Run one raftlet tablet server in the foreground. It opens (or creates) the replicas "
    "that --config places on --server_id, joins their Raft groups and serves gRPC until "
    "SIGTERM (graceful) or SIGINT."
)
_EPILOG = (
    "Every flag also has a dashed spelling (--server-id = --server_id). Flags marked "
    "'Settable at runtime' can be changed without a restart through the admin service "
    "(SetFlag), e.g. to inject disk latency in a test."
)


def build_tserver_parser(prog: str = "raftlet tserver") -> OneLineArgumentParser:
    """A standalone parser with the tserver flags (the CLI adds them to its subcommand)."""
    parser = OneLineArgumentParser(
        prog=prog,
        description=_DESCRIPTION,
        epilog=_EPILOG,
        # Abbreviations (--rpc for --rpc_addr) break silently when a flag is added later.
        allow_abbrev=False,
    )
    add_tserver_arguments(parser)
    return parser


def settings_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ServerSettings:
    """Load ``--config`` and resolve the settings; any problem is ``parser.error`` (exit 2)."""
    try:
        config = load_cluster_config(args.config)
        return ServerSettings.from_args(args, config)
    except (ConfigError, FlagError) as e:
        parser.error(str(e))


def parse_tserver_args(
    argv: Sequence[str] | None = None, prog: str = "raftlet tserver"
) -> ServerSettings:
    """Parse ``argv`` into validated settings, or exit 2 with one line on stderr."""
    parser = build_tserver_parser(prog)
    return settings_from_args(parser, parser.parse_args(argv))


# --- the runtime registry ----------------------------------------------------------------


def render_flag_value(value: object) -> str:
    """A value as it would be written on the command line (what GetFlags reports)."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    if isinstance(value, TermCheckMode):
        return value.value
    if value is None:
        return ""
    return str(value)


Listener = Callable[[Any], None]


@dataclass(slots=True)
class _Flag:
    value: Any
    parse: Callable[[str], Any] | None  # None: read-only at runtime
    help: str
    listeners: list[Listener] = field(default_factory=list)


class FlagRegistry:
    """The server's flags by name, for the admin service; a few may be set at runtime.

    Thread-safe. Reads take ``_lock`` only for the dictionary lookup. ``set`` is serialized
    by ``_set_lock`` (an RLock, held while listeners run, so listeners see changes in the
    order they were made and a listener that itself calls ``set`` does not deadlock);
    ``_lock`` is never held while a listener runs, so a listener may ``get`` freely.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set_lock = threading.RLock()
        self._flags: dict[str, _Flag] = {}

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> FlagRegistry:
        """Every flag with its resolved value; the ``runtime`` ones settable."""
        registry = cls()
        for spec in FLAGS:
            if spec.name == "config":
                value: Any = settings.config.path
            elif spec.name in ("tick_interval_ms", "election_ticks", "heartbeat_ticks"):
                value = getattr(settings.raft, spec.name)
            else:
                value = getattr(settings, spec.name)
            registry.define(
                spec.name, value, parse=spec.parse if spec.runtime else None, help=spec.help
            )
        return registry

    def define(
        self,
        name: str,
        value: object,
        *,
        parse: Callable[[str], Any] | None = None,
        help: str = "",
    ) -> None:
        """Register a flag. ``parse`` (text → value, ValueError if invalid) makes it settable."""
        with self._lock:
            if name in self._flags:
                raise FlagError(f"flag {name!r} is already defined")
            self._flags[name] = _Flag(value, parse, help)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._flags)

    def runtime_names(self) -> list[str]:
        with self._lock:
            return sorted(n for n, f in self._flags.items() if f.parse is not None)

    def is_runtime(self, name: str) -> bool:
        return self._entry(name)[1].parse is not None

    def get(self, name: str) -> Any:
        """The current (typed) value of ``name``; FlagError if there is no such flag."""
        return self._entry(name)[1].value

    def render(self, names: Iterable[str] = ()) -> dict[str, str]:
        """``{name: value as on the command line}`` for ``names``, or every flag if empty
        (what GetFlags answers); FlagError naming the first unknown one."""
        wanted = list(names)
        if not wanted:
            with self._lock:
                return {n: render_flag_value(f.value) for n, f in sorted(self._flags.items())}
        out = {}
        for n in wanted:
            key, flag = self._entry(n)
            out[key] = render_flag_value(flag.value)
        return out

    def set(self, name: str, value: str) -> str:
        """Set runtime flag ``name`` from its command-line text; returns the old value as
        text (so a test can put it back). Raises FlagError, changing nothing, for an unknown
        or read-only flag or an invalid value.

        Listeners run after the value is stored, in subscription order, all of them even if
        one fails; the first failure is then re-raised (the new value stays set: GetFlags
        shows what is in force for everything that did apply it).
        """
        with self._set_lock:
            key, flag = self._entry(name)
            if flag.parse is None:
                settable = ", ".join(self.runtime_names()) or "none"
                raise FlagError(
                    f"flag {key!r} cannot be changed at runtime (restart the server with "
                    f"--{key}=...; settable at runtime: {settable})"
                )
            if not isinstance(value, str):
                raise FlagError(f"flag {key!r}: the value must be text, got {value!r}")
            try:
                new = flag.parse(value)
            except ValueError as e:
                raise FlagError(f"flag {key!r}: {e}") from None
            with self._lock:
                old = flag.value
                flag.value = new
                listeners = list(flag.listeners)
            first_error: BaseException | None = None
            for listener in listeners:
                try:
                    listener(new)
                except Exception as e:
                    logger.exception("listener of flag %s failed for value %r", key, new)
                    first_error = first_error or e
            if first_error is not None:
                raise first_error
            logger.info("flag %s changed from %s to %s", key, render_flag_value(old), value)
            return render_flag_value(old)

    def subscribe(self, name: str, listener: Listener) -> Callable[[], None]:
        """Call ``listener(new_value)`` after each change of ``name``; returns an
        unsubscribe function. Only runtime-settable flags ever change."""
        _, flag = self._entry(name)
        with self._lock:
            flag.listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in flag.listeners:
                    flag.listeners.remove(listener)

        return unsubscribe

    def _entry(self, name: str) -> tuple[str, _Flag]:
        # Accept the spellings a user might type: "--log-inject-latency-ms" too.
        key = name.strip().lstrip("-").replace("-", "_") if isinstance(name, str) else ""
        with self._lock:
            flag = self._flags.get(key)
            if flag is not None:
                return key, flag
            known = sorted(self._flags)
        hint = difflib.get_close_matches(key, known, n=1)
        maybe = f"; did you mean {hint[0]!r}?" if hint else ""
        raise FlagError(f"unknown flag {name!r}{maybe}")
