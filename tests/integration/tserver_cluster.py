"""Real ``raftlet tserver`` processes on loopback for integration tests.

Every port is picked by the test (bound to port 0 by the kernel, then released just before
the server binds it; if someone else takes one first, the cluster starts again on new
ports), every directory lives under the test's tmp_path, and every process
is stopped by PID when the test ends -- gracefully with SIGTERM, SIGKILL after a timeout.

Besides starting and stopping servers:
- ``Server.scan_rows`` (all rows of a replica, following resume keys; follower reads by
  default), ``Server.list_tablets``, ``Server.metric`` (a sum of samples from ``/metrics``);
- ``TserverCluster.wait_converged`` (every replica applied exactly these rows),
  ``new_leader_of``, ``tablet_for_key`` (the client's hash routing);
- ``write_with_retry`` (one request id, retried on NOT_LEADER / UNAVAILABLE /
  RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED at the hinted leader or the next server, within a
  deadline) and ``WriteLoad`` (writer threads doing that continuously, each write a unique
  INSERT, so a retry applied twice shows as KEY_EXISTS).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import grpc
from prometheus_client.parser import text_string_to_metric_families

from raftlet.client.channels import ChannelPool, channel_options
from raftlet.cluster import (
    ClusterConfig,
    RaftTimings,
    ServerConfig,
    TableConfig,
    write_cluster_config,
)
from raftlet.proto import (
    ERROR_METADATA_KEY,
    admin_pb2,
    admin_pb2_grpc,
    consensus_pb2_grpc,
    tablet_pb2,
    tablet_pb2_grpc,
)
from raftlet.proto.common_pb2 import ServerErrorPB
from raftlet.schema.partition import partition_for_key
from raftlet.schema.row_block import encode_row_block
from raftlet.schema.rows import OpType, decode_row_op, encode_row_op, row_from_pb
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from tests import waiting

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
# What a tablet server says when an address it was given is not free (tserver.server).
PORT_TAKEN = "cannot listen for"
PORT_ATTEMPTS = 3

KV_SCHEMA = Schema(
    [
        ColumnSchema("key", DataType.INT64, is_key=True),
        ColumnSchema("value", DataType.STRING, nullable=True),
    ]
)


# A short reconnect backoff: a test reaches a server it restarted at once. Options unlike the
# client's also keep gRPC from sharing the test's connections, and their backoff, with the
# Clients under test.
TEST_CHANNEL_OPTIONS = channel_options(max_reconnect_backoff_ms=500)


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    """``tests.waiting.wait_for``, polling less often: these predicates are often RPCs."""
    waiting.wait_for(predicate, timeout, what, poll_s=0.02)


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _holds_data(directory: Path) -> bool:
    return directory.is_dir() and any(directory.iterdir())


def _empty(directory: Path) -> None:
    # Only the contents: the directory may be a mount point (the full-disk test's tmpfs).
    if directory.is_dir():
        for child in directory.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


class ServerDidNotStart(AssertionError):
    def __init__(self, message: str, *, port_taken: bool) -> None:
        super().__init__(message)
        self.port_taken = port_taken


def server_error(err: grpc.RpcError) -> ServerErrorPB | None:
    for key, value in err.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == ERROR_METADATA_KEY:
            return ServerErrorPB.FromString(value)
    return None


class Server:
    def __init__(self, cluster: TserverCluster, config: ServerConfig) -> None:
        self.cluster = cluster
        self.config = config
        self.id = config.id
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel = cluster.channels.channel(config.rpc_addr)
        self.tablet = tablet_pb2_grpc.TabletServiceStub(self.channel)
        self.consensus = consensus_pb2_grpc.ConsensusServiceStub(self.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)
        self.log_path = cluster.root / f"{self.id}.log"

    def start(self, extra_flags: Sequence[str] = ()) -> None:
        self.spawn(extra_flags)
        self.wait_ready()

    def spawn(self, extra_flags: Sequence[str] = ()) -> None:
        """Start the process; ``wait_ready`` waits for its ready line."""
        assert self.proc is None or self.proc.poll() is not None
        # No wait for peers on an empty directory: a test that wants the wait says so.
        # And no hand-over on SIGTERM: the last server a test stops waited out the transfer
        # to a peer that had just stopped (0.5-1 s a cluster); the tests of the hand-over
        # turn it on.
        flags = [
            "--empty_dir_wait_s=0",
            "--leader_handover_wait_s=0",
            *self.cluster.flags,
            *self.cluster.server_flags.get(self.id, ()),
            *extra_flags,
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "raftlet",
                "tserver",
                "--config",
                str(self.cluster.path),
                "--server_id",
                self.id,
                *flags,
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        log.close()

    def wait_ready(self) -> None:
        assert self.proc is not None
        line = _read_line(self.proc, START_TIMEOUT_S)
        if "ready" not in line:
            tail = self.log_tail()
            raise ServerDidNotStart(
                f"{self.id} did not start: {line!r}\n{tail}", port_taken=PORT_TAKEN in tail
            )

    def log_tail(self, n: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._close_pipe()

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit in time.  Returns the exit code."""
        assert self.proc is not None
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(timeout=30)
        self._close_pipe()
        return self.proc.returncode

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def http(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://{self.config.http_addr}{path}", timeout=10) as r:
            return r.read()

    def tablets_json(self) -> list[dict[str, Any]]:
        doc = json.loads(self.http("/tablets.json"))
        return list(doc["tablets"])

    def tablet_status(self, tablet_id: str) -> dict[str, Any]:
        """This server's entry for ``tablet_id`` in its /tablets.json."""
        (status,) = [t for t in self.tablets_json() if t["tablet_id"] == tablet_id]
        return status

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def list_tablets(self, timeout: float = 5.0) -> dict[str, tablet_pb2.TabletStatusPB]:
        """tablet id -> this server's view of its replica (ListTablets)."""
        resp = self.tablet.ListTablets(tablet_pb2.ListTabletsRequest(), timeout=timeout)
        return {t.tablet_id: t for t in resp.tablets}

    def scan_rows(
        self,
        tablet_id: str,
        read_mode: int = tablet_pb2.READ_FOLLOWER_APPLIED,
        timeout: float = 5.0,
        batch_size_rows: int = 0,
    ) -> dict[Any, Any]:
        """Every row of this server's replica of ``tablet_id`` as {key: value}, following
        resume keys.  Needs a two-column (key, value) schema such as ``KV_SCHEMA``."""
        rows: dict[Any, Any] = {}
        resume: bytes | None = None  # None: from the start (b"" is a key)
        while True:
            req = tablet_pb2.ScanRequest(
                tablet_id=tablet_id,
                read_mode=read_mode,  # type: ignore[arg-type]
                resume_key=resume,
                batch_size_rows=batch_size_rows,
            )
            resp = self.tablet.Scan(req, timeout=timeout)
            for row in resp.rows:
                key, value = row_from_pb(self.cluster.schema, list(resp.columns), row)
                assert key not in rows, f"{self.id}: key {key!r} scanned twice in {tablet_id}"
                rows[key] = value
            if not resp.has_more:
                return rows
            resume = resp.resume_key

    def metric_families(self) -> list[Any]:
        """/metrics parsed by prometheus_client."""
        text = self.http("/metrics").decode()
        return list(text_string_to_metric_families(text))

    def metric(self, sample_name: str, **labels: str) -> float:
        """Sum of the samples named ``sample_name`` (e.g. ``rpcs_queue_overflow_total``)
        whose labels include ``labels``; 0.0 when there is none."""
        total = 0.0
        for family in self.metric_families():
            for sample in family.samples:
                if sample.name == sample_name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total


def tserver_that_exits(cluster: TserverCluster, *flags: str) -> tuple[int | None, str, str]:
    """Run a ``raftlet tserver`` of ``cluster``'s config with ``flags``, expecting it to exit
    on its own: its exit code (None if it had to be killed after ``START_TIMEOUT_S``),
    stdout and stderr."""
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "raftlet", "tserver", "--config", str(cluster.path)),
            *("--empty_dir_wait_s=0", *flags),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return None, out.decode(), err.decode()
    return proc.returncode, out.decode(), err.decode()


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or (proc.poll() is not None and not sel.select(0)):
                return buf.decode(errors="replace")
            if sel.select(min(left, 0.5)):
                chunk = os.read(fd, 4096)
                if not chunk:
                    return buf.decode(errors="replace")
                buf += chunk
    return buf.split(b"\n", 1)[0].decode(errors="replace")


HARNESS_TICK_MS = 50


def harness_timings(election_ticks: int = 10) -> RaftTimings:
    """The harness's Raft timings: 50 ms ticks, a heartbeat every tick, elections after
    ``election_ticks`` to twice that without one (0.5-1 s by default).  Tests that must see
    no election a loaded machine could start ask for more ticks."""
    return RaftTimings(
        tick_interval_ms=HARNESS_TICK_MS, election_ticks=election_ticks, heartbeat_ticks=1
    )


class TserverCluster:
    def __init__(
        self,
        root: Path,
        *,
        n_servers: int = 3,
        partitions: int = 2,
        schema: Schema = KV_SCHEMA,
        flags: Sequence[str] = (),
        raft: RaftTimings | None = None,
    ) -> None:
        self.root = root
        self.flags = list(flags)
        # Flags for one server only (after ``flags``, kept across restarts), e.g. the
        # --peer_addresses of a ProxyNetwork, which needs the config's ports to exist first.
        self.server_flags: dict[str, list[str]] = {}
        self.path = root / "cluster.toml"
        self.schema = schema
        self.partitions = partitions
        self.channels = ChannelPool(TEST_CHANNEL_OPTIONS)
        self._n_servers = n_servers
        self._raft = raft or harness_timings()
        self._started = False
        self._pick_ports()

    def _new_servers(self, first: int, count: int) -> tuple[ServerConfig, ...]:
        """Servers ts<first>.. on free ports, their data under ``root``."""
        ports = free_ports(2 * count)
        return tuple(
            ServerConfig(
                id=f"ts{first + i}",
                rpc_addr=f"127.0.0.1:{ports[2 * i]}",
                http_addr=f"127.0.0.1:{ports[2 * i + 1]}",
                data_dir=self.root / f"ts{first + i}",
            )
            for i in range(count)
        )

    def add_servers(self, count: int) -> None:
        """Add ``count`` servers to the config file (every server stopped first; ``start``
        starts them all, in config order)."""
        assert not any(s.alive for s in self.servers.values())
        added = self._new_servers(len(self.config.servers) + 1, count)
        grown = dataclasses.replace(self.config, servers=(*self.config.servers, *added))
        self.config = write_cluster_config(grown, self.path)
        self.channels.close()
        self.channels = ChannelPool(TEST_CHANNEL_OPTIONS)
        self.servers = {s.id: Server(self, s) for s in self.config.servers}

    def _pick_ports(self) -> None:
        servers = self._new_servers(1, self._n_servers)
        config = ClusterConfig(
            name="itest",
            servers=servers,
            tables=(TableConfig("kv", self.schema, self.partitions, min(3, self._n_servers)),),
            raft=self._raft,
        )
        self.config = write_cluster_config(config, self.path)
        self.servers = {s.id: Server(self, s) for s in self.config.servers}

    def start(self) -> TserverCluster:
        """Start every server.  A port picked for the first start can be taken by someone
        else before its server binds it (it was free only when picked); then, if nothing
        yet depends on the ports, every server is stopped, its data removed, and the
        cluster starts again on new ports."""
        for attempt in range(PORT_ATTEMPTS):
            try:
                # Together: one by one, each waited for the last to import and open (2-3 s
                # a cluster of three on two cores, against ~1.5 s).  As `cluster up` does,
                # servers that hold data first: an empty one asks them whether it ran
                # before, and one that asked before they listened made replicas afresh.
                servers = list(self.servers.values())
                holding = [s for s in servers if _holds_data(s.config.data_dir)]
                waves = (holding, [s for s in servers if s not in holding])
                for wave in waves:
                    for s in wave:
                        s.spawn()
                    for s in wave:
                        s.wait_ready()
            except ServerDidNotStart as e:
                if not e.port_taken or self._started or self.server_flags:
                    raise
                if attempt == PORT_ATTEMPTS - 1:
                    raise
                self._stop_servers()
                for s in self.servers.values():
                    _empty(s.config.data_dir)
                self._pick_ports()
            else:
                self._started = True
                return self
        raise AssertionError("unreachable")

    def _stop_servers(self) -> None:
        for s in self.servers.values():
            if s.proc is not None:
                s.terminate()

    def stop(self) -> None:
        self._stop_servers()
        self.channels.close()

    @contextlib.contextmanager
    def ports_held(self) -> Iterator[None]:
        """Hold this cluster's ports (bound, not listening) until the block ends, for a
        test that opens listeners of its own before the servers start: one on port 0 --
        a link proxy, say -- could otherwise be given a port picked for a server, which
        then cannot start (seen in CI)."""
        socks: list[socket.socket] = []
        try:
            for server in self.config.servers:
                for addr in (server.rpc_addr, server.http_addr):
                    host, port = addr.rsplit(":", 1)
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    socks.append(sock)
                    sock.bind((host, int(port)))
            yield
        finally:
            for sock in socks:
                sock.close()

    def tablet_ids(self) -> list[str]:
        return [p.tablet_id for p in self.config.placements()]

    def leaders(self) -> dict[str, str]:
        """tablet id -> leader id, for tablets whose leader is ready (asked of each server)."""
        found: dict[str, str] = {}
        for s in self.servers.values():
            if not s.alive:
                continue
            try:
                resp = s.tablet.ListTablets(tablet_pb2.ListTabletsRequest(), timeout=5)
            except grpc.RpcError:
                continue
            for t in resp.tablets:
                if t.leader_ready and t.leader_uuid == s.id:
                    found[t.tablet_id] = s.id
        return found

    def _wait_leaders_where(
        self, ok: Callable[[dict[str, str]], bool], timeout: float, what: str
    ) -> dict[str, str]:
        """The first ``leaders()`` that ``ok`` accepts -- the very answer the wait saw:
        asking again after it could meet a server that failed to answer or an election."""
        seen: dict[str, str] = {}

        def check() -> bool:
            nonlocal seen
            seen = self.leaders()
            return ok(seen)

        wait_for(check, timeout, what)
        return seen

    def wait_leaders(self, timeout: float = 30.0) -> dict[str, str]:
        n = len(self.tablet_ids())
        return self._wait_leaders_where(lambda found: len(found) == n, timeout, "every leader")

    def wait_caught_up(self, timeout: float = 30.0) -> None:
        """Wait until every replica of every tablet has applied what its leader had
        committed when the wait began, and has heard from a leader: a server started
        last may take a reconnect backoff or two to be reached, and until then ``cluster
        status`` rightly calls it lagging.  (A restarted one may have applied everything
        from its own files, yet know no leader, and refuse follower reads.)"""
        leaders = self.wait_leaders(timeout)
        target: dict[str, int] = {}
        for sid in set(leaders.values()):  # one ListTablets per leading server
            listed = self.servers[sid].list_tablets()
            target |= {t: listed[t].commit_index for t, led in leaders.items() if led == sid}
        hosted = {
            s.id: [t for t in target if s.id in self.config.placement(t).replicas]
            for s in self.alive_servers()
        }

        def caught_up() -> bool:
            for sid, tablets in hosted.items():
                if not tablets or not self.servers[sid].alive:
                    continue
                try:
                    listed = self.servers[sid].list_tablets()
                except grpc.RpcError:
                    return False
                for t in tablets:
                    st = listed.get(t)
                    if st is None or st.applied_index < target[t]:
                        return False
                    if not st.leader_uuid:  # none heard from since it opened
                        return False
            return True

        wait_for(caught_up, timeout, f"every replica applied up to {target}")

    def leader_of(self, tablet_id: str, timeout: float = 30.0) -> Server:
        found = self._wait_leaders_where(
            lambda f: tablet_id in f, timeout, f"a leader of {tablet_id}"
        )
        return self.servers[found[tablet_id]]

    def follower_of(self, tablet_id: str) -> Server:
        """A server other than ``tablet_id``'s leader (the first in id order)."""
        leader = self.leader_of(tablet_id)
        return next(s for s in self.servers.values() if s.id != leader.id)

    def new_leader_of(self, tablet_id: str, old: str, timeout: float = 30.0) -> Server:
        """Wait for a ready leader of ``tablet_id`` other than server ``old``."""
        found = self._wait_leaders_where(
            lambda f: f.get(tablet_id, old) != old,
            timeout,
            f"a leader of {tablet_id} other than {old}",
        )
        return self.servers[found[tablet_id]]

    def move_leader(self, tablet_id: str, to: str, timeout: float = 60.0) -> None:
        """Make server ``to`` the ready leader of ``tablet_id`` (leader transfers, asked
        again while another server leads: a transfer may lose to an election)."""
        asked_at = -float("inf")

        def there() -> bool:
            nonlocal asked_at
            leader = self.leaders().get(tablet_id)
            if leader is None or leader == to:
                return leader == to
            if time.monotonic() - asked_at < 2.0:  # a transfer takes a few heartbeats
                return False
            asked_at = time.monotonic()
            with contextlib.suppress(grpc.RpcError):  # not ready, or leadership moved
                self.servers[leader].admin.LeaderStepDown(
                    admin_pb2.LeaderStepDownRequest(tablet_id=tablet_id, new_leader_uuid=to),
                    timeout=10,
                )
            return False

        wait_for(there, timeout, f"{to} leading {tablet_id}")

    def tablet_for_key(self, key: object) -> str:
        """The tablet holding ``key`` of table kv (the client's routing)."""
        return f"kv-p{partition_for_key(self.schema, [key], self.partitions)}"

    def alive_servers(self) -> list[Server]:
        return [s for s in self.servers.values() if s.alive]

    def replica_rows(
        self, tablet_id: str, servers: Sequence[str] | None = None
    ) -> dict[str, dict[Any, Any] | str]:
        """Follower-applied rows of ``tablet_id`` on each live server of ``servers`` (default
        all), or the error its scan failed with."""
        out: dict[str, dict[Any, Any] | str] = {}
        for s in self.alive_servers():
            if servers is not None and s.id not in servers:
                continue
            try:
                out[s.id] = s.scan_rows(tablet_id)
            except grpc.RpcError as e:
                out[s.id] = f"{e.code()}: {e.details()}"
        return out

    def wait_converged(
        self,
        tablet_id: str,
        expected: dict[Any, Any],
        timeout: float = 30.0,
        servers: Sequence[str] | None = None,
    ) -> None:
        """Wait until each replica of ``tablet_id`` (on ``servers``, default all that host
        one, which must then all be running) has applied exactly ``expected``, read with
        follower reads; on timeout the assertion shows what each one holds."""
        ids = list(servers or self.config.placement(tablet_id).replicas)
        deadline = time.monotonic() + timeout
        while True:
            seen = self.replica_rows(tablet_id, ids)
            if all(seen.get(sid) == expected for sid in ids):
                return
            if time.monotonic() > deadline:
                diffs = {sid: _diff(seen.get(sid, "not running"), expected) for sid in ids}
                raise AssertionError(
                    f"{tablet_id}: replicas did not converge on {len(expected)} rows "
                    f"within {timeout} s: {diffs}"
                )
            threading.Event().wait(0.05)


def _diff(rows: dict[Any, Any] | str, expected: dict[Any, Any]) -> str:
    if isinstance(rows, str):
        return rows
    missing = sorted(set(expected) - set(rows))
    extra = sorted(set(rows) - set(expected))
    wrong = sorted(k for k in set(rows) & set(expected) if rows[k] != expected[k])
    return (
        f"{len(rows)} rows, missing {missing[:10]}, extra {extra[:10]}, "
        f"wrong values {[(k, rows[k], expected[k]) for k in wrong[:10]]}"
    )


@contextlib.contextmanager
def running_cluster(root: Path, **kwargs: Any) -> Iterator[TserverCluster]:
    cluster = TserverCluster(root, **kwargs)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# --- writing -------------------------------------------------------------------------------

# Statuses after which a write may be retried, elsewhere, with the same request id.
# CANCELLED: a server that shuts down cancels the RPCs still running after its grace
# period; the request id makes resending them safe.
RETRIABLE = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)


def kv_op(key: int, value: str | None, op: OpType = OpType.INSERT) -> tablet_pb2.RowOperationPB:
    return encode_row_op(KV_SCHEMA, op, {"key": key, "value": value})


def write_request(
    tablet_id: str,
    ops: Sequence[tablet_pb2.RowOperationPB],
    client_id: str = "",
    seq_no: int = 0,
    first_incomplete_seq_no: int = 0,
    *,
    packed: bool = False,
) -> tablet_pb2.WriteRequest:
    """A write of ``ops``; ``packed``: the same rows as one packed row block."""
    req = tablet_pb2.WriteRequest(tablet_id=tablet_id)
    if client_id:
        req.request_id.client_id = client_id
        req.request_id.seq_no = seq_no
        req.request_id.first_incomplete_seq_no = first_incomplete_seq_no
    if packed:
        rows = [decode_row_op(KV_SCHEMA, op) for op in ops]
        req.row_block.rows, req.row_block.indirect = encode_row_block(
            KV_SCHEMA,
            [(r.type, {"key": r.key[0], **r.values}) for r in rows],
        )
    else:
        req.ops.extend(ops)
    return req


class WriteFailed(AssertionError):
    pass


class WriteResult(NamedTuple):
    response: tablet_pb2.WriteResponse
    attempts: int
    server: str


def write_with_retry(
    cluster: TserverCluster,
    request: tablet_pb2.WriteRequest,
    *,
    timeout: float = 30.0,
    attempt_timeout: float = 2.0,
    first: str | None = None,
    on_attempt: Callable[[str, grpc.StatusCode | None], None] | None = None,
    abort: threading.Event | None = None,
) -> WriteResult:
    """Send ``request`` until a server accepts it: the answer, the number of attempts and
    the server that answered.

    Every attempt carries the same request id (only ``attempt_no`` counts up).  NOT_LEADER
    goes to the hinted leader if it is known, else to the next server; UNAVAILABLE,
    RESOURCE_EXHAUSTED and DEADLINE_EXCEEDED to the next server after a short pause.  Any
    other status, running out of ``timeout``, or ``abort`` being set raises WriteFailed."""
    ids = list(cluster.servers)
    target = first if first in cluster.servers else ids[0]
    deadline = time.monotonic() + timeout
    attempts = 0
    last = ""
    while time.monotonic() < deadline:
        if abort is not None and abort.is_set():
            raise WriteFailed(f"write {request.request_id} aborted; last {last}")
        attempts += 1
        request.request_id.attempt_no = attempts - 1
        server = cluster.servers[target]
        try:
            response = server.tablet.Write(request, timeout=attempt_timeout)
        except grpc.RpcError as e:
            code = e.code()
            if on_attempt is not None:
                on_attempt(target, code)
            err = server_error(e)
            last = f"{target}: {code} {e.details()}"
            nxt = ids[(ids.index(target) + 1) % len(ids)]
            if (
                code == grpc.StatusCode.FAILED_PRECONDITION
                and err is not None
                and (err.code == ServerErrorPB.NOT_LEADER)
            ):
                hint = err.leader_uuid
                if hint in cluster.servers and hint != target:
                    target = hint
                else:  # no leader known here: ask the next server, without spinning
                    target = nxt
                    threading.Event().wait(0.02)
                continue
            if code in RETRIABLE:
                if err is not None and err.code == ServerErrorPB.LEADER_NOT_READY:
                    nxt = target  # the leader, just not ready yet: ask it again
                target = nxt
                threading.Event().wait(0.02)
                continue
            raise WriteFailed(f"write {request.request_id} failed: {last}") from e
        if on_attempt is not None:
            on_attempt(target, None)
        return WriteResult(response, attempts, target)
    raise WriteFailed(f"write {request.request_id} not acknowledged in {timeout} s; last {last}")


@dataclasses.dataclass(frozen=True)
class AckedWrite:
    client_id: str
    seq_no: int
    tablet_id: str
    key: int
    value: str
    op_index: int
    op_term: int
    attempts: int
    server: str
    acked_at: float  # time.monotonic()


class WriteLoad:
    """A continuous write load: ``n_writers`` threads, each with its own client id and
    increasing seq_no, each write one INSERT of a key no other write uses, retried with
    ``write_with_retry`` (same request id) until acknowledged.

    Any answer with a row error is recorded in ``errors``: a unique key can only meet
    KEY_EXISTS if a retry was applied on top of its own first attempt.  A writer whose write
    is not acknowledged within ``write_timeout`` stops and records that too; ``stop`` lets
    every writer finish the write it is on, so afterwards each write it started is either
    acknowledged (in ``acked``) or reported in ``errors``."""

    def __init__(
        self,
        cluster: TserverCluster,
        *,
        n_writers: int = 3,
        write_timeout: float = 30.0,
        key_base: int = 0,
        name: str = "load",
    ) -> None:
        self.cluster = cluster
        self.write_timeout = write_timeout
        self.acked: list[AckedWrite] = []
        self.errors: list[str] = []
        self.failed_attempts: dict[grpc.StatusCode, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._abort = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._run,
                args=(f"{name}-w{w}", key_base + w * 1_000_000),
                name=f"{name}-w{w}",
                daemon=True,
            )
            for w in range(n_writers)
        ]

    def __enter__(self) -> WriteLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:  # the test failed already: do not retry for long
            self._abort.set()
        self.stop()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout if timeout is not None else self.write_timeout + 10)
            assert not t.is_alive(), f"writer {t.name} did not stop"

    def _record_attempt(self, _server: str, code: grpc.StatusCode | None) -> None:
        if code is not None:
            with self._lock:
                self.failed_attempts[code] = self.failed_attempts.get(code, 0) + 1

    def _run(self, client_id: str, key_base: int) -> None:
        leader: dict[str, str] = {}
        seq = 0
        while not self._stop.is_set():
            seq += 1
            key = key_base + seq
            value = f"{client_id}#{seq}"
            tablet_id = self.cluster.tablet_for_key(key)
            req = write_request(tablet_id, [kv_op(key, value)], client_id, seq, seq)
            try:
                resp, attempts, server = write_with_retry(
                    self.cluster,
                    req,
                    timeout=self.write_timeout,
                    first=leader.get(tablet_id),
                    on_attempt=self._record_attempt,
                    abort=self._abort,
                )
            except Exception as e:  # WriteFailed, or a bug in the test: report, stop
                with self._lock:
                    self.errors.append(f"{client_id} seq {seq} key {key}: {e}")
                return
            leader[tablet_id] = server
            ack = AckedWrite(
                client_id,
                seq,
                tablet_id,
                key,
                value,
                resp.op_index,
                resp.op_term,
                attempts,
                server,
                time.monotonic(),
            )
            with self._lock:
                if resp.row_errors:
                    codes = [tablet_pb2.RowErrorPB.Code.Name(e.code) for e in resp.row_errors]
                    self.errors.append(
                        f"{client_id} seq {seq} key {key} after {attempts} attempts: "
                        f"row errors {codes} (a retry applied twice?)"
                    )
                self.acked.append(ack)

    # --- reading the results --------------------------------------------------------------

    def snapshot(self) -> list[AckedWrite]:
        with self._lock:
            return list(self.acked)

    def count(self, tablet_id: str | None = None, after: float = 0.0) -> int:
        return sum(
            1
            for a in self.snapshot()
            if (tablet_id is None or a.tablet_id == tablet_id) and a.acked_at > after
        )

    def wait_acked(
        self, n: int, timeout: float = 30.0, tablet_id: str | None = None, after: float = 0.0
    ) -> None:
        """Wait for ``n`` more acknowledgements (of ``tablet_id``) after time ``after``."""
        wait_for(
            lambda: self.count(tablet_id, after) >= n or bool(self.errors),
            timeout,
            f"{n} writes acknowledged{' on ' + tablet_id if tablet_id else ''}",
        )
        assert not self.errors, self.errors

    def expected(self, tablet_id: str) -> dict[int, str]:
        return {a.key: a.value for a in self.snapshot() if a.tablet_id == tablet_id}
