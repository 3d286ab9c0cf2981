"""The cluster config: which servers exist, which tables they serve, and where each tablet lives.

One TOML file (read with the stdlib ``tomllib``) names the servers and the tables; every
server and every client derives the same tablet placement from it, so there is no master::

    [cluster]
    name = "demo"
    [raft]                      # optional, all have defaults
    tick_interval_ms = 100
    election_ticks = 10
    heartbeat_ticks = 3
    [[servers]]
    id = "ts1"
    rpc_addr = "127.0.0.1:7051"
    http_addr = "127.0.0.1:8051"
    data_dir = "ts1"            # optional; relative to the file's directory; default = id
    [[tables]]
    name = "kv"
    partitions = 2
    replication_factor = 3
    columns = [
      { name = "key", type = "INT64", key = true },
      { name = "value", type = "STRING", nullable = true },
    ]

Rules this module keeps:

- **Validated once, in the constructors.** ``ServerConfig``, ``TableConfig``, ``RaftTimings``
  and ``ClusterConfig`` check their invariants in ``__post_init__``, so a config built by hand,
  parsed from TOML or received from a server (``from_pb``) is equally trustworthy. The TOML
  layer adds what only it can know: unknown keys, missing keys, wrong TOML types, and the line
  an error is on. Every problem is one ``ConfigError`` whose message names the field
  (``servers[1].rpc_addr``) and, when parsed from a file, ``file:line``.
- **Placement is a pure function of the config** (``ClusterConfig.placements``). Tablet
  ``<table>-p<partition>`` gets ``replication_factor`` consecutive servers of the ring of
  servers sorted by id, starting at ``(crc32(table name) + partition) % len(servers)``.
  Consecutive partitions start one server further on, so replicas (and, since every replica
  is equally likely to win an election, leaders) spread evenly; the per-table hash offset keeps
  partition 0 of every table from landing on the same servers. CRC-32, never ``hash()``, which
  is salted per process. Sorting by id makes the order of ``[[servers]]`` in the file
  irrelevant. ``tests/unit/test_cluster_config.py`` pins a golden placement: changing this
  function re-homes every tablet of every existing cluster.
- **The server set is fixed for a cluster's life.** raftlet has no membership changes, so
  adding or removing a ``[[servers]]`` entry moves tablets between servers whose data dirs
  still hold the old replicas. Start a new cluster (new data dirs) instead.
- ``dump_cluster_config`` writes TOML that loads back equal (hand-written: the stdlib reads
  TOML but cannot write it, and the format here is small).
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import re
import tempfile
import tomllib
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from raftlet.proto import tablet_pb2
from raftlet.schema.schema import ColumnSchema, Schema, SchemaError
from raftlet.schema.types import DataType

__all__ = [
    "MAX_PARTITIONS",
    "ClusterConfig",
    "ConfigError",
    "NotInConfigError",
    "RaftTimings",
    "ServerConfig",
    "TableConfig",
    "TabletPlacement",
    "dump_cluster_config",
    "load_cluster_config",
    "parse_cluster_config",
    "parse_host_port",
    "tablet_id",
    "write_cluster_config",
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


class ConfigError(ValueError):
    """The cluster config is invalid. ``str()`` is one line: ``[source[:line]: ][field: ]reason``.

    ``field`` is a path into the config such as ``servers[1].rpc_addr`` or
    ``tables[0].columns[2].type`` (indices 0-based, in file order).
    """

    def __init__(
        self,
        reason: str,
        field: str = "",
        *,
        source: str | None = None,
        line: int | None = None,
    ) -> None:
        self.reason = reason
        self.field = field
        self.source = source
        self.line = line
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.source is not None:
            where = f"{self.source}:{self.line}: " if self.line else f"{self.source}: "
        elif self.line:
            where = f"line {self.line}: "
        return f"{where}{self.field}: {self.reason}" if self.field else f"{where}{self.reason}"

    def within(self, prefix: str) -> ConfigError:
        """The same error with ``prefix`` (e.g. ``servers[1]``) put before its field."""
        joined = f"{prefix}.{self.field}" if self.field else prefix
        return ConfigError(self.reason, joined, source=self.source, line=self.line)


class NotInConfigError(ConfigError, LookupError):
    """A server, table or tablet looked up by name is not in the config."""


def parse_host_port(addr: str) -> tuple[str, int]:
    """Split ``host:port`` (IPv6 in brackets: ``[::1]:7051``); ValueError saying what is wrong.

    Port 0 ("any free port") is refused: peers and clients dial the address in the config,
    so it must be the real one.
    """
    if not isinstance(addr, str):
        raise ValueError(f"must be a string 'host:port', got {type(addr).__name__}")
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


def tablet_id(table: str, partition: int) -> str:
    """The id of partition ``partition`` of ``table``: ``<table>-p<partition>``.

    Unique across tables: the suffix after the last ``-p`` is all digits, so the table name
    and partition can be read back unambiguously even if the table name contains ``-p``.
    """
    return f"{table}-p{partition}"


def _is_int(value: object) -> bool:
    # bool is an int subclass, and `partitions = true` is a mistake, not 1.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class RaftTimings:
    """How wall time becomes Raft ticks (see ``consensus.core.Config``).

    A follower that hears no leader for a random ``[election_ticks, 2 * election_ticks)``
    ticks campaigns; a leader heartbeats every ``heartbeat_ticks`` ticks.  The defaults give
    1-2 s election timeouts and a heartbeat every 300 ms: three or more per timeout (Kudu's
    ratio), and a third of the idle traffic of a heartbeat per tick, which with 64 tablets
    per server was most of an idle server's CPU.  A follower learns a new commit index with
    the next append or heartbeat.
    """

    tick_interval_ms: float = 100
    election_ticks: int = 10
    heartbeat_ticks: int = 3

    def __post_init__(self) -> None:
        t = self.tick_interval_ms
        if not isinstance(t, int | float) or isinstance(t, bool) or not math.isfinite(t) or t <= 0:
            raise ConfigError(
                f"must be a positive number of milliseconds, got {t!r}", "tick_interval_ms"
            )
        if not _is_int(self.heartbeat_ticks) or self.heartbeat_ticks < 1:
            raise ConfigError(
                f"must be an integer >= 1, got {self.heartbeat_ticks!r}", "heartbeat_ticks"
            )
        if not _is_int(self.election_ticks) or self.election_ticks <= self.heartbeat_ticks:
            # The core's rule (Config.validate): a follower must not time out between two
            # heartbeats of a healthy leader.
            raise ConfigError(
                f"must be an integer greater than heartbeat_ticks ({self.heartbeat_ticks}), "
                f"got {self.election_ticks!r}",
                "election_ticks",
            )

    @property
    def tick_interval_s(self) -> float:
        return self.tick_interval_ms / 1000.0


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One tablet server. ``data_dir`` is where it keeps its replicas (absolute once loaded
    from a file; received from a server via ``from_pb`` it is just ``Path(id)``)."""

    id: str
    rpc_addr: str
    http_addr: str
    data_dir: Path

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _SERVER_ID.match(self.id):
            raise ConfigError(
                f"{self.id!r} is not a valid server id (ASCII letters, digits, '_', '.', '-', "
                "starting with a letter or digit)",
                "id",
            )
        if len(self.id) > MAX_NAME_LENGTH:
            raise ConfigError(f"longer than {MAX_NAME_LENGTH} characters", "id")
        for name in ("rpc_addr", "http_addr"):
            try:
                parse_host_port(getattr(self, name))
            except ValueError as e:
                raise ConfigError(str(e), name) from None
        if self.rpc_addr == self.http_addr:
            raise ConfigError(f"{self.http_addr!r} is also this server's rpc_addr", "http_addr")
        data_dir: object = self.data_dir
        if isinstance(data_dir, str) and data_dir:  # a convenience for hand-built configs
            object.__setattr__(self, "data_dir", Path(data_dir))
        elif not isinstance(data_dir, Path):
            raise ConfigError(f"must be a path, got {data_dir!r}", "data_dir")

    def to_pb(self) -> tablet_pb2.ServerPB:
        return tablet_pb2.ServerPB(uuid=self.id, rpc_addr=self.rpc_addr, http_addr=self.http_addr)


@dataclass(frozen=True, slots=True)
class TableConfig:
    """A table: its schema, split into ``partitions`` hash partitions (one tablet each), each
    replicated on ``replication_factor`` servers."""

    name: str
    schema: Schema
    partitions: int
    replication_factor: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _TABLE_NAME.match(self.name):
            raise ConfigError(
                f"{self.name!r} is not a valid table name (ASCII letters, digits, '_' and '-', "
                "not starting with '-'; it becomes part of tablet directory names)",
                "name",
            )
        if len(self.name) > MAX_NAME_LENGTH:
            raise ConfigError(f"longer than {MAX_NAME_LENGTH} characters", "name")
        if not isinstance(self.schema, Schema):
            raise ConfigError(f"must be a Schema, got {type(self.schema).__name__}", "schema")
        if not _is_int(self.partitions) or not 1 <= self.partitions <= MAX_PARTITIONS:
            raise ConfigError(
                f"must be an integer in 1..{MAX_PARTITIONS}, got {self.partitions!r}",
                "partitions",
            )
        if not _is_int(self.replication_factor) or self.replication_factor < 1:
            raise ConfigError(
                f"must be an integer >= 1, got {self.replication_factor!r}", "replication_factor"
            )

    def to_pb(self) -> tablet_pb2.TablePB:
        return tablet_pb2.TablePB(
            name=self.name,
            schema=self.schema.to_pb(),
            num_partitions=self.partitions,
            replication_factor=self.replication_factor,
        )


@dataclass(frozen=True, slots=True)
class TabletPlacement:
    """Where one tablet lives. ``replicas`` are server ids, sorted: the Raft voters, in the
    same order on every server (the order carries no meaning, e.g. no preferred leader)."""

    tablet_id: str
    table: str
    partition: int
    replicas: tuple[str, ...]

    def to_pb(self) -> tablet_pb2.TabletPB:
        return tablet_pb2.TabletPB(
            tablet_id=self.tablet_id,
            table_name=self.table,
            partition=self.partition,
            replica_uuids=self.replicas,
        )

    @classmethod
    def from_pb(cls, pb: tablet_pb2.TabletPB) -> TabletPlacement:
        return cls(pb.tablet_id, pb.table_name, pb.partition, tuple(pb.replica_uuids))


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The whole cluster. ``path`` is the file it was loaded from (not part of equality: the
    same config written elsewhere is the same config)."""

    name: str
    servers: tuple[ServerConfig, ...]
    tables: tuple[TableConfig, ...]
    raft: RaftTimings = field(default_factory=RaftTimings)
    path: Path | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # Accept lists from hand-built configs; store tuples so the config stays immutable.
        object.__setattr__(self, "servers", tuple(self.servers))
        object.__setattr__(self, "tables", tuple(self.tables))
        _check_cluster(self)

    # --- lookups -------------------------------------------------------------------------

    @property
    def server_ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.servers)

    def server(self, server_id: str) -> ServerConfig:
        """The server ``server_id``; ``NotInConfigError`` listing the known ids otherwise."""
        for s in self.servers:
            if s.id == server_id:
                return s
        raise NotInConfigError(
            f"unknown server id {server_id!r} (known: {', '.join(self.server_ids)})"
        )

    def table(self, name: str) -> TableConfig:
        for t in self.tables:
            if t.name == name:
                return t
        known = ", ".join(t.name for t in self.tables) or "none"
        raise NotInConfigError(f"unknown table {name!r} (known: {known})")

    # --- placement -----------------------------------------------------------------------

    def placements(self) -> list[TabletPlacement]:
        """Every tablet and its replicas, tables in config order, partitions ascending.

        A pure function of the server ids and the tables: see the module docstring.
        """
        ring = sorted(self.server_ids)
        n = len(ring)
        out: list[TabletPlacement] = []
        for t in self.tables:
            base = zlib.crc32(t.name.encode("utf-8"))
            for p in range(t.partitions):
                start = (base + p) % n
                chosen = sorted(ring[(start + i) % n] for i in range(t.replication_factor))
                out.append(TabletPlacement(tablet_id(t.name, p), t.name, p, tuple(chosen)))
        return out

    def placements_for(self, server_id: str) -> list[TabletPlacement]:
        """The tablets of which ``server_id`` hosts a replica (it must be in the config)."""
        self.server(server_id)
        return [p for p in self.placements() if server_id in p.replicas]

    def placement(self, tablet: str) -> TabletPlacement:
        for p in self.placements():
            if p.tablet_id == tablet:
                return p
        raise NotInConfigError(f"unknown tablet {tablet!r}")

    # --- wire form -----------------------------------------------------------------------

    def to_pb(self) -> tablet_pb2.GetClusterConfigResponse:
        """What ``GetClusterConfig`` answers: servers, tables and the placement."""
        return tablet_pb2.GetClusterConfigResponse(
            servers=[s.to_pb() for s in self.servers],
            tables=[t.to_pb() for t in self.tables],
            tablets=[p.to_pb() for p in self.placements()],
        )

    @classmethod
    def from_pb(
        cls, pb: tablet_pb2.GetClusterConfigResponse, *, name: str = "remote"
    ) -> ClusterConfig:
        """A client's view of a server's config, validated like a file.

        The response carries no cluster name, Raft timings or data dirs (they are the
        servers' business): the config gets ``name``, default timings and ``data_dir =
        Path(id)``. The placement the server sent must equal the one computed here, or the
        client would route rows to the wrong tablets (a client and a server of different
        raftlet versions); that is a ``ConfigError``.
        """
        servers = []
        for i, s in enumerate(pb.servers):
            try:
                servers.append(ServerConfig(s.uuid, s.rpc_addr, s.http_addr, Path(s.uuid or "_")))
            except ConfigError as e:
                raise e.within(f"servers[{i}]") from None
        tables = []
        for i, t in enumerate(pb.tables):
            try:
                schema = Schema.from_pb(t.schema)
            except SchemaError as e:
                raise ConfigError(str(e), f"tables[{i}].columns") from None
            try:
                tables.append(TableConfig(t.name, schema, t.num_partitions, t.replication_factor))
            except ConfigError as e:
                raise e.within(f"tables[{i}]") from None
        config = cls(name, tuple(servers), tuple(tables))
        sent = [TabletPlacement.from_pb(t) for t in pb.tablets]
        expected = config.placements()
        if sent != expected:
            diff = next(
                (
                    f"{a.tablet_id} on {list(a.replicas)} vs {list(b.replicas)}"
                    for a, b in zip(sent, expected, strict=False)
                    if a != b
                ),
                f"{len(sent)} tablets vs {len(expected)}",
            )
            raise ConfigError(
                f"the server's placement differs from the one computed here ({diff}); "
                "are client and server different raftlet versions?",
                "tablets",
            )
        return config


def _check_cluster(config: ClusterConfig) -> None:
    """The invariants that span servers and tables (each item checked itself already)."""
    name = config.name
    if not isinstance(name, str) or not name or len(name) > 128:
        raise ConfigError(
            f"must be a non-empty string of at most 128 characters, got {name!r}", "cluster.name"
        )
    if any(not ch.isprintable() for ch in name):
        raise ConfigError(f"{name!r} contains non-printable characters", "cluster.name")
    if not isinstance(config.raft, RaftTimings):
        raise ConfigError(f"must be RaftTimings, got {type(config.raft).__name__}", "raft")
    if not config.servers:
        raise ConfigError("at least one [[servers]] entry is needed", "servers")
    ids: dict[str, int] = {}
    addrs: dict[str, str] = {}
    dirs: dict[str, int] = {}
    for i, s in enumerate(config.servers):
        if not isinstance(s, ServerConfig):
            raise ConfigError(f"is a {type(s).__name__}, not a ServerConfig", f"servers[{i}]")
        if s.id in ids:
            raise ConfigError(
                f"duplicate server id {s.id!r} (also servers[{ids[s.id]}])", f"servers[{i}].id"
            )
        ids[s.id] = i
        for key in ("rpc_addr", "http_addr"):
            addr = getattr(s, key)
            if addr in addrs:
                raise ConfigError(
                    f"address {addr!r} is already {addrs[addr]}", f"servers[{i}].{key}"
                )
            addrs[addr] = f"servers[{i}].{key}"
        # Two servers in one directory would corrupt each other's replicas.
        d = os.path.normpath(s.data_dir)
        if d in dirs:
            raise ConfigError(
                f"data_dir {str(s.data_dir)!r} is also servers[{dirs[d]}]'s",
                f"servers[{i}].data_dir",
            )
        dirs[d] = i
    names: dict[str, int] = {}
    for i, t in enumerate(config.tables):
        if not isinstance(t, TableConfig):
            raise ConfigError(f"is a {type(t).__name__}, not a TableConfig", f"tables[{i}]")
        # Ignoring case: tablet ids are directory names, and some file systems fold case.
        folded = t.name.lower()
        if folded in names:
            raise ConfigError(
                f"duplicate table name {t.name!r} (also tables[{names[folded]}]; "
                "names are compared ignoring case)",
                f"tables[{i}].name",
            )
        names[folded] = i
        if t.replication_factor > len(config.servers):
            raise ConfigError(
                f"{t.replication_factor} is more than the {len(config.servers)} servers "
                "(each replica needs its own server)",
                f"tables[{i}].replication_factor",
            )


# --- TOML reading ------------------------------------------------------------------------


def load_cluster_config(path: str | os.PathLike[str]) -> ClusterConfig:
    """Read and validate the TOML file at ``path``; data dirs resolve against its directory."""
    p = Path(path).absolute()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(
            f"cannot read the cluster config: {e.strerror or e}", source=str(path)
        ) from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"not UTF-8 text ({e.reason} at byte {e.start})", source=str(path)
        ) from None
    return _parse(text, p.parent, path=p, source=str(path))


def parse_cluster_config(text: str, base_dir: str | os.PathLike[str] = ".") -> ClusterConfig:
    """Parse and validate TOML ``text``; relative ``data_dir``s resolve against ``base_dir``."""
    return _parse(text, Path(base_dir), path=None, source=None)


def _parse(text: str, base_dir: Path, *, path: Path | None, source: str | None) -> ClusterConfig:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # tomllib's message already ends with "(at line N, column M)".
        raise ConfigError(f"invalid TOML: {e}", source=source) from None
    try:
        return _build(doc, base_dir, path)
    except ConfigError as e:
        line = e.line if e.line is not None else _Locator(text).line_of(e.field)
        raise ConfigError(e.reason, e.field, source=source, line=line) from None


_TOP_KEYS = ("cluster", "raft", "servers", "tables")
_CLUSTER_KEYS = ("name",)
_RAFT_KEYS = ("tick_interval_ms", "election_ticks", "heartbeat_ticks")
_SERVER_KEYS = ("id", "rpc_addr", "http_addr", "data_dir")
_TABLE_KEYS = ("name", "partitions", "replication_factor", "columns")
_COLUMN_KEYS = ("name", "type", "key", "nullable")


class _Table:
    """One TOML table being read: typed getters that name the field in their errors."""

    def __init__(self, raw: object, where: str, allowed: tuple[str, ...], what: str) -> None:
        if not isinstance(raw, dict):
            raise ConfigError(f"must be a table ({what}), got {_toml_type(raw)}", where)
        self.raw: dict[str, Any] = raw
        self.where = where
        for key in raw:
            if key not in allowed:
                hint = difflib.get_close_matches(key, allowed, n=1, cutoff=0.7)
                maybe = f"did you mean {hint[0]!r}? " if hint else ""
                raise ConfigError(
                    f"unknown key {key!r} ({maybe}expected one of: {', '.join(allowed)})",
                    self.path(key),
                )

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, kind: type | tuple[type, ...], what: str, default: Any = ...) -> Any:
        if key not in self.raw:
            if default is ...:
                raise ConfigError(f"missing (expected {what})", self.path(key))
            return default
        value = self.raw[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            shown = "" if isinstance(value, dict | list) else f" {value!r}"
            raise ConfigError(f"must be {what}, got {_toml_type(value)}{shown}", self.path(key))
        return value


def _toml_type(value: object) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        list: "an array",
        dict: "a table",
    }
    return next((n for t, n in names.items() if isinstance(value, t)), type(value).__name__)


def _build(doc: dict[str, Any], base_dir: Path, path: Path | None) -> ClusterConfig:
    top = _Table(doc, "", _TOP_KEYS, "the document")
    cluster = _Table(
        top.get("cluster", dict, "a [cluster] table"), "cluster", _CLUSTER_KEYS, "[cluster]"
    )
    name = cluster.get("name", str, "a string")

    raft_raw = _Table(top.get("raft", dict, "a [raft] table", {}), "raft", _RAFT_KEYS, "[raft]")
    defaults = RaftTimings()
    tick = raft_raw.get("tick_interval_ms", (int, float), "a number", defaults.tick_interval_ms)
    election = raft_raw.get("election_ticks", int, "an integer", defaults.election_ticks)
    heartbeat = raft_raw.get("heartbeat_ticks", int, "an integer", defaults.heartbeat_ticks)
    try:
        raft = RaftTimings(tick, election, heartbeat)
    except ConfigError as e:
        raise e.within("raft") from None

    servers = []
    for i, raw in enumerate(_array_of_tables(top, "servers", "[[servers]]")):
        where = f"servers[{i}]"
        s = _Table(raw, where, _SERVER_KEYS, "[[servers]]")
        sid = s.get("id", str, "a string")
        data_dir = s.get("data_dir", str, "a string (a path)", sid)
        if not data_dir:
            raise ConfigError("must not be empty", s.path("data_dir"))
        rpc_addr = s.get("rpc_addr", str, "a string 'host:port'")
        http_addr = s.get("http_addr", str, "a string 'host:port'")
        try:
            # Relative to the config file, so a cluster directory can be moved whole.
            servers.append(
                ServerConfig(sid, rpc_addr, http_addr, base_dir / Path(data_dir).expanduser())
            )
        except ConfigError as e:
            raise e.within(where) from None

    tables = []
    for i, raw in enumerate(_array_of_tables(top, "tables", "[[tables]]", required=False)):
        where = f"tables[{i}]"
        t = _Table(raw, where, _TABLE_KEYS, "[[tables]]")
        tname = t.get("name", str, "a string")
        partitions = t.get("partitions", int, "an integer")
        rf = t.get("replication_factor", int, "an integer")
        columns = t.get("columns", list, "an array of column tables")
        cols = [_column(c, f"{where}.columns[{j}]") for j, c in enumerate(columns)]
        try:
            schema = Schema(cols)
        except SchemaError as e:
            # Schema's own message ("key column 'k' cannot be nullable") is the clear one.
            raise ConfigError(str(e), f"{where}.columns") from None
        try:
            tables.append(TableConfig(tname, schema, partitions, rf))
        except ConfigError as e:
            raise e.within(where) from None

    return ClusterConfig(name, tuple(servers), tuple(tables), raft, path)


def _array_of_tables(top: _Table, key: str, what: str, required: bool = True) -> list[Any]:
    value = top.get(key, list, f"an array of tables ({what})", ... if required else [])
    return cast(list[Any], value)


def _column(raw: object, where: str) -> ColumnSchema:
    c = _Table(raw, where, _COLUMN_KEYS, "{ name = ..., type = ... }")
    name = c.get("name", str, "a string")
    type_name = c.get("type", str, "a string naming a type")
    try:
        # Case-insensitive: "int64" cannot mean anything else.
        dtype = DataType[type_name.upper()]
    except KeyError:
        known = ", ".join(t.name for t in DataType)
        raise ConfigError(
            f"unknown column type {type_name!r} (expected one of: {known})", f"{where}.type"
        ) from None
    return ColumnSchema(
        name,
        dtype,
        c.get("nullable", bool, "true or false", False),
        c.get("key", bool, "true or false", False),
    )


_HEADER = re.compile(r"\s*(\[\[?)\s*([A-Za-z0-9_.-]+)\s*\]\]?\s*(?:#.*)?\Z")
_FIELD_PART = re.compile(r"([A-Za-z0-9_.-]+?)(?:\[(\d+)\])?(?:\.|\Z)")


class _Locator:
    """Best-effort: the 1-based line of a field path such as ``servers[1].rpc_addr``.

    Understands the layout this module documents and writes (``[table]``, ``[[array]]``
    headers, ``key = value`` lines, one inline table per column); returns the nearest
    enclosing line it can be sure of, or None rather than a wrong line.
    """

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        # (line index, name, occurrence) of every header.
        self.headers: list[tuple[int, str, int]] = []
        seen: dict[str, int] = {}
        for i, line in enumerate(self.lines):
            m = _HEADER.match(line)
            if m:
                name = m.group(2)
                occurrence = seen.get(name, 0) if m.group(1) == "[[" else 0
                seen[name] = occurrence + 1
                self.headers.append((i, name, occurrence))

    def line_of(self, field_path: str) -> int | None:
        parts = [(m.group(1), m.group(2)) for m in _FIELD_PART.finditer(field_path) if m.group(1)]
        if not parts:
            return None
        (name, index), rest = parts[0], parts[1:]
        section = next(
            (h for h, n, occ in self.headers if n == name and occ == int(index or 0)), None
        )
        if section is None:
            # A top-level key, before any header (e.g. an unknown `foo = 1`).
            first = self.headers[0][0] if self.headers else len(self.lines)
            return self._key_line(name, 0, first)
        if not rest:
            return section + 1
        end = next((h for h, _, _ in self.headers if h > section), len(self.lines))
        key, key_index = rest[0]
        found = self._key_line(key, section + 1, end)
        if found is None:
            return section + 1
        if key_index is None:
            return found
        brace = self._nth_brace(found - 1, end, int(key_index))
        return brace + 1 if brace is not None else found

    def _key_line(self, key: str, start: int, end: int) -> int | None:
        pattern = re.compile(rf"\s*{re.escape(key)}\s*=")
        return next((i + 1 for i in range(start, end) if pattern.match(self.lines[i])), None)

    def _nth_brace(self, start: int, end: int, n: int) -> int | None:
        """The line of the n-th (0-based) '{' from line ``start``, outside strings/comments."""
        count = 0
        for i in range(start, end):
            quote = ""
            for ch in self.lines[i]:
                if quote:
                    quote = "" if ch == quote else quote
                elif ch in "\"'":
                    quote = ch
                elif ch == "#":
                    break
                elif ch == "{":
                    if count == n:
                        return i
                    count += 1
        return None


# --- TOML writing ------------------------------------------------------------------------


def dump_cluster_config(
    config: ClusterConfig, base_dir: str | os.PathLike[str] | None = None
) -> str:
    """TOML text that ``parse_cluster_config(text, base_dir)`` reads back equal to ``config``.

    Data dirs under ``base_dir`` (default: the directory of ``config.path``, if any) are
    written relative to it, so the directory holding the file and the data can be moved.
    """
    if base_dir is None and config.path is not None:
        base_dir = config.path.parent
    base = Path(base_dir) if base_dir is not None else None
    r = config.raft
    out = [
        "# raftlet cluster config: the servers, the tables, and (derived from both) where",
        "# every tablet lives. Relative data_dir paths are relative to this file's directory.",
        "",
        "[cluster]",
        f"name = {_toml_str(config.name)}",
        "",
        "[raft]",
        f"tick_interval_ms = {_toml_number(r.tick_interval_ms)}",
        f"election_ticks = {r.election_ticks}",
        f"heartbeat_ticks = {r.heartbeat_ticks}",
    ]
    for s in config.servers:
        out += [
            "",
            "[[servers]]",
            f"id = {_toml_str(s.id)}",
            f"rpc_addr = {_toml_str(s.rpc_addr)}",
            f"http_addr = {_toml_str(s.http_addr)}",
            f"data_dir = {_toml_str(_relative(s.data_dir, base))}",
        ]
    for t in config.tables:
        out += [
            "",
            "[[tables]]",
            f"name = {_toml_str(t.name)}",
            f"partitions = {t.partitions}",
            f"replication_factor = {t.replication_factor}",
            "columns = [",
        ]
        for c in t.schema.columns:
            parts = [f"name = {_toml_str(c.name)}", f"type = {_toml_str(c.type.name)}"]
            parts += ["key = true"] * c.is_key + ["nullable = true"] * c.nullable
            out.append(f"  {{ {', '.join(parts)} }},")
        out.append("]")
    return "\n".join(out) + "\n"


def write_cluster_config(config: ClusterConfig, path: str | os.PathLike[str]) -> ClusterConfig:
    """Write ``config`` to ``path`` atomically (a reader never sees half a file; a crash
    leaves the old file or the new one). Returns the config with ``path`` set."""
    target = Path(path).absolute()
    text = dump_cluster_config(config, target.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dataclasses.replace(config, path=target)


def _relative(path: Path, base: Path | None) -> str:
    if base is not None:
        try:
            return path.relative_to(base).as_posix() or "."
        except ValueError:
            pass
    return str(path)


_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _toml_str(value: str) -> str:
    """A TOML basic string. TOML forbids raw control characters (tab aside) and DEL, and its
    \\u escapes must be Unicode scalar values, so a lone surrogate cannot be written."""
    out = []
    for ch in value:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        elif 0xD800 <= code <= 0xDFFF:
            raise ConfigError(f"{value!r} contains a lone surrogate and cannot be written as TOML")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_number(value: float) -> str:
    if _is_int(value):
        return str(value)
    # repr() of a finite float always has a '.' or an exponent, as a TOML float must.
    return repr(float(value))
