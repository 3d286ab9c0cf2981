"""What makes a cluster config valid: names, addresses, counts, and the rules across servers
and tables.

The model's constructors call these (``RaftTimings``, ``ServerConfig``, ``TableConfig`` and
``ClusterConfig`` check themselves in ``__post_init__``), so a config built by hand, parsed
from TOML or received from a server is equally trustworthy. Every problem is one
``ClusterConfigError`` naming the field; the TOML reader adds the file and line.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from raftlet.cluster.errors import ClusterConfigError
from raftlet.schema.schema import Schema

if TYPE_CHECKING:
    from raftlet.cluster.model import ClusterConfig, RaftTimings, ServerConfig, TableConfig

__all__ = [
    "MAX_ELECTION_SPAN_MS",
    "MAX_ELECTION_TICKS",
    "MAX_NAME_LENGTH",
    "MAX_PARTITIONS",
    "MAX_TICK_INTERVAL_MS",
    "MIN_TICK_INTERVAL_MS",
    "bare_host",
    "check_cluster",
    "check_raft_timings",
    "check_server",
    "check_table",
    "parse_host_port",
]

# Every tablet replica is a Raft group with its own threads and files; a typo such as
# `partitions = 20000` would otherwise take the server down at start.
MAX_PARTITIONS = 1024
MAX_NAME_LENGTH = 64

# Server ids are Raft node ids and the default data directory name; table names are the
# prefix of tablet ids, which are directory names. So both are restricted to characters that
# are safe in a path on every file system, and cannot be "." or "..".
_SERVER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_TABLE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*\Z")
# A DNS name or IPv4 address (underscores allowed: container names often have them).
_HOSTNAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?\Z")
_PORT = re.compile(r"[0-9]{1,5}\Z")

# Raft timings. Below a millisecond a tick is shorter than the ticker thread's own wake-up
# (0.001 ms ran endless elections at 50-90% CPU on an idle cluster); past a minute a
# follower would take many minutes to notice a dead leader, and a value such as 1e13 once
# overflowed the ticker's wait and killed it.
MIN_TICK_INTERVAL_MS = 1.0
MAX_TICK_INTERVAL_MS = 60_000.0
# Ticks in an election timeout: 10,000 is 10 s at the shortest tick and ~17 minutes at the
# default 100 ms. And whatever the tick, election_ticks x tick_interval_ms is at most half
# an hour, so a follower (which waits a random [N, 2N) ticks) notices a dead leader within
# an hour; 99999999999999999999 was accepted and no election ever came.
MAX_ELECTION_TICKS = 10_000
MAX_ELECTION_SPAN_MS = 1_800_000.0


def bare_host(host: str) -> str:
    """``host`` as the socket API takes it: an IPv6 literal without the brackets a
    ``host:port`` address writes it in (``[::1]`` -> ``::1``); any other host as it is."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def host_port(host: str, port: int) -> str:
    """``host:port`` as an address is written, an IPv6 literal in brackets (``[::1]:7051``):
    the inverse of ``parse_host_port``."""
    host = bare_host(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback_addr(addr: str) -> bool:
    """Whether ``host:port`` binds only loopback: ``localhost`` or a loopback IP. Any other
    name could resolve anywhere, so it counts as not loopback."""
    host = addr.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_host_port(addr: str) -> tuple[str, int]:
    """Split ``host:port`` (IPv6 in brackets: ``[::1]:7051``); ValueError saying what is wrong.

    Port 0 ("any free port") is refused: peers and clients dial the address in the config,
    so it must be the real one.
    """
    if not isinstance(addr, str):
        raise ValueError(f"must be a string 'host:port', got {type(addr).__name__}")
    if "://" in addr:
        raise ValueError(f"{addr!r}: give host:port, without a scheme (e.g. 127.0.0.1:7051)")
    host, sep, port = addr.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{addr!r} is not host:port (e.g. 127.0.0.1:7051)")
    if not _PORT.match(port) or not 1 <= int(port) <= 65535:
        raise ValueError(f"{addr!r}: port must be a number in 1..65535")
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1] if host.endswith("]") else "not closed")
        except ValueError:
            raise ValueError(f"{addr!r}: {host!r} is not a bracketed IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"{addr!r}: an IPv6 address needs brackets, e.g. [::1]:{port}")
    elif not _HOSTNAME.match(host):
        raise ValueError(f"{addr!r}: {host!r} is not a valid host name or address")
    return host, int(port)


def _is_int(value: object) -> bool:
    # bool is an int subclass, and `partitions = true` is a mistake, not 1.
    return isinstance(value, int) and not isinstance(value, bool)


def check_raft_timings(timings: RaftTimings) -> None:
    t = timings.tick_interval_ms
    if (
        not isinstance(t, int | float)
        or isinstance(t, bool)
        or not math.isfinite(t)
        or not MIN_TICK_INTERVAL_MS <= t <= MAX_TICK_INTERVAL_MS
    ):
        raise ClusterConfigError(
            f"must be a number of milliseconds in {MIN_TICK_INTERVAL_MS:g}.."
            f"{MAX_TICK_INTERVAL_MS:g}, got {t!r}",
            "tick_interval_ms",
        )
    heartbeat = timings.heartbeat_ticks
    if not _is_int(heartbeat) or not 1 <= heartbeat < MAX_ELECTION_TICKS:
        raise ClusterConfigError(
            f"must be an integer in 1..{MAX_ELECTION_TICKS - 1}, got {heartbeat!r}",
            "heartbeat_ticks",
        )
    election = timings.election_ticks
    if not _is_int(election) or election <= heartbeat:
        # The core's rule (Config.validate): a follower must not time out between two
        # heartbeats of a healthy leader.
        raise ClusterConfigError(
            f"must be an integer greater than heartbeat_ticks ({heartbeat}), got {election!r}",
            "election_ticks",
        )
    if election > MAX_ELECTION_TICKS:
        raise ClusterConfigError(
            f"must be at most {MAX_ELECTION_TICKS}, got {election}", "election_ticks"
        )
    if election * t > MAX_ELECTION_SPAN_MS:
        raise ClusterConfigError(
            f"{election} ticks of {t:g} ms is an election timeout of {election * t / 1000:g} s; "
            f"election_ticks x tick_interval_ms must be at most {MAX_ELECTION_SPAN_MS:.0f} ms "
            "(30 minutes), or a dead leader goes unnoticed for up to twice that: lower one "
            "of them",
            "election_ticks",
        )


def check_server(server: ServerConfig) -> None:
    if not isinstance(server.id, str) or not _SERVER_ID.match(server.id):
        raise ClusterConfigError(
            f"{server.id!r} is not a valid server id (ASCII letters, digits, '_', '.', '-', "
            "starting with a letter or digit)",
            "id",
        )
    if len(server.id) > MAX_NAME_LENGTH:
        raise ClusterConfigError(f"longer than {MAX_NAME_LENGTH} characters", "id")
    names = ("rpc_addr", "http_addr", "token_rpc_addr")
    for name in names if server.token_rpc_addr else names[:2]:
        try:
            parse_host_port(getattr(server, name))
        except ValueError as e:
            raise ClusterConfigError(str(e), name) from None
    if server.rpc_addr == server.http_addr:
        raise ClusterConfigError(
            f"{server.http_addr!r} is also this server's rpc_addr", "http_addr"
        )
    if server.token_rpc_addr in (server.rpc_addr, server.http_addr):
        raise ClusterConfigError(
            f"{server.token_rpc_addr!r} is also another of this server's addresses",
            "token_rpc_addr",
        )
    data_dir: object = server.data_dir
    if not isinstance(data_dir, Path):
        raise ClusterConfigError(f"must be a path, got {data_dir!r}", "data_dir")


def check_table(table: TableConfig) -> None:
    if not isinstance(table.name, str) or not _TABLE_NAME.match(table.name):
        raise ClusterConfigError(
            f"{table.name!r} is not a valid table name (ASCII letters, digits, '_' and '-', "
            "not starting with '-'; it becomes part of tablet directory names)",
            "name",
        )
    if len(table.name) > MAX_NAME_LENGTH:
        raise ClusterConfigError(f"longer than {MAX_NAME_LENGTH} characters", "name")
    schema: object = table.schema
    if not isinstance(schema, Schema):
        raise ClusterConfigError(f"must be a Schema, got {type(schema).__name__}", "schema")
    if not _is_int(table.partitions) or not 1 <= table.partitions <= MAX_PARTITIONS:
        raise ClusterConfigError(
            f"must be an integer in 1..{MAX_PARTITIONS}, got {table.partitions!r}",
            "partitions",
        )
    rf = table.replication_factor
    if not _is_int(rf) or rf < 1:
        raise ClusterConfigError(f"must be an integer >= 1, got {rf!r}", "replication_factor")


def check_cluster(config: ClusterConfig) -> None:
    """The invariants that span servers and tables (each item checked itself already)."""
    # Late: model imports this module to validate in its constructors, and the checks below
    # need its classes at run time (a hand-built config may hold anything).
    from raftlet.cluster.model import RaftTimings, ServerConfig, TableConfig

    name = config.name
    if not isinstance(name, str) or not name or len(name) > 128:
        raise ClusterConfigError(
            f"must be a non-empty string of at most 128 characters, got {name!r}", "cluster.name"
        )
    if any(not ch.isprintable() for ch in name):
        raise ClusterConfigError(f"{name!r} contains non-printable characters", "cluster.name")
    raft: object = config.raft
    if not isinstance(raft, RaftTimings):
        raise ClusterConfigError(f"must be RaftTimings, got {type(raft).__name__}", "raft")
    if not config.servers:
        raise ClusterConfigError("at least one [[servers]] entry is needed", "servers")
    ids: dict[str, int] = {}
    addrs: dict[str, str] = {}
    dirs: dict[str, int] = {}
    for i, s in enumerate(config.servers):
        if not isinstance(s, ServerConfig):
            raise ClusterConfigError(
                f"is a {type(s).__name__}, not a ServerConfig", f"servers[{i}]"
            )
        if s.id in ids:
            raise ClusterConfigError(
                f"duplicate server id {s.id!r} (also servers[{ids[s.id]}])", f"servers[{i}].id"
            )
        ids[s.id] = i
        for key in ("rpc_addr", "http_addr", "token_rpc_addr"):
            addr = getattr(s, key)
            if not addr:
                continue
            if addr in addrs:
                raise ClusterConfigError(
                    f"address {addr!r} is already {addrs[addr]}", f"servers[{i}].{key}"
                )
            addrs[addr] = f"servers[{i}].{key}"
        # Two servers in one directory would corrupt each other's replicas.
        d = os.path.normpath(s.data_dir)
        if d in dirs:
            raise ClusterConfigError(
                f"data_dir {str(s.data_dir)!r} is also servers[{dirs[d]}]'s",
                f"servers[{i}].data_dir",
            )
        dirs[d] = i
    names: dict[str, int] = {}
    for i, t in enumerate(config.tables):
        if not isinstance(t, TableConfig):
            raise ClusterConfigError(f"is a {type(t).__name__}, not a TableConfig", f"tables[{i}]")
        # Ignoring case: tablet ids are directory names, and some file systems fold case.
        folded = t.name.lower()
        if folded in names:
            raise ClusterConfigError(
                f"duplicate table name {t.name!r} (also tables[{names[folded]}]; "
                "names are compared ignoring case)",
                f"tables[{i}].name",
            )
        names[folded] = i
        if t.replication_factor > len(config.servers):
            raise ClusterConfigError(
                f"{t.replication_factor} is more than the {len(config.servers)} servers "
                "(each replica needs its own server)",
                f"tables[{i}].replication_factor",
            )
