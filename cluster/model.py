"""The cluster config as values: the servers, the tables, the Raft timings.

Frozen dataclasses that validate themselves on construction (the rules are in ``validate``),
so holding one means holding a valid config. Placement (``placement``) and the wire form
(``convert``) are reached through methods, so a caller needs only ``ClusterConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from raftlet.cluster.errors import NotInConfigError
from raftlet.cluster.placement import TabletPlacement, place
from raftlet.cluster.validate import check_cluster, check_raft_timings, check_server, check_table
from raftlet.schema.schema import Schema

if TYPE_CHECKING:
    from raftlet.proto import tablet_pb2

__all__ = ["ClusterConfig", "RaftTimings", "ServerConfig", "TableConfig"]


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
        check_raft_timings(self)

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
    # TLS without client certificates, for callers with a bearer token alone; "" for none.
    token_rpc_addr: str = ""

    def __post_init__(self) -> None:
        data_dir: object = self.data_dir
        if isinstance(data_dir, str) and data_dir:  # a convenience for hand-built configs
            object.__setattr__(self, "data_dir", Path(data_dir))
        check_server(self)


@dataclass(frozen=True, slots=True)
class TableConfig:
    """A table: its schema, split into ``partitions`` hash partitions (one tablet each), each
    replicated on ``replication_factor`` servers."""

    name: str
    schema: Schema
    partitions: int
    replication_factor: int

    def __post_init__(self) -> None:
        check_table(self)


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
        check_cluster(self)

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
        """Every tablet and its replicas, tables in config order, partitions ascending
        (``placement.place``)."""
        return place(self.server_ids, self.tables)

    def placements_for(self, server_id: str) -> list[TabletPlacement]:
        """The tablets of which ``server_id`` hosts a replica (it must be in the config)."""
        self.server(server_id)
        return [p for p in self.placements() if server_id in p.replicas]

    def placement(self, tablet: str) -> TabletPlacement:
        for p in self.placements():
            if p.tablet_id == tablet:
                return p
        raise NotInConfigError(f"unknown tablet {tablet!r}")

    # --- wire form (convert) -------------------------------------------------------------
    # convert imports this module for the constructors, so it is imported here only when used.

    def to_pb(self) -> tablet_pb2.GetClusterConfigResponse:
        """What ``GetClusterConfig`` answers: servers, tables and the placement."""
        from raftlet.cluster.convert import cluster_to_pb

        return cluster_to_pb(self)

    @classmethod
    def from_pb(
        cls, pb: tablet_pb2.GetClusterConfigResponse, *, name: str = "remote"
    ) -> ClusterConfig:
        """A client's view of a server's config, validated like a file (``convert``)."""
        from raftlet.cluster.convert import cluster_from_pb

        return cluster_from_pb(pb, name=name)
