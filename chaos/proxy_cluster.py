"""A chaos cluster without root: loopback servers that reach each other through link proxies.

Every server listens on its own loopback port (chosen free by the kernel) and is started with
``--peer_addresses`` naming, for each peer, the ``chaos.link_proxy.ProxyNetwork`` proxy of
that directed link; clients dial the servers directly. Cutting a proxy link is then a
partition between two servers that the workload does not see, as with network namespaces.
Processes are started and stopped by PID; their data and logs live under ``root``.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from raftlet.chaos.cluster import ProcessCluster
from raftlet.chaos.link_proxy import ProxyNetwork
from raftlet.chaos.servers import ServerProbe
from raftlet.cluster import (
    ClusterConfig,
    RaftTimings,
    ServerConfig,
    TableConfig,
    write_cluster_config,
)
from raftlet.deploy.local import reserved_ports
from raftlet.deploy.ready import wait_ready_line

__all__ = ["ProxyChaosCluster"]

_READY_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 10.0
# `-m raftlet` must import this checkout even where the project is not installed.
_ROOT = Path(__file__).resolve().parents[1]


class ProxyChaosCluster(ProcessCluster):
    """``n_servers`` loopback servers behind per-link proxies; a ``ChaosCluster``."""

    backend = "proxy"

    def __init__(
        self,
        root: Path,
        *,
        n_servers: int,
        tables: Sequence[TableConfig],
        raft: RaftTimings,
        flags: Sequence[str] = (),
    ) -> None:
        self.root = Path(root).absolute()
        self._n = n_servers
        self._tables = tuple(tables)
        self._raft = raft
        self._flags = list(flags)
        self._config: ClusterConfig | None = None
        self._network: ProxyNetwork | None = None
        self._probe: ServerProbe | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # --- lifecycle -------------------------------------------------------------------------

    def start_all(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # The servers' ports stay held while the proxies bind theirs (to port 0): a proxy
        # given a server's port would keep that server from starting (seen once in CI).
        with reserved_ports(2 * self._n) as ports:
            servers = tuple(
                ServerConfig(
                    f"ts{i + 1}",
                    f"127.0.0.1:{ports[2 * i]}",
                    f"127.0.0.1:{ports[2 * i + 1]}",
                    self.root / f"ts{i + 1}",
                )
                for i in range(self._n)
            )
            config = ClusterConfig("chaos-proxy", servers, self._tables, self._raft)
            self._config = write_cluster_config(config, self.config_path)
            self._network = ProxyNetwork.for_config(self._config)
        self._probe = ServerProbe(self._config)
        for sid in self.server_ids():
            self._spawn(sid)
        for sid in self.server_ids():
            self._wait_ready(sid)

    def close(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)  # a paused server would not see SIGTERM
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        for proc in self._procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        if self._probe is not None:
            self._probe.close()
        if self._network is not None:
            self._network.close()

    # --- what the run reads ----------------------------------------------------------------

    @property
    def config(self) -> ClusterConfig:
        assert self._config is not None, "the cluster is not started"
        return self._config

    @property
    def config_path(self) -> Path:
        return self.root / "cluster.toml"

    def server_ids(self) -> list[str]:
        return [s.id for s in self.config.servers]

    def pid(self, sid: str) -> int | None:
        return self._procs[sid].pid if self.alive(sid) else None

    def alive(self, sid: str) -> bool:
        proc = self._procs.get(sid)
        return proc is not None and proc.poll() is None

    def log_tail(self, sid: str, n: int = 30) -> str:
        with contextlib.suppress(OSError):
            lines = (self.root / f"{sid}.log").read_text(errors="replace").splitlines()
            return "\n".join(lines[-n:])
        return ""

    # --- faults ----------------------------------------------------------------------------

    def kill(self, sid: str) -> None:
        proc = self._procs.get(sid)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)

    def start(self, sid: str) -> None:
        if not self.alive(sid):
            self._spawn(sid)
            self._wait_ready(sid)

    def cut(self, src: str, dst: str) -> None:
        assert self._network is not None
        self._network.cut(src, dst)

    def heal_network(self) -> None:
        assert self._network is not None
        self._network.heal()

    # --- processes -------------------------------------------------------------------------

    def _spawn(self, sid: str) -> None:
        assert self._network is not None
        argv = [
            sys.executable, "-m", "raftlet", "tserver",
            "--config", str(self.config_path), "--server_id", sid,
            "--peer_addresses", self._network.peer_addresses_flag(sid),
            # Its servers start together (as raftlet cluster up starts them): none waits for
            # peers on an empty directory, at the first start or a nemesis restart.
            "--empty_dir_wait_s=0",
            *self._flags,
        ]  # fmt: skip
        out = self.root / f"{sid}.out"
        with open(out, "wb") as stdout, open(self.root / f"{sid}.log", "ab") as log:
            self._procs[sid] = subprocess.Popen(
                argv, cwd=_ROOT, stdin=subprocess.DEVNULL, stdout=stdout, stderr=log
            )

    def _wait_ready(self, sid: str) -> None:
        """Until the server printed its ready line; RuntimeError with its log if it never will."""
        why = wait_ready_line(self.root / f"{sid}.out", self._procs[sid], _READY_TIMEOUT_S)
        if why is not None:
            raise RuntimeError(f"{sid} {why}:\n{self.log_tail(sid)}")
