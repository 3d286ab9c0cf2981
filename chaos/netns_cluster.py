"""A chaos cluster on network namespaces (root only): one "host" per server, real partitions.

Wraps ``deploy.netns.NetnsCluster``: links between servers are cut by ``NetnsCluster.cut``
(frames silently dropped, connections kept), while the run's clients in the root namespace
still reach every server -- so a cut-off leader is what a client may be talking to.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from pathlib import Path

from raftlet.chaos.cluster import ProcessCluster
from raftlet.chaos.servers import ServerProbe
from raftlet.cluster import ClusterConfig, RaftTimings, TableConfig
from raftlet.deploy.netns import NetnsCluster

__all__ = ["NetnsChaosCluster"]


class NetnsChaosCluster(ProcessCluster):
    """``n_servers`` servers, each in its own namespace (a ``chaos.cluster.ChaosCluster``)."""

    backend = "netns"

    def __init__(
        self,
        root: Path,
        *,
        n_servers: int,
        tables: Sequence[TableConfig],
        raft: RaftTimings,
        flags: Sequence[str] = (),
    ) -> None:
        self._cluster = NetnsCluster(
            root, n_servers=n_servers, tables=tables, raft=raft, flags=flags, start_timeout=60.0
        )
        self._probe: ServerProbe | None = None

    def start_all(self) -> None:
        """Build the network and start every server (``close`` undoes it, also on failure)."""
        self._cluster.start()
        assert self._cluster.config is not None
        self._probe = ServerProbe(self._cluster.config)

    def close(self) -> None:
        try:
            if self._probe is not None:
                self._probe.close()
        finally:
            for h in self._cluster.hosts:  # a paused server would not see SIGTERM
                if h.alive and h.pid is not None:
                    os.kill(h.pid, signal.SIGCONT)
            self._cluster.stop()

    @property
    def config(self) -> ClusterConfig:
        assert self._cluster.config is not None
        return self._cluster.config

    @property
    def config_path(self) -> Path:
        return self._cluster.path

    def server_ids(self) -> list[str]:
        return [h.server_id for h in self._cluster.hosts]

    def pid(self, sid: str) -> int | None:
        h = self._cluster.host(sid)
        return h.pid if h.alive else None

    def alive(self, sid: str) -> bool:
        return self._cluster.host(sid).alive

    def kill(self, sid: str) -> None:
        h = self._cluster.host(sid)
        if h.alive and h.proc is not None:
            h.proc.kill()
            h.proc.wait(timeout=30)

    def start(self, sid: str) -> None:
        if not self._cluster.host(sid).alive:
            self._cluster.start_server(sid)

    def cut(self, src: str, dst: str) -> None:
        self._cluster.cut(src, dst)

    def heal_network(self) -> None:
        self._cluster.restore_all()

    def log_tail(self, sid: str, n: int = 30) -> str:
        return self._cluster.host(sid).log_tail(n)
