"""What ``raftlet write`` shows: progress while the load runs and the summary after it.

Apart from the load (``cli.write_load``) so that the same load can be watched on a terminal
(a rich progress bar), in a log (a plain line every few seconds) or not at all, and its
summary printed as a table; ``--format json`` prints ``LoadSummary.to_json`` instead
(``cli.write_cmd``). rich is imported only when something is drawn.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raftlet.cli.common import human_count, human_us, stdout_gone
from raftlet.cli.write_load import LoadState, LoadSummary, OnTick

if TYPE_CHECKING:
    from raftlet.cli.server_cpu import ServerCpu
    from raftlet.client import ClientStats

__all__ = ["print_summary", "with_plain_progress", "with_progress_bar"]


def with_progress_bar(
    load: Callable[[OnTick], LoadSummary], table: str, args: argparse.Namespace, out: Any
) -> LoadSummary:
    """Run ``load`` under a progress bar on the terminal ``out``; return its summary."""
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

        def tick(elapsed: float, stats: ClientStats, shared: LoadState) -> None:
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
    threads = f"{args.threads} thread{'s' if args.threads != 1 else ''}"
    if args.in_flight is not None:
        writers = f"{args.in_flight} in flight (asyncio)"
    elif getattr(args, "batches_in_flight", None) is not None:
        writers = f"{threads}, {args.batches_in_flight} batches in flight each"
    else:
        writers = threads
    return (
        f"writing {what} to {table}: {writers}, flush mode {args.flush_mode}, "
        f"{args.row_bytes}-byte rows"
    )


def with_plain_progress(
    load: Callable[[OnTick], LoadSummary], table: str, args: argparse.Namespace
) -> LoadSummary:
    """Run ``load`` with a plain progress line every few seconds (none with
    ``--no-progress`` or ``--format json``); return its summary."""
    # Not a terminal (CI logs, pipes): a line every few seconds instead of a redrawn bar.
    quiet = [args.no_progress or args.format == "json"]
    last = [0.0]

    def say(line: str) -> None:
        try:
            print(line, flush=True)
        except BrokenPipeError:
            # `raftlet write … | head -1`: the reader left, the load was asked for all the
            # same. It stopped here, with its writers running on a closed client, and
            # exited 0; now it finishes, quietly.
            quiet[0] = True
            stdout_gone()

    if not quiet[0]:
        say(_headline(table, args))

    def tick(elapsed: float, stats: ClientStats, shared: LoadState) -> None:
        if quiet[0] or elapsed - last[0] < 2.0:
            return
        last[0] = elapsed
        errors = sum(shared.errors.values())
        say(
            f"  {elapsed:5.1f} s  {stats.rows_acked:>10,} rows  "
            f"{stats.rows_acked / elapsed:>9,.0f} rows/s  {stats.total_retries:,} retries  "
            f"{errors:,} errors"
        )

    return load(tick)


def print_summary(s: LoadSummary, out: Any) -> None:
    """Print the summary as tables on the rich console ``out``."""
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
    cpu_value, cpu_rate, cpu_note = _cpu_cells(s)
    t.add_row("server CPU", cpu_value, cpu_rate)
    if s.client_cpu_s is not None:
        per_write = s.client_cpu_ms_per_write
        rate = f"{per_write:.3f} ms/write" if per_write is not None else "-"
        t.add_row("client CPU", f"{s.client_cpu_s:,.2f} s", rate)
    out.print(t)
    if cpu_note:
        # Under the table, not in its cell: a sentence there widened the column of every
        # row (review r34b).
        out.print(cpu_note, markup=False)
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
    if s.failed_rows_maybe_applied:
        errors += (
            f" ({s.failed_rows_maybe_applied:,} of these rows may have been written all the "
            "same: their outcome is unknown, not counted as written)"
        )
    causes.add_row("errors", Text(errors, style="red" if s.errors_by_cause else "green"))
    out.print(causes)
    if s.first_error:
        out.print(Text(f"first error: {s.first_error}", style="red"))


def _cpu_cells(s: LoadSummary) -> tuple[str, str, str]:
    """The server CPU row's value and rate, and a note for under the table ("" if none)."""
    cpu = s.server_cpu
    if cpu is None:
        return "-", "not read", ""
    total = cpu.total_s
    if total is None:
        if not cpu.by_server:
            return "-", "unknown (no server to read it from)", ""
        return "-", "unknown", f"server CPU is unknown: {_without(cpu)}"
    per_write = s.server_cpu_ms_per_write
    rate = f"{per_write:.3f} ms/write" if per_write is not None else "-"
    if cpu.missing:
        return f"{total:,.2f} s", rate + " *", f"* server CPU leaves out {_without(cpu)}"
    return f"{total:,.2f} s", rate, ""


def _without(cpu: ServerCpu) -> str:
    """Why servers have no figure: every server exports it (metrics.process), so one
    without missed a reading (read_cpu_seconds keeps no error to say why) or restarted."""
    parts = [f"{sid} (restarted during the run)" for sid in cpu.restarted]
    parts += [f"{sid} (missed a /metrics reading before or after the run)" for sid in cpu.unread]
    return ", ".join(parts)


def _by_cause(counts: dict[str, int]) -> str:
    if not counts:
        return "none"
    return ", ".join(f"{cause} {n:,}" for cause, n in sorted(counts.items(), key=lambda i: -i[1]))
