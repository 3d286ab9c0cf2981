"""What a chaos run needs of a cluster, whichever way it was started.

Two implementations: ``netns_cluster.NetnsChaosCluster`` (root: a network namespace per
server, links cut in the kernel) and ``proxy_cluster.ProxyChaosCluster`` (anyone: loopback
servers that reach each other through per-link TCP proxies).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the command line imports this module to parse its options: keep it light
    from raftlet.chaos.servers import ServerProbe
    from raftlet.cluster import ClusterConfig

__all__ = ["ChaosCluster", "ProcessCluster"]


class ChaosCluster(Protocol):
    """Processes by server id, the links between them, and a probe that asks each one."""

    backend: str

    @property
    def config(self) -> ClusterConfig: ...

    @property
    def config_path(self) -> Path: ...

    @property
    def probe(self) -> ServerProbe: ...

    def server_ids(self) -> list[str]: ...

    def alive(self, sid: str) -> bool: ...

    def kill(self, sid: str) -> None:
        """SIGKILL the server and reap it."""

    def start(self, sid: str) -> None:
        """Start a stopped server and wait until it serves."""

    def pause(self, sid: str) -> None:
        """SIGSTOP."""

    def resume(self, sid: str) -> None:
        """SIGCONT."""

    def cut(self, src: str, dst: str) -> None:
        """Drop what ``src`` sends to ``dst`` (one direction), as a partition does."""

    def heal_network(self) -> None:
        """Every cut link works again."""

    def set_flag(self, sid: str, name: str, value: str) -> None: ...

    def leaders(self) -> dict[str, str]:
        """Tablet id -> the server that leads it now (tablets without a leader left out)."""

    def log_tail(self, sid: str, n: int = 30) -> str: ...

    def start_all(self) -> None:
        """Start the cluster; ``close`` it afterwards even if this fails."""

    def close(self) -> None:
        """Stop every server (by PID) and remove what was made for the run."""


class ProcessCluster:
    """What both backends do alike: signals by PID, and flags and leaders through the probe.
    A subclass says where each server's process is (``pid``) and sets ``_probe`` once its
    cluster is up."""

    _probe: ServerProbe | None = None

    def pid(self, sid: str) -> int | None:
        """The running process of ``sid``, None if it is not running."""
        raise NotImplementedError

    @property
    def probe(self) -> ServerProbe:
        assert self._probe is not None, "the cluster is not started"
        return self._probe

    def pause(self, sid: str) -> None:
        self._signal(sid, signal.SIGSTOP)

    def resume(self, sid: str) -> None:
        self._signal(sid, signal.SIGCONT)

    def _signal(self, sid: str, sig: signal.Signals) -> None:
        pid = self.pid(sid)
        if pid is not None:
            os.kill(pid, sig)

    def set_flag(self, sid: str, name: str, value: str) -> None:
        self.probe.set_flag(sid, name, value)

    def leaders(self) -> dict[str, str]:
        return self.probe.leaders()
