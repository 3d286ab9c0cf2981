"""raftlet next to its peers: single-row durable writes against etcd and PySyncObj, one run.

    .venv/bin/python bench/peers.py [--duration 5] [--repeat 3] [--inflight 1,16,64]
    .venv/bin/python bench/peers.py --mode tablets [--tablets 1,4,16,64] [--idle 5]
    make bench-peers ARGS="--duration 3 --repeat 3"

``--mode peers`` (the default) starts, all at once and all on 127.0.0.1 with ports from the
kernel and data in one temporary directory:

- raftlet: a 3-server cluster with 1 tablet and another with 4 tablets (``raftlet.deploy.local``,
  what ``raftlet cluster up`` runs), replication factor 3, every WAL group fsynced;
- etcd: a 3-member cluster of Debian's ``etcd`` (package ``etcd-server``, installed with
  ``apt-get`` when missing and running as root), default settings, so every member fsyncs its
  WAL before acknowledging;
- PySyncObj: 3 processes replicating a dict, run by the bench's own virtualenv
  (``--bench-venv``, default ``.bench-venv/``, created with ``pysyncobj`` when missing), with no
  journal file (its default: the log is in memory, nothing is written to disk or fsynced) and
  ``appendEntriesUseBatch=False``, its fastest setting here (the default, batching, sends new
  entries only on the next 100 ms tick: ~10 writes/s at 1 in flight; ``--systems
  pysyncobj-batch`` adds that column).
- raftlet with TLS (``--systems raftlet-1-tls,raftlet-4-tls``): the same clusters made by
  ``cluster up --tls``: mutual TLS between servers and with the client, every call's role
  checked; compare with the plaintext columns for what transport security costs.
- raftlet on gRPC only (``--systems raftlet-1-stream,raftlet-4-stream``, and
  ``raftlet-1-tls-stream,raftlet-4-tls-stream``): peers on ``--consensus_transport=stream``
  and the client on the gRPC WriteStream (``AsyncClient(tcp_writes=False)``) -- the write
  path before the tcp ports, measured side by side with it.

- CPU placement: every server process of every system gets one CPU, round-robin over the
  CPUs the bench may use (raftlet's ``cluster up`` default, ``--cpu_affinity auto``; etcd and
  PySyncObj members started bound the same way), since on a small VM waking a thread on
  another CPU costs more than the work it hands over.  ``raftlet-1-unpinned``,
  ``raftlet-4-unpinned``, ``etcd-unpinned`` and ``pysyncobj-unpinned`` leave placement to
  the OS, for the side-by-side.

A system that cannot be set up is skipped with the reason printed.  Every repetition starts
every system anew (new directories, new processes; all of them up together) and stops them
at its end: two clusters of one build can differ by 10-30% for as long as they run
(docs/benchmarks.md, "Two clusters of one build"), so no one cluster of a system decides
its medians.  In each repetition, each system in turn (round-robin, the starting system
rotating), after ``--warmup`` unrecorded seconds, and each in-flight level:
a closed loop of N concurrent writers, each write one ~100-byte row (``--value-bytes``) under
a new key, for ``--duration`` seconds.  Per cell: writes/s, p50/p99 latency, the CPU time
(utime+stime from /proc/<pid>/stat) of the system's three server processes per acknowledged
write, and the bench client's own CPU per write.  Printed: the median over repetitions of
each, and the ratios raftlet/peer per in-flight level.

The clients:

- raftlet (``--raftlet-client``): ``open_raftlet_driver`` is the one place that picks the
  client path.  ``aio``: the asyncio client ``raftlet.client.aio`` (``AsyncClient.insert``,
  one row per Write RPC), from coroutines on one event loop; ``grpc``: the bench's own
  coroutines calling ``TabletService/Write`` through ``grpc.aio`` on each tablet's leader
  (found with GetClusterConfig + ListTablets; NOT_LEADER takes the hint or refreshes), each
  write with its own request id, as the threaded client does; ``auto`` (default): ``aio``
  when it imports, else ``grpc``.  The printout names the path used.
- etcd: coroutines on the same kind of ``grpc.aio`` loop calling ``etcdserverpb.KV/Put`` on
  the leader with a hand-encoded PutRequest (no etcd .proto files needed).
- PySyncObj has no client protocol: the writer runs inside the leader process, keeping N
  replicated calls outstanding with callbacks (``bench/_peers_syncobj.py``) — its best
  configuration, and its "server CPU" includes that writer.  Client CPU: none.

``--mode tablets``: for each tablet count (tablets per server: 3 servers, replication 3), a
fresh raftlet cluster; its idle CPU per server (% of one core over ``--idle`` seconds), threads
per server (/proc/<pid>/status), and writes at the highest in-flight level (median of
``--repeat`` cells); servers one CPU each, or left to the OS with ``--unpinned``.  ``--mode
all`` runs both.

Every process the bench starts is stopped (by PID) and the temporary directory removed, also on
failure and Ctrl-C.  Not part of ``make bench``: it installs packages and runs for minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from _drivers import percentile, place_leaders, run_coroutines_for  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
DEFAULT_BENCH_VENV = ROOT / ".bench-venv"
SYNCOBJ_NODE = BENCH / "_peers_syncobj.py"

# ---- pure parts (tests/unit/test_bench_peers.py) --------------------------------------------


def int_list(text: str) -> list[int]:
    """``"1,16,64"`` -> ``[1, 16, 64]`` (positive integers)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"need positive integers, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--mode", choices=["peers", "tablets", "all"], default="peers")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per cell")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (medians printed)")
    parser.add_argument("--inflight", type=int_list, default=[1, 16, 64], help="e.g. 1,16,64")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument(
        "--systems",
        default="raftlet-1,raftlet-4,etcd,pysyncobj",
        help="which columns of --mode peers (comma separated)",
    )
    parser.add_argument("--tablets", type=int_list, default=[1, 4, 16, 64], help="--mode tablets")
    parser.add_argument("--idle", type=float, default=5.0, help="idle CPU window, seconds")
    parser.add_argument(
        "--unpinned",
        action="store_true",
        help="--mode tablets: leave the servers' CPU placement to the OS (cluster up "
        "--cpu-affinity none) instead of one CPU each",
    )
    parser.add_argument("--warmup", type=float, default=1.0, help="unrecorded seconds per system")
    parser.add_argument(
        "--raftlet-client",
        choices=RAFTLET_CLIENTS,
        default="auto",
        help="aio: raftlet.client.aio; grpc: grpc.aio on the Write RPC; auto: aio if present",
    )
    parser.add_argument("--bench-venv", type=Path, default=DEFAULT_BENCH_VENV)
    parser.add_argument("--no-install", action="store_true", help="never apt-get or pip install")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.duration <= 0:
        parser.error("--duration must be positive")
    unknown = set(args.systems.split(",")) - set(SYSTEM_NAMES)
    if unknown:
        parser.error(f"unknown --systems {sorted(unknown)}; choose from {SYSTEM_NAMES}")
    return args


def median(values: Sequence[float]) -> float:
    """The median of the finite values; nan if there are none."""
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def ratio(a: float, b: float) -> float:
    """``a / b``; nan when either is nan or ``b`` is 0."""
    if math.isnan(a) or math.isnan(b) or b == 0:
        return math.nan
    return a / b


def fmt(value: float, digits: int = 2) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def fmt_ratio(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}x"


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    if n < 0:
        raise ValueError("varint of a negative number")
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def encode_put_request(key: bytes, value: bytes) -> bytes:
    """etcd's ``PutRequest`` (``bytes key = 1; bytes value = 2;``) in protobuf wire format."""
    return b"\x0a" + varint(len(key)) + key + b"\x12" + varint(len(value)) + value


def cpu_ticks_from_stat(stat: str) -> int:
    """utime + stime (clock ticks) from the text of /proc/<pid>/stat."""
    # Field 2, the command, is in parentheses and may hold spaces: split after the last ')'.
    rest = stat.rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])  # fields 14 and 15


def threads_from_status(status: str) -> int:
    """The ``Threads:`` line of /proc/<pid>/status."""
    for line in status.splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise ValueError("no Threads: line")


@dataclass
class Cell:
    """One measured cell: a system, an in-flight level, a fixed time."""

    writes: int
    elapsed: float
    latencies_ms: list[float]
    server_cpu_s: float = math.nan
    client_cpu_s: float = math.nan  # nan: the writer runs inside the server (PySyncObj)
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.writes / self.elapsed if self.elapsed > 0 else math.nan

    @property
    def server_ms_per_write(self) -> float:
        return ratio(self.server_cpu_s * 1000, self.writes)

    @property
    def client_ms_per_write(self) -> float:
        return ratio(self.client_cpu_s * 1000, self.writes)


@dataclass(frozen=True)
class Summary:
    """Medians over the repetitions of one (system, in-flight) cell."""

    rate: float
    p50: float
    p99: float
    server_ms: float
    client_ms: float
    errors: int
    cells: int


def summarize(cells: Sequence[Cell]) -> Summary:
    return Summary(
        rate=median([c.rate for c in cells]),
        p50=median([percentile(c.latencies_ms, 0.5) for c in cells]),
        p99=median([percentile(c.latencies_ms, 0.99) for c in cells]),
        server_ms=median([c.server_ms_per_write for c in cells]),
        client_ms=median([c.client_ms_per_write for c in cells]),
        errors=sum(sum(c.errors.values()) for c in cells),
        cells=len(cells),
    )


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table, columns padded to their widest cell (numbers right-aligned)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(cells):
            numeric = c[:1].isdigit() or c in ("-",) or c.endswith("x")
            out.append(c.rjust(widths[i]) if numeric else c.ljust(widths[i]))
        return "| " + " | ".join(out) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def peers_table(
    systems: Sequence[tuple[str, str]],
    results: dict[tuple[str, int], Summary],
    levels: Sequence[int],
) -> str:
    """Per system and in-flight level: the medians, and the system's durability."""
    header = [
        "system",
        "in flight",
        "writes/s",
        "p50 ms",
        "p99 ms",
        "server CPU ms/write",
        "client CPU ms/write",
        "errors",
        "durability",
    ]
    rows = []
    for name, durability in systems:
        for level in levels:
            s = results.get((name, level))
            if s is None:
                continue
            rows.append(
                [
                    name,
                    str(level),
                    fmt(s.rate, 0),
                    fmt(s.p50),
                    fmt(s.p99),
                    fmt(s.server_ms, 3),
                    fmt(s.client_ms, 3),
                    str(s.errors),
                    durability,
                ]
            )
    return markdown_table(header, rows)


def ratios_table(
    results: dict[tuple[str, int], Summary],
    levels: Sequence[int],
    ours: Sequence[str],
    peers: Sequence[str],
) -> str:
    """raftlet / peer, per in-flight level: writes/s (> 1: raftlet faster), p50, p99 and
    server CPU per write (< 1: raftlet lower)."""
    header = ["in flight", "raftlet", "vs", "writes/s", "p50", "p99", "server CPU/write"]
    rows = []
    for level in levels:
        for mine in ours:
            for peer in peers:
                a, b = results.get((mine, level)), results.get((peer, level))
                if a is None or b is None:
                    continue
                rows.append(
                    [
                        str(level),
                        mine,
                        peer,
                        fmt_ratio(ratio(a.rate, b.rate)),
                        fmt_ratio(ratio(a.p50, b.p50)),
                        fmt_ratio(ratio(a.p99, b.p99)),
                        fmt_ratio(ratio(a.server_ms, b.server_ms)),
                    ]
                )
    return markdown_table(header, rows)


def verdict(ok: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "n/a"}[ok]


def peer_targets(
    results: dict[tuple[str, int], Summary],
    one: str | None,
    four: str | None,
    etcd: str | None,
    pysyncobj: str | None,
) -> list[str]:
    """Issue 12's "Must show" targets that this run can judge, one line each (raftlet 1 and 4
    tablets, etcd and PySyncObj by the names their rows carry; None: not measured)."""

    def get(name: str | None, level: int) -> Summary | None:
        return None if name is None else results.get((name, level))

    def at_least(mine: str | None, peer: str | None, levels: Sequence[int]) -> bool | None:
        pairs = [(get(mine, lv), get(peer, lv)) for lv in levels]
        if any(a is None or b is None for a, b in pairs):
            return None
        return all(a.rate >= b.rate for a, b in pairs if a is not None and b is not None)

    def below(name: str | None, level: int, attr: str, limit: float) -> bool | None:
        s = get(name, level)
        return None if s is None or math.isnan(getattr(s, attr)) else getattr(s, attr) <= limit

    return [
        f"- {verdict(at_least(four, etcd, [1, 64]))}: raftlet 4 tablets >= etcd writes/s "
        "at 1 and 64 in flight",
        f"- {verdict(at_least(four, pysyncobj, [16, 64]))}: raftlet 4 tablets >= PySyncObj "
        "writes/s at 16 and 64 in flight",
        f"- {verdict(below(four, 1, 'p50', 1.5))}: single-writer p50 <= 1.5 ms (4 tablets)",
        f"- {verdict(below(four, 64, 'server_ms', 0.3))}: server CPU <= 0.3 ms per write at "
        "64 in flight (4 tablets)",
        f"- {verdict(at_least(four, one, [16, 64]))}: 4 tablets >= 1 tablet writes/s at 16 "
        "and 64 in flight",
    ]


@dataclass(frozen=True)
class TabletsRow:
    tablets: int
    idle_cpu_pct: list[float]  # per server, % of one core
    threads: list[int]  # per server
    write: Summary
    inflight: int


def tablets_table(rows: Sequence[TabletsRow]) -> str:
    header = [
        "tablets per server",
        "idle CPU % of a core per server (mean / max)",
        "threads per server",
        "in flight",
        "writes/s",
        "p50 ms",
        "p99 ms",
        "server CPU ms/write",
    ]
    out = []
    for r in rows:
        cpu = f"{fmt(statistics.mean(r.idle_cpu_pct), 1)} / {fmt(max(r.idle_cpu_pct), 1)}"
        threads = "/".join(str(t) for t in r.threads)
        out.append(
            [
                str(r.tablets),
                cpu,
                threads,
                str(r.inflight),
                fmt(r.write.rate, 0),
                fmt(r.write.p50),
                fmt(r.write.p99),
                fmt(r.write.server_ms, 3),
            ]
        )
    return markdown_table(header, out)


def tablets_targets(rows: Sequence[TabletsRow]) -> list[str]:
    """Issue 12's targets for many tablets: at 64 tablets per server, idle <= 5% of a core
    per server and writes no slower than with 1 tablet."""
    by = {r.tablets: r for r in rows}
    many, one = by.get(64), by.get(1)
    idle = None if many is None else max(many.idle_cpu_pct) <= 5.0
    rate = None if many is None or one is None else many.write.rate >= one.write.rate
    return [
        f"- {verdict(idle)}: 64 tablets per server, idle CPU <= 5% of a core on every server",
        f"- {verdict(rate)}: 64 tablets per server write no slower than 1 tablet",
    ]


# ---- processes -------------------------------------------------------------------------------


def cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime of these processes (all their threads), in seconds."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_ticks_from_stat(Path(f"/proc/{pid}/stat").read_text())
    return total / CLK_TCK


def thread_count(pid: int) -> int:
    return threads_from_status(Path(f"/proc/{pid}/status").read_text())


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def free_ports(n: int) -> list[int]:
    from raftlet.deploy.local import free_ports as _free_ports

    return _free_ports(n, "127.0.0.1")


def one_cpu(i: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` binding the child (and every thread it starts) to one CPU: member
    ``i`` gets the CPU raftlet's ``--cpu_affinity auto`` gives server i.  None where there
    is no CPU affinity."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    from raftlet.tserver.cpu_affinity import AUTO, resolve_cpus

    cpus = resolve_cpus(AUTO, i, frozenset(os.sched_getaffinity(0)))
    assert cpus is not None  # auto always names a CPU
    return lambda: os.sched_setaffinity(0, cpus)


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], timeout: float = 10.0) -> None:
    """SIGTERM each (by its PID), wait, SIGKILL what is left, reap all."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- the systems -----------------------------------------------------------------------------


class Unavailable(Exception):
    """A system cannot be set up here; its column is skipped with this reason."""


WriteFn = Callable[[int, int], Awaitable[None]]  # (slot, key)


async def closed_loop(write: WriteFn, inflight: int, seconds: float) -> Cell:
    """``inflight`` coroutines, each writing one key after another for ``seconds``."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    keys = itertools.count(time.time_ns())
    slots = itertools.count()

    async def produce(stop: asyncio.Event) -> int:
        slot = next(slots)
        n = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                await write(slot, next(keys))
            except Exception as e:
                name = type(e).__name__
                errors[name] = errors.get(name, 0) + 1
                await asyncio.sleep(0.01)
                continue
            latencies.append((time.perf_counter() - t0) * 1000)
            n += 1
        return n

    writes, elapsed = await run_coroutines_for(seconds, inflight, produce)
    return Cell(writes, elapsed, latencies, errors=errors)


class System(Protocol):
    name: str
    durability: str

    def start(self) -> None: ...

    def pids(self) -> list[int]: ...

    async def run_cell(self, inflight: int, seconds: float) -> Cell: ...

    async def close(self) -> None: ...

    def stop(self) -> None: ...


# -- raftlet --


class RaftletDriver(Protocol):
    """What the bench needs of a raftlet client: one single-row insert, awaited."""

    async def write(self, slot: int, key: int, value: str) -> None: ...

    async def close(self) -> None: ...


class GrpcAioRaftletDriver:
    """grpc.aio straight on ``TabletService/Write``: one channel per server, each tablet's
    leader from ListTablets, a request id per write (client id per slot, rising seq_no),
    retried on NOT_LEADER (hint or refresh) and on busy/not-ready answers."""

    def __init__(self, addresses: Sequence[str], credentials: Any = None) -> None:
        import grpc

        from raftlet.proto import tablet_pb2_grpc

        self._grpc = grpc
        self._credentials = credentials  # grpc.ChannelCredentials of a TLS cluster, or None
        self._seed = list(addresses)
        self._channels: dict[str, Any] = {}
        self._stubs: dict[str, Any] = {}
        self._stub_class = tablet_pb2_grpc.TabletServiceStub
        self.addr: dict[str, str] = {}  # server uuid -> rpc address
        self.tablet_of_partition: dict[int, str] = {}
        self.partitions = 0
        self.leader: dict[str, str] = {}  # tablet id -> server uuid
        self._refresh_lock = asyncio.Lock()
        self._generation = 0
        self._client = f"peers-{os.getpid()}-{time.time_ns() % 10**9}"
        self._seq: dict[int, int] = {}
        self.retries: dict[str, int] = {}

    def _stub(self, address: str) -> Any:
        if address not in self._stubs:
            if self._credentials is not None:
                ch = self._grpc.aio.secure_channel(address, self._credentials)
            else:
                ch = self._grpc.aio.insecure_channel(address)
            self._channels[address] = ch
            self._stubs[address] = self._stub_class(ch)
        return self._stubs[address]

    async def open(self) -> None:
        from raftlet.proto import tablet_pb2

        resp = await self._stub(self._seed[0]).GetClusterConfig(
            tablet_pb2.GetClusterConfigRequest(), timeout=10
        )
        self.addr = {s.uuid: s.rpc_addr for s in resp.servers}
        self.partitions = resp.tables[0].num_partitions
        self.tablet_of_partition = {t.partition: t.tablet_id for t in resp.tablets}
        await self.refresh(self._generation)

    async def refresh(self, seen_generation: int) -> None:
        """Ask every server which tablets it leads (once for all writers that saw the same
        stale view)."""
        from raftlet.proto import consensus_pb2, tablet_pb2

        async with self._refresh_lock:
            if self._generation != seen_generation:
                return
            for uuid, address in self.addr.items():
                try:
                    resp = await self._stub(address).ListTablets(
                        tablet_pb2.ListTabletsRequest(), timeout=2
                    )
                except self._grpc.aio.AioRpcError:
                    continue
                for t in resp.tablets:
                    if t.role == consensus_pb2.LEADER and t.leader_ready:
                        self.leader[t.tablet_id] = uuid
            self._generation += 1

    async def write(self, slot: int, key: int, value: str) -> None:
        from raftlet.deploy.local import KV_SCHEMA
        from raftlet.proto import ERROR_METADATA_KEY, tablet_pb2
        from raftlet.proto.common_pb2 import ServerErrorPB
        from raftlet.schema.partition import partition_for_key
        from raftlet.schema.rows import OpType, encode_row_op

        seq = self._seq.get(slot, 0) + 1
        self._seq[slot] = seq
        tid = self.tablet_of_partition[partition_for_key(KV_SCHEMA, [key], self.partitions)]
        req = tablet_pb2.WriteRequest(tablet_id=tid)
        req.request_id.client_id = f"{self._client}-{slot}"
        req.request_id.seq_no = seq
        req.request_id.first_incomplete_seq_no = seq
        req.ops.append(encode_row_op(KV_SCHEMA, OpType.INSERT, {"key": key, "value": value}))
        deadline = time.monotonic() + 30
        for attempt in itertools.count():
            req.request_id.attempt_no = attempt
            generation = self._generation
            uuid = self.leader.get(tid)
            if uuid is None:
                await self.refresh(generation)
                uuid = self.leader.get(tid) or next(iter(self.addr))
            err = ServerErrorPB()
            cause = ""
            try:
                resp = await self._stub(self.addr[uuid]).Write(req, timeout=10)
            except self._grpc.aio.AioRpcError as e:
                cause = e.code().name
                for k, v in e.trailing_metadata() or ():
                    if k == ERROR_METADATA_KEY:
                        err.ParseFromString(v)
            else:
                if not resp.error.code and not resp.error.message:
                    if resp.row_errors:
                        raise RuntimeError(f"row error {resp.row_errors[0].code}")
                    return
                err = resp.error
            if err.code:
                cause = ServerErrorPB.Code.Name(err.code)
            self.retries[cause] = self.retries.get(cause, 0) + 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"write to {tid} failed: {cause}")
            if cause in ("NOT_LEADER", "TERM_MOVED", "TABLET_NOT_FOUND", "UNAVAILABLE", ""):
                if err.leader_uuid and err.leader_uuid != uuid and err.leader_uuid in self.addr:
                    self.leader[tid] = err.leader_uuid
                else:
                    self.leader.pop(tid, None)
                    await asyncio.sleep(0.01)
                    await self.refresh(generation)
            else:  # queue full, leader not ready, deadline…: back off, same server
                await asyncio.sleep(min(0.2, 0.005 * 2**attempt))

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
        self._stubs.clear()


class AioClientRaftletDriver:
    """``raftlet.client.aio.AsyncClient``: ``insert`` of one row, its own request ids,
    routing and retries."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def write(self, slot: int, key: int, value: str) -> None:
        await self.client.insert("kv", {"key": key, "value": value})

    async def close(self) -> None:
        await self.client.close()


RAFTLET_CLIENTS = ("auto", "aio", "grpc")


async def open_raftlet_driver(
    addresses: Sequence[str], which: str, tls: Any = None, tcp_writes: bool = True
) -> tuple[RaftletDriver, str]:
    """The raftlet client path of the bench, and its name for the printout.  ``which``:
    ``aio`` the asyncio client ``raftlet.client.aio`` (an error if it is missing), ``grpc``
    grpc.aio straight on the Write RPC, ``auto`` the first when it imports, else the second.
    ``tls``: the ``TlsOptions`` of a TLS cluster (its admin certificate), or None.
    ``tcp_writes``: the asyncio client's writes on the servers' plain-TCP write ports (when
    they have them), else on their gRPC WriteStream.
    """
    if which in ("auto", "aio"):
        try:
            from raftlet.client.aio import AsyncClient
        except ImportError as e:
            if which == "aio":
                raise
            say(f"raftlet.client.aio unavailable ({e}); grpc.aio on the Write RPC instead")
        else:
            client = await AsyncClient.connect(list(addresses), tls=tls, tcp_writes=tcp_writes)
            path = "tcp write port" if tcp_writes else "WriteStream"  # TLS there under TLS
            return AioClientRaftletDriver(client), f"raftlet.client.aio AsyncClient.insert ({path})"
    driver = GrpcAioRaftletDriver(addresses, tls.credentials() if tls is not None else None)
    await driver.open()
    return driver, "grpc.aio on the Write RPC (bench's own routing)"


class Raftlet:
    durability = "fsync (WAL group commit) on each replica"

    def __init__(
        self,
        tablets: int,
        root: Path,
        value_bytes: int,
        client: str = "auto",
        tls: bool = False,
        transport: str = "",
        pinned: bool = True,
    ) -> None:
        self.tablets = tablets
        self.pinned = pinned
        self.client = client
        self.tls = tls
        # "": the server's default --consensus_transport (tcp).
        self.transport = transport
        self.name = f"raftlet {tablets} tablet" + ("s" if tablets != 1 else "")
        self.name += " TLS" if tls else ""
        self.name += f" ({transport})" if transport else ""
        self.name += "" if pinned else " unpinned"
        self.dir = root / (
            f"raftlet-{tablets}"
            + ("-tls" if tls else "")
            + (f"-{transport}" if transport else "")
            + ("" if pinned else "-unpinned")
        )
        self.value = "v" * value_bytes
        self.cluster: Any = None
        self.driver: RaftletDriver | None = None
        self.client_path = ""

    def start(self) -> None:
        from raftlet.deploy.local import LocalCluster

        # tls: mutual TLS between servers and with the client, roles checked on every call.
        flags = [f"--consensus_transport={self.transport}"] if self.transport else []
        self.cluster = LocalCluster.create(
            self.dir,
            servers=3,
            tablets=self.tablets,
            leader_timeout_s=180,
            tls=self.tls,
            extra_flags=flags,
            cpu_affinity="auto" if self.pinned else "",
        )
        # Tablet i's leader on server i mod 3, every run: elections alone would leave it to luck.
        place_leaders(ROOT, self.dir)

    def pids(self) -> list[int]:
        return [s.pid for s in self.cluster.servers.values()]

    def addresses(self) -> list[str]:
        return [s.rpc_addr for s in self.cluster.config.servers]

    async def run_cell(self, inflight: int, seconds: float) -> Cell:
        if self.driver is None:
            tls = None
            if self.tls:
                from raftlet.client.tls import TlsOptions
                from raftlet.deploy.local import local_tls_files

                files = local_tls_files(self.cluster.data_dir)
                assert files is not None
                tls = TlsOptions(*files)
            # The stream systems measure the path before plain TCP: peers and client on gRPC.
            self.driver, self.client_path = await open_raftlet_driver(
                self.addresses(), self.client, tls, tcp_writes=self.transport != "stream"
            )
        driver = self.driver

        async def write(slot: int, key: int) -> None:
            await driver.write(slot, key, self.value)

        return await closed_loop(write, inflight, seconds)

    async def close(self) -> None:
        if self.driver is not None:
            await self.driver.close()
            self.driver = None

    def stop(self) -> None:
        if self.cluster is not None:
            try:
                self.cluster.down(timeout=10)
            finally:
                self.cluster = None


# -- etcd --


def ensure_etcd(install: bool) -> str:
    """The etcd binary, installing Debian's etcd-server when missing and root; else raises
    Unavailable with the reason."""
    found = shutil.which("etcd")
    if found:
        return found
    if not install:
        raise Unavailable("etcd is not installed (and --no-install)")
    if os.geteuid() != 0:
        raise Unavailable("etcd is not installed and the bench is not root (apt-get needed)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "etcd-server"]
    say("installing etcd-server with apt-get")
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    found = shutil.which("etcd")
    if not found:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["?"]
        raise Unavailable(f"apt-get install etcd-server failed: {tail[0]}")
    return found


def etcd_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    first = out.stdout.splitlines()[0] if out.stdout else "etcd"
    return first.replace("etcd Version: ", "etcd ")


def etcd_status(client_port: int) -> dict[str, Any]:
    """The member's Maintenance/Status through etcd's JSON gateway."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{client_port}/v3/maintenance/status",
        data=b"{}",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=2) as resp:
        return dict(json.loads(resp.read()))


class Etcd:
    name = "etcd"
    durability = "fsync (WAL) on each member"

    def __init__(self, root: Path, value_bytes: int, install: bool, pinned: bool = True) -> None:
        self.pinned = pinned
        self.dir = root / ("etcd" if pinned else "etcd-unpinned")
        self.value = b"v" * value_bytes
        self.install = install
        self.procs: list[subprocess.Popen[bytes]] = []
        self.client_ports: list[int] = []
        self.leader_port = 0
        self.channel: Any = None

    def start(self) -> None:
        binary = ensure_etcd(self.install)
        self.name = f"etcd ({etcd_version(binary).split()[-1]})"
        self.name += "" if self.pinned else " unpinned"
        ports = free_ports(6)
        self.client_ports, peer_ports = ports[:3], ports[3:]
        names = [f"m{i + 1}" for i in range(3)]
        initial = ",".join(
            f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, peer_ports, strict=True)
        )
        self.dir.mkdir(parents=True)
        for i, (name, cport, pport) in enumerate(
            zip(names, self.client_ports, peer_ports, strict=True)
        ):
            argv = [
                binary,
                "--name", name,
                "--data-dir", str(self.dir / name),
                "--listen-client-urls", f"http://127.0.0.1:{cport}",
                "--advertise-client-urls", f"http://127.0.0.1:{cport}",
                "--listen-peer-urls", f"http://127.0.0.1:{pport}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{pport}",
                "--initial-cluster", initial,
                "--initial-cluster-state", "new",
                "--initial-cluster-token", "raftlet-bench-peers",
                "--logger", "zap",
                "--log-level", "warn",
            ]  # fmt: skip
            with open(self.dir / f"{name}.log", "ab") as log:
                self.procs.append(
                    subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=one_cpu(i) if self.pinned else None,
                    )
                )
        deadline = time.monotonic() + 60
        while True:
            for p in self.procs:
                if p.poll() is not None:
                    raise Unavailable(f"etcd member exited with {p.returncode} (see its log)")
            try:
                statuses = [etcd_status(port) for port in self.client_ports]
                leaders = {s.get("leader") for s in statuses}
                if len(leaders) == 1 and None not in leaders and "0" not in leaders:
                    leader = leaders.pop()
                    for port, s in zip(self.client_ports, statuses, strict=True):
                        if s["header"]["member_id"] == leader:
                            self.leader_port = port
                    if self.leader_port:
                        return
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise Unavailable("etcd cluster elected no leader within 60 s")
            time.sleep(0.2)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    async def run_cell(self, inflight: int, seconds: float) -> Cell:
        import grpc

        if self.channel is None:
            self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.leader_port}")
        put = self.channel.unary_unary(
            "/etcdserverpb.KV/Put", request_serializer=None, response_deserializer=None
        )
        value = self.value

        async def write(_slot: int, key: int) -> None:
            await put(encode_put_request(b"k%d" % key, value), timeout=10)

        return await closed_loop(write, inflight, seconds)

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None

    def stop(self) -> None:
        stop_processes(self.procs)


# -- PySyncObj --


def ensure_bench_python(venv: Path, install: bool) -> Path:
    """The bench virtualenv's python, with pysyncobj (created when missing)."""
    venv = Path(os.path.abspath(venv))  # absolute, but not resolved: its python is a symlink
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import pysyncobj"]
    if python.exists() and subprocess.run(check, capture_output=True, check=False).returncode == 0:
        return python
    if not install:
        raise Unavailable(f"{venv} has no pysyncobj (and --no-install)")
    say(f"creating {venv} with pysyncobj")
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "pysyncobj"],
    ]
    for cmd in steps:
        if python.exists() and cmd[0] == sys.executable:
            continue
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
            raise Unavailable(f"{' '.join(cmd[:4])} failed: {tail[0]}")
    if subprocess.run(check, capture_output=True, check=False).returncode != 0:
        raise Unavailable(f"pysyncobj does not import in {venv}")
    return python


def control(port: int, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One JSON-line request to a PySyncObj node's control socket."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(json.dumps(request).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                raise ConnectionError("control socket closed")
            buf += chunk
    return dict(json.loads(buf))


class PySyncObj:
    name = "PySyncObj"
    durability = "no fsync (in-memory log, no journal)"

    def __init__(
        self,
        root: Path,
        value_bytes: int,
        venv: Path,
        install: bool,
        batch: bool = False,
        pinned: bool = True,
    ) -> None:
        self.batch = batch
        self.pinned = pinned
        self.dir = root / (
            ("pysyncobj-batch" if batch else "pysyncobj") + ("" if pinned else "-unpinned")
        )
        self.value_bytes = value_bytes
        self.venv = venv
        self.install = install
        self.procs: list[subprocess.Popen[bytes]] = []
        self.raft_ports: list[int] = []
        self.control_ports: list[int] = []
        self.key_base = 0

    def start(self) -> None:
        python = ensure_bench_python(self.venv, self.install)
        version = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('pysyncobj'))"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if version:
            self.name = f"PySyncObj ({version})"
        if self.batch:
            self.name += " batched"
        if not self.pinned:
            self.name += " unpinned"
        ports = free_ports(6)
        self.raft_ports, self.control_ports = ports[:3], ports[3:]
        addrs = [f"127.0.0.1:{p}" for p in self.raft_ports]
        self.dir.mkdir(parents=True)
        for i, (addr, cport) in enumerate(zip(addrs, self.control_ports, strict=True)):
            argv = [
                str(python),
                str(SYNCOBJ_NODE),
                "--self", addr,
                "--partners", ",".join(a for a in addrs if a != addr),
                "--control", f"127.0.0.1:{cport}",
                *(["--batch"] if self.batch else []),
            ]  # fmt: skip
            with open(self.dir / f"node{i + 1}.log", "ab") as log:
                self.procs.append(
                    subprocess.Popen(
                        argv,
                        cwd=self.dir,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=one_cpu(i) if self.pinned else None,
                    )
                )
        self.leader_control()

    def leader_control(self, timeout: float = 60) -> int:
        """The control port of the node that is leader and ready."""
        deadline = time.monotonic() + timeout
        while True:
            for p in self.procs:
                if p.poll() is not None:
                    raise Unavailable(f"a PySyncObj node exited with {p.returncode}")
            for port in self.control_ports:
                try:
                    state = control(port, {"cmd": "state"}, timeout=2)
                except (OSError, ValueError):
                    continue
                if state.get("is_leader") and state.get("ready"):
                    return port
            if time.monotonic() > deadline:
                raise Unavailable(f"PySyncObj elected no leader within {timeout:.0f} s")
            time.sleep(0.2)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    async def run_cell(self, inflight: int, seconds: float) -> Cell:
        port = self.leader_control()
        self.key_base += 1 << 40
        request = {
            "cmd": "load",
            "inflight": inflight,
            "seconds": seconds,
            "value_bytes": self.value_bytes,
            "key_base": self.key_base,
        }
        out = await asyncio.to_thread(control, port, request, seconds + 60)
        lat = [float(x) for x in out["latencies_ms"]]
        errors = {f"fail {k}": int(v) for k, v in out.get("errors", {}).items()}
        return Cell(len(lat), float(out["elapsed"]), lat, errors=errors)

    async def close(self) -> None:
        return None

    def stop(self) -> None:
        stop_processes(self.procs)


SYSTEM_NAMES = (
    "raftlet-1",
    "raftlet-4",
    "raftlet-1-tls",
    "raftlet-4-tls",
    "raftlet-1-stream",
    "raftlet-4-stream",
    "raftlet-1-tls-stream",
    "raftlet-4-tls-stream",
    "etcd",
    "pysyncobj",
    "pysyncobj-batch",
    "raftlet-1-unpinned",
    "raftlet-4-unpinned",
    "etcd-unpinned",
    "pysyncobj-unpinned",
)


def make_system(name: str, root: Path, args: argparse.Namespace) -> System:
    if name in ("raftlet-1", "raftlet-4", "raftlet-1-unpinned", "raftlet-4-unpinned"):
        pinned = not name.endswith("-unpinned")
        return Raftlet(int(name[8]), root, args.value_bytes, args.raftlet_client, pinned=pinned)
    if name in ("raftlet-1-tls", "raftlet-4-tls"):
        return Raftlet(int(name[8]), root, args.value_bytes, args.raftlet_client, tls=True)
    if name in ("raftlet-1-tls-stream", "raftlet-4-tls-stream"):
        return Raftlet(
            int(name[8]), root, args.value_bytes, args.raftlet_client, tls=True, transport="stream"
        )
    if name in ("raftlet-1-stream", "raftlet-4-stream"):
        return Raftlet(
            int(name[8]), root, args.value_bytes, args.raftlet_client, transport="stream"
        )
    if name in ("etcd", "etcd-unpinned"):
        return Etcd(root, args.value_bytes, not args.no_install, pinned=name == "etcd")
    return PySyncObj(
        root,
        args.value_bytes,
        args.bench_venv,
        not args.no_install,
        name == "pysyncobj-batch",
        pinned=not name.endswith("-unpinned"),
    )


# ---- measuring -------------------------------------------------------------------------------


async def measure(system: System, inflight: int, seconds: float) -> Cell:
    """One cell, with the CPU its server processes and this client spent on it."""
    pids = system.pids()
    server0, client0 = cpu_seconds(pids), own_cpu_seconds()
    cell = await system.run_cell(inflight, seconds)
    server1, client1 = cpu_seconds(pids), own_cpu_seconds()
    cell.server_cpu_s = server1 - server0
    if not isinstance(system, PySyncObj):
        cell.client_cpu_s = client1 - client0
    return cell


def idle_cpu_pct(pids: Sequence[int], seconds: float) -> list[float]:
    """Per process: % of one core used over ``seconds`` of doing nothing."""
    before = [cpu_seconds([p]) for p in pids]
    t0 = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    after = [cpu_seconds([p]) for p in pids]
    return [100 * (a - b) / elapsed for a, b in zip(after, before, strict=True)]


def header(args: argparse.Namespace, what: str, started: datetime.datetime, load: str) -> str:
    """The line above a table: what ran, when it started, on what, how loaded."""
    return (
        f"# bench/peers.py --mode {what}  started {started:%Y-%m-%d %H:%M} UTC  "
        f"python {platform.python_version()}  {os.cpu_count()} cpus  "
        f"{args.duration:g} s per cell  {args.repeat} repetitions (medians)  "
        f"{args.value_bytes}-byte values  load average {load}"
    )


def load_average() -> str:
    return "/".join(f"{v:.1f}" for v in os.getloadavg())


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


async def start_systems(
    names: Sequence[str], root: Path, args: argparse.Namespace, skipped: list[str]
) -> dict[str, System]:
    """Every system of ``names`` (``--systems`` names) that can be set up here, started
    under ``root``, by name; the others are stopped again and said in ``skipped``."""
    started: dict[str, System] = {}
    try:
        for name in names:
            system = make_system(name, root, args)
            say(f"starting {name}")
            try:
                system.start()
            except Unavailable as e:
                skipped.append(f"{name}: skipped, {e}")
                say(skipped[-1])
                system.stop()
                continue
            except BaseException:
                system.stop()
                raise
            started[name] = system
    except BaseException:
        await stop_systems(list(started.values()))
        raise
    return started


async def stop_systems(systems: Sequence[System]) -> None:
    for s in systems:
        with contextlib.suppress(Exception):
            await s.close()
        try:
            s.stop()
        except Exception as e:
            say(f"stopping {s.name}: {e}")


async def run_peers(args: argparse.Namespace, root: Path) -> None:
    started_at, load_before = utc_now(), load_average()
    levels: list[int] = args.inflight
    names: list[str] = args.systems.split(",")
    skipped: list[str] = []
    first: list[System] = []  # as the first repetition started them: what the tables show
    idle: dict[str, list[float]] = {}
    cells: dict[tuple[str, int], list[Cell]] = {}
    for rep in range(args.repeat):
        up = await start_systems(names, root / f"rep{rep + 1}", args, skipped)
        started = list(up.values())
        try:
            if rep == 0:
                first = started
                # Later repetitions run what the first could start (a later failure to
                # start is said, and that system has a cell fewer).
                names = list(up)
                if not started:
                    print("nothing to measure:", *skipped, sep="\n  ")
                    return
                idle = {s.name: idle_cpu_pct(s.pids(), min(args.idle, 3.0)) for s in started}
            for s in started:
                if args.warmup > 0:
                    await s.run_cell(16, args.warmup)
            k = rep % len(started) if started else 0
            for s in started[k:] + started[:k]:
                for level in levels:
                    cell = await measure(s, level, args.duration)
                    cells.setdefault((s.name, level), []).append(cell)
                    say(
                        f"rep {rep + 1}/{args.repeat} {s.name} {level} in flight: "
                        f"{cell.rate:,.0f} w/s p50 {percentile(cell.latencies_ms, 0.5):.2f} ms "
                        f"server {cell.server_ms_per_write:.3f} ms/w errors {cell.errors or '-'}"
                    )
        finally:
            await stop_systems(started)
        shutil.rmtree(root / f"rep{rep + 1}", ignore_errors=True)
    started = first
    results = {key: summarize(v) for key, v in cells.items()}
    load = f"{load_before} at the start, {load_average()} at the end (1/5/15 min)"
    print(header(args, "peers", started_at, load))
    print()
    print(peers_table([(s.name, s.durability) for s in started], results, levels))
    print()
    ours = [s.name for s in started if isinstance(s, Raftlet)]
    peers = [s.name for s in started if not isinstance(s, Raftlet)]
    if ours and peers:
        print(
            "Ratios raftlet / peer (writes/s: > 1 is raftlet faster; the others: < 1 is "
            "raftlet lower):"
        )
        print()
        print(ratios_table(results, levels, ours, peers))
        print()
    by_kind = {
        kind: next((s.name for s in started if pred(s)), None)
        for kind, pred in (
            ("one", lambda s: isinstance(s, Raftlet) and s.tablets == 1),
            ("four", lambda s: isinstance(s, Raftlet) and s.tablets == 4),
            ("etcd", lambda s: isinstance(s, Etcd)),
            ("pysyncobj", lambda s: isinstance(s, PySyncObj) and not s.batch),
        )
    }
    print("Issue 12 targets judged by this run:")
    print(*peer_targets(results, **by_kind), sep="\n")
    print()
    print(
        "Idle CPU per server process before the first repetition, % of a core (all systems "
        "were up during every cell): "
        + "; ".join(f"{name} {'/'.join(f'{v:.1f}' for v in pct)}" for name, pct in idle.items())
    )
    clients = [f"{s.name}: {s.client_path}" for s in started if isinstance(s, Raftlet)]
    clients += ["etcd: grpc.aio KV/Put on the leader" for s in started if isinstance(s, Etcd)]
    clients += [
        "PySyncObj: writer inside the leader process (callbacks), its CPU counted as server's"
        for s in started
        if isinstance(s, PySyncObj)
    ]
    print("Clients: " + "; ".join(clients))
    for line in skipped:
        print(line)


async def run_tablets(args: argparse.Namespace, root: Path) -> None:
    started_at, load_before = utc_now(), load_average()
    inflight = max(args.inflight)
    rows: list[TabletsRow] = []
    client_path = ""
    for n in args.tablets:
        system = Raftlet(n, root, args.value_bytes, args.raftlet_client, pinned=not args.unpinned)
        say(f"starting raftlet with {n} tablets")
        try:
            system.start()
            time.sleep(5)  # let elections, leader moves and the first heartbeats settle
            pids = system.pids()
            idle = idle_cpu_pct(pids, args.idle)
            threads = [thread_count(p) for p in pids]
            if args.warmup > 0:
                await system.run_cell(16, args.warmup)
            cells = []
            for rep in range(args.repeat):
                cell = await measure(system, inflight, args.duration)
                cells.append(cell)
                say(f"{n} tablets rep {rep + 1}: {cell.rate:,.0f} w/s, errors {cell.errors or '-'}")
            rows.append(TabletsRow(n, idle, threads, summarize(cells), inflight))
            client_path = system.client_path
        finally:
            with contextlib.suppress(Exception):
                await system.close()
            system.stop()
            shutil.rmtree(system.dir, ignore_errors=True)
    load = f"{load_before} at the start, {load_average()} at the end (1/5/15 min)"
    print(header(args, "tablets", started_at, load))
    print()
    print(tablets_table(rows))
    print()
    print("Issue 12 targets judged by this run:")
    print(*tablets_targets(rows), sep="\n")
    print()
    print(
        "3 servers, replication factor 3: every server holds a replica of every tablet. "
        f"Threads: per server (ts1/ts2/ts3). Client: {client_path}."
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)

    def on_term(_signo: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    root = Path(tempfile.mkdtemp(prefix="raftlet-bench-peers-"))
    try:
        if args.mode in ("peers", "all"):
            asyncio.run(run_peers(args, root))
        if args.mode == "all":
            print()
        if args.mode in ("tablets", "all"):
            asyncio.run(run_tablets(args, root))
    except KeyboardInterrupt:
        say("interrupted; everything the bench started is stopped")
        sys.exit(130)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
