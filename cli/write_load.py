"""The load behind ``raftlet write``: the rows it inserts, the writers that insert them, and
the summary of what the servers acknowledged.

Kept apart from the command (``cli.write_cmd``: arguments, checks, the run) and from what
the terminal shows (``cli.write_report``), so that the threaded load here and the asyncio
load (``cli.write_async``) share one row factory, one shared state and one summary.

Rows have keys no other writer or earlier run uses:

    key = run_id << 40 | thread << 32 | n        (run_id: 22 random bits, n < 2**32)

so every row is an INSERT that can only fail with KEY_EXISTS if the exactly-once machinery
failed (a retried write applied twice). With ``--keys scattered`` n is replaced by
n * C mod 2**32 (C odd), a one-to-one map, so keys stay unique but each writer's land
all over its range, as random keys (hashes, UUIDs) do: a tablet's store then changes a
page per row, where rising keys add to the few pages at the end of each writer's range.
Non-key columns are filled by type; a STRING or BINARY column gets ``--row-bytes`` of
payload.

What is measured (all from the client's own statistics, ``Client.stats``, so the numbers
are the same whatever the flush mode):

- rows/s: rows acknowledged by the servers per second of wall time;
- writes/s: Write RPCs acknowledged (a batch of rows is one write; in sync mode, one row);
- latency: of each acknowledged Write RPC, from the first attempt to the answer, retries and
  backoff included: what an application waiting on the write would see;
- retries by cause (NOT_LEADER, RESOURCE_EXHAUSTED, UNAVAILABLE, …) and errors by cause:
  rows that failed (a RowError's code, TIMEOUT, …) as the application saw them;
- server CPU: every server's ``process_cpu_seconds_total`` (its ``/metrics``) read just
  before and just after the run, the difference summed over the servers and divided by the
  acknowledged writes (``cli.server_cpu``): CPU per write on all replicas together; a
  server restarted during the run has none, and the summary names it;
- client CPU: this process's CPU time (every thread's) from the first write to the last
  answer, divided by the acknowledged writes: what the client's side of a write costs.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raftlet.cli.common import CliError, UsageError
from raftlet.cli.server_cpu import ServerCpu
from raftlet.schema.schema import Schema
from raftlet.schema.types import INTEGER_RANGES, DataType, Value

if TYPE_CHECKING:
    from raftlet.client import Client, ClientStats, Session

__all__ = [
    "KEY_ORDERS",
    "LoadState",
    "LoadSummary",
    "OnTick",
    "RowFactory",
    "run_load",
    "summarize",
]

_SEQ_BITS = 32
_THREAD_BITS = 8
_RUN_BITS = 22  # 22 + 8 + 32 = 62 bits: the key stays a positive INT64
_SEQ_MASK = (1 << _SEQ_BITS) - 1
# Odd, so multiplying by it mod 2**32 maps the sequence numbers one to one; 2**32 over the
# golden ratio, so consecutive ones fall far apart.
_SCATTER = 0x9E3779B1
KEY_ORDERS = ("rising", "scattered")


# --- rows ------------------------------------------------------------------------------------


class RowFactory:
    """Rows for ``schema`` with unique keys per (run, thread, n); see the module docstring."""

    def __init__(
        self,
        schema: Schema,
        row_bytes: int,
        run_id: int | None = None,
        *,
        keys: str = "rising",
    ) -> None:
        if keys not in KEY_ORDERS:
            raise UsageError(f"keys must be one of {', '.join(KEY_ORDERS)}, not {keys!r}")
        self.scattered = keys == "scattered"
        key_columns = schema.key_columns
        if len(key_columns) != 1 or key_columns[0].type not in (
            DataType.INT64,
            DataType.UNIXTIME_MICROS,
        ):
            raise UsageError(
                "the load generator needs a table whose primary key is one INT64 or "
                "UNIXTIME_MICROS column "
                f"(this one's key: {', '.join(f'{c.name} {c.type.name}' for c in key_columns)})"
            )
        self.key = key_columns[0].name
        self.others = [c for c in schema.columns if not c.is_key]
        self.run_id = random.getrandbits(_RUN_BITS) if run_id is None else run_id
        self.row_bytes = row_bytes
        # Rows differ (a sliding window over random text) without costing a random string
        # per row: the generator must not be the bottleneck of a write benchmark.
        alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        rng = random.Random(self.run_id)
        self._text = "".join(rng.choice(alphabet) for _ in range(row_bytes + 256))

    def key_of(self, thread: int, n: int) -> int:
        if self.scattered:
            n = (n * _SCATTER) & _SEQ_MASK
        return (self.run_id << (_THREAD_BITS + _SEQ_BITS)) | (thread << _SEQ_BITS) | n

    def row(self, thread: int, n: int) -> dict[str, Value]:
        row: dict[str, Value] = {self.key: self.key_of(thread, n)}
        for c in self.others:
            row[c.name] = self._value(c.type, n)
        return row

    def _value(self, dtype: DataType, n: int) -> Value:
        if dtype is DataType.STRING:
            off = n % 256
            return self._text[off : off + self.row_bytes]
        if dtype is DataType.BINARY:
            off = n % 256
            return self._text[off : off + self.row_bytes].encode()
        if dtype in INTEGER_RANGES:
            return n % (INTEGER_RANGES[dtype][1] + 1)
        if dtype in (DataType.FLOAT, DataType.DOUBLE):
            return float(n % 1_000_000)
        if dtype is DataType.BOOL:
            return n % 2 == 0
        return None


# --- the load --------------------------------------------------------------------------------


@dataclass
class LoadState:
    """What the writers of one load share: the signal to stop, the rows that failed by cause
    (the first failure's message kept), and the bug that stopped them all, if any."""

    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    errors: Counter[str] = field(default_factory=Counter)
    submitted: int = 0
    # Failed rows whose outcome is unknown (a timeout, a lost connection): they may be in
    # the table, where a refused row (``may_have_applied`` False) is not.
    maybe_applied: int = 0
    first_error: str = ""
    fatal: str = ""

    def error(self, cause: str, message: str, rows: int = 1, maybe_applied: bool = True) -> None:
        with self.lock:
            self.errors[cause] += rows
            if maybe_applied:
                self.maybe_applied += rows
            if not self.first_error:
                self.first_error = message

    def failed(self, err: BaseException) -> None:
        """Count one row that failed with ``err`` (its outcome unknown unless it says)."""
        self.error(
            getattr(err, "cause", type(err).__name__),
            str(err),
            maybe_applied=getattr(err, "may_have_applied", True),
        )


# Called every tick of a load with (seconds elapsed, the client's statistics, the state).
OnTick = Callable[[float, "ClientStats", LoadState], None]


@dataclass(frozen=True)
class LoadSummary:
    table: str
    threads: int | None  # None with --in-flight
    flush_mode: str
    row_bytes: int
    elapsed_s: float
    rows: int
    writes: int
    latency_us: dict[str, float | None]
    retries_by_cause: dict[str, int]
    errors_by_cause: dict[str, int]
    first_error: str
    interrupted: bool
    # Of the failed rows, those that may have been applied all the same (outcome unknown).
    failed_rows_maybe_applied: int = 0
    in_flight: int | None = None  # --in-flight N (the asyncio client), else None
    # Each session's batches per tablet in flight (--batch-rows N --in-flight M), else None.
    batches_in_flight: int | None = None
    packed_rows: bool = True  # False: rows sent in the per-cell form (--row-format cells)
    server_cpu: ServerCpu | None = None
    # This process's CPU (every thread's) while it wrote: the client's side of each write.
    client_cpu_s: float | None = None

    @property
    def failed_rows(self) -> int:
        return sum(self.errors_by_cause.values())

    @property
    def writers(self) -> str:
        if self.in_flight is not None:
            return f"{self.in_flight} in flight (asyncio)"
        if self.batches_in_flight is not None:
            return (
                f"{self.threads} thread{'s' if self.threads != 1 else ''}, "
                f"{self.batches_in_flight} batches in flight per tablet each"
            )
        return f"{self.threads} thread{'s' if self.threads != 1 else ''}"

    @property
    def server_cpu_ms_per_write(self) -> float | None:
        return self.server_cpu.ms_per_write(self.writes) if self.server_cpu else None

    @property
    def client_cpu_ms_per_write(self) -> float | None:
        if self.client_cpu_s is None or not self.writes:
            return None
        return self.client_cpu_s * 1000 / self.writes

    def to_json(self) -> dict[str, Any]:
        el = self.elapsed_s or 1e-9
        cpu = self.server_cpu
        return {
            "table": self.table,
            "threads": self.threads,
            "in_flight": self.in_flight,
            "batches_in_flight": self.batches_in_flight,
            "row_format": "block" if self.packed_rows else "cells",
            "client": "asyncio" if self.in_flight is not None else "threads",
            "flush_mode": self.flush_mode,
            "row_bytes": self.row_bytes,
            "elapsed_s": round(self.elapsed_s, 3),
            "rows": self.rows,
            "writes": self.writes,
            "rows_per_s": round(self.rows / el, 1),
            "writes_per_s": round(self.writes / el, 1),
            "latency_us": {
                k: None if v is None else round(v, 1) for k, v in self.latency_us.items()
            },
            "retries_by_cause": self.retries_by_cause,
            "errors_by_cause": self.errors_by_cause,
            "failed_rows": self.failed_rows,
            "failed_rows_maybe_applied": self.failed_rows_maybe_applied,
            "first_error": self.first_error,
            "interrupted": self.interrupted,
            "server_cpu_s": _round(cpu.total_s if cpu else None, 4),
            "server_cpu_ms_per_write": _round(self.server_cpu_ms_per_write, 4),
            "server_cpu_s_by_server": {
                sid: _round(v, 4) for sid, v in (cpu.by_server.items() if cpu else ())
            },
            "server_cpu_restarted": list(cpu.restarted) if cpu else [],
            # Left out for want of a /metrics reading, before or after the run (one killed
            # and still starting at the end, say): named, as the restarted ones are.
            "server_cpu_unread": list(cpu.unread) if cpu else [],
            "client_cpu_s": _round(self.client_cpu_s, 4),
            "client_cpu_ms_per_write": _round(self.client_cpu_ms_per_write, 4),
        }


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


@dataclass(frozen=True)
class SessionOptions:
    """How each writer's session writes: ``flush_mode`` sync, background or manual;
    ``batches_in_flight`` None for the session's default window; ``packed_rows`` False for
    the per-cell wire form."""

    flush_mode: str
    batch_rows: int
    timeout_s: float
    batches_in_flight: int | None = None
    packed_rows: bool = True


def _writer(
    client: Client,
    table: str,
    thread: int,
    quota: int | None,
    factory: RowFactory,
    options: SessionOptions,
    shared: LoadState,
) -> None:
    from raftlet.client import ClientClosed, FlushMode, RaftletError
    from raftlet.client.session import DEFAULT_BATCHES_IN_FLIGHT

    mode, batch_rows = options.flush_mode, options.batch_rows
    flush_mode = {
        "sync": FlushMode.AUTO_FLUSH_SYNC,
        "background": FlushMode.AUTO_FLUSH_BACKGROUND,
        "manual": FlushMode.MANUAL_FLUSH,
    }[mode]
    session: Session = client.new_session(
        flush_mode=flush_mode,
        timeout_s=options.timeout_s,
        max_batch_rows=batch_rows,
        max_batches_in_flight=options.batches_in_flight or DEFAULT_BATCHES_IN_FLIGHT,
        packed_rows=options.packed_rows,
    )

    def collect() -> None:
        for err in session.errors():
            shared.failed(err)

    n = 0
    try:
        while not shared.stop.is_set() and (quota is None or n < quota):
            try:
                session.insert(table, factory.row(thread, n))
            except ClientClosed:
                return
            except RaftletError as e:  # sync mode: this row failed; the load goes on
                shared.failed(e)
            n += 1
            with shared.lock:
                shared.submitted += 1
            if mode == "manual" and n % batch_rows == 0:
                session.flush()
                collect()
        session.flush()
        collect()
    except Exception as e:  # a bug or a closed client: stop everyone, report it once
        with shared.lock:
            shared.fatal = shared.fatal or f"writer {thread}: {type(e).__name__}: {e}"
        shared.stop.set()
    finally:
        try:
            session.close()
            collect()
        except Exception as e:
            shared.failed(e)


def run_load(
    client: Client,
    table: str,
    schema: Schema,
    *,
    rows: int | None,
    duration_s: float | None,
    threads: int,
    row_bytes: int,
    flush_mode: str,
    batch_rows: int,
    timeout_s: float,
    batches_in_flight: int | None = None,
    packed_rows: bool = True,
    keys: str = "rising",
    on_tick: OnTick | None = None,
    tick_s: float = 0.2,
) -> LoadSummary:
    """Run the load and return its summary (see the module docstring)."""
    factory = RowFactory(schema, row_bytes, keys=keys)
    shared = LoadState()
    quotas: list[int | None] = (
        [rows // threads + (1 if t < rows % threads else 0) for t in range(threads)]
        if rows is not None
        else [None] * threads
    )
    options = SessionOptions(flush_mode, batch_rows, timeout_s, batches_in_flight, packed_rows)
    before = client.stats
    workers = [
        threading.Thread(
            target=_writer,
            args=(client, table, t, quotas[t], factory, options, shared),
            name=f"writer-{t}",
            daemon=True,
        )
        for t in range(threads)
    ]
    start = time.monotonic()
    cpu_start = time.process_time()
    interrupted = False
    for w in workers:
        w.start()
    try:
        while any(w.is_alive() for w in workers):
            elapsed = time.monotonic() - start
            if duration_s is not None and elapsed >= duration_s:
                shared.stop.set()
            if on_tick is not None:
                on_tick(elapsed, client.stats, shared)
            time.sleep(tick_s)
    except KeyboardInterrupt:
        # First Ctrl-C: stop writing, let each session flush what it holds, then report.
        interrupted = True
        shared.stop.set()
        for w in workers:
            w.join(timeout_s + 5)
    elapsed = time.monotonic() - start
    cpu = time.process_time() - cpu_start
    after = client.stats
    if shared.fatal:
        raise CliError(shared.fatal)
    summary = summarize(
        before,
        after,
        shared,
        elapsed,
        table,
        threads,
        flush_mode,
        row_bytes,
        interrupted,
        client_cpu_s=cpu,
    )
    return dataclasses.replace(
        summary, batches_in_flight=batches_in_flight, packed_rows=packed_rows
    )


def summarize(
    before: ClientStats,
    after: ClientStats,
    shared: LoadState,
    elapsed: float,
    table: str,
    threads: int | None,
    flush_mode: str,
    row_bytes: int,
    interrupted: bool,
    *,
    in_flight: int | None = None,
    client_cpu_s: float | None = None,
) -> LoadSummary:
    """The summary of a load from the client's statistics before and after it; the same
    for the threaded and the asyncio load, so their figures compare.  ``client_cpu_s``:
    this process's CPU time while it wrote."""
    snap = after.write_latency_us
    latency: dict[str, float | None] = dict.fromkeys(("p50", "p95", "p99", "p99.9", "max"))
    if snap is not None and snap.count:
        latency = {
            "p50": snap.p50,
            "p95": snap.p95,
            "p99": snap.p99,
            "p99.9": snap.p99_9,
            "max": snap.max,
        }
    retries = Counter(after.retries_by_cause)
    retries.subtract(before.retries_by_cause)
    return LoadSummary(
        table=table,
        threads=threads,
        flush_mode=flush_mode,
        row_bytes=row_bytes,
        elapsed_s=elapsed,
        rows=after.rows_acked - before.rows_acked,
        writes=after.writes_acked - before.writes_acked,
        latency_us=latency,
        retries_by_cause={k: v for k, v in sorted(retries.items()) if v > 0},
        errors_by_cause=dict(sorted(shared.errors.items())),
        failed_rows_maybe_applied=shared.maybe_applied,
        first_error=shared.first_error,
        interrupted=interrupted,
        in_flight=in_flight,
        client_cpu_s=client_cpu_s,
    )
