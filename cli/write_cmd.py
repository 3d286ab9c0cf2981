"""``raftlet write``: a concurrent load generator with a progress bar and a summary.

Two ways to keep writes concurrent:

- ``--threads T`` (default 4): each of T threads has its own client ``Session`` (one shared
  ``Client``, so one gRPC channel per server), in any flush mode;
- ``--in-flight N``: one event loop keeps N single-row writes in flight through the asyncio
  client (``raftlet.client.aio``; ``cli.write_async``) — the cheap way to many concurrent
  writes. The two options exclude each other; ``--in-flight`` takes only ``--flush-mode
  sync`` (every write is one row, acknowledged before that task writes the next).

Rows have keys no other writer or earlier run uses:

    key = run_id << 40 | thread << 32 | n        (run_id: 22 random bits, n < 2**32)

so every row is an INSERT that can only fail with KEY_EXISTS if the exactly-once machinery
failed (a retried write applied twice). Non-key columns are filled by type; a STRING or
BINARY column gets ``--row-bytes`` of payload.

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
  acknowledged writes (``cli.server_cpu``): CPU per write on all replicas together.

Exit status 1 if any row failed: a load test that lost writes did not succeed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raftlet.cli.common import (
    CliError,
    UsageError,
    add_target_arguments,
    console,
    human_count,
    human_us,
    positive_float,
    positive_int,
    resolve_target,
)
from raftlet.cli.server_cpu import ServerCpu, read_cpu_seconds
from raftlet.schema.schema import Schema
from raftlet.schema.types import INTEGER_RANGES, DataType, Value

if TYPE_CHECKING:
    from raftlet.client import Client, ClientStats, Session

__all__ = ["LoadSummary", "RowFactory", "add_parser", "run"]

MAX_THREADS = 256
MAX_IN_FLIGHT = 4096
DEFAULT_THREADS = 4
_SEQ_BITS = 32
_THREAD_BITS = 8
_RUN_BITS = 22  # 22 + 8 + 32 = 62 bits: the key stays a positive INT64

_EPILOG = """\
examples:
  raftlet write --data-dir ./c1 --rows 10000
  raftlet write --data-dir ./c1 --duration 10 --threads 8
  raftlet write --data-dir ./c1 --duration 30 --threads 16 --flush-mode background
  raftlet write --data-dir ./c1 --duration 10 --in-flight 64  # asyncio: 64 writes in flight
  raftlet write --servers 127.0.0.1:7051 --rows 1000 --flush-mode manual --batch-rows 200
  raftlet write --data-dir ./c1 --rows 500 --format json      # summary for scripts

Flush modes: sync waits for each row's acknowledgement (one row per write RPC); background
buffers rows and flushes batches per tablet in the background; manual flushes every
--batch-rows rows. --in-flight N keeps N single-row writes in flight from one event loop
(the asyncio client) instead of threads; it excludes --threads. Latency is per acknowledged
write RPC, retries included; server CPU per write is read from every server's /metrics.
Exit status: 0 when every row was written, 1 if any failed, 2 for usage errors.
"""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    p = commands.add_parser(
        "write",
        help="load generator: insert rows concurrently, report throughput, latency, server CPU",
        description=(
            "Insert rows into a table from concurrent threads (or N writes in flight on one "
            "event loop), with a progress bar, then print rows/s, writes/s, latency "
            "percentiles, retries and errors by cause, and server CPU per write."
        ),
        epilog=_EPILOG,
        formatter_class=formatter,
        allow_abbrev=False,
    )
    add_target_arguments(p)
    amount = p.add_mutually_exclusive_group(required=True)
    amount.add_argument("--rows", type=positive_int, metavar="N", help="insert N rows in all")
    amount.add_argument("--duration", type=positive_float, metavar="S", help="insert for S seconds")
    writers = p.add_mutually_exclusive_group()
    writers.add_argument(
        "--threads",
        type=_threads,
        default=None,
        metavar="T",
        help=f"concurrent writer threads, each with its own session (default {DEFAULT_THREADS}, "
        f"at most {MAX_THREADS})",
    )
    writers.add_argument(
        "--in-flight",
        type=_in_flight,
        default=None,
        metavar="N",
        help="keep N single-row writes in flight from one event loop (the asyncio client) "
        f"instead of threads (at most {MAX_IN_FLIGHT})",
    )
    p.add_argument(
        "--row-bytes",
        type=_row_bytes,
        default=100,
        metavar="B",
        help="payload bytes per row in the STRING/BINARY column (default 100)",
    )
    p.add_argument(
        "--flush-mode",
        choices=("sync", "background", "manual"),
        default=None,
        help="sync (default), background or manual; see below (--in-flight: sync only)",
    )
    p.add_argument(
        "--batch-rows",
        type=positive_int,
        default=100,
        metavar="N",
        help="rows per write RPC: manual mode flushes every N rows, background mode sends "
        "batches of up to N (default 100)",
    )
    p.add_argument("--table", default="kv", metavar="TABLE", help="table to write (default kv)")
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=30.0,
        metavar="S",
        help="deadline of each write, retries included (default 30)",
    )
    p.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="summary as a table (default) or one JSON object",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (it is also plain text when stdout is not a terminal)",
    )


def _threads(text: str) -> int:
    n = positive_int(text)
    if n > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"at most {MAX_THREADS}, got {n}")
    return n


def _in_flight(text: str) -> int:
    n = positive_int(text)
    if n > MAX_IN_FLIGHT:
        raise argparse.ArgumentTypeError(f"at most {MAX_IN_FLIGHT}, got {n}")
    return n


def _row_bytes(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= n <= 1 << 20:
        raise argparse.ArgumentTypeError(f"must be in 0..1048576, got {n}")
    return n


# --- rows ------------------------------------------------------------------------------------


class RowFactory:
    """Rows for ``schema`` with unique keys per (run, thread, n); see the module docstring."""

    def __init__(self, schema: Schema, row_bytes: int, run_id: int | None = None) -> None:
        keys = schema.key_columns
        if len(keys) != 1 or keys[0].type not in (DataType.INT64, DataType.UNIXTIME_MICROS):
            raise UsageError(
                "the load generator needs a table whose primary key is one INT64 column "
                f"(this one's key: {', '.join(f'{c.name} {c.type.name}' for c in keys)})"
            )
        self.key = keys[0].name
        self.others = [c for c in schema.columns if not c.is_key]
        self.run_id = random.getrandbits(_RUN_BITS) if run_id is None else run_id
        self.row_bytes = row_bytes
        # Rows differ (a sliding window over random text) without costing a random string
        # per row: the generator must not be the bottleneck of a write benchmark.
        alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        rng = random.Random(self.run_id)
        self._text = "".join(rng.choice(alphabet) for _ in range(row_bytes + 256))

    def key_of(self, thread: int, n: int) -> int:
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
class _Shared:
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    errors: Counter[str] = field(default_factory=Counter)
    submitted: int = 0
    first_error: str = ""
    fatal: str = ""

    def error(self, cause: str, message: str, rows: int = 1) -> None:
        with self.lock:
            self.errors[cause] += rows
            if not self.first_error:
                self.first_error = message


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
    in_flight: int | None = None  # --in-flight N (the asyncio client), else None
    server_cpu: ServerCpu | None = None

    @property
    def failed_rows(self) -> int:
        return sum(self.errors_by_cause.values())

    @property
    def writers(self) -> str:
        if self.in_flight is not None:
            return f"{self.in_flight} in flight (asyncio)"
        return f"{self.threads} threads"

    @property
    def server_cpu_ms_per_write(self) -> float | None:
        return self.server_cpu.ms_per_write(self.writes) if self.server_cpu else None

    def to_json(self) -> dict[str, Any]:
        el = self.elapsed_s or 1e-9
        cpu = self.server_cpu
        return {
            "table": self.table,
            "threads": self.threads,
            "in_flight": self.in_flight,
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
            "first_error": self.first_error,
            "interrupted": self.interrupted,
            "server_cpu_s": _round(cpu.total_s if cpu else None, 4),
            "server_cpu_ms_per_write": _round(self.server_cpu_ms_per_write, 4),
            "server_cpu_s_by_server": {
                sid: _round(v, 4) for sid, v in (cpu.by_server.items() if cpu else ())
            },
        }


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _writer(
    client: Client,
    table: str,
    thread: int,
    quota: int | None,
    factory: RowFactory,
    mode: str,
    batch_rows: int,
    timeout_s: float,
    shared: _Shared,
) -> None:
    from raftlet.client import ClientClosed, FlushMode, RaftletError

    flush_mode = {
        "sync": FlushMode.AUTO_FLUSH_SYNC,
        "background": FlushMode.AUTO_FLUSH_BACKGROUND,
        "manual": FlushMode.MANUAL_FLUSH,
    }[mode]
    session: Session = client.new_session(
        flush_mode=flush_mode, timeout_s=timeout_s, max_batch_rows=batch_rows
    )

    def collect() -> None:
        for err in session.errors():
            shared.error(getattr(err, "cause", type(err).__name__), str(err))

    n = 0
    try:
        while not shared.stop.is_set() and (quota is None or n < quota):
            try:
                session.insert(table, factory.row(thread, n))
            except ClientClosed:
                return
            except RaftletError as e:  # sync mode: this row failed; the load goes on
                shared.error(e.cause, str(e))
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
            shared.error(getattr(e, "cause", type(e).__name__), str(e))


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
    on_tick: Callable[[float, ClientStats, _Shared], None] | None = None,
    tick_s: float = 0.2,
) -> LoadSummary:
    """Run the load and return its summary (see the module docstring)."""
    factory = RowFactory(schema, row_bytes)
    shared = _Shared()
    quotas: list[int | None] = (
        [rows // threads + (1 if t < rows % threads else 0) for t in range(threads)]
        if rows is not None
        else [None] * threads
    )
    before = client.stats
    workers = [
        threading.Thread(
            target=_writer,
            args=(client, table, t, quotas[t], factory, flush_mode, batch_rows, timeout_s, shared),
            name=f"writer-{t}",
            daemon=True,
        )
        for t in range(threads)
    ]
    start = time.monotonic()
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
    after = client.stats
    if shared.fatal:
        raise CliError(shared.fatal)
    return _summarize(
        before, after, shared, elapsed, table, threads, flush_mode, row_bytes, interrupted
    )


def _summarize(
    before: ClientStats,
    after: ClientStats,
    shared: _Shared,
    elapsed: float,
    table: str,
    threads: int | None,
    flush_mode: str,
    row_bytes: int,
    interrupted: bool,
    *,
    in_flight: int | None = None,
) -> LoadSummary:
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
        first_error=shared.first_error,
        interrupted=interrupted,
        in_flight=in_flight,
    )


# --- the command -----------------------------------------------------------------------------


def check_writers(args: argparse.Namespace) -> None:
    """Resolve ``--threads`` / ``--in-flight`` / ``--flush-mode`` defaults; ``UsageError``
    for a flush mode ``--in-flight`` cannot have (argparse already refuses both options)."""
    if args.in_flight is not None:
        if args.flush_mode not in (None, "sync"):
            raise UsageError(
                f"--in-flight writes single rows (flush mode sync); --flush-mode "
                f"{args.flush_mode} needs --threads"
            )
        args.flush_mode = "sync"
        return
    if args.threads is None:
        args.threads = DEFAULT_THREADS
    if args.flush_mode is None:
        args.flush_mode = "sync"


def run(args: argparse.Namespace) -> int:
    check_writers(args)
    target = resolve_target(args)
    table = target.table(args.table, option="--table: ")
    RowFactory(table.schema, args.row_bytes)  # a table it cannot fill is a usage error now
    load: Callable[[_Tick], LoadSummary]
    client: Client | None = None
    if args.in_flight is not None:

        def load(on_tick: _Tick) -> LoadSummary:
            from raftlet.cli.write_async import run_load_async

            return run_load_async(
                target,
                table.name,
                table.schema,
                rows=args.rows,
                duration_s=args.duration,
                in_flight=args.in_flight,
                row_bytes=args.row_bytes,
                timeout_s=args.timeout,
                on_tick=on_tick,
            )

    else:
        # Per-tablet batches of a flush go out in parallel on the client's flush threads,
        # shared by all sessions: enough of them that writers do not queue behind each other.
        threaded = target.client(
            timeout_s=args.timeout, flush_threads=min(64, max(4, 2 * args.threads))
        )
        client = threaded

        def load(on_tick: _Tick) -> LoadSummary:
            return run_load(
                threaded, table.name, table.schema, on_tick=on_tick, **_load_kwargs(args)
            )

    out = console()
    fancy = out.is_terminal and not args.no_progress and args.format == "table"
    try:
        # SIGTERM (a CI runner's timeout) gets the same orderly stop as Ctrl-C.
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            cpu_before = read_cpu_seconds(target.config.servers)
            if fancy:
                summary = _with_progress_bar(load, table.name, args, out)
            else:
                summary = _with_plain_progress(load, table.name, args)
            cpu = ServerCpu.between(cpu_before, read_cpu_seconds(target.config.servers))
            summary = dataclasses.replace(summary, server_cpu=cpu)
        finally:
            signal.signal(signal.SIGTERM, previous)
    finally:
        if client is not None:
            client.close()
    if args.format == "json":
        print(json.dumps(summary.to_json(), indent=2))
    else:
        _print_summary(summary, out)
    if summary.interrupted:
        return 130
    return 1 if summary.failed_rows else 0


def _raise_interrupt(_sig: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _load_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "rows": args.rows,
        "duration_s": args.duration,
        "threads": args.threads,
        "row_bytes": args.row_bytes,
        "flush_mode": args.flush_mode,
        "batch_rows": args.batch_rows,
        "timeout_s": args.timeout,
    }


_Tick = Callable[[float, "ClientStats", _Shared], None]


def _with_progress_bar(
    load: Callable[[_Tick], LoadSummary], table: str, args: argparse.Namespace, out: Any
) -> LoadSummary:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    by_rows = args.rows is not None
    columns: list[Any] = [
        TextColumn("[bold]{task.description}[/]"),
        BarColumn(bar_width=30),
        MofNCompleteColumn() if by_rows else TaskProgressColumn(),
        TextColumn("{task.fields[rate]}"),
        TextColumn("{task.fields[trouble]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    ]
    out.print(_headline(table, args), markup=False)
    with Progress(*columns, console=out, transient=False, refresh_per_second=8) as progress:
        task = progress.add_task(
            "writing", total=args.rows if by_rows else args.duration, rate="", trouble=""
        )

        def tick(elapsed: float, stats: ClientStats, shared: _Shared) -> None:
            done = stats.rows_acked
            rate = done / elapsed if elapsed > 0 else 0.0
            # Time-bound runs: the bar shows time, so say how many rows so far.
            rows = "" if by_rows else f"{done:,} rows "
            errors = sum(shared.errors.values())
            trouble = f"{human_count(stats.total_retries)} retries" if stats.total_retries else ""
            if errors:
                trouble = f"[red]{human_count(errors)} errors[/] " + trouble
            progress.update(
                task,
                completed=done if by_rows else min(elapsed, args.duration),
                rate=f"{rows}{human_count(rate)} rows/s",
                trouble=trouble,
            )

        summary = load(tick)
        progress.update(
            task,
            completed=summary.rows if by_rows else args.duration,
            rate=f"{'' if by_rows else f'{summary.rows:,} rows '}"
            f"{human_count(summary.rows / max(summary.elapsed_s, 1e-9))} rows/s",
        )
    return summary


def _headline(table: str, args: argparse.Namespace) -> str:
    what = f"{args.rows:,} rows" if args.rows is not None else f"for {args.duration:g} s"
    writers = (
        f"{args.in_flight} in flight (asyncio)"
        if args.in_flight is not None
        else f"{args.threads} threads"
    )
    return (
        f"writing {what} to {table}: {writers}, flush mode {args.flush_mode}, "
        f"{args.row_bytes}-byte rows"
    )


def _with_plain_progress(
    load: Callable[[_Tick], LoadSummary], table: str, args: argparse.Namespace
) -> LoadSummary:
    # Not a terminal (CI logs, pipes): a line every few seconds instead of a redrawn bar.
    quiet = args.no_progress or args.format == "json"
    last = [0.0]
    if not quiet:
        print(_headline(table, args), flush=True)

    def tick(elapsed: float, stats: ClientStats, shared: _Shared) -> None:
        if quiet or elapsed - last[0] < 2.0:
            return
        last[0] = elapsed
        errors = sum(shared.errors.values())
        print(
            f"  {elapsed:5.1f} s  {stats.rows_acked:>10,} rows  "
            f"{stats.rows_acked / elapsed:>9,.0f} rows/s  {stats.total_retries:,} retries  "
            f"{errors:,} errors",
            flush=True,
        )

    return load(tick)


def _print_summary(s: LoadSummary, out: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    el = max(s.elapsed_s, 1e-9)
    head = (
        f"Write load on {s.table}: {s.writers}, flush mode {s.flush_mode}, "
        f"{s.row_bytes}-byte rows, {s.elapsed_s:.1f} s"
    )
    out.print()
    out.print(Text(head + (" (interrupted)" if s.interrupted else ""), style="bold"))
    t = Table(box=None, pad_edge=False, show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_column("rate", justify="right")
    t.add_row("rows written", f"{s.rows:,}", f"{s.rows / el:,.0f} rows/s")
    t.add_row("write RPCs", f"{s.writes:,}", f"{s.writes / el:,.0f} writes/s")
    if s.writes:
        t.add_row("rows per write", f"{s.rows / s.writes:,.1f}", "")
    t.add_row("server CPU", *_cpu_cells(s))
    out.print(t)
    out.print(Text("Latency per acknowledged write RPC, retries included:", style="bold"))
    lat = Table(box=None, pad_edge=False)
    for k in s.latency_us:
        lat.add_column(k, justify="right")
    lat.add_row(*(human_us(v) for v in s.latency_us.values()))
    out.print(lat)
    causes = Table(box=None, pad_edge=False, show_header=False)
    causes.add_column("what")
    causes.add_column("by cause")
    causes.add_row("retries", _by_cause(s.retries_by_cause))
    errors = _by_cause(s.errors_by_cause)
    causes.add_row("errors", Text(errors, style="red" if s.errors_by_cause else "green"))
    out.print(causes)
    if s.first_error:
        out.print(Text(f"first error: {s.first_error}", style="red"))


def _cpu_cells(s: LoadSummary) -> tuple[str, str]:
    cpu = s.server_cpu
    total = cpu.total_s if cpu else None
    if cpu is None or total is None:
        return "-", "unknown (no server exports process_cpu_seconds_total)"
    per_write = s.server_cpu_ms_per_write
    rate = f"{per_write:.3f} ms/write" if per_write is not None else "-"
    if cpu.missing:
        rate += f" (without {', '.join(cpu.missing)})"
    return f"{total:,.2f} s", rate


def _by_cause(counts: dict[str, int]) -> str:
    if not counts:
        return "none"
    return ", ".join(f"{cause} {n:,}" for cause, n in sorted(counts.items(), key=lambda i: -i[1]))
