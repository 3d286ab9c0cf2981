"""Rows as ``raftlet row`` reads them: ``COL=VALUE`` arguments, or JSON objects from a file.

Both are checked against the table's schema before anything is sent, so a typo is a usage
error naming the argument or the line, not a row error from a server:

- ``COL=VALUE`` reads VALUE by the column's type as ``raftlet scan --where`` does
  (``scan_cmd.parse_value``); a bare ``null`` is SQL NULL (``'null'``, quoted, is the
  string).
- JSON reads what ``raftlet scan --format json`` writes, so a scan's output can be written
  back: BINARY as base64, UNIXTIME_MICROS as microseconds (or an ISO 8601 time), infinite
  floats as ``"Infinity"``/``"-Infinity"``, ``null`` as NULL. A file is one JSON array of
  objects or objects one after another (JSON lines); it is read as it goes, never whole.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import math
from collections.abc import Iterable, Iterator
from typing import IO, NamedTuple

from raftlet.cli.common import UsageError, cut
from raftlet.cli.scan_cmd import parse_value
from raftlet.schema.schema import Schema
from raftlet.schema.types import DataType, Value, normalize

__all__ = [
    "JsonRowError",
    "RowPlace",
    "json_rows",
    "keys_only",
    "row_from_assignments",
    "row_from_json",
]

# A row object larger than this is refused rather than buffered without end (a file with an
# unclosed brace would otherwise be read whole into memory).
MAX_ROW_TEXT = 64 * 1024 * 1024
# How much of a line is read at a time.
_CHUNK = 1024 * 1024
_FLOATS = (DataType.FLOAT, DataType.DOUBLE)
# A longer integer is beyond every column's range, DOUBLE's too (309 digits).
_MAX_INT_TEXT = 400


class RowPlace(NamedTuple):
    """Where a row of a file is: its number among the file's rows and the line its text
    starts on (both 1-based)."""

    row: int
    line: int
    in_array: bool

    def __str__(self) -> str:
        # The rows of an array can share a line (a compact array is one line); rows one
        # after another are told apart by their lines.
        return f"row {self.row} (line {self.line})" if self.in_array else f"line {self.line}"


class JsonRowError(ValueError):
    """A JSON row that cannot be read; ``line`` is where its text starts (1-based), ``row``
    which of an array's rows it is (None for rows one after another, or no row at all)."""

    def __init__(self, line: int, message: str, *, row: int | None = None) -> None:
        super().__init__(f"{RowPlace(row or 0, line, row is not None)}: {message}")
        self.line = line
        self.row = row


def row_from_assignments(schema: Schema, assignments: Iterable[str]) -> dict[str, Value]:
    """``["key=5", "value=hi"]`` as a row of ``schema``; ``UsageError`` naming the argument
    that does not fit."""
    row: dict[str, Value] = {}
    for text in assignments:
        name, eq, value = text.partition("=")
        name = name.strip()
        if not eq or not name:
            raise UsageError(f"{cut(text)!r} is not COLUMN=VALUE (e.g. key=5, value=hello)")
        if not schema.has_column(name):
            raise UsageError(
                f"{cut(text)!r}: no column {cut(name)!r} "
                f"(columns: {', '.join(schema.column_names)})"
            )
        if name in row:
            raise UsageError(f"column {cut(name)!r} given twice")
        if value.strip() == "null":
            row[name] = None
            continue
        try:
            row[name] = parse_value(schema.column(name).type, value)
        except ValueError as e:
            raise UsageError(f"{cut(text)!r}: {e}") from None
    if not row:
        raise UsageError("give the row as COLUMN=VALUE arguments, or --json FILE")
    return row


def row_from_json(schema: Schema, doc: object) -> dict[str, Value]:
    """One JSON object as a row of ``schema``; ValueError saying which column is wrong."""
    if not isinstance(doc, dict):
        raise ValueError(f"a row is a JSON object, got {type(doc).__name__}")
    row: dict[str, Value] = {}
    for name, value in doc.items():
        if not schema.has_column(name):
            raise ValueError(f"no column {cut(name)!r} (columns: {', '.join(schema.column_names)})")
        try:
            row[name] = _cell(schema.column(name).type, value)
        except ValueError as e:
            raise ValueError(f"column {name!r}: {e}") from None
    if not row:
        raise ValueError("an empty object is no row")
    return row


def keys_only(schema: Schema, doc: object) -> object:
    """The key columns of a JSON row, before it is read (``row_from_json``): a DELETE takes
    nothing else, so a value it would not use must not stop the file. ValueError if the row
    gives no key column."""
    if not isinstance(doc, dict):
        return doc
    names = [c.name for c in schema.key_columns]
    keys = {name: value for name, value in doc.items() if name in names}
    if doc and not keys:
        raise ValueError(f"a delete takes the key ({', '.join(names)}), and this row has none")
    return keys


class _Overflowed(float):
    """A JSON number beyond any float (``1e400``), which ``float()`` makes infinite: kept
    apart so that it is refused, not stored as infinity."""

    text: str


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isinf(value):
        return value
    overflowed = _Overflowed(value)
    overflowed.text = text
    return overflowed


class _Unreadable(ValueError):
    """JSON text no row can be made of (a number beyond every column, a key given twice)."""


def _one_of_each_key(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object's members, refusing a key given twice: the last one won, and the row
    of the first was never written (review r31b), where `row insert` refuses a column
    given twice."""
    row: dict[str, object] = {}
    for key, value in pairs:
        if key in row:
            raise _Unreadable(f"column {key!r} given twice")
        row[key] = value
    return row


def _json_int(text: str) -> int:
    if len(text) > _MAX_INT_TEXT:  # int() refuses past 4,300 digits, in its own words
        raise _Unreadable(f"an integer of {len(text)} digits is out of every column's range")
    return int(text)


def _cell(dtype: DataType, value: object) -> Value:
    """A JSON value as a value of ``dtype`` (``normalize`` checks the type and range);
    ValueError saying why not."""
    if isinstance(value, _Overflowed):
        hint = ' (write "inf" or "-inf" for infinity)' if dtype in _FLOATS else ""
        raise ValueError(f"{value.text[:40]} is out of range for {dtype.name}{hint}")
    if dtype is DataType.BINARY and value is not None:
        if not isinstance(value, str):
            raise ValueError(f"BINARY is a base64 string, got {json.dumps(value)[:40]}")
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{value[:40]!r} is not base64 (BINARY column)") from None
    if dtype in _FLOATS and isinstance(value, str):
        word = value.strip().lower().lstrip("+")
        if word not in ("infinity", "inf", "-infinity", "-inf"):
            raise ValueError(f"{value[:40]!r} is not a number ({dtype.name} column)")
        value = -math.inf if word.startswith("-") else math.inf
    if dtype is DataType.UNIXTIME_MICROS and isinstance(value, str):
        return parse_value(dtype, value)
    return normalize(dtype, value)


def json_rows(stream: IO[str]) -> Iterator[tuple[RowPlace, object]]:
    """The JSON values in ``stream``, each with its place: one array's items, or values one
    after another (JSON lines). ``JsonRowError`` for text that is not that."""
    decoder = json.JSONDecoder(
        parse_float=_json_float, parse_int=_json_int, object_pairs_hook=_one_of_each_key
    )
    text = ""
    pos = 0  # where unread text starts in ``text``
    line = 1  # the line ``pos`` is on
    eof = False
    in_array: bool | None = None  # None until the first value or '[' is seen
    need_comma = False
    rows = 0  # values read so far

    def more() -> bool:
        nonlocal text, pos, eof
        if eof:
            return False
        try:
            # At most a chunk at a time: a compact array of a million rows is one line.
            chunk = stream.readline(_CHUNK)
        except UnicodeDecodeError as e:
            at = line + text.count("\n", pos)
            raise JsonRowError(at, f"not UTF-8 text ({e.reason})") from None
        if not chunk:
            eof = True
            return False
        text = text[pos:] + chunk
        pos = 0
        return True

    while True:
        # Skip blanks (counting lines) up to the next value or punctuation.
        while True:
            while pos < len(text) and text[pos] in " \t\r\n":
                line += text[pos] == "\n"
                pos += 1
            if pos < len(text) or not more():
                break
        if pos >= len(text):
            if in_array:
                raise JsonRowError(line, "the array is not closed (']' missing): truncated?")
            return
        ch = text[pos]
        if in_array is None and ch == "[":
            in_array = True
            pos += 1
            continue
        if in_array is None:
            in_array = False
        if in_array and ch == "]":
            pos += 1
            _expect_end(stream, text[pos:], line)
            return
        if in_array and need_comma:
            if ch != ",":
                raise JsonRowError(line, f"expected ',' or ']' between rows, got {ch!r}")
            pos += 1
            need_comma = False
            continue
        start = line
        row = rows + 1 if in_array else None
        while True:
            try:
                value, end = decoder.raw_decode(text, pos)
                break
            except _Unreadable as e:
                raise JsonRowError(start, str(e), row=row) from None
            except json.JSONDecodeError as e:
                if len(text) - pos > MAX_ROW_TEXT:
                    raise JsonRowError(
                        start,
                        f"a row over {MAX_ROW_TEXT} bytes, or not valid JSON: {e.msg}",
                        row=row,
                    ) from None
                if _unfinished(text, e.pos) and more():
                    continue
                if not text[e.pos :].strip():
                    raise JsonRowError(
                        start, "the input ends inside this row: truncated?", row=row
                    ) from None
                before = text.count("\n", 0, pos)  # lines of ``text`` before the row
                raise JsonRowError(
                    start + e.lineno - 1 - before, f"not valid JSON: {e.msg}", row=row
                ) from None
        line += text.count("\n", pos, end)
        pos = end
        need_comma = bool(in_array)
        rows += 1
        yield RowPlace(rows, start, bool(in_array)), value


def _unfinished(text: str, at: int) -> bool:
    """Whether more input could mend the decoding error at ``at`` of ``text``: it is at the
    end of what was read (a row over several lines), or in a line cut at ``_CHUNK``. An
    error before a line's end is final -- reading on for it, to the end of the input, took
    a reviewer's file 82 s (each line copied the rest), and a pipe forever."""
    rest = text[at:]
    if not rest.strip():
        return True
    # A string cannot span lines: unterminated at a line's end, it is an error.
    return not text.endswith("\n") and "\n" not in rest


def _expect_end(stream: IO[str], rest: str, line: int) -> None:
    for chunk in itertools.chain([rest], stream):
        stripped = chunk.strip()
        if stripped:
            raise JsonRowError(line, f"text after the array's ']': {stripped[:40]!r}")
        line += chunk.count("\n")
