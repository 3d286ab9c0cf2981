"""Short digests of the parts of a cluster config every server must agree on.

Each server reads its own copy of ``cluster.toml``; nothing stops one of them running on a
stale or edited copy (other Raft timings, a server or table more or less), and such a
server works, only not as its peers expect: a heartbeat interval past a peer's election
timeout has that peer campaign again and again. Each server reports the digests of its
config in ``ListTablets``, and the health check (``client.health``) names a server whose
digests differ from the others' and in which part.

A digest covers what is shared and nothing local: the data directories are each server's
own. Order does not count (placement sorts the servers and places each table by its
name), so the servers and tables are digested sorted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from raftlet.cluster.convert import server_to_pb, table_to_pb
from raftlet.cluster.model import ClusterConfig, RaftTimings

__all__ = ["SECTIONS", "config_digests"]

# The digested parts, with the words the health check uses for them.
SECTIONS = {
    "name": "cluster name",
    "servers": "servers",
    "tables": "tables",
    "raft": "raft timings",
}


def _digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))  # so no two lists of parts hash alike
        h.update(part)
    return h.hexdigest()[:16]


def config_digests(config: ClusterConfig, raft: RaftTimings | None = None) -> dict[str, str]:
    """Section name (``SECTIONS``) -> a digest of that part of ``config``; ``raft``: the
    timings the server runs with, when flags override the file's."""
    raft = raft or config.raft
    servers = sorted(config.servers, key=lambda s: s.id)
    tables = sorted(config.tables, key=lambda t: t.name)
    return {
        "name": _digest([config.name.encode()]),
        "servers": _digest(server_to_pb(s).SerializeToString(deterministic=True) for s in servers),
        "tables": _digest(table_to_pb(t).SerializeToString(deterministic=True) for t in tables),
        "raft": _digest(
            [
                repr(
                    (float(raft.tick_interval_ms), raft.election_ticks, raft.heartbeat_ticks)
                ).encode()
            ]
        ),
    }
