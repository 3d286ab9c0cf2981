"""The cluster config on the wire: ``GetClusterConfigResponse`` and its parts.

``ClusterConfig.to_pb``/``from_pb`` call these. The response carries no cluster name, Raft
timings or data dirs (they are the servers' business), so a config read back from it gets the
caller's ``name``, default timings and ``data_dir = Path(id)``.
"""

from __future__ import annotations

from pathlib import Path

from raftlet.cluster.errors import ClusterConfigError
from raftlet.cluster.model import ClusterConfig, ServerConfig, TableConfig
from raftlet.cluster.placement import TabletPlacement
from raftlet.proto import tablet_pb2
from raftlet.schema.schema import Schema, SchemaError

__all__ = [
    "cluster_from_pb",
    "cluster_to_pb",
    "placement_from_pb",
    "placement_to_pb",
    "server_to_pb",
    "table_to_pb",
]


def server_to_pb(server: ServerConfig) -> tablet_pb2.ServerPB:
    return tablet_pb2.ServerPB(
        uuid=server.id,
        rpc_addr=server.rpc_addr,
        http_addr=server.http_addr,
        token_rpc_addr=server.token_rpc_addr,
    )


def table_to_pb(table: TableConfig) -> tablet_pb2.TablePB:
    return tablet_pb2.TablePB(
        name=table.name,
        schema=table.schema.to_pb(),
        num_partitions=table.partitions,
        replication_factor=table.replication_factor,
    )


def placement_to_pb(placement: TabletPlacement) -> tablet_pb2.TabletPB:
    return tablet_pb2.TabletPB(
        tablet_id=placement.tablet_id,
        table_name=placement.table,
        partition=placement.partition,
        replica_uuids=placement.replicas,
    )


def placement_from_pb(pb: tablet_pb2.TabletPB) -> TabletPlacement:
    return TabletPlacement(pb.tablet_id, pb.table_name, pb.partition, tuple(pb.replica_uuids))


def cluster_to_pb(config: ClusterConfig) -> tablet_pb2.GetClusterConfigResponse:
    """What ``GetClusterConfig`` answers: servers, tables and the placement."""
    return tablet_pb2.GetClusterConfigResponse(
        servers=[server_to_pb(s) for s in config.servers],
        tables=[table_to_pb(t) for t in config.tables],
        tablets=[placement_to_pb(p) for p in config.placements()],
    )


def cluster_from_pb(
    pb: tablet_pb2.GetClusterConfigResponse, *, name: str = "remote"
) -> ClusterConfig:
    """A client's view of a server's config, validated like a file.

    The placement the server sent must equal the one computed here, or the client would
    route rows to the wrong tablets (a client and a server of different raftlet versions);
    that is a ``ClusterConfigError``.
    """
    servers = []
    for i, s in enumerate(pb.servers):
        try:
            servers.append(
                ServerConfig(s.uuid, s.rpc_addr, s.http_addr, Path(s.uuid or "_"), s.token_rpc_addr)
            )
        except ClusterConfigError as e:
            raise e.within(f"servers[{i}]") from None
    tables = []
    for i, t in enumerate(pb.tables):
        try:
            schema = Schema.from_pb(t.schema)
        except SchemaError as e:
            raise ClusterConfigError(str(e), f"tables[{i}].columns") from None
        try:
            tables.append(TableConfig(t.name, schema, t.num_partitions, t.replication_factor))
        except ClusterConfigError as e:
            raise e.within(f"tables[{i}]") from None
    config = ClusterConfig(name, tuple(servers), tuple(tables))
    sent = [placement_from_pb(t) for t in pb.tablets]
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
        raise ClusterConfigError(
            f"the server's placement differs from the one computed here ({diff}); "
            "are client and server different raftlet versions?",
            "tablets",
        )
    return config
