"""The local launcher: a multi-server raftlet cluster as separate processes on this machine.

``raftlet cluster up`` / ``status`` / ``down`` are thin wrappers around ``LocalCluster``.
A cluster lives in one data directory::

    <data_dir>/cluster.toml     the cluster config every server (and client) reads
    <data_dir>/cluster.json     the launcher's state: each server's PID, addresses, argv
    <data_dir>/.made-by-cluster-up  marks a directory ``up`` made: ``down --remove-data``
                                removes no other (``up`` refuses a non-empty directory
                                without a cluster in it)
    <data_dir>/<id>.log         each server's stdout and stderr
    <data_dir>/<id>/            each server's replicas (WAL, metadata, SQLite store)
    <data_dir>/tls/             with ``up --tls``: the CA, server-<id>.crt/.key,
                                client-admin.crt/.key (``deploy.certs``) and ``tokens``:
                                a bearer token per role, for the servers' token ports

Rules this module keeps, and why:

- **The servers outlive the launcher.** Each is started with ``start_new_session=True``, so
  the CLI that started them can exit (and a Ctrl-C in its terminal, which signals the whole
  foreground process group, does not reach them). Everything needed to find them again is in
  ``cluster.json``; ``LocalCluster.load(data_dir)`` reads it back.
- **Never signal a process that is not ours.** PIDs are recycled: a PID from a stale state
  file may now belong to anything. Before any signal the process's command line must hold
  ``tserver``, this cluster's config path and the server id (``owns``) -- or, for a server
  restarted by hand, ``tserver`` and the server id while it holds the server's data
  directory's lock (``_holder``) -- checked again just before SIGKILL; anything else is
  left alone and reported.
- **No half-started clusters.** The state file is written after every spawn, so a launcher
  killed mid-start leaves PIDs that ``down`` can still stop; and a start that fails (a server
  exits, no ready line, no leader in time) stops everything it started before raising.
- **``down`` verifies.** SIGTERM (the server shuts down gracefully: gRPC drains, logs sync),
  wait, SIGKILL whatever is left, then check that every PID is really gone (a zombie counts
  as gone: it holds no ports or files) before removing the state file. If one survives
  even SIGKILL, the state file stays so a later ``down`` can try again.
- **TLS is a property of the directory.** ``create(tls=True)`` makes ``tls/`` once; any
  later start of a directory holding its CA and the admin certificate and key
  (``local_tls_files``) starts the servers with TLS again, and client commands given
  ``--data-dir`` find the admin certificate there, so nobody has to remember which
  clusters are TLS.
- **Ports come from the kernel.** With ``base_port=None`` each address is bound to port 0
  and released just before the server binds it (the integration tests do the same), so two
  clusters, or a cluster and a test run, never fight over fixed ports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftlet.client.health import (
    ClusterHealth,
    ProbeOptions,
    Severity,
    TabletHealth,
    check_cluster,
)
from raftlet.cluster import (
    ClusterConfig,
    ClusterConfigError,
    RaftTimings,
    ServerConfig,
    TableConfig,
    load_cluster_config,
    write_cluster_config,
)
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType

__all__ = [
    "CONFIG_FILE",
    "DEFAULT_TABLE",
    "KV_SCHEMA",
    "MADE_BY_UP_FILE",
    "STATE_FILE",
    "ClusterRunningError",
    "LauncherError",
    "LocalCluster",
    "NoClusterError",
    "ServerProcess",
    "ServerStop",
    "data_dir_in_use",
    "free_ports",
    "launch_flags",
    "pid_alive",
    "pid_stopped",
    "reserved_ports",
]

CONFIG_FILE = "cluster.toml"
STATE_FILE = "cluster.json"
# Marks a directory `up` made for a new cluster: the only kind `down --remove-data` removes.
MADE_BY_UP_FILE = ".made-by-cluster-up"
# The server flags of the last start of every server (``_LaunchOptions``): a restart after
# `down` that names none starts the cluster with them again.
LAUNCH_FILE = "launch.json"
STATE_FORMAT = 1
DEFAULT_TABLE = "kv"
# The table `cluster up` creates. The load generator writes a unique INT64 key per row and a
# STRING payload of --row-bytes; nullable so `raftlet scan --where "value is-null"` means
# something and a generated row may leave it out.
KV_SCHEMA = Schema(
    [
        ColumnSchema("key", DataType.INT64, is_key=True),
        ColumnSchema("value", DataType.STRING, nullable=True),
    ]
)
MAX_SERVERS = 64
# How long one server may take to print its ready line. Opening replicas replays their WALs,
# so a restart of a cluster holding much data takes longer than a fresh start.
READY_TIMEOUT_S = 60.0
LEADER_TIMEOUT_S = 60.0
DOWN_TIMEOUT_S = 30.0
# SIGKILL cannot be caught; a process still there this long after it is stuck in the kernel.
_KILL_WAIT_S = 10.0
_POLL_S = 0.05
# What a tablet server says when an address it was given is not free (tserver.server), and
# how many sets of kernel-picked ports a new cluster tries.
PORT_TAKEN = "cannot listen for"
PORT_ATTEMPTS = 3


class LauncherError(RuntimeError):
    """Starting, finding or stopping a local cluster failed. ``str()`` is one line (plus,
    for a server that failed to start, ``details`` holds its log tail)."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details


class NoClusterError(LauncherError):
    """There is no local cluster state (``cluster.json``) in the data directory."""


class ClusterRunningError(LauncherError):
    """``up`` was asked for a data directory whose cluster is still running."""


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports the kernel considers free now (bound to port 0, then released).

    All sockets stay open until every port is picked, so the kernel cannot hand out the same
    port twice; the window between release and the server's bind is the usual small race.
    """
    with reserved_ports(n, host) as ports:
        return ports


@contextlib.contextmanager
def reserved_ports(n: int, host: str = "127.0.0.1") -> Iterator[list[int]]:
    """``n`` distinct free ports, held (bound, not listening) until the block ends: whatever
    else the block binds to port 0 -- a proxy's listener, say -- cannot be given one of them."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        yield [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# --- processes ---------------------------------------------------------------------------


def _proc_state(pid: int) -> str | None:
    """The one-letter state from /proc/<pid>/stat (``Z`` = zombie), None if not readable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces or ')'.
    return stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else None


def pid_stopped(pid: int) -> bool:
    """True if ``pid`` is stopped (SIGSTOP, or a debugger holds it): alive, and answering
    nothing until it is continued."""
    return _proc_state(pid) in ("T", "t")


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is a live process. A zombie is dead: it holds no ports or files, and
    only its parent (maybe not us) can reap it."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return _proc_state(pid) != "Z"


def _cmdline(pid: int) -> list[str] | None:
    """The argv of ``pid``, or None if it cannot be read (gone, or no /proc and no ps)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        # As Python spelled the argv it started (undecodable bytes as surrogates), so a path
        # that is not UTF-8 matches the one recorded; "replace" made it another program.
        return [os.fsdecode(a) for a in raw.split(b"\0") if a]
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return None  # /proc works; the process is gone
    except OSError:
        return None
    # No /proc (macOS): ps prints the command line as one string.
    try:
        out = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.split() if out.returncode == 0 and out.stdout.strip() else None


@dataclass(frozen=True, slots=True)
class ServerProcess:
    """One server of a local cluster, as recorded in the state file."""

    id: str
    pid: int
    rpc_addr: str
    http_addr: str
    log: Path
    argv: tuple[str, ...]
    started_at: str

    @property
    def status_url(self) -> str:
        scheme = "https" if "--tls_cert" in self.argv else "http"
        return f"{scheme}://{self.http_addr}/"

    def to_json(self, base: Path) -> dict[str, Any]:
        return {
            "id": self.id,
            "pid": self.pid,
            "rpc_addr": self.rpc_addr,
            "http_addr": self.http_addr,
            "log": os.path.relpath(self.log, base),
            "argv": list(self.argv),
            "started_at": self.started_at,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any], base: Path) -> ServerProcess:
        return cls(
            id=str(raw["id"]),
            pid=int(raw["pid"]),
            rpc_addr=str(raw["rpc_addr"]),
            http_addr=str(raw["http_addr"]),
            log=base / str(raw["log"]),
            argv=tuple(str(a) for a in raw["argv"]),
            started_at=str(raw.get("started_at", "")),
        )


@dataclass(frozen=True, slots=True)
class ServerStop:
    """What ``down`` did to one server."""

    id: str
    pid: int
    outcome: str  # "stopped", "killed", "not running", "not ours"
    seconds: float = 0.0

    def describe(self) -> str:
        if self.outcome == "stopped":
            return f"{self.id} (pid {self.pid}): stopped gracefully in {self.seconds:.1f} s"
        if self.outcome == "killed":
            return (
                f"{self.id} (pid {self.pid}): did not stop within {self.seconds:.0f} s "
                "of SIGTERM; killed"
            )
        if self.outcome == "not ours":
            return (
                f"{self.id}: pid {self.pid} is now another program (the server exited and the "
                "PID was reused); left alone"
            )
        return f"{self.id} (pid {self.pid}): was not running"


# --- the cluster ---------------------------------------------------------------------------


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


# The lock a tablet server holds on its data directory while it runs, its PID inside
# (``tserver.data_dir_lock.LOCK_FILE``; the launcher does not import the server).
_SERVER_LOCK = "server.lock"


def data_dir_in_use(data_dir: Path) -> int | None:
    """The PID of the server holding ``data_dir``'s lock (-1 if it wrote none), or None
    when no process holds it."""
    try:
        fd = os.open(data_dir / _SERVER_LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 64, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _holds_data(data_dir: Path) -> bool:
    """Whether a server's data directory holds anything (a server that ran there)."""
    try:
        return any(data_dir.iterdir())
    except FileNotFoundError:
        return False


def launch_flags(
    extra_flags: Sequence[str] = (),
    *,
    cpu_affinity: str = "auto",
    term_check_mode: str | None = None,
    log_inject_latency_ms: float | None = None,
) -> list[str]:
    """The flags ``LocalCluster.create`` gives every server besides its own (config, id,
    certificates): ``--cpu_affinity`` first, so one in ``extra_flags`` wins over it, then
    ``extra_flags``, then the options with flags of their own (``""``: no affinity)."""
    flags = ["--cpu_affinity", cpu_affinity] if cpu_affinity else []
    flags += extra_flags
    if term_check_mode is not None:
        flags += ["--term_check_mode", term_check_mode]
    if log_inject_latency_ms is not None:
        flags += ["--log_inject_latency_ms", f"{log_inject_latency_ms:g}"]
    return flags


@dataclass
class LocalCluster:
    """A local cluster: its directory, config and the processes in its state file."""

    data_dir: Path
    config: ClusterConfig
    servers: dict[str, ServerProcess] = field(default_factory=dict)
    # Popen handles of the processes this object started, so their exit status is collected
    # (no zombies while the starting process lives on, e.g. in a test).
    _children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    @property
    def config_path(self) -> Path:
        return self.data_dir / CONFIG_FILE

    @property
    def state_path(self) -> Path:
        return self.data_dir / STATE_FILE

    # --- creating and starting ---------------------------------------------------------

    @classmethod
    def create(
        cls,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        servers: int | None = None,
        tablets: int | None = None,
        term_check_mode: str | None = None,
        log_inject_latency_ms: float | None = None,
        extra_flags: Sequence[str] = (),
        base_port: int | None = None,
        tls: bool = False,
        raft: RaftTimings | None = None,
        cpu_affinity: str = "auto",
        ready_timeout_s: float = READY_TIMEOUT_S,
        leader_timeout_s: float = LEADER_TIMEOUT_S,
        on_progress: Callable[[str], None] | None = None,
    ) -> LocalCluster:
        """Write the config (unless ``data_dir`` holds one already), start every server as a
        detached process and wait until each has printed its ready line and every tablet
        has a ready leader.

        ``data_dir`` None makes a new temporary directory. A directory that already holds a
        ``cluster.toml`` restarts that cluster (same servers, ports and data); ``servers``
        and ``tablets``, if given, must then match it. ``servers``/``tablets`` default to 3/4.
        ``cpu_affinity`` is every server's ``--cpu_affinity``: ``auto`` (the default) gives
        each server one CPU, round-robin over this machine's, since they all share it
        (``tserver.cpu_affinity``); ``""`` leaves placement to the OS.  A restart that gives
        none of ``extra_flags``, ``term_check_mode`` and ``log_inject_latency_ms`` starts the
        servers with those of the last start (``LAUNCH_FILE``), as a restart of some of them
        does; one that gives any starts them with only what it gives, and says what it drops.
        Raises ``LauncherError`` (after stopping whatever it started) on any failure.
        """
        say = on_progress or (lambda _msg: None)
        if data_dir is None:
            root = Path(tempfile.mkdtemp(prefix="raftlet-")).resolve()
        else:
            root = _abspath(data_dir)
            try:
                root.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise LauncherError(f"cannot make the data directory {root}: {e}") from None
        config_path = root / CONFIG_FILE
        if not config_path.exists() and any(root.iterdir()):
            # `cluster down --remove-data` removes the directory whole: never one that
            # holds anything but the cluster it made.
            raise LauncherError(
                f"{root} holds files but no cluster (no {CONFIG_FILE}): give a new or "
                "empty directory"
            )
        if (root / STATE_FILE).exists():
            existing = cls.load(root)
            existing._forget_dropped(say)
            # One restarted by hand runs too (``_live``).
            running = [p for sid in existing.servers if (p := existing._live(sid)) is not None]
            stopped = [s for s in existing.servers.values() if s.id not in {p.id for p in running}]
            # Servers added to cluster.toml since the cluster started: started only with
            # the whole cluster (their flags are the start's), never beside running ones.
            unstarted = [s.id for s in existing.config.servers if s.id not in existing.servers]
            later = (
                f"; {', '.join(unstarted)}, added to {CONFIG_FILE} since it started, "
                f"{'is' if len(unstarted) == 1 else 'are'} not running: `raftlet cluster down "
                f"--data-dir {root}` then `up` starts every server of the config"
                if unstarted and running
                else ""
            )
            if running and not stopped:
                pids = ", ".join(f"{s.id}={s.pid}" for s in running)
                raise ClusterRunningError(
                    f"a cluster is already running in {root} ({pids}){later}; "
                    f"stop it with: raftlet cluster down --data-dir {root}"
                )
            if running:
                # Some crashed or were killed: start those again, as they were started.
                changes = {
                    "--tserver-flag": bool(extra_flags),
                    "--term-check-mode": term_check_mode is not None,
                    "--log-inject-latency-ms": log_inject_latency_ms is not None,
                    "--base-port": base_port is not None,
                    "--tls": tls and local_tls_files(root) is None,
                }
                given = [flag for flag, on in changes.items() if on]
                if given:
                    raise ClusterRunningError(
                        f"{', '.join(s.id for s in running)} of the cluster in {root} are "
                        f"running: the others start again as they were, without "
                        f"{', '.join(given)}; to change flags, `raftlet cluster down` first"
                    )
                _check_matches(existing.config, servers, tablets, root)
                existing._start_again(stopped, ready_timeout_s, leader_timeout_s, say)
                if later:
                    say(later[2:])
                return existing
            _LaunchOptions.keep_from(root, existing.servers.values())
            (root / STATE_FILE).unlink()  # stale: every process is gone
        # Ports the kernel picked for a new cluster were only free when picked: if a server
        # finds one taken, the cluster (nothing in it yet) starts again on new ones.
        may_repick = base_port is None and not config_path.exists()
        options = _LaunchOptions(tuple(extra_flags), term_check_mode, log_inject_latency_ms)
        if config_path.exists():
            try:
                config = load_cluster_config(config_path)
            except ClusterConfigError as e:
                raise LauncherError(f"{root} holds an invalid cluster config: {e}") from None
            _check_matches(config, servers, tablets, root)
            if base_port is not None:
                raise LauncherError(
                    f"{root} already holds a cluster with its ports in cluster.toml; omit "
                    "--base-port to restart it, or use a new --data-dir"
                )
            if any(_holds_data(s.data_dir) for s in config.servers):
                say(f"restarting the cluster in {root} (its data is kept)")
                options = _options_again(root, options, say)
            else:
                say(f"starting the cluster of {config_path}")
        else:
            (root / MADE_BY_UP_FILE).write_text(
                "made by `raftlet cluster up`: `raftlet cluster down --remove-data` removes "
                "this directory whole\n"
            )
            config = write_cluster_config(
                new_config(
                    root,
                    servers=3 if servers is None else servers,
                    tablets=4 if tablets is None else tablets,
                    base_port=base_port,
                    raft=raft,
                    token_ports=tls,
                ),
                config_path,
            )
        if tls and local_tls_files(root) is None:
            say(f"making a CA and certificates in {root / TLS_DIR}")
            _make_certs(root, config.servers)
        elif local_tls_files(root) is not None:
            # Servers added to the config since: certificates from the same CA.
            added = [s for s in config.servers if not _has_server_cert(root, s.id)]
            if added:
                say(f"making certificates for {', '.join(s.id for s in added)}")
                _make_certs(root, added, clients=False)
        if local_tls_files(root) is not None:
            _make_tokens(root / TLS_DIR / TOKENS_FILE)
        options.record(root)
        flags = launch_flags(
            options.extra_flags,
            cpu_affinity=cpu_affinity,
            term_check_mode=options.term_check_mode,
            log_inject_latency_ms=options.log_inject_latency_ms,
        )
        for attempt in range(1, PORT_ATTEMPTS + 1):
            cluster = cls(root, config)
            try:
                cluster._start_all(flags, ready_timeout_s, leader_timeout_s, say)
            except BaseException as e:
                # Includes KeyboardInterrupt: a Ctrl-C during `up` must not leave orphans.
                with contextlib.suppress(Exception):
                    cluster.down(timeout=10.0)
                taken = isinstance(e, LauncherError) and PORT_TAKEN in e.details
                if not (taken and may_repick and attempt < PORT_ATTEMPTS):
                    raise
                say(f"{e}; starting again on new ports")
                for s in config.servers:
                    shutil.rmtree(s.data_dir, ignore_errors=True)
                config = write_cluster_config(
                    new_config(
                        root,
                        servers=len(config.servers),
                        tablets=len(config.placements()),
                        raft=config.raft,
                        token_ports=tls,
                    ),
                    config_path,
                )
            else:
                return cluster
        raise AssertionError("unreachable")

    def _forget_dropped(self, say: Callable[[str], None]) -> None:
        """Before an `up`: servers taken out of cluster.toml are not started again, and one
        that still runs must be stopped first (``ClusterRunningError``): counted with the
        config's servers, it would pass for one of them."""
        dropped = self.dropped()
        running = [sid for sid in dropped if self._live(sid) is not None]
        if running:
            raise ClusterRunningError("; ".join(self._dropped_but_running(s) for s in running))
        if dropped:
            for sid in dropped:
                del self.servers[sid]
            self._save()
            say(f"{', '.join(dropped)}, no longer in {CONFIG_FILE}, not started again")

    def _start_all(
        self,
        flags: Sequence[str],
        ready_timeout_s: float,
        leader_timeout_s: float,
        say: Callable[[str], None],
    ) -> None:
        # Servers that hold data first, then those added to the config: a server with an
        # empty data directory asks the others which groups run without it before it makes
        # replicas, and one that asked before they listened made replicas of groups that
        # exist (two such servers formed groups of their own).
        holding = [s for s in self.config.servers if _holds_data(s.data_dir)]
        added = [s for s in self.config.servers if s not in holding]
        # A new cluster's servers start together and answer nobody until each has made its
        # replicas: each would wait out --empty_dir_wait_s for the others, to no purpose.
        new = [] if holding else [_NEW_CLUSTER_FLAG]
        for wave in (holding, added) if holding else (added,):
            for s in wave:
                # The caller's flags last: argparse keeps the last value, so they win.
                self._spawn(s, [*self.tls_flags(s.id), *new, *flags])
            for s in wave:
                self._wait_ready(s.id, ready_timeout_s)
                token = f", token port {s.token_rpc_addr}" if s.token_rpc_addr else ""
                status = self.servers[s.id].status_url
                say(f"{s.id} ready: rpc {s.rpc_addr}{token}, status {status}")
        self.wait_leaders(leader_timeout_s)

    def _start_again(
        self,
        stopped: Sequence[ServerProcess],
        ready_timeout_s: float,
        leader_timeout_s: float,
        say: Callable[[str], None],
    ) -> None:
        """Start ``stopped`` servers (no longer running) with the flags they had."""
        for old in stopped:
            say(f"{old.id} is not running (pid {old.pid}): starting it again")
            self._spawn(self.config.server(old.id), _flags_again(old))
        for old in stopped:
            self._wait_ready(old.id, ready_timeout_s)
            say(f"{old.id} ready: rpc {old.rpc_addr}, status {self.servers[old.id].status_url}")
        health = self.wait_leaders(leader_timeout_s, rolling=True)
        restarted = {old.id for old in stopped}
        for server in health.servers:
            # Not one of this start's, nor one added to the config since (it never ran).
            if server.state == "DOWN" and server.id in self.servers.keys() - restarted:
                # Its process runs, so `up` left it alone and called the cluster up: a
                # paused (SIGSTOP) or hung server read as one of the servers up (r30a).
                pid = self.servers[server.id].pid
                say(
                    f"{server.id} (pid {pid}) runs but does not answer ({server.error}): "
                    f"paused or hung? `raftlet cluster status --data-dir {self.data_dir}` "
                    "shows it; stopping it (`cluster down --server`) and `up` starts it again"
                )
        short: dict[str, list[TabletHealth]] = {}
        for t in health.tablets:
            if t.leader is None and not t.lost_majority:  # that one `up` reports itself
                short.setdefault(t.table, []).append(t)
        for table, tablets in sorted(short.items()):
            present = min(_present(t) for t in tablets)
            say(
                f"table {table}: {present} of {len(tablets[0].replicas)} replicas of its "
                "tablets exist so far, too few to elect a leader (a table new to cluster.toml: "
                "restart the other servers the same way, and each tablet gets a leader once "
                "a majority of its servers run this config)"
            )

    def tls_flags(self, server_id: str) -> list[str]:
        """The tserver flags of ``server_id``'s certificates; [] for a plaintext cluster."""
        tls = self.data_dir / TLS_DIR
        if local_tls_files(self.data_dir) is None:
            return []
        tokens = tls / TOKENS_FILE
        return [
            "--tls_cert", str(tls / f"server-{server_id}.crt"),
            "--tls_key", str(tls / f"server-{server_id}.key"),
            "--tls_ca", str(tls / "ca.crt"),
            *(["--auth_tokens_file", str(tokens)] if tokens.exists() else []),
        ]  # fmt: skip

    @property
    def probe_credentials(self) -> Any:
        """Channel credentials of the admin certificate (None: plaintext cluster)."""
        files = local_tls_files(self.data_dir)
        if files is None:
            return None
        from raftlet.client.tls import TlsOptions, channel_credentials

        return channel_credentials(TlsOptions(*files))

    def _spawn(self, server: ServerConfig, flags: Sequence[str]) -> None:
        log_path = self.data_dir / f"{server.id}.log"
        argv = [
            sys.executable,
            "-m",
            "raftlet",
            "tserver",
            "--config",
            str(self.config_path),
            "--server_id",
            server.id,
            *flags,
        ]
        # The server's user's alone, as the files the server makes (its --umask): a log
        # names keys and values of failed writes.
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # a log made before (by an older launcher) too
        with os.fdopen(fd, "ab") as log:  # the child keeps its own descriptor
            log.write(f"\n==== {_now()} raftlet cluster up: starting {server.id}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                argv,
                # `-m raftlet` resolves against the working directory first; the project
                # root makes a source checkout work even if it is not installed.
                cwd=_project_root(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=_child_env(),
            )
        self._children[server.id] = proc
        self.servers[server.id] = ServerProcess(
            server.id, proc.pid, server.rpc_addr, server.http_addr, log_path, tuple(argv), _now()
        )
        self._save()

    def _wait_ready(self, server_id: str, timeout: float) -> None:
        """Wait for the server's ready line in its log (it prints it on stdout, which goes
        there). Only the part of the log written by this start counts."""
        proc = self._children[server_id]
        log = self.servers[server_id].log
        marker = f"raftlet tserver {server_id} ready"
        start_marker = f"raftlet cluster up: starting {server_id}"
        deadline = time.monotonic() + timeout
        while True:
            this_start = _this_start(_read_text(log), start_marker)
            if marker in this_start:
                return
            code = proc.poll()
            if code is not None:
                raise LauncherError(
                    f"{server_id} {_exited(code)} before it was ready "
                    f"(log: {log}): {_last_error_line(this_start)}",
                    _tail(this_start),
                )
            if time.monotonic() > deadline:
                raise LauncherError(
                    f"{server_id} printed no ready line within {timeout:.0f} s (log: {log})",
                    _tail(this_start),
                )
            time.sleep(_POLL_S)

    def wait_leaders(
        self, timeout: float = LEADER_TIMEOUT_S, *, rolling: bool = False
    ) -> ClusterHealth:
        """Wait until every tablet has a ready leader; the health seen then. Not for a
        tablet that lost a majority of its replicas (``TabletHealth.lost_majority``: it
        cannot elect one; the wait took the whole timeout, then stopped every server, whose
        other tablets would serve). ``rolling`` (some servers restarted while the others
        run): nor for a tablet with too few replicas to elect one -- a table added to the
        config, whose replicas only the servers restarted with it have made."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_children()
            health = self.health(ProbeOptions(timeout_s=2.0))
            missing = [
                t.tablet_id
                for t in health.tablets
                if t.leader is None
                and not t.lost_majority
                and not (rolling and 2 * _present(t) <= len(t.replicas))
            ]
            if not missing:
                return health
            if time.monotonic() > deadline:
                # The servers the check could not ask: their leaders may well exist (a
                # certificate that expired said "no ready leader" and nothing else).
                unasked = "".join(
                    f"; {s.id} did not answer the check: {s.error or s.state}"
                    for s in health.servers
                    if s.state != "UP"
                )
                # A server that makes no replica until its peers tell it whether it ran.
                unasked += "".join(
                    f"; {i}" for i in health.issues if "started with an empty data directory" in i
                )
                raise LauncherError(
                    f"no ready leader within {timeout:.0f} s for {', '.join(missing)}{unasked} "
                    f"(server logs in {self.data_dir})"
                )
            time.sleep(0.1)

    def _check_children(self) -> None:
        """``LauncherError`` if a server this launcher started has exited since it was
        ready: waiting for leaders then took the whole timeout, and blamed the refused
        connections of the check."""
        for sid, proc in self._children.items():
            code = proc.poll()
            if code is None:
                continue
            log = self.servers[sid].log
            this_start = _this_start(_read_text(log), f"raftlet cluster up: starting {sid}")
            raise LauncherError(
                f"{sid} {_exited(code)} after it was ready (log: {log}): "
                f"{_last_error_line(this_start)}",
                _tail(this_start),
            )

    # --- finding -----------------------------------------------------------------------

    @classmethod
    def load(cls, data_dir: str | os.PathLike[str]) -> LocalCluster:
        """The cluster whose state is in ``data_dir`` (``NoClusterError`` if none)."""
        root = _abspath(data_dir)
        state_path = root / STATE_FILE
        try:
            raw = json.loads(state_path.read_text())
        except FileNotFoundError:
            hint = (
                " (it has a cluster.toml: the cluster is stopped; start it with "
                f"`raftlet cluster up --data-dir {root}`)"
                if (root / CONFIG_FILE).exists()
                else ""
            )
            raise NoClusterError(
                f"no local cluster in {root}: {STATE_FILE} not found{hint}"
            ) from None
        except (OSError, ValueError) as e:
            raise LauncherError(f"cannot read {state_path}: {e}") from None
        if not isinstance(raw, dict) or raw.get("format") != STATE_FORMAT:
            raise LauncherError(f"{state_path} is not a raftlet cluster state file")
        try:
            config = load_cluster_config(root / CONFIG_FILE)
        except ClusterConfigError as e:
            raise LauncherError(str(e)) from None
        try:
            servers = {s["id"]: ServerProcess.from_json(s, root) for s in raw.get("servers", [])}
        except (KeyError, TypeError, ValueError) as e:
            raise LauncherError(f"{state_path}: malformed server entry ({e})") from None
        return cls(root, config, servers)

    def _save(self) -> None:
        doc = {
            "format": STATE_FORMAT,
            "config": CONFIG_FILE,
            "updated_at": _now(),
            "servers": [s.to_json(self.data_dir) for s in self.servers.values()],
        }
        # Atomic, so a `down` racing an `up` never reads half a file; synced, so a power cut
        # leaves the servers' PIDs and flags of one save or the other, never an empty file.
        fd, tmp = tempfile.mkstemp(dir=self.data_dir, prefix=".cluster.json.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=2)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.state_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    # --- inspecting --------------------------------------------------------------------

    def _reap_children(self) -> None:
        # Servers this object started are our children: collect the exit status of those
        # that ended, so none lingers as a zombie (and the PID check works without /proc).
        for proc in self._children.values():
            proc.poll()

    def owns(self, server: ServerProcess) -> bool:
        """True if ``server.pid`` is alive and is this cluster's tserver ``server.id``."""
        self._reap_children()
        if not pid_alive(server.pid):
            return False
        argv = _cmdline(server.pid)
        if argv is None:
            return False
        # The config path as it was passed at start (recorded in the state file), so a
        # data dir spelled differently now (a symlink, a relative path) still matches.
        recorded = list(server.argv)
        config = recorded[recorded.index("--config") + 1] if "--config" in recorded else ""
        joined = " ".join(argv)
        # Both checks: "tserver" alone would match another cluster's server with a reused
        # PID; the config path alone would match an editor that has the file open.
        return "tserver" in joined and bool(config) and config in joined and server.id in joined

    def _holder(self, server_id: str) -> ServerProcess | None:
        """Server ``server_id`` as the process holding its data directory's lock, if that
        is this cluster's tserver ``server_id`` (``owns``) under another PID than the one
        recorded; None otherwise."""
        s = self.servers[server_id]
        if server_id not in self.config.server_ids:
            return None  # taken out of cluster.toml: its recorded PID is all there is
        pid = data_dir_in_use(self.config.server(server_id).data_dir)
        if pid is None or pid <= 0 or pid == s.pid:
            return None
        # Holding this data directory's lock is the server's own mark; its command line
        # need not name the config as `up` did (a relative path, run from elsewhere).
        argv = _cmdline(pid)
        joined = " ".join(argv or ())
        if "tserver" in joined and server_id in joined:
            return dataclasses.replace(s, pid=pid)
        return None

    def running(self) -> dict[str, bool]:
        """Server id -> whether its process is alive (and ours): the one recorded, or one
        restarted by hand that holds its data directory (``_live``)."""
        live = self.pids()
        return {sid: sid in live for sid in self.servers}

    def pids(self) -> dict[str, int]:
        """Server id -> the PID of its running process (``running``); stopped ones absent."""
        return {sid: p.pid for sid in self.servers if (p := self._live(sid)) is not None}

    def _live(self, server_id: str) -> ServerProcess | None:
        """Server ``server_id``'s running process: the one recorded if it is ours, else one
        restarted by hand (``_holder``); None if it runs nowhere."""
        s = self.servers[server_id]
        return s if self.owns(s) else self._holder(server_id)

    def health(self, options: ProbeOptions | None = None) -> ClusterHealth:
        """A ksck-style check of the cluster (see ``client.health``), with process state."""
        options = options or ProbeOptions()
        if options.credentials is None:
            options = dataclasses.replace(options, credentials=self.probe_credentials)
        running = self.running()
        health = check_cluster(self.config, options, processes=running)
        self.note_dropped(health, running)
        return health

    def note_dropped(self, health: ClusterHealth, running: Mapping[str, bool]) -> None:
        """Add to ``health`` (a check of this cluster's config) the servers ``dropped`` from
        it that still run (``running``: server id -> process alive): a WARN each."""
        for sid in self.dropped():
            if running.get(sid):
                health.issues.append(self._dropped_but_running(sid))
                health.severity = max(health.severity, Severity.WARN)

    def dropped(self) -> list[str]:
        """Servers this cluster started that its cluster.toml no longer lists (taken out
        after `replace-server` emptied them): stopped by `down`, never started again."""
        return [sid for sid in self.servers if sid not in self.config.server_ids]

    def _dropped_but_running(self, server_id: str) -> str:
        return (
            f"server {server_id} (pid {self.servers[server_id].pid}) still runs but is no "
            f"longer in {CONFIG_FILE}: `raftlet cluster down --data-dir {self.data_dir} "
            f"--server {server_id}` stops it"
        )

    def status(self, options: ProbeOptions | None = None) -> ClusterHealth:
        """Alias of ``health`` (the name ``raftlet cluster status`` uses)."""
        return self.health(options)

    # --- stopping ----------------------------------------------------------------------

    def down(self, timeout: float = DOWN_TIMEOUT_S, only: str | None = None) -> list[ServerStop]:
        """Stop every server (or ``only`` that one: a rolling restart, which ``up`` then
        finishes): SIGTERM, wait up to ``timeout`` s, SIGKILL the rest, verify.

        Removes the state file once no recorded process is left (not for ``only``). Raises
        ``LauncherError`` (keeping the state file) if a process survives SIGKILL.
        """
        if only is not None and only not in self.servers:
            raise LauncherError(
                f"no server {only!r} in {self.data_dir} (it has {', '.join(self.servers)})"
            )
        chosen = [only] if only is not None else list(self.servers)
        results: dict[str, ServerStop] = {}
        targets: dict[str, ServerProcess] = {}
        self._reap_children()
        for sid in chosen:
            s = self.servers[sid]
            # The PID recorded, or (restarted by hand: a rolling upgrade, say) the server
            # of this cluster that holds the data directory's lock.
            live = self._live(sid)
            if live is not None:
                targets[sid] = live
            elif not pid_alive(s.pid):
                results[sid] = ServerStop(sid, s.pid, "not running")
            else:
                results[sid] = ServerStop(sid, s.pid, "not ours")
        start = time.monotonic()
        for s in targets.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(s.pid, signal.SIGTERM)
        pending = dict(targets)
        deadline = start + timeout
        while pending and time.monotonic() < deadline:
            self._reap_children()
            for sid, s in list(pending.items()):
                if not pid_alive(s.pid):
                    results[sid] = ServerStop(sid, s.pid, "stopped", time.monotonic() - start)
                    del pending[sid]
            if pending:
                time.sleep(_POLL_S)
        for sid, s in pending.items():
            # Re-check ownership as it was found (the PID recorded, or the holder of the
            # data directory's lock): in the timeout the process may have exited and its
            # PID been reused. ``owns`` alone would spare a server restarted by hand, whose
            # command line need not name the config as `up` did.
            again = self._live(sid)
            if again is not None and again.pid == s.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(s.pid, signal.SIGKILL)
            results[sid] = ServerStop(sid, s.pid, "killed", timeout)
        kill_deadline = time.monotonic() + _KILL_WAIT_S
        survivors = list(pending.values())
        while survivors and time.monotonic() < kill_deadline:
            self._reap_children()
            survivors = [s for s in survivors if pid_alive(s.pid)]
            if survivors:
                time.sleep(_POLL_S)
        for sid, proc in self._children.items():
            # Our own children: collect their status so none lingers as a zombie.
            if sid in chosen:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=1.0)
        left = [p for sid in chosen if (p := self._live(sid)) is not None]
        if left:
            pids = ", ".join(f"{s.id}={s.pid}" for s in left)
            raise LauncherError(f"still running after SIGKILL: {pids}; {self.state_path} kept")
        if only is None:
            # The state file holds the flags the servers ran with: kept for the next `up`.
            _LaunchOptions.keep_from(self.data_dir, self.servers.values())
            with contextlib.suppress(FileNotFoundError):
                self.state_path.unlink()
            self._children.clear()
        else:
            self._children.pop(only, None)
        return [results[sid] for sid in chosen]

    def restart_server(
        self,
        server_id: str,
        before_start: Callable[[], None] | None = None,
        *,
        stop_timeout: float = DOWN_TIMEOUT_S,
        ready_timeout: float = READY_TIMEOUT_S,
    ) -> ServerProcess:
        """Stop one server this object started (SIGTERM, SIGKILL after ``stop_timeout``),
        call ``before_start`` while it is down (a bench wipes its files there), start it
        again with the same flags and wait for its ready line."""
        old = self.servers[server_id]
        proc = self._children.get(server_id)
        if proc is None:
            raise LauncherError(f"{server_id} was not started by this launcher")
        with contextlib.suppress(ProcessLookupError):
            os.kill(old.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=_KILL_WAIT_S)
        if before_start is not None:
            before_start()
        self._spawn(self.config.server(server_id), _flags_again(old))
        self._wait_ready(server_id, ready_timeout)
        return self.servers[server_id]

    def remove_data(self) -> None:
        """Delete the data directory (only when nothing runs)."""
        if any(self.running().values()):
            raise LauncherError(f"refusing to remove {self.data_dir}: servers are running")
        shutil.rmtree(self.data_dir, ignore_errors=True)


# --- helpers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _LaunchOptions:
    """The options of `cluster up` that become server flags, kept for the next start."""

    extra_flags: tuple[str, ...] = ()
    term_check_mode: str | None = None
    log_inject_latency_ms: float | None = None

    def given(self) -> bool:
        return bool(self.extra_flags) or (
            self.term_check_mode is not None or self.log_inject_latency_ms is not None
        )

    def words(self) -> list[str]:
        """As `cluster up` options, for the messages."""
        out = [f"--tserver-flag={f}" for f in self.extra_flags]
        if self.term_check_mode is not None:
            out.append(f"--term-check-mode {self.term_check_mode}")
        if self.log_inject_latency_ms is not None:
            out.append(f"--log-inject-latency-ms {self.log_inject_latency_ms:g}")
        return out

    def record(self, root: Path) -> None:
        doc = {
            "extra_flags": list(self.extra_flags),
            "term_check_mode": self.term_check_mode,
            "log_inject_latency_ms": self.log_inject_latency_ms,
        }
        try:
            (root / LAUNCH_FILE).write_text(json.dumps(doc) + "\n")
        except OSError as e:
            raise LauncherError(f"cannot write {root / LAUNCH_FILE}: {e}") from None

    @classmethod
    def keep_from(cls, root: Path, servers: Iterable[ServerProcess]) -> None:
        """Write ``LAUNCH_FILE`` from the flags a server ran with, unless there is one: a
        cluster started by a build from before the record (and restarted by this one) kept
        its flags only in the state file, which `down` removes."""
        if not root.is_dir() or (root / LAUNCH_FILE).exists():
            return  # removed meanwhile, or recorded already
        first = next(iter(servers), None)
        if first is not None and first.id in first.argv:
            # A convenience: a stop never fails for it (the next `up` says it found none).
            with contextlib.suppress(LauncherError):
                cls.from_flags(_flags_again(first)).record(root)

    @classmethod
    def from_flags(cls, flags: Sequence[str]) -> _LaunchOptions:
        """The options ``launch_flags`` (and the certificates' flags) made ``flags`` of."""
        extra: list[str] = []
        term_check_mode: str | None = None
        latency: float | None = None
        rest = list(flags)
        while rest:
            flag = rest.pop(0)
            if flag == _NEW_CLUSTER_FLAG:
                continue  # a new cluster's first start only (``_start_all``)
            if flag in _OWN_VALUE_FLAGS and rest:
                value = rest.pop(0)
                if flag == "--term_check_mode":
                    term_check_mode = value
                elif flag == "--log_inject_latency_ms":
                    latency = float(value)
            else:
                extra.append(flag)
        return cls(tuple(extra), term_check_mode, latency)

    @classmethod
    def recorded(cls, root: Path) -> _LaunchOptions | None:
        """The last start's, or None (none recorded: a cluster from before the record, or
        one whose record cannot be read, which is said rather than guessed at)."""
        try:
            doc = json.loads((root / LAUNCH_FILE).read_text())
            latency = doc["log_inject_latency_ms"]
            return cls(
                tuple(str(f) for f in doc["extra_flags"]),
                None if doc["term_check_mode"] is None else str(doc["term_check_mode"]),
                None if latency is None else float(latency),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise LauncherError(
                f"cannot read {root / LAUNCH_FILE} (the server flags of the last start): "
                f"{e}; remove it to start with only the flags given now"
            ) from None


# Flags with a value of their own that `up` sets (the options and the certificates), not
# the caller's --tserver-flag.
_OWN_VALUE_FLAGS = frozenset(
    {
        "--cpu_affinity",
        "--term_check_mode",
        "--log_inject_latency_ms",
        "--tls_cert",
        "--tls_key",
        "--tls_ca",
        "--auth_tokens_file",
    }
)


def _options_again(root: Path, given: _LaunchOptions, say: Callable[[str], None]) -> _LaunchOptions:
    """The options a restart of the whole cluster starts the servers with: the last start's,
    unless the command gives some (then only those, and it says which it drops)."""
    last = _LaunchOptions.recorded(root)
    if last is None:
        say(
            f"no record of the server flags of its last start ({LAUNCH_FILE}): starting it "
            "with only those this command gives"
        )
        return given
    if not last.given():
        return given
    if not given.given():
        say(f"with the server flags of its last start: {' '.join(last.words())}")
        return last
    dropped = [w for w in last.words() if w not in given.words()]
    if dropped:
        say(f"without the last start's {' '.join(dropped)}, which this command does not give")
    return given


# What a new cluster's first start passes (``_start_all``), and never a restart: a server
# started again may have lost its data directory, and must wait for its peers to say so.
_NEW_CLUSTER_FLAG = "--empty_dir_wait_s=0"


def _flags_again(old: ServerProcess) -> list[str]:
    """The flags ``old`` ran with, to start it again: all but the new cluster's no-wait (a
    wiped server restarted with it asked a paused peer once, took itself for new, and its
    forgotten vote elected an empty leader)."""
    flags = old.argv[old.argv.index(old.id) + 1 :]
    return [f for f in flags if f != _NEW_CLUSTER_FLAG]


TLS_DIR = "tls"
ADMIN_CLIENT = "admin"
TOKENS_FILE = "tokens"


def local_tls_files(data_dir: Path) -> tuple[Path, Path, Path] | None:
    """(CA, admin certificate, its key) of a cluster started with ``up --tls`` in
    ``data_dir``; None if it has none (a plaintext cluster)."""
    tls = Path(data_dir) / TLS_DIR
    files = (tls / "ca.crt", tls / f"client-{ADMIN_CLIENT}.crt", tls / f"client-{ADMIN_CLIENT}.key")
    return files if all(f.exists() for f in files) else None


def _has_server_cert(root: Path, server_id: str) -> bool:
    from raftlet.deploy.certs import server_cert_paths

    paths = server_cert_paths(root / TLS_DIR, server_id)
    return paths.cert.exists() and paths.key.exists()


def _make_certs(root: Path, servers: Sequence[ServerConfig], *, clients: bool = True) -> None:
    """Certificates for ``servers`` (and the admin client's, unless not ``clients``), signed
    by the CA in ``root``'s TLS directory (made if missing)."""
    from raftlet.cluster.identity import AccessRole
    from raftlet.deploy.certs import CertError, ClientSpec, create_certs

    hosts = sorted({"127.0.0.1", "localhost"} | {s.rpc_addr.rpartition(":")[0] for s in servers})
    try:
        create_certs(
            root / TLS_DIR,
            servers=[s.id for s in servers],
            hosts=hosts,
            clients=[ClientSpec(ADMIN_CLIENT, AccessRole.ADMIN)] if clients else [],
        )
    except CertError as e:
        raise LauncherError(f"cannot make certificates: {e}") from None


def _make_tokens(path: Path) -> None:
    """A random bearer token per role, in the servers' ``--auth_tokens_file`` format,
    readable by the owner only (made so before the secrets are written)."""
    import secrets

    from raftlet.cluster.identity import AccessRole

    if path.exists():
        return
    roles = (AccessRole.READER, AccessRole.WRITER, AccessRole.ADMIN)
    lines = [f"{secrets.token_urlsafe(32)} {r.label} local-{r.label}\n" for r in roles]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# TOKEN ROLE NAME -- bearer tokens of this local cluster (keep secret)\n")
        f.writelines(lines)


def local_tokens(data_dir: Path) -> dict[str, str]:
    """Role → bearer token of a cluster started with ``up --tls`` ({} if none)."""
    path = Path(data_dir) / TLS_DIR / TOKENS_FILE
    if not path.exists():
        return {}
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) == 3 and not line.startswith("#"):
            out[fields[1]] = fields[0]
    return out


def new_config(
    root: Path,
    *,
    servers: int = 3,
    tablets: int = 4,
    base_port: int | None = None,
    raft: RaftTimings | None = None,
    host: str = "127.0.0.1",
    name: str = "local",
    token_ports: bool = False,
) -> ClusterConfig:
    """The config of a fresh local cluster: servers ts1..tsN on ``host``, one table ``kv``
    of ``tablets`` hash partitions replicated min(3, N) times.

    Ports: ``base_port`` gives server i RPC port ``base_port + i`` and status port
    ``base_port + 1000 + i`` (7051 → 7051, 8051, …: Kudu's convention); None asks the kernel.
    ``token_ports`` (a TLS cluster) adds a token port per server, ``base_port + 2000 + i``.
    """
    if not 1 <= servers <= MAX_SERVERS:
        raise LauncherError(f"--servers must be in 1..{MAX_SERVERS}, got {servers}")
    kinds = 3 if token_ports else 2
    if base_port is None:
        ports = free_ports(kinds * servers, host)
        rpc_ports, http_ports, token = ports[0::kinds], ports[1::kinds], ports[2::kinds]
    else:
        if base_port < 1 or base_port + 1000 * (kinds - 1) + servers > 65535:
            raise LauncherError(f"base port {base_port} leaves no room for {servers} servers")
        rpc_ports = [base_port + i for i in range(servers)]
        http_ports = [base_port + 1000 + i for i in range(servers)]
        token = [base_port + 2000 + i for i in range(servers)] if token_ports else []
    server_configs = tuple(
        ServerConfig(
            id=f"ts{i + 1}",
            rpc_addr=f"{host}:{rpc_ports[i]}",
            http_addr=f"{host}:{http_ports[i]}",
            data_dir=root / f"ts{i + 1}",
            token_rpc_addr=f"{host}:{token[i]}" if token_ports else "",
        )
        for i in range(servers)
    )
    try:
        table = TableConfig(DEFAULT_TABLE, KV_SCHEMA, tablets, min(3, servers))
        return ClusterConfig(name, server_configs, (table,), raft or RaftTimings())
    except ClusterConfigError as e:
        raise LauncherError(f"invalid cluster: {e}") from None


def _check_matches(
    config: ClusterConfig, servers: int | None, tablets: int | None, root: Path
) -> None:
    have_tablets = len(config.placements())
    if servers is not None and servers != len(config.servers):
        raise LauncherError(
            f"{root} already holds a cluster of {len(config.servers)} servers (asked for "
            f"{servers}); omit --servers to restart it, or use a new --data-dir"
        )
    if tablets is not None and tablets != have_tablets:
        raise LauncherError(
            f"{root} already holds a cluster of {have_tablets} tablets (asked for {tablets}); "
            "omit --tablets to restart it, or use a new --data-dir"
        )


def _abspath(path: str | os.PathLike[str]) -> Path:
    # abspath also folds "..", so `up --data-dir ../x` and a later `down --data-dir /a/x`
    # name the same cluster.
    return Path(os.path.abspath(Path(path).expanduser()))


def _project_root() -> Path:
    # deploy/local.py -> the directory holding the cli/, tserver/, ... packages.
    return Path(__file__).resolve().parents[1]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # The server's log lines should reach its log file as they happen, not at exit.
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _tail(text: str, n: int = 20) -> str:
    return "\n".join(text.splitlines()[-n:])


def _this_start(text: str, start_marker: str) -> str:
    """The part of a server's log its latest start wrote, from the line after the
    launcher's marker line (cut at the marker itself, the rest of that line passed for the
    server's last words)."""
    at = text.rfind(start_marker)
    if at < 0:
        return text
    end = text.find("\n", at)
    return "" if end < 0 else text[end + 1 :]


def _exited(code: int) -> str:
    """How a process ended, from its ``returncode`` (negative: killed by that signal)."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _last_error_line(text: str) -> str:
    """The most telling line of a failed start: the last error, else the last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("====")]
    for ln in reversed(lines):
        if "error" in ln.lower() or "Error" in ln:
            return ln
    return lines[-1] if lines else "(no output)"


def _present(tablet: TabletHealth) -> int:
    """How many of ``tablet``'s replicas exist on a server that answers."""
    return sum(r.present for r in tablet.replicas)
