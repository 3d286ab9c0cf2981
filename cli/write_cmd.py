"""``raftlet write``: a concurrent load generator with a progress bar and a summary.

This module is the command: its arguments, their checks, and the run that wires a load to
its display. The load itself (unique row keys, the writer threads, what is measured and how)
is ``cli.write_load``; the asyncio load ``cli.write_async``; the progress display and the
printed summary ``cli.write_report``.

Three ways to keep writes concurrent:

- ``--threads T`` (default 4): each of T threads has its own client ``Session`` (one shared
  ``Client``, so one gRPC channel per server), in any flush mode;
- ``--in-flight N`` (flush mode sync, the default): one event loop keeps N single-row
  writes in flight through the asyncio client (``raftlet.client.aio``;
  ``cli.write_async``) — the cheap way to many concurrent single-row writes. It excludes
  ``--threads``;
- ``--batch-rows N --in-flight M`` (flush mode background, implied): each session keeps up
  to M batches of N rows per tablet in flight (``Session``'s ``max_batches_in_flight``), so
  one thread (``--threads`` defaults to 1 here) keeps the servers busy while it forms the
  next batches.

Exit status 1 if any row failed: a load test that lost writes did not succeed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raftlet.cli.common import (
    UsageError,
    add_target_arguments,
    close_client,
    console,
    positive_float,
    positive_int,
    resolve_target,
    stdout_gone,
    timeout_seconds,
)
from raftlet.cli.server_cpu import ServerCpu, read_cpu_seconds
from raftlet.cli.write_load import KEY_ORDERS, LoadSummary, OnTick, RowFactory, run_load
from raftlet.cli.write_report import print_summary, with_plain_progress, with_progress_bar

if TYPE_CHECKING:
    from raftlet.client import Client

__all__ = ["add_parser", "check_writers", "run"]

MAX_THREADS = 256
MAX_IN_FLIGHT = 4096
DEFAULT_THREADS = 4
DEFAULT_BATCH_ROWS = 100

_EPILOG = """\
examples:
  raftlet write --data-dir ./c1 --rows 10000
  raftlet write --data-dir ./c1 --duration 10 --threads 8
  raftlet write --data-dir ./c1 --duration 30 --threads 16 --flush-mode background
  raftlet write --data-dir ./c1 --duration 10 --in-flight 64  # asyncio: 64 writes in flight
  raftlet write --data-dir ./c1 --duration 10 --batch-rows 1000 --in-flight 4
  raftlet write --servers 127.0.0.1:7051 --rows 1000 --flush-mode manual --batch-rows 200
  raftlet write --data-dir ./c1 --rows 500 --format json      # summary for scripts

Flush modes: sync waits for each row's acknowledgement (one row per write RPC); background
buffers rows and flushes batches per tablet in the background (implied by --batch-rows);
manual flushes every --batch-rows rows. In sync mode --in-flight N keeps N single-row writes
in flight from one event loop (the asyncio client) instead of threads. With --batch-rows (or
--flush-mode background) --in-flight M lets each session keep M batches per tablet in
flight; --threads then defaults to 1. Latency is per acknowledged write RPC, retries
included; server CPU per write is read from every server's /metrics, client CPU per write
from this process's own.
Exit status: 0 when every row was written, 1 if any failed, 2 for usage errors. Output into
a pipe whose reader left (`| head`) does not stop the load: it runs to its end (Ctrl-C stops
it, with its summary).
"""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    p = commands.add_parser(
        "write",
        help="load generator: insert rows concurrently, report throughput, latency, server CPU",
        description=(
            "Insert rows into a table from concurrent threads (or N writes in flight on one "
            "event loop), with a progress bar, then print rows/s, writes/s, latency "
            "percentiles, retries and errors by cause, and server and client CPU per write."
        ),
        epilog=_EPILOG,
        formatter_class=formatter,
        allow_abbrev=False,
    )
    add_target_arguments(p)
    amount = p.add_mutually_exclusive_group(required=True)
    amount.add_argument("--rows", type=positive_int, metavar="N", help="insert N rows in all")
    amount.add_argument(
        "--duration",
        type=positive_float,
        metavar="S",
        help="insert for S seconds (with --flush-mode background, the rows the sessions hold "
        "buffered then are written before the summary, whose time and rate count them)",
    )
    p.add_argument(
        "--threads",
        type=_threads,
        default=None,
        metavar="T",
        help=f"concurrent writer threads, each with its own session (default {DEFAULT_THREADS}, "
        f"at most {MAX_THREADS}; 1 with batches in flight)",
    )
    p.add_argument(
        "--in-flight",
        type=_in_flight,
        default=None,
        metavar="N",
        help="sync mode: keep N single-row writes in flight from one event loop (the asyncio "
        "client) instead of threads; background mode: N batches per tablet in flight per "
        f"session (at most {MAX_IN_FLIGHT})",
    )
    p.add_argument(
        "--row-bytes",
        type=_row_bytes,
        default=100,
        metavar="B",
        help="payload bytes per row in the STRING/BINARY column (default 100)",
    )
    p.add_argument(
        "--keys",
        choices=KEY_ORDERS,
        default="rising",
        help="rising (default): each writer's keys in order, added at the end of its range; "
        "scattered: all over it, as random keys (hashes, UUIDs) land",
    )
    p.add_argument(
        "--flush-mode",
        choices=("sync", "background", "manual"),
        default=None,
        help="sync (default; background with --batch-rows), background or manual; see below",
    )
    p.add_argument(
        "--batch-rows",
        type=positive_int,
        default=None,
        metavar="N",
        help="rows per write RPC: manual mode flushes every N rows, background mode sends "
        f"batches of up to N (default {DEFAULT_BATCH_ROWS})",
    )
    p.add_argument(
        "--row-format",
        choices=("block", "cells"),
        default="block",
        help="rows on the wire: a packed row block per write (default) or the older per-cell "
        "form, for comparisons",
    )
    p.add_argument("--table", default="kv", metavar="TABLE", help="table to write (default kv)")
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
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


# --- the command -----------------------------------------------------------------------------


def check_writers(args: argparse.Namespace) -> None:
    """Resolve ``--threads`` / ``--in-flight`` / ``--flush-mode`` / ``--batch-rows``
    defaults (see the module docstring); ``UsageError`` for combinations that mean nothing.
    Afterwards ``args.in_flight`` is set only for the asyncio load, and
    ``args.batches_in_flight`` holds the sessions' window."""
    args.batches_in_flight = None
    if args.in_flight is not None:
        batched = args.flush_mode == "background" or (
            args.flush_mode is None and args.batch_rows is not None
        )
        if batched:
            args.flush_mode = "background"
            args.batches_in_flight, args.in_flight = args.in_flight, None
            if args.threads is None:
                args.threads = 1
        elif args.flush_mode == "manual":
            raise UsageError(
                "--in-flight with --flush-mode manual: a manual flush waits for its batch; "
                "use --flush-mode background (or just --batch-rows N) for batches in flight"
            )
        else:
            if args.threads is not None:
                raise UsageError(
                    "--threads and --in-flight exclude each other for single-row writes "
                    "(--in-flight N keeps N of them in flight from one event loop)"
                )
            if args.batch_rows is not None:
                raise UsageError("--batch-rows needs --flush-mode background or manual")
            args.flush_mode = "sync"
    if args.in_flight is not None and getattr(args, "row_format", "block") != "block":
        raise UsageError("--row-format cells is for sessions (--threads), not --in-flight writes")
    if args.threads is None and args.in_flight is None:
        args.threads = DEFAULT_THREADS
    if args.batch_rows is not None:
        # A sync session writes each row as it is applied: N rows a write means batches.
        if args.flush_mode == "sync":
            raise UsageError(
                "--batch-rows with --flush-mode sync: a sync session sends every row on "
                "its own; use --flush-mode background or manual (or leave it out)"
            )
        if args.flush_mode is None:
            args.flush_mode = "background"
    if args.flush_mode is None:
        args.flush_mode = "sync"
    if args.batch_rows is None:
        args.batch_rows = DEFAULT_BATCH_ROWS


def run(args: argparse.Namespace) -> int:
    check_writers(args)
    target = resolve_target(args)
    table = target.table(args.table, option="--table: ")
    RowFactory(table.schema, args.row_bytes)  # a table it cannot fill is a usage error now
    load: Callable[[OnTick], LoadSummary]
    client: Client | None = None
    if args.in_flight is not None:

        def load(on_tick: OnTick) -> LoadSummary:
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
                keys=args.keys,
                on_tick=on_tick,
            )

    else:
        # Per-tablet batches of a flush go out in parallel on the client's flush threads,
        # shared by all sessions: enough of them that writers do not queue behind each other.
        threaded = target.client(
            timeout_s=args.timeout, flush_threads=min(64, max(4, 2 * args.threads))
        )
        client = threaded

        def load(on_tick: OnTick) -> LoadSummary:
            return run_load(
                threaded, table.name, table.schema, on_tick=on_tick, **_load_kwargs(args)
            )

    out = console()
    fancy = out.is_terminal and not args.no_progress and args.format == "table"
    try:
        # SIGTERM stops the load as Ctrl-C does (cli.main): the summary says so.
        cpu_before = read_cpu_seconds(target.config.servers, creds=target.creds)
        if fancy:
            summary = with_progress_bar(load, table.name, args, out)
        else:
            summary = with_plain_progress(load, table.name, args)
        cpu_after = read_cpu_seconds(target.config.servers, creds=target.creds)
        cpu = ServerCpu.between(cpu_before, cpu_after)
        summary = dataclasses.replace(summary, server_cpu=cpu)
    finally:
        if client is not None:
            close_client(client)
    try:
        if args.format == "json":
            print(json.dumps(summary.to_json(), indent=2))
        else:
            print_summary(summary, out)
    except BrokenPipeError:
        stdout_gone()  # the reader left; the exit status still tells how the load went
    if summary.interrupted:
        return 130
    return 1 if summary.failed_rows else 0


def _load_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "rows": args.rows,
        "duration_s": args.duration,
        "threads": args.threads,
        "row_bytes": args.row_bytes,
        "flush_mode": args.flush_mode,
        "batch_rows": args.batch_rows,
        "batches_in_flight": args.batches_in_flight,
        "packed_rows": args.row_format == "block",
        "keys": args.keys,
        "timeout_s": args.timeout,
    }
