"""A multi-host raftlet cluster on one Linux machine: each server in its own network namespace.

Loopback clusters (``tests/integration/tserver_cluster.py``, ``raftlet cluster up``) cannot
cut the network between two servers: every server shares one ``lo``. Here each server is a
"host" with its own address, so a test can pull one host's cable (``isolate``) and plug it
back in (``heal``) while the processes keep running, which is what a real partition is.

Topology of one run (every name carries the run's id ``rlt<pid>-<seq>``, so parallel runs, and
several clusters in one process, never collide)::

    root namespace            <run>-br (bridge namespace)          <run>-tsN
    rlt<pid>u<seq> ──veth── up0 ─┐
      10.213.X.254/24            br0 ── vN ──────veth─────── eth0 10.213.X.(10+N)/24, lo

- **The bridge lives in a namespace of its own**, not in the root namespace. Bridged frames
  then never meet the host's firewall (on a Docker host br_netfilter sends them through
  iptables' FORWARD chain, whose policy is DROP), and the only thing added to the root
  namespace is one veth end with an address in the run's /24: enough for the test process to
  dial every server directly, nothing that routes anywhere else.
- **Addresses:** the launcher picks a free ``10.213.X.0/24`` (one no route or address of the
  root namespace overlaps), under a lock file so two launchers starting at once cannot pick
  the same X. Only interfaces this launcher creates get addresses.
- **isolate / heal** set the bridge-side end ``vN`` down / up: no frame in or out of that
  host, its address and processes untouched, TCP connections resume after ``heal``.
- **Processes** run as ``ip netns exec NS python -c <pdeathsig shim> … -m raftlet tserver``.
  ``ip netns exec`` execs (no fork), and so does the shim, so the PID we hold is the server's:
  SIGTERM reaches it directly. The shim asks the kernel to SIGTERM the server if the launcher
  dies, so a killed test run leaves no server behind. The kernel ties that signal to the
  *thread* that forked the server, so every server is forked from one launcher thread that
  lives until ``stop``, whichever thread (re)starts it.
- **Teardown** (``stop``) is idempotent and runs on every failure path: SIGTERM, then SIGKILL
  after a timeout, of every server by PID (and of any process still inside our namespaces),
  then deletion of the root-namespace veth and every namespace, which takes the bridge and the
  other veths with it. ``cleanup_stale`` removes what runs that were SIGKILLed left behind
  (their launcher's PID is gone); ``start`` calls it.

Needs root and iproute2's ``ip``: ``netns_available()`` says whether this machine can, and why
not. ``python -m raftlet.deploy.netns --servers 3`` starts a cluster and keeps it until Ctrl-C.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from raftlet.cluster import (
    ClusterConfig,
    RaftTimings,
    ServerConfig,
    TableConfig,
    write_cluster_config,
)
from raftlet.deploy.ready import wait_ready_line
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType

__all__ = [
    "NetnsCluster",
    "NetnsError",
    "NetnsHost",
    "cleanup_stale",
    "list_run_namespaces",
    "netns_available",
]

# The project root: ``-m raftlet`` must import from here when the project is not installed.
_ROOT = Path(__file__).resolve().parents[1]
# The subnets runs pick from: 10.213.X.0/24, X = 0..255. Private (RFC 1918), and /16 wide so
# a host on some 10.213.x network still leaves most of them free.
_SUPERNET = ipaddress.IPv4Network("10.213.0.0/16")
_HOST_OFFSET = 10  # server i (1-based) gets .10+i
_UPLINK_HOST = 254  # the root namespace's end
# Servers one launcher runs at most: each gets a .N address of one /24 (10 + N, below the uplink).
MAX_SERVERS = 200
_RPC_PORT = 7051
_HTTP_PORT = 8051
_LOCK_PATH = Path("/run/raftlet-netns.lock")
_IFNAMSIZ = 15  # longest Linux interface name
# A locally administered unicast MAC that no interface of a run has (veths get random ones
# with the same bit set, but never this one): frames sent to it go nowhere.
_NOWHERE_MAC = "02:00:00:00:0d:ad"
_IP_TIMEOUT_S = 30.0
_NS_NAME = re.compile(r"rlt(\d+)-(\d+)-\S+\Z")
_UPLINK_NAME = re.compile(r"rlt(\d+)u(\d+)\Z")
_seq = itertools.count()

# Run as `python -c` inside the namespace, argv: launcher pid, then the server's argv. Sets
# PR_SET_PDEATHSIG so the server gets SIGTERM when the launcher dies, then execs the server
# (same PID). The getppid check closes the race where the launcher died before the prctl.
_PDEATHSIG_SHIM = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('raftlet netns: the launcher exited before the server started')\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)

KV_SCHEMA = Schema(
    [
        ColumnSchema("key", DataType.INT64, is_key=True),
        ColumnSchema("value", DataType.STRING, nullable=True),
    ]
)


class NetnsError(RuntimeError):
    """A namespace, link or server could not be set up (the message says which and why)."""


# --- running ip ----------------------------------------------------------------------------


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; NetnsError with ip's own message if it fails and ``check``."""
    try:
        done = subprocess.run(
            ["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetnsError(f"ip {' '.join(args)}: {e}") from None
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def list_namespaces() -> list[str]:
    """Every named network namespace (``ip netns list``), ours or not."""
    out = _ip("netns", "list", check=False).stdout
    # Lines look like "name" or "name (id: 3)".
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def list_run_namespaces(prefix: str = "rlt") -> list[str]:
    """The named namespaces whose name starts with ``prefix`` (a run's, by default any run's)."""
    return [ns for ns in list_namespaces() if ns.startswith(prefix)]


def _ns_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(tok) for tok in out.split() if tok.isdigit()]


def netns_available() -> tuple[bool, str]:
    """Whether this process can build the topology, and if not, a reason a user can act on.

    Checks by doing: creates a probe namespace holding a bridge and a veth pair, then deletes
    it. Being root is not enough in a container without CAP_NET_ADMIN or without a shared
    /run/netns mount.
    """
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, f"network namespaces need root (running as uid {os.geteuid()})"
    if shutil.which("ip") is None:
        return False, "the `ip` command is missing (Debian/Ubuntu: apt-get install iproute2)"
    probe = f"rlt{os.getpid()}-{next(_seq)}-probe"
    try:
        _ip("netns", "add", probe)
        try:
            _ip("-n", probe, "link", "add", "br0", "type", "bridge")
            _ip("-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        finally:
            _ip("netns", "delete", probe, check=False)
    except NetnsError as e:
        return False, f"cannot create network namespaces here: {e}"
    return True, "ok"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, someone else's
        return True
    return True


def cleanup_stale() -> list[str]:
    """Remove the namespaces and root-namespace veths of runs whose launcher is gone.

    A run that was SIGKILLed cannot tear down; its servers died with it (PDEATHSIG), but its
    namespaces and its uplink (holding a /24) stay. Only names of this module's exact pattern
    whose launcher PID no longer exists are touched. Returns what was removed.
    """
    removed: list[str] = []
    for ns in list_namespaces():
        m = _NS_NAME.match(ns)
        if m is None or _pid_alive(int(m.group(1))):
            continue
        for pid in _ns_pids(ns):  # a server that outlived its launcher (should not happen)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if _ip("netns", "delete", ns, check=False).returncode == 0:
            removed.append(ns)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        # "12: rlt123u0@if11: <BROADCAST,...": the name is the second field, before any '@'.
        parts = line.split(":", 2)
        if len(parts) < 3:
            continue
        name = parts[1].strip().split("@")[0]
        m = _UPLINK_NAME.match(name)
        stale = m is not None and not _pid_alive(int(m.group(1)))
        if stale and _ip("link", "delete", name, check=False).returncode == 0:
            removed.append(name)
    return removed


# --- the subnet ----------------------------------------------------------------------------


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    """Serializes subnet choice and uplink creation between launchers on this machine."""
    path = _LOCK_PATH
    if not path.parent.is_dir():
        path = Path(tempfile.gettempdir()) / _LOCK_PATH.name
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    """Networks of the root namespace's routes (all tables) and addresses, default excluded."""
    used: list[ipaddress.IPv4Network] = []
    lines = _ip("-4", "-o", "route", "show", "table", "all", check=False).stdout.splitlines()
    lines += [
        # "2: eth0    inet 192.0.2.2/24 brd ...": the 4th field is the address/prefix.
        " ".join(line.split()[3:4])
        for line in _ip("-4", "-o", "addr", "show", check=False).stdout.splitlines()
    ]
    route_types = {"unicast", "local", "broadcast", "multicast", "unreachable", "blackhole",
                   "prohibit", "throw", "nat", "anycast"}  # fmt: skip
    for line in lines:
        tokens = line.split()
        if tokens and tokens[0] in route_types:
            tokens = tokens[1:]
        if not tokens or tokens[0] == "default":
            continue
        with contextlib.suppress(ValueError):
            used.append(ipaddress.IPv4Network(tokens[0], strict=False))
    return used


def _pick_subnet() -> ipaddress.IPv4Network:
    used = _networks_in_use()
    subnets = list(_SUPERNET.subnets(new_prefix=24))
    # Start at a PID-dependent /24 so concurrent runs mostly do not even contend.
    start = os.getpid() % len(subnets)
    for subnet in subnets[start:] + subnets[:start]:
        if not any(subnet.overlaps(n) for n in used):
            return subnet
    raise NetnsError(f"no free /24 in {_SUPERNET}: every one overlaps a route of this host")


# --- the cluster ---------------------------------------------------------------------------


@dataclass
class NetnsHost:
    """One server's "host": its namespace, address, bridge port and process."""

    index: int  # 0-based
    server_id: str
    netns: str
    bridge_port: str  # the veth end on the bridge (in the bridge namespace)
    address: str
    rpc_addr: str
    http_addr: str
    out_path: Path  # the server's stdout (the "ready" line)
    log_path: Path  # its stderr (the log)
    proc: subprocess.Popen[bytes] | None = None
    isolated: bool = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""


@dataclass
class _Created:
    """What this launcher made, so teardown removes exactly that (and survives a second run)."""

    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # in the root namespace


class NetnsCluster:
    """``n_servers`` raftlet servers, each in its own network namespace, on one bridge.

    Use as a context manager (``with NetnsCluster(tmp) as c:``) or call ``start``/``stop``;
    ``stop`` is idempotent and ``start`` stops everything itself if it fails. Servers are
    ``ts1..tsN``; ``isolate``/``heal`` take a server id or a 0-based index.
    """

    def __init__(
        self,
        root: Path,
        *,
        n_servers: int = 3,
        tables: Sequence[TableConfig] | None = None,
        raft: RaftTimings | None = None,
        flags: Sequence[str] = (),
        python: str = sys.executable,
        start_timeout: float = 30.0,
    ) -> None:
        if not 1 <= n_servers <= MAX_SERVERS:
            raise ValueError(f"n_servers must be in 1..{MAX_SERVERS}, got {n_servers}")
        self.root = Path(root).absolute()
        self.n_servers = n_servers
        self.tables = (
            tuple(tables)
            if tables is not None
            else (TableConfig("kv", KV_SCHEMA, 2, min(3, n_servers)),)
        )
        # Faster than the defaults (100 ms ticks) so tests see elections within a second.
        self.raft = raft or RaftTimings(tick_interval_ms=50, election_ticks=10, heartbeat_ticks=1)
        self.flags = list(flags)
        self.python = python
        self.start_timeout = start_timeout
        seq = next(_seq)
        pid = os.getpid()
        self.run_id = f"rlt{pid}-{seq}"
        self.prefix = f"{self.run_id}-"  # every namespace of this run starts with it
        self.bridge_ns = f"{self.prefix}br"
        self.uplink = f"rlt{pid}u{seq}"
        if len(self.uplink) > _IFNAMSIZ:  # pids are < 2**22, so only with > 9999 clusters
            raise NetnsError(f"interface name {self.uplink!r} is too long")
        self.subnet: ipaddress.IPv4Network | None = None
        self.hosts: list[NetnsHost] = []
        self.config: ClusterConfig | None = None
        self.path = self.root / "cluster.toml"
        self._created = _Created()
        self._cut_links: set[tuple[str, str]] = set()
        self._lock = threading.Lock()  # teardown may race with atexit
        # The one thread every server is forked from (see start_server); it lives until stop.
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix=f"{self.run_id}-spawner")

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> NetnsCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> NetnsCluster:
        """Build the network, write the config, start every server and wait for "ready"."""
        ok, reason = netns_available()
        if not ok:
            raise NetnsError(reason)
        atexit.register(self.stop)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with _host_lock():
                cleanup_stale()
                self.subnet = _pick_subnet()
                self._build_network(self.subnet)
            self._write_config()
            self._start_servers()
        except BaseException:
            self.stop()
            raise
        return self

    def _build_network(self, subnet: ipaddress.IPv4Network) -> None:
        hosts = list(subnet.hosts())
        prefix = subnet.prefixlen
        br = self.bridge_ns
        self._add_namespace(br)
        _ip("-n", br, "link", "set", "lo", "up")
        _ip("-n", br, "link", "add", "br0", "type", "bridge")
        _ip("-n", br, "link", "set", "br0", "up")
        # The uplink: created in the root namespace with its peer directly in the bridge
        # namespace, so no other name ever appears in the root namespace.
        _ip("link", "add", self.uplink, "type", "veth", "peer", "name", "up0", "netns", br)
        self._created.links.append(self.uplink)
        _ip("-n", br, "link", "set", "up0", "master", "br0")
        _ip("-n", br, "link", "set", "up0", "up")
        uplink_addr = hosts[_UPLINK_HOST - 1]
        _ip("addr", "add", f"{uplink_addr}/{prefix}", "dev", self.uplink)
        _ip("link", "set", self.uplink, "up")
        for i in range(self.n_servers):
            sid = f"ts{i + 1}"
            ns = f"{self.prefix}{sid}"
            port = f"v{i + 1}"
            address = str(hosts[_HOST_OFFSET + i])
            self._add_namespace(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            # Created inside the bridge namespace, its peer straight into the server's.
            _ip("-n", br, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", br, "link", "set", port, "master", "br0")
            _ip("-n", br, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{address}/{prefix}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            self.hosts.append(
                NetnsHost(
                    index=i,
                    server_id=sid,
                    netns=ns,
                    bridge_port=port,
                    address=address,
                    rpc_addr=f"{address}:{_RPC_PORT}",
                    http_addr=f"{address}:{_HTTP_PORT}",
                    out_path=self.root / f"{sid}.out",
                    log_path=self.root / f"{sid}.log",
                )
            )

    def _add_namespace(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._created.namespaces.append(ns)

    def _write_config(self) -> None:
        servers = tuple(
            ServerConfig(h.server_id, h.rpc_addr, h.http_addr, self.root / h.server_id)
            for h in self.hosts
        )
        config = ClusterConfig(f"netns-{self.run_id}", servers, self.tables, self.raft)
        self.config = write_cluster_config(config, self.path)

    def server_argv(self, host: NetnsHost) -> list[str]:
        """The full command line that runs ``host``'s server inside its namespace."""
        return [
            "ip", "netns", "exec", host.netns,
            self.python, "-c", _PDEATHSIG_SHIM, str(os.getpid()),
            self.python, "-m", "raftlet", "tserver",
            "--config", str(self.path), "--server_id", host.server_id,
            # A new cluster at every start, whose servers start together (see cluster up).
            "--empty_dir_wait_s=0", *self.flags,
            # A private test network in namespaces of our own: plaintext is deliberate.
            "--insecure",
        ]  # fmt: skip

    def _start_servers(self) -> None:
        # All at once, then wait for all: on 2 cores the interpreters' start-up overlaps.
        for h in self.hosts:
            self.start_server(h, wait=False)
        for h in self.hosts:
            self.wait_ready(h)

    def start_server(self, server: str | int | NetnsHost, *, wait: bool = True) -> NetnsHost:
        """(Re)start one server in its namespace; waits for its "ready" line if ``wait``."""
        h = self.host(server)
        if h.alive:
            raise NetnsError(f"{h.server_id} is already running (pid {h.pid})")
        # Forked from the launcher's own thread, whichever thread asks: the shim's parent-death
        # signal fires when the *thread* that forked the server ends, so a server restarted
        # from a short-lived thread (a fault injector's) would get SIGTERM when that thread
        # finished.
        h.proc = self._spawner.submit(self._popen, h).result()
        if wait:
            self.wait_ready(h)
        return h

    def _popen(self, h: NetnsHost) -> subprocess.Popen[bytes]:
        with open(h.out_path, "wb") as out, open(h.log_path, "ab") as log:
            return subprocess.Popen(
                self.server_argv(h), cwd=_ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=log
            )

    def wait_ready(self, server: str | int | NetnsHost) -> None:
        """Wait until the server printed its "ready" line; NetnsError with its log if not."""
        h = self.host(server)
        why = wait_ready_line(h.out_path, h.proc, self.start_timeout)
        if why is not None:
            raise NetnsError(f"{h.server_id} {why}:\n{h.log_tail()}")

    def stop_server(self, server: str | int | NetnsHost, timeout: float = 10.0) -> int | None:
        """SIGTERM one server, SIGKILL after ``timeout``; its exit code (None if never run)."""
        h = self.host(server)
        self._terminate([h], timeout)
        return h.proc.returncode if h.proc is not None else None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every server and delete everything this launcher created. Idempotent.

        Every step is attempted even if an earlier one failed; what could not be removed is
        raised at the end as one NetnsError.
        """
        with self._lock:
            problems: list[str] = []
            try:
                self._terminate(self.hosts, timeout)
            except Exception as e:  # keep going: the namespaces must still go
                problems.append(f"stopping servers: {e}")
            for ns in list(self._created.namespaces):
                # Anything else still running inside a namespace of ours (nothing, normally)
                # would keep the namespace alive after `ip netns delete`.
                for pid in _ns_pids(ns):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            for link in list(self._created.links):
                done = _ip("link", "delete", link, check=False)
                if done.returncode == 0 or "Cannot find device" in done.stderr:
                    self._created.links.remove(link)
                else:
                    problems.append(f"ip link delete {link}: {done.stderr.strip()}")
            # Deleting the bridge namespace deletes the bridge and every veth with it.
            for ns in reversed(list(self._created.namespaces)):
                done = _ip("netns", "delete", ns, check=False)
                if done.returncode == 0 or ns not in list_namespaces():
                    self._created.namespaces.remove(ns)
                else:
                    problems.append(f"ip netns delete {ns}: {done.stderr.strip()}")
            self._spawner.shutdown(wait=False)
            atexit.unregister(self.stop)
            if problems:
                raise NetnsError("teardown incomplete: " + "; ".join(problems))

    @staticmethod
    def _terminate(hosts: Sequence[NetnsHost], timeout: float) -> None:
        running = [h for h in hosts if h.alive]
        for h in running:
            assert h.proc is not None
            with contextlib.suppress(ProcessLookupError):
                h.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for h in running:
            assert h.proc is not None
            try:
                h.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    h.proc.kill()
                h.proc.wait(timeout=30)

    # --- faults --------------------------------------------------------------------------

    def host(self, server: str | int | NetnsHost) -> NetnsHost:
        """A host by server id (``"ts2"``), 0-based index, or itself."""
        if isinstance(server, NetnsHost):
            return server
        if isinstance(server, int):
            return self.hosts[server]
        for h in self.hosts:
            if h.server_id == server:
                return h
        raise KeyError(f"no server {server!r} (have {[h.server_id for h in self.hosts]})")

    def isolate(self, server: str | int | NetnsHost) -> None:
        """Cut ``server``'s link: it can reach no other server, nor the root namespace."""
        h = self.host(server)
        _ip("-n", self.bridge_ns, "link", "set", h.bridge_port, "down")
        h.isolated = True

    def heal(self, server: str | int | NetnsHost) -> None:
        """Restore the link ``isolate`` cut."""
        h = self.host(server)
        _ip("-n", self.bridge_ns, "link", "set", h.bridge_port, "up")
        h.isolated = False

    def cut(self, src: str | int | NetnsHost, dst: str | int | NetnsHost) -> None:
        """Silently drop every packet ``src`` sends to ``dst`` (one direction; cut both for
        a symmetric partition). Clients in the root namespace still reach both.

        ``src`` is given a permanent neighbour entry that maps ``dst``'s address to a MAC
        no host has: its frames for ``dst`` cross the bridge and are dropped by every NIC.
        Unlike a blackhole route (EINVAL to the sender) this is what a real partition does:
        nothing fails locally, established connections stay open and TCP retransmits what
        was lost once the link is ``restore``d."""
        s, d = self.host(src), self.host(dst)
        if s is d:
            raise ValueError(f"cannot cut {s.server_id} from itself")
        _ip(
            "-n", s.netns, "neigh", "replace", d.address, "dev", "eth0",
            "lladdr", _NOWHERE_MAC, "nud", "permanent",
        )  # fmt: skip
        self._cut_links.add((s.server_id, d.server_id))

    def restore(self, src: str | int | NetnsHost, dst: str | int | NetnsHost) -> None:
        """Undo ``cut(src, dst)``: ``src`` resolves ``dst`` by ARP again."""
        s, d = self.host(src), self.host(dst)
        done = _ip("-n", s.netns, "neigh", "del", d.address, "dev", "eth0", check=False)
        if done.returncode != 0 and (s.server_id, d.server_id) in self._cut_links:
            raise NetnsError(f"restoring {s.server_id} -> {d.server_id}: {done.stderr.strip()}")
        self._cut_links.discard((s.server_id, d.server_id))

    def cut_links(self) -> set[tuple[str, str]]:
        """The (src, dst) server pairs ``cut`` now."""
        return set(self._cut_links)

    def restore_all(self) -> None:
        """Restore every cut link (``isolate``d hosts stay isolated: ``heal`` them)."""
        for src, dst in sorted(self._cut_links):
            self.restore(src, dst)

    def exec_in(
        self, server: str | int | NetnsHost, argv: Sequence[str], timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``server``'s namespace (e.g. to see the network as it does)."""
        h = self.host(server)
        return subprocess.run(
            ["ip", "netns", "exec", h.netns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def namespaces(self) -> list[str]:
        """This run's namespaces that currently exist (empty after ``stop``)."""
        return list_run_namespaces(self.prefix)

    def uplink_exists(self) -> bool:
        return _ip("link", "show", self.uplink, check=False).returncode == 0


# --- command line --------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m raftlet.deploy.netns",
        description="Start a raftlet cluster with each server in its own network namespace "
        "(needs root), print its addresses, and keep it until Ctrl-C or SIGTERM.",
    )
    parser.add_argument(
        "--servers",
        type=_server_count,
        default=3,
        help=f"number of servers (default 3; 1..{MAX_SERVERS})",
    )
    parser.add_argument("--dir", type=Path, help="data dir (default: a new temporary one)")
    parser.add_argument("--cleanup-stale", action="store_true", help="only remove leftovers")
    args = parser.parse_args(argv)
    if args.cleanup_stale:
        for name in cleanup_stale():
            print(f"removed {name}")
        return 0
    ok, reason = netns_available()
    if not ok:
        print(f"deploy.netns: error: {reason}", file=sys.stderr)
        return 1
    made = args.dir is None
    root = args.dir or Path(tempfile.mkdtemp(prefix="raftlet-netns-"))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with NetnsCluster(root, n_servers=args.servers) as cluster:
            print(f"cluster config: {cluster.path}")
            for h in cluster.hosts:
                print(f"{h.server_id}: rpc {h.rpc_addr} http://{h.http_addr}/ netns {h.netns}")
            print("Ctrl-C to stop", flush=True)
            stop.wait()
    except (NetnsError, OSError) as e:  # OSError: e.g. the data dir cannot be created
        print(f"deploy.netns: error: {e}", file=sys.stderr)
        if made:  # kept: the servers' logs say why
            print(f"deploy.netns: data and logs kept in {root}", file=sys.stderr)
        return 1
    if made:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def _server_count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= n <= MAX_SERVERS:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_SERVERS}, got {n}")
    return n


if __name__ == "__main__":
    sys.exit(main())
