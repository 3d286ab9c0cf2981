"""``raftlet scan TABLE``: read rows, with predicates, as a table or JSON.

``--where`` takes one condition per flag, ANDed, as a user would write it::

    key = 5        key < 100      key >= 10      value = 'hello world'
    key in (1, 2, 3)              value is-null  value not-null

(``is null`` / ``is not null`` work too.) Parsing happens in two steps, so the CLI can tell
the user about a typo before connecting to anything: ``parse_where`` checks the syntax
(usage error, exit 2), ``WhereClause.predicate(schema)`` converts each value by its
column's type (as ``parse_value`` does; the predicate then rounds a FLOAT's number to the
float32 a write of it stores) and validates it, which needs the table's schema (still a
usage error: the argument is wrong, not the cluster).
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import json
import math
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from raftlet.cli.common import (
    CliError,
    UsageError,
    add_target_arguments,
    close_client,
    cut,
    positive_int,
    resolve_target,
    timeout_seconds,
)
from raftlet.schema.predicates import Predicate, PredicateError
from raftlet.schema.schema import Schema
from raftlet.schema.types import DataType, Value, datetime_from_micros, normalize

__all__ = ["WhereClause", "add_parser", "parse_value", "parse_where", "print_json_rows", "run"]

_EPILOG = """\
examples:
  raftlet scan kv --data-dir ./c1 --limit 20
  raftlet scan kv --data-dir ./c1 --where "key >= 100" --where "key < 200"
  raftlet scan kv --data-dir ./c1 --where "key in (1, 2, 3)" --columns value
  raftlet scan kv --data-dir ./c1 --where "value is-null" --format json
  raftlet scan kv --servers 127.0.0.1:7051 --follower-reads --limit 5
  raftlet scan kv --data-dir ./c1 --follower-reads --min-index kv-p1=1234 --min-index kv-p3=987

--where syntax: COLUMN OP VALUE with OP one of = < <= > >=; COLUMN in (V1, V2, ...);
COLUMN is-null; COLUMN not-null. Conditions are ANDed. Values are read by the column's
type: integers (also 0x-hex, and _ between digits), floats, true/false (also t/f, yes/no,
y/n, 1/0), strings (quotes optional unless they have commas or spaces at the ends; in
single quotes '' is one quote and \\\\ one backslash), BINARY as 0x-hex (other text
as its UTF-8 bytes), UNIXTIME_MICROS as an integer or an ISO 8601 time or date (UTC unless
it has an offset; at most microseconds). A FLOAT value means the float32 the column would
store for it: f = 0.1 and f <= 0.1 find a FLOAT written as 0.1, and f > 0.4999999999 is
f > 0.5. An integer bound beyond the column's type matches all rows or none (i8 < 1000:
all but NULLs).
In table output BINARY shows as 0x-hex and UNIXTIME_MICROS as UTC time; a string that
could be read as something else -- NULL, empty or blank, starting with a quote (' or "),
or with characters that do not print (control and format characters, line separators:
shown as \\xNN or \\uNNNN escapes) -- in single quotes with its quotes and
backslashes doubled ('NULL', '', 'it''s'; NULL itself is NULL), which --where reads back,
escapes aside; JSON keeps microseconds, base64 for BINARY, and writes infinite floats as
the strings "Infinity" and "-Infinity".
JSON rows are printed as they arrive; a scan that fails midway exits 1 with the array left
open, so that no JSON parser takes the rows before the failure for the whole result.
"""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    p = commands.add_parser(
        "scan",
        help="read rows of a table (with predicates, a projection, a limit)",
        description=(
            "Scan a table: every tablet, paged by resume key, failing over between replicas. "
            "Reads go to each tablet's leader (its latest data) unless --follower-reads."
        ),
        epilog=_EPILOG,
        formatter_class=formatter,
        allow_abbrev=False,
    )
    p.add_argument("table", metavar="TABLE", help="table name (e.g. kv)")
    add_target_arguments(p)
    p.add_argument(
        "--where",
        action="append",
        default=[],
        type=_where_arg,
        metavar="COND",
        help='a condition such as "key < 100" (repeatable; ANDed)',
    )
    p.add_argument("--limit", type=_limit_arg, metavar="N", help="return at most N rows")
    p.add_argument(
        "--columns",
        type=_columns_arg,
        metavar="A,B",
        help="columns to return, in this order (default: all)",
    )
    p.add_argument(
        "--follower-reads",
        action="store_true",
        help="let any replica answer from what it has applied (may be slightly stale)",
    )
    p.add_argument(
        "--min-index",
        type=_min_index_arg,
        action="append",
        default=[],
        metavar="TABLET=N",
        help=(
            "serve TABLET only from a replica that has applied its Raft index N or later "
            "(e.g. a write's tablet and op_index: that write is then seen even with "
            "--follower-reads); a replica that has not waits briefly, then the next one is "
            "tried. Repeatable, one per tablet; a plain N when the scan visits one tablet"
        ),
    )
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=30.0,
        metavar="S",
        help="deadline of each page of the scan, its retries included (default 30)",
    )


def _limit_arg(text: str) -> int:
    from raftlet.schema.scan_bounds import MAX_SCAN_LIMIT

    n = positive_int(text)
    if n > MAX_SCAN_LIMIT:
        raise argparse.ArgumentTypeError(f"must be at most 2**53 ({MAX_SCAN_LIMIT}), got {n}")
    return n


def _min_index_arg(text: str) -> tuple[str, int]:
    """``TABLET=N`` as (TABLET, N); a plain ``N`` as ("", N)."""
    tablet, eq, number = text.rpartition("=")
    try:
        if eq and not tablet.strip():
            raise ValueError("no tablet before =")
        value = int(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected TABLET=N (a tablet and a Raft index), got {text!r}"
        ) from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**63), got {value}")
    return tablet.strip(), value


def _min_indexes(given: list[tuple[str, int]]) -> int | dict[str, int]:
    if not given:
        return 0
    if any(not tablet for tablet, _ in given):
        if len(given) > 1:
            raise UsageError("--min-index: a plain N stands alone; for several, TABLET=N each")
        return given[0][1]
    bounds: dict[str, int] = {}
    for tablet, index in given:
        bounds[tablet] = max(index, bounds.get(tablet, 0))
    return bounds


def _columns_arg(text: str) -> list[str]:
    cols = [c.strip() for c in text.split(",") if c.strip()]
    if not cols:
        raise argparse.ArgumentTypeError("give at least one column name")
    twice = sorted({c for c in cols if cols.count(c) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"column {twice[0]!r} named twice")
    return cols


# --- --where -------------------------------------------------------------------------------

_COLUMN = r"(?P<col>[A-Za-z_][A-Za-z0-9_]*)"
_NULL_TEST = re.compile(
    rf"\s*{_COLUMN}\s+(?P<test>is-null|is\s+null|not-null|is-not-null|is\s+not\s+null)\s*\Z",
    re.IGNORECASE,
)
_IN_LIST = re.compile(rf"\s*{_COLUMN}\s+in\s*\((?P<values>.*)\)\s*\Z", re.IGNORECASE | re.DOTALL)
_COMPARISON = re.compile(
    rf"\s*{_COLUMN}\s*(?P<op><=|>=|==|!=|<>|=|<|>)\s*(?P<value>.*?)\s*\Z", re.DOTALL
)
_OPS = "=, <, <=, >, >=, in (...), is-null, not-null"


@dataclass(frozen=True, slots=True)
class WhereClause:
    """One parsed ``--where``: ``op`` is one of = < <= > >= in is-null not-null; ``values``
    the value texts (unparsed: their type is the column's)."""

    text: str
    column: str
    op: str
    values: tuple[str, ...] = ()

    @property
    def shown(self) -> str:
        """The clause as an error quotes it: an IN list of thousands cut short."""
        return repr(cut(self.text))

    def predicate(self, schema: Schema) -> Predicate:
        """The validated predicate; ``UsageError`` naming this clause if it does not fit."""
        if not schema.has_column(self.column):
            raise UsageError(
                f"--where {self.shown}: no column {cut(self.column)!r} "
                f"(columns: {', '.join(schema.column_names)})"
            )
        col = schema.column(self.column)
        try:
            # validate() normalizes; a range's integer bound may lie beyond the column's
            # type (``i8 < 1000`` is every row: ``predicates._clamped``).
            ranged = self.op in ("<", "<=", ">", ">=")
            vals = [_literal(col.type, v, in_range=not ranged) for v in self.values]
        except ValueError as e:
            raise UsageError(f"--where {self.shown}: {e}") from None
        if self.op == "is-null":
            pred = Predicate.is_null(col.name)
        elif self.op == "not-null":
            pred = Predicate.is_not_null(col.name)
        elif self.op == "in":
            pred = Predicate.in_list(col.name, vals)
        elif self.op == "=":
            pred = Predicate.equals(col.name, vals[0])
        elif self.op in ("<", "<="):
            pred = Predicate.range(col.name, upper=vals[0], upper_inclusive=self.op == "<=")
        else:
            pred = Predicate.range(col.name, lower=vals[0], lower_inclusive=self.op == ">=")
        try:
            return pred.validate(schema)
        except PredicateError as e:
            raise UsageError(f"--where {self.shown}: {e}") from None


def parse_where(text: str) -> WhereClause:
    """The syntax of one condition (no schema needed); ValueError saying what is wrong."""
    m = _NULL_TEST.match(text)
    if m:
        test = " ".join(m["test"].lower().replace("-", " ").split())
        return WhereClause(text, m["col"], "is-null" if test == "is null" else "not-null")
    m = _IN_LIST.match(text)
    if m:
        values = _split_list(m["values"])
        if not values:
            raise ValueError(f"{cut(text)!r}: the IN list is empty")
        return WhereClause(text, m["col"], "in", tuple(values))
    m = _COMPARISON.match(text)
    if m:
        op = m["op"]
        if op in ("!=", "<>"):
            raise ValueError(f"{cut(text)!r}: {op} is not supported (operators: {_OPS})")
        if not m["value"]:
            raise ValueError(f"{cut(text)!r}: no value after {op!r}")
        value = m["value"]
        if value.lower() == "null":
            raise ValueError(
                f"{cut(text)!r}: nothing compares equal to NULL; use '{m['col']} is-null'"
            )
        return WhereClause(text, m["col"], "=" if op == "==" else op, (value,))
    raise ValueError(
        f"{cut(text)!r} is not a condition: expected COLUMN OP VALUE with OP one of {_OPS} "
        '(e.g. "key < 100")'
    )


def _where_arg(text: str) -> WhereClause:
    try:
        return parse_where(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _split_list(text: str) -> list[str]:
    """Split ``a, 'b,c', "d"`` on the commas outside quotes; items keep their quotes."""
    items: list[str] = []
    current: list[str] = []
    quote = ""
    for ch in text:
        if quote:
            current.append(ch)
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
            current.append(ch)
        elif ch == ",":
            items.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if quote:
        raise ValueError(f"unclosed quote in ({text})")
    last = "".join(current).strip()
    if last or items:
        items.append(last)
    if any(not item for item in items):
        raise ValueError(f"empty value in ({text})")
    return items


def _unquote(text: str) -> str:
    """A value's text without its quotes; in single quotes a doubled quote is one, as SQL
    writes it, and a doubled backslash one -- as the table format prints a string that
    needs quotes."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        inner = text[1:-1]
        return _UNDOUBLE.sub(lambda m: m.group(0)[0], inner) if text[0] == "'" else inner
    return text


# A doubled quote or backslash in a single-quoted value.
_UNDOUBLE = re.compile(r"''|\\\\")


# The largest finite value of each floating-point column type.
_MAX_FINITE = {DataType.DOUBLE: sys.float_info.max, DataType.FLOAT: 3.4028234663852886e38}
# Longer integer text is beyond every integer column's range, with zeros to spare.
_MAX_INT_TEXT = 64
_TRUE = {"true", "t", "yes", "y", "1"}
_FALSE = {"false", "f", "no", "n", "0"}


def parse_value(dtype: DataType, text: str) -> Value:
    """``text`` as a value of a column of type ``dtype``; ValueError saying why not."""
    return normalize(dtype, _literal(dtype, text))


def _literal(dtype: DataType, text: str, *, in_range: bool = True) -> Value:
    """The value ``text`` denotes, checked against ``dtype`` (range -- unless not
    ``in_range``, for an integer --, NaN) but a FLOAT not rounded to float32; ValueError
    saying why not."""
    raw = _unquote(text.strip())
    if dtype is DataType.UNIXTIME_MICROS and not _looks_int(raw):
        return normalize(dtype, _parse_time(raw))
    if dtype.is_integer:
        if not _looks_int(raw):
            raise ValueError(f"{cut(text)!r} is not an integer ({dtype.name} column)")
        digits = raw.replace("_", "")
        if len(digits) > _MAX_INT_TEXT:  # int() refuses past 4,300 digits, in its own words
            raise ValueError(
                f"an integer of {len(digits)} characters is out of range ({dtype.name} column)"
            )
        try:
            number = int(digits, 0)
        except ValueError:
            # Only a decimal with a leading zero gets here: Python refuses it, as a C
            # reader would take it for octal.
            raise ValueError(
                f"{cut(text)!r}: a decimal integer cannot start with 0 "
                f"(write {int(digits, 10)}, or 0x... for hex)"
            ) from None
        return normalize(dtype, number) if in_range else number
    if dtype in (DataType.FLOAT, DataType.DOUBLE):
        # Only float() in the try: normalize's TypeMismatch (NaN, out of FLOAT's range) is
        # a ValueError too, and says the real reason.
        try:
            real = float(raw)
        except ValueError:
            raise ValueError(f"{cut(text)!r} is not a number ({dtype.name} column)") from None
        if math.isinf(real) and raw.lstrip("+-").lower() not in ("inf", "infinity"):
            raise ValueError(
                f"{cut(text)!r} is out of range for {dtype.name} "
                f"(beyond +-{_MAX_FINITE[dtype]:.6g}; write inf or -inf for infinity)"
            )
        normalize(dtype, real)
        return real
    if dtype is DataType.BOOL:
        low = raw.lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise ValueError(f"{cut(text)!r} is not true or false (BOOL column)")
    if dtype is DataType.BINARY:
        if raw[:2].lower() == "0x":
            try:
                return bytes.fromhex(raw[2:])
            except ValueError:
                raise ValueError(f"{cut(text)!r} is not valid hex (BINARY column)") from None
        return raw.encode()
    return normalize(dtype, raw)


# The fraction of an ISO 8601 time's seconds, extended (12:00:00.5) or basic (120000.5):
# the date has none.
_FRACTION = re.compile(r"\d[.,](\d+)")


def _looks_int(text: str) -> bool:
    return re.fullmatch(r"[+-]?(0[xX][0-9a-fA-F_]+|[0-9][0-9_]*)", text) is not None


def _parse_time(text: str) -> _dt.datetime:
    try:
        t = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{cut(text)!r} is neither microseconds since the epoch nor an ISO 8601 time "
            "(UNIXTIME_MICROS column)"
        ) from None
    # fromisoformat drops the digits of a fraction past the sixth: a time the column cannot
    # hold would be stored as another one.
    fraction = _FRACTION.search(text)
    if fraction and fraction.group(1)[6:].strip("0"):
        raise ValueError(
            f"{cut(text)!r} is finer than a microsecond, which is what UNIXTIME_MICROS holds"
        )
    # A time without an offset means UTC: the column stores UTC, and the local zone of the
    # machine running the CLI is an accident.
    return t if t.tzinfo is not None else t.replace(tzinfo=_dt.UTC)


# --- running -------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from raftlet.client import InvalidArgument, RaftletError, ReadMode

    target = resolve_target(args)
    table = target.table(args.table)
    schema = table.schema
    if args.columns:
        unknown = [c for c in args.columns if not schema.has_column(c)]
        if unknown:
            raise UsageError(
                f"--columns: no column {cut(unknown[0])!r} in {table.name} "
                f"(columns: {', '.join(schema.column_names)})"
            )
    predicates = [w.predicate(schema) for w in args.where]
    columns = list(args.columns or schema.column_names)
    mode = ReadMode.FOLLOWER_APPLIED if args.follower_reads else ReadMode.LEADER_LATEST
    min_index = _min_indexes(args.min_index)
    client = target.client(timeout_s=args.timeout)
    try:
        try:
            rows = client.scan(
                table.name,
                projection=args.columns,
                predicates=predicates,
                limit=args.limit,
                read_mode=mode,
                min_index=min_index,
            )
        except InvalidArgument as e:  # the arguments, checked before any call
            hint = ""
            if isinstance(min_index, int) and "min_index" in str(e):
                hint = " (--min-index TABLET=N, once for each tablet)"
            raise UsageError(f"{e}{hint}") from None
        try:
            if args.format == "json":
                print_json_rows(rows, columns, schema)
            else:
                _print_table(rows, columns, schema, table.name)
        except RaftletError as e:
            raise CliError(f"scan of {table.name} failed: {e}") from None
    finally:
        close_client(client)
    return 0


def print_json_rows(
    rows: Iterator[dict[str, Value]], columns: Sequence[str], schema: Schema
) -> None:
    import sys

    # Streamed, one row per line inside the array, so a large scan starts printing at once
    # and never sits in memory whole. A failure midway propagates before the closing
    # bracket: truncated output must not parse as a complete result.
    out = sys.stdout
    out.write("[")
    first = True
    for row in rows:
        doc = {c: _json_value(schema.column(c).type, row.get(c)) for c in columns}
        out.write(("\n" if first else ",\n") + json.dumps(doc, ensure_ascii=False))
        first = False
    out.write("\n]\n" if not first else "]\n")
    out.flush()


def _json_value(dtype: DataType, value: Value) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and math.isinf(value):
        # JSON has no number for it (json.dumps would write the bare word, which strict
        # parsers refuse); NaN is never stored.
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _escape_control(text: str) -> str:
    """``text`` with what is not printable escaped (control characters, and Unicode's format
    characters and line separators: a stored escape sequence could recolour the terminal
    or move its cursor, a right-to-left override reverse what follows, a line separator
    split a row)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escaped(c) for c in text)


def _escaped(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _text_value(dtype: DataType, value: Value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if dtype is DataType.UNIXTIME_MICROS and isinstance(value, int):
        try:
            return datetime_from_micros(value).isoformat().replace("+00:00", "Z")
        except OverflowError:
            return str(value)
    if isinstance(value, str):
        return _shown_string(value)
    return str(value)


def _shown_string(text: str) -> str:
    """A string as the table shows it: as it is, unless it could be read as something else
    -- NULL, a quoted string, an empty or blank cell, escapes (a NUL and the four characters
    ``\x00`` printed alike). Those are shown in single quotes with their own quotes doubled,
    as SQL writes them and ``--where`` reads them."""
    if (
        text.isprintable()
        and text
        and text == text.strip()
        and text.upper() != "NULL"
        and not text.startswith(("'", '"'))
    ):
        return text
    # In quotes a backslash is doubled, so that an escape is one (a NUL and the text
    # " \x00" were both shown ' \x00'); --where reads it back as one (``_unquote``).
    return "'" + _escape_control(text.replace("\\", "\\\\")).replace("'", "''") + "'"


def _print_table(
    rows: Iterator[dict[str, Value]], columns: Sequence[str], schema: Schema, name: str
) -> None:
    """Rows as aligned columns, printed as they come, a thousand at a time: built as one rich
    table, a 300,000-row scan printed nothing for six minutes and held 2.7 GB. Each column
    is as wide as its widest value so far (a wider one later widens it from there on)."""
    import sys

    types = [schema.column(c).type for c in columns]
    table = _Columns(list(columns), [_numeric(t) for t in types])
    n = 0
    chunk: list[list[str]] = []
    for row in rows:
        chunk.append([_text_value(t, row.get(c)) for t, c in zip(types, columns, strict=True)])
        if len(chunk) == _TABLE_CHUNK_ROWS:
            sys.stdout.write(table.lines(chunk, header=n == 0))
            n += len(chunk)
            chunk = []
    if chunk:
        sys.stdout.write(table.lines(chunk, header=n == 0))
        n += len(chunk)
    sys.stdout.write(f"({n} row{'s' * (n != 1)} from {name})\n")
    sys.stdout.flush()


# Rows measured and printed at a time by the table format.
_TABLE_CHUNK_ROWS = 1000


def _numeric(t: DataType) -> bool:
    return (t.is_integer and t is not DataType.UNIXTIME_MICROS) or t in (
        DataType.FLOAT,
        DataType.DOUBLE,
    )


class _Columns:
    """Aligned text columns two spaces apart, numbers to the right, widths that only grow."""

    def __init__(self, header: list[str], right: list[bool]) -> None:
        from rich.cells import cell_len  # terminal cells: a CJK character takes two

        self._len = cell_len
        self.header = header
        self.right = right
        self.widths = [cell_len(h) for h in header]

    def lines(self, rows: list[list[str]], *, header: bool) -> str:
        """``rows`` (and the header first if asked) as lines, each ending in a newline."""
        widths, cell_len = self.widths, self._len
        for cells in rows:
            for i, text in enumerate(cells):
                w = cell_len(text)
                if w > widths[i]:
                    widths[i] = w
        out = [self._line(self.header)] if header else []
        out += [self._line(cells) for cells in rows]
        return "\n".join(out) + "\n"

    def _line(self, cells: list[str]) -> str:
        last = len(cells) - 1
        parts = []
        for i, text in enumerate(cells):
            pad = " " * (self.widths[i] - self._len(text))
            parts.append(pad + text if self.right[i] else text if i == last else text + pad)
        return "  ".join(parts)
