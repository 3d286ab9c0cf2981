"""``raftlet row insert|upsert|update|delete TABLE``: write chosen rows from the command line.

One row from ``COLUMN=VALUE`` arguments, written and acknowledged before the command ends
(it prints the tablet and Raft index, which ``raftlet scan --min-index`` takes); or many
rows from ``--json FILE`` (``-`` for stdin), in the form ``raftlet scan --format json``
writes, sent in batches by a background session. Arguments and rows are read by
``cli.row_input``.

Outcomes a user acts on:
- a row the servers refuse (KEY_EXISTS for an insert, KEY_NOT_FOUND for an update or
  delete)
  is a failed row: the command says which (for a file, its line; in an array, its number
  and line), carries on with the others, and exits 1;
- a write whose fate is unknown (a deadline, a lost connection) says the row may have been
  written all the same;
- a failure that is not about one row (the cluster does not answer) stops a file at the
  row it reached: what was sent before it is reported, nothing after it is sent;
- a file row that cannot be read (not JSON, no such column, a value of the wrong type)
  stops the file there, with the rows before it written.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from array import array
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

from raftlet.cli.common import (
    CliError,
    UsageError,
    add_target_arguments,
    close_client,
    console,
    print_out,
    resolve_target,
    timeout_seconds,
)
from raftlet.cli.row_input import (
    JsonRowError,
    RowPlace,
    json_rows,
    keys_only,
    row_from_assignments,
    row_from_json,
)
from raftlet.schema.schema import Schema

__all__ = ["add_parser", "run"]

_ACTIONS = {
    "insert": ("inserted", "add a row (KEY_EXISTS if its key is there)"),
    "upsert": ("upserted", "add a row, or set the given columns of the one with its key"),
    "update": ("updated", "change columns of the row with this key (KEY_NOT_FOUND if none)"),
    "delete": ("deleted", "delete the row with this key (KEY_NOT_FOUND if none)"),
}

# Failed rows a summary lists one by one; the rest are counted by code.
_LISTED_ERRORS = 10
# Rows between two collections of a file session's errors (keeps their memory bounded).
_COLLECT_EVERY = 4096

_EPILOG = """\
examples:
  raftlet row insert kv key=1 value=hello --data-dir ./c1
  raftlet row upsert kv key=1 "value=hello world" --data-dir ./c1
  raftlet row update kv key=1 value=null --data-dir ./c1       # NULL; 'null' is the string
  raftlet row delete kv key=1 --data-dir ./c1
  raftlet scan kv --data-dir ./c1 --format json > kv.json     # a table's rows ...
  raftlet row upsert kv --json kv.json --data-dir ./c2         # ... written to another cluster
  raftlet row delete kv --json kv.json --data-dir ./c1         # deletes by the rows' keys

VALUE is read by the column's type, as `raftlet scan --where` reads it: integers (also
0x-hex, and _ between digits), floats, true/false (also t/f, yes/no, y/n, 1/0), strings
(quote them for spaces at the ends), BINARY as 0x-hex (other text as its UTF-8 bytes),
UNIXTIME_MICROS as microseconds or an ISO 8601 time or date (UTC unless it has an offset);
a bare null is NULL.
An insert leaves out nullable columns as NULL. An upsert of a new key does too; of a key
that exists it sets the columns given and keeps the others' values (it does not replace
the row: give a column as null to clear it) -- but, as an insert, it must give every
non-nullable column. An update gives the key and the columns to change; a delete gives the
key (with --json, a row's other columns are ignored).

--json FILE (- for stdin) holds one JSON array of row objects, or objects one after another
(JSON lines), as `raftlet scan --format json` writes them: BINARY in base64,
UNIXTIME_MICROS in microseconds, infinite floats as "Infinity" and "-Infinity". Rows go in
batches, each acknowledged by its tablet's majority, in file order for each key. A row the
servers refuse is listed with its line (in an array: its number among the array's rows, and
its line) and the others carry on; a row that cannot be read, or a failure that is not
about one row (the cluster stopped answering), stops the file there, after the rows before
it. Exit status: 0 when every row was written, 1 otherwise.
"""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    row = commands.add_parser(
        "row",
        help="insert, upsert, update or delete rows given on the command line or in a file",
        description=(
            "Write chosen rows: one from COLUMN=VALUE arguments, or many from a JSON file "
            "(what `raftlet scan --format json` prints)."
        ),
        epilog=_EPILOG,
        formatter_class=formatter,
        allow_abbrev=False,
    )
    sub = row.add_subparsers(dest="row_command", metavar="ACTION", required=True)
    for action, (_, help_text) in _ACTIONS.items():
        p = sub.add_parser(action, help=help_text, epilog=_EPILOG, formatter_class=formatter)
        p.add_argument("table", metavar="TABLE", help="table name (e.g. kv)")
        p.add_argument(
            "values", nargs="*", metavar="COLUMN=VALUE", help="the row (e.g. key=5 value=hi)"
        )
        add_target_arguments(p)
        p.add_argument(
            "--json",
            metavar="FILE",
            help="rows from FILE instead (- for stdin): a JSON array of objects, or JSON lines",
        )
        p.add_argument("--format", choices=("table", "json"), default="table")
        p.add_argument(
            "--timeout",
            type=timeout_seconds,
            default=30.0,
            metavar="S",
            help="deadline of each write, its retries included (default 30)",
        )


def run(args: argparse.Namespace) -> int:
    if args.json is not None and args.values:
        raise UsageError("give the row as COLUMN=VALUE arguments or --json FILE, not both")
    target = resolve_target(args)
    table = target.table(args.table)
    if args.json is None:
        row = row_from_assignments(table.schema, args.values)
        _check_columns(args.row_command, table.schema, row)
        client = target.client(timeout_s=args.timeout)
        try:
            return _write_one(client, args, table.name, row)
        finally:
            close_client(client)
    with _opened(args.json) as stream:
        client = target.client(timeout_s=args.timeout)
        try:
            return _write_file(client, args, table.name, table.schema, stream)
        finally:
            close_client(client)


def _check_columns(action: str, schema: Schema, row: Mapping[str, object]) -> None:
    """What the servers would refuse for every row of this shape, said as a usage error."""
    keys = {c.name for c in schema.key_columns}
    missing = [c.name for c in schema.key_columns if c.name not in row]
    if missing:
        raise UsageError(f"give the key: {', '.join(f'{name}=...' for name in missing)}")
    if action == "delete" and set(row) - keys:
        extra = sorted(set(row) - keys)[0]
        raise UsageError(f"a delete gives the key columns only, not {extra!r}")
    if action == "update" and not set(row) - keys:
        raise UsageError("an update gives a column to change besides the key")


@contextmanager
def _opened(path: str) -> Iterator[IO[str]]:
    if path == "-":
        yield sys.stdin
        return
    try:
        # Opened outside the `with`: an OSError of the command's own work must not be
        # reported as this file's.
        stream = open(path, encoding="utf-8")  # noqa: SIM115
    except OSError as e:
        raise CliError(f"--json {path}: {e.strerror or e}") from None
    with stream:
        yield stream


def _write_one(client: Any, args: argparse.Namespace, table: str, row: dict[str, Any]) -> int:
    from raftlet.client import OpType, RaftletError, RowError

    action = args.row_command
    session = client.new_session()
    try:
        result = session.apply(OpType[action.upper()], table, row)
    except RowError as e:
        raise CliError(f"{e.code}: {e.message}") from None
    except RaftletError as e:
        raise CliError(str(e)) from None
    finally:
        session.close()
    if args.format == "json":
        doc = {
            "op": action,
            "table": table,
            "rows": 1,
            "written": 1,
            "failed": 0,
            "tablet_id": result.tablet_id,
            "op_index": result.op_index,
            "op_term": result.op_term,
        }
        print_out(json.dumps(doc))
    else:
        console().print(
            f"{_ACTIONS[action][0]} 1 row in {table} (tablet {result.tablet_id}, log index "
            f"{result.op_index}, term {result.op_term})",
            markup=False,
        )
    return 0


@dataclass
class _FileOutcome:
    """What a file's rows came to."""

    read: int = 0  # rows given to the session
    failed: int = 0
    maybe_applied: int = 0  # failed rows that may have been written all the same
    by_code: Counter[str] = field(default_factory=Counter)
    # Reasons listed one by one, with the first row each failed and how many rows did: a
    # write that failed as a whole fails each of its rows with one reason.
    listed: dict[str, _Listed] = field(default_factory=dict)
    stopped: str = ""  # why the file stopped before its end
    last_given: RowPlace | None = None  # the last row given to the session

    def failure(self, place: RowPlace, code: str, reason: str, error: Exception) -> None:
        maybe = bool(getattr(error, "may_have_applied", False))
        self.failed += 1
        self.maybe_applied += maybe
        self.by_code[code] += 1
        seen = self.listed.get(reason)
        if seen is not None:
            seen.rows += 1
        elif len(self.listed) < _LISTED_ERRORS:
            self.listed[reason] = _Listed(place, reason)

    @property
    def unlisted(self) -> int:
        return self.failed - sum(e.rows for e in self.listed.values())


@dataclass
class _Listed:
    place: RowPlace
    reason: str
    rows: int = 1


def _write_file(
    client: Any, args: argparse.Namespace, table: str, schema: Schema, stream: IO[str]
) -> int:
    from raftlet.client import FlushMode, OpType, RaftletError, RowError

    action = args.row_command
    op = OpType[action.upper()]
    out = _FileOutcome()
    # Where each row the session was given is in the file, by its row index.
    rows_at = array("Q")
    lines = array("Q")
    in_array = False
    started = time.monotonic()
    session = client.new_session(FlushMode.AUTO_FLUSH_BACKGROUND)

    def collect() -> bool:
        """Count the failed rows so far; whether a write failed as a whole."""
        whole = False
        for e in session.errors():
            i = e.row_index
            place = (
                RowPlace(rows_at[i], lines[i], in_array) if i is not None else RowPlace(0, 0, False)
            )
            if isinstance(e, RowError):
                out.failure(place, e.code, f"{e.code}: {e.message}", e)
            else:
                out.failure(place, e.cause, f"{e.cause}: {e}", e)
                whole = True
        return whole

    interrupts = _Interrupts()
    place: RowPlace | None = None
    try:
        for at, doc in interrupts.watching(json_rows(stream)):
            place = at
            try:
                row = row_from_json(schema, keys_only(schema, doc) if op is OpType.DELETE else doc)
            except ValueError as e:
                out.stopped = f"{at}: {e}"
                break
            rows_at.append(at.row)
            lines.append(at.line)
            in_array = at.in_array
            try:
                session.apply(op, table, row)
            except RowError as e:  # refused by the client: the server would refuse it too
                out.failure(at, e.code, f"{e.code}: {e.message}", e)
            out.read += 1
            out.last_given = at
            if out.read % _COLLECT_EVERY == 0 and collect():
                out.stopped = "a write failed as a whole (above)"
                break
    except KeyboardInterrupt:  # the second interrupt (``_Interrupts``)
        out.stopped = "interrupted"
    except JsonRowError as e:
        out.stopped = str(e)
    except RaftletError as e:  # not about the row: the session's buffer stayed full
        out.stopped = f"{place}: {e}" if place is not None else str(e)
    finally:
        if interrupts.asked and not out.stopped:
            out.stopped = "interrupted"
        try:
            session.close()
        except RaftletError as e:
            out.stopped = out.stopped or str(e)
    collect()
    _report_file(args, table, out, time.monotonic() - started)
    if out.stopped == "interrupted":
        raise KeyboardInterrupt
    return 0 if out.failed == 0 and not out.stopped else 1


class _Interrupts:
    """Ctrl-C or SIGTERM while a file is written stops it between two rows: what was sent
    is flushed and reported, so a user knows where to start again, and the command still
    ends as interrupted. A second one interrupts at once (a write stuck on a cluster that
    does not answer, or a read of a pipe that sends nothing)."""

    def __init__(self) -> None:
        self.asked = False

    def watching(
        self, rows: Iterator[tuple[RowPlace, object]]
    ) -> Iterator[tuple[RowPlace, object]]:
        """``rows`` until an interrupt is asked for."""
        if threading.current_thread() is not threading.main_thread():
            yield from rows
            return
        saved = {sig: signal.signal(sig, self._ask) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for item in rows:
                if self.asked:
                    return
                yield item
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)

    def _ask(self, _sig: int, _frame: object) -> None:
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True
        print_out(
            "stopping after the rows sent so far (interrupt again to stop at once)",
            file=sys.stderr,
        )


def _report_file(args: argparse.Namespace, table: str, out: _FileOutcome, seconds: float) -> None:
    action = args.row_command
    written = out.read - out.failed
    if args.format == "json":
        doc = {
            "op": action,
            "table": table,
            "rows": out.read,
            "written": written,
            "failed": out.failed,
            "failed_maybe_applied": out.maybe_applied,
            "errors_by_code": dict(out.by_code),
            "first_errors": [
                {"row": e.place.row, "line": e.place.line, "rows": e.rows, "error": e.reason}
                for e in out.listed.values()
            ],
            "stopped": out.stopped or None,
            "seconds": round(seconds, 3),
        }
        print_out(json.dumps(doc))
        return
    con = console()
    verb = _ACTIONS[action][0]
    of = f" of {out.read:,}" if out.failed else ""
    con.print(
        f"{verb} {written:,}{of} row{'s' * (out.read != 1)} in {table} in {seconds:.1f} s",
        markup=False,
    )
    if out.failed:
        codes = ", ".join(f"{code} {n:,}" for code, n in out.by_code.most_common())
        con.print(f"{out.failed:,} failed ({codes}):", markup=False)
        for e in out.listed.values():
            more = f" (and {e.rows - 1:,} more rows)" if e.rows > 1 else ""
            con.print(f"  {e.place}{more}: {e.reason}", markup=False)
        if out.unlisted:
            con.print(f"  ... and {out.unlisted:,} more", markup=False)
        if out.maybe_applied:
            con.print(
                f"{out.maybe_applied:,} of the failed rows may have been written all the same",
                markup=False,
            )
    if out.stopped:
        after = str(out.last_given) if out.last_given else "the start"
        con.print(f"stopped: {out.stopped}; no row after {after} was sent", markup=False)
