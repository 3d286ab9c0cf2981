"""How ``raftlet row`` reads rows: ``COLUMN=VALUE`` arguments and JSON files, checked
against the schema before anything is sent."""

from __future__ import annotations

import io
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlet.cli.common import UsageError
from raftlet.cli.row_input import (
    MAX_ROW_TEXT,
    JsonRowError,
    json_rows,
    keys_only,
    row_from_assignments,
    row_from_json,
)
from raftlet.cli.scan_cmd import _json_value
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import INTEGER_RANGES, DataType, normalize

SCHEMA = Schema(
    [
        ColumnSchema("id", DataType.INT64, is_key=True),
        ColumnSchema("name", DataType.STRING, is_key=True),
        ColumnSchema("small", DataType.INT8, nullable=True),
        ColumnSchema("ratio", DataType.FLOAT, nullable=True),
        ColumnSchema("score", DataType.DOUBLE, nullable=True),
        ColumnSchema("ok", DataType.BOOL, nullable=True),
        ColumnSchema("blob", DataType.BINARY, nullable=True),
        ColumnSchema("at", DataType.UNIXTIME_MICROS, nullable=True),
    ]
)


def rows(text: str) -> list[tuple[str, object]]:
    """Each row of ``text`` with its place as messages name it."""
    return [(str(place), doc) for place, doc in json_rows(io.StringIO(text))]


# --- COLUMN=VALUE -----------------------------------------------------------------------------


def test_assignments_are_read_by_each_columns_type() -> None:
    row = row_from_assignments(
        SCHEMA,
        ["id=0x10", "name= 'a b '", "small=-128", "ratio=0.1", "score=-inf", "ok=yes",
         "blob=0x00ff", "at=1970-01-01T00:00:01Z"],
    )  # fmt: skip
    assert row == {
        "id": 16,
        "name": "a b ",
        "small": -128,
        "ratio": normalize(DataType.FLOAT, 0.1),
        "score": -math.inf,
        "ok": True,
        "blob": b"\x00\xff",
        "at": 1_000_000,
    }


def test_a_bare_null_is_null_and_a_quoted_one_the_string() -> None:
    assert row_from_assignments(SCHEMA, ["name=null"]) == {"name": None}
    assert row_from_assignments(SCHEMA, ["name='null'"]) == {"name": "null"}
    assert row_from_assignments(SCHEMA, ["name=a=b"]) == {"name": "a=b"}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["id"], "'id' is not COLUMN=VALUE"),
        (["=5"], "is not COLUMN=VALUE"),
        (["idd=5"], "no column 'idd' (columns: id, name, small"),
        (["id=5", "id=6"], "column 'id' given twice"),
        (["small=200"], "out of range for INT8"),
        # The argument is echoed cut short: 5,000 digits were repeated whole.
        (
            ["small=" + "7" * 5000],
            "'small=" + "7" * 54 + "...(5006 characters)': an integer of 5000 characters",
        ),
        (["id=five"], "'five' is not an integer (INT64 column)"),
        # A name of thousands of characters, cut short too (it was echoed twice, whole).
        (["n" * 5000 + "=1"], "no column '" + "n" * 60 + "...(5000 characters)' (columns"),
        (["blob=0xzz"], "is not valid hex"),
        ([], "give the row as COLUMN=VALUE arguments, or --json FILE"),
    ],
)
def test_assignments_that_do_not_fit_are_usage_errors(args: list[str], said: str) -> None:
    with pytest.raises(UsageError) as e:
        row_from_assignments(SCHEMA, args)
    assert said in str(e.value)


# --- JSON values ------------------------------------------------------------------------------


def test_json_rows_take_what_scan_writes() -> None:
    doc = {
        "id": 1, "name": "x", "small": None, "ratio": "Infinity", "score": "-Infinity",
        "ok": False, "blob": "AP8=", "at": -5,
    }  # fmt: skip
    assert row_from_json(SCHEMA, doc) == {
        "id": 1, "name": "x", "small": None, "ratio": math.inf, "score": -math.inf,
        "ok": False, "blob": b"\x00\xff", "at": -5,
    }  # fmt: skip
    assert row_from_json(SCHEMA, {"at": "1970-01-01T00:00:02+00:00"}) == {"at": 2_000_000}


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        ([1, 2], "a row is a JSON object, got list"),
        ({}, "an empty object is no row"),
        ({"nope": 1}, "no column 'nope'"),
        ({"id": "1"}, "column 'id': INT64 needs an int, got str"),
        ({"id": True}, "column 'id': INT64 needs an int, got bool"),
        ({"id": 2**63}, "column 'id': 9223372036854775808 is out of range"),
        ({"ok": 1}, "column 'ok': BOOL needs a bool, got int"),
        ({"name": 5}, "column 'name': STRING needs a str, got int"),
        ({"blob": "not base64!"}, "column 'blob': 'not base64!' is not base64"),
        ({"blob": [1]}, "column 'blob': BINARY is a base64 string"),
        ({"score": "NaN"}, "column 'score': 'NaN' is not a number"),
        ({"score": math.nan}, "column 'score': NaN is not supported"),
        ({"at": "yesterday"}, "column 'at': 'yesterday' is neither microseconds"),
    ],
)
def test_json_rows_that_do_not_fit_say_which_column(doc: object, said: str) -> None:
    with pytest.raises(ValueError, match=r"\S") as e:
        row_from_json(SCHEMA, doc)
    assert said in str(e.value)


_VALUES = {
    DataType.INT8: st.integers(*INTEGER_RANGES[DataType.INT8]),
    DataType.INT64: st.integers(*INTEGER_RANGES[DataType.INT64]),
    DataType.UNIXTIME_MICROS: st.integers(*INTEGER_RANGES[DataType.UNIXTIME_MICROS]),
    DataType.FLOAT: st.floats(allow_nan=False, width=32),
    DataType.DOUBLE: st.floats(allow_nan=False),
    DataType.BOOL: st.booleans(),
    DataType.STRING: st.text(),
    DataType.BINARY: st.binary(),
}


@given(
    st.fixed_dictionaries(
        {c.name: _VALUES[c.type] if c.is_key else st.none() | _VALUES[c.type] for c in SCHEMA}
    )
)
def test_a_scans_json_reads_back_as_the_row_it_printed(row: dict[str, object]) -> None:
    row = {c.name: normalize(c.type, row[c.name]) for c in SCHEMA}
    printed = json.dumps(
        {c.name: _json_value(c.type, row[c.name]) for c in SCHEMA}, ensure_ascii=False
    )
    [(place, doc)] = rows(printed + "\n")
    assert place == "line 1"
    assert row_from_json(SCHEMA, doc) == row


@pytest.mark.parametrize(
    ("text", "said"),
    [
        # json reads a number beyond any float as infinity: it was stored as one.
        ('{"score": 1e400}', "column 'score': 1e400 is out of range for DOUBLE (write \"inf\""),
        ('{"ratio": -1e400}', "column 'ratio': -1e400 is out of range for FLOAT"),
        ('{"id": 1e400}', "column 'id': 1e400 is out of range for INT64"),
    ],
)
def test_a_json_number_beyond_every_float_is_refused_not_infinity(text: str, said: str) -> None:
    [(_, doc)] = rows(text)
    with pytest.raises(ValueError, match="out of range") as e:
        row_from_json(SCHEMA, doc)
    assert said in str(e.value)
    assert row_from_json(SCHEMA, rows('{"score": 1e300}')[0][1]) == {"score": 1e300}


def test_a_json_integer_of_thousands_of_digits_says_the_line() -> None:
    # int() refuses past 4,300 digits: a bare ValueError came out of the reader.
    with pytest.raises(JsonRowError, match="line 2: an integer of 5000 digits is out of"):
        rows('{"id": 1}\n{"id": ' + "7" * 5000 + "}\n")


def test_a_json_row_giving_a_column_twice_is_refused_with_its_line() -> None:
    """Review r31b: the last value won, and the row of the first was never written."""
    with pytest.raises(JsonRowError, match="line 2: column 'id' given twice"):
        rows('{"id": 1}\n{"id": 20014, "name": "x", "id": 20015}\n')


def test_a_delete_keeps_the_key_columns_alone_before_reading_the_row() -> None:
    """A value the delete does not use stopped the file (review r33b), though --help says
    a delete's other columns are ignored."""
    doc = {"id": 1, "name": "a", "ok": "not a bool"}
    assert row_from_json(SCHEMA, keys_only(SCHEMA, doc)) == {"id": 1, "name": "a"}
    with pytest.raises(ValueError, match=r"a delete takes the key \(id, name\), and this row"):
        keys_only(SCHEMA, {"ok": True})


# --- JSON files -------------------------------------------------------------------------------


def test_an_array_as_scan_prints_it_and_json_lines_give_the_same_rows() -> None:
    array = '[\n{"id": 1},\n{"id": 2,\n "name": "x"}\n]\n'
    lines = '{"id": 1}\n\n{"id": 2,\n "name": "x"}\n'
    assert rows(array) == [
        ("row 1 (line 2)", {"id": 1}),
        ("row 2 (line 3)", {"id": 2, "name": "x"}),
    ]
    assert rows(lines) == [("line 1", {"id": 1}), ("line 3", {"id": 2, "name": "x"})]
    assert rows("[]") == rows("[\n]\n") == rows("") == rows("\n  \n") == []
    # A compact array is one line: its rows are told apart by their numbers.
    compact = rows('[{"id": 1}, {"id": 2}]')
    assert compact == [("row 1 (line 1)", {"id": 1}), ("row 2 (line 1)", {"id": 2})]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[{"id": 1}, {"id": 2}, {"id": 3,, "x": 1}]', "row 3 (line 1): not valid JSON"),
        ('[{"id": 1}, {"id": 2, "id": 3}]', "row 2 (line 1): column 'id' given twice"),
        ('[{"id": 1},\n {"id": 2}, {"id":', "row 3 (line 2): the input ends inside this row"),
        ('[{"id": 1}, {"id": 2}', "line 1: the array is not closed"),
    ],
)
def test_an_arrays_unreadable_row_is_named_by_its_number(text: str, said: str) -> None:
    with pytest.raises(JsonRowError) as e:
        rows(text)
    assert str(e.value).startswith(said), str(e.value)


@pytest.mark.parametrize(
    ("text", "line", "said"),
    [
        ('[\n{"id": 1},\n{"id": 2}\n', 4, "the array is not closed"),
        ('[\n{"id": 1}\n{"id": 2}]\n', 3, "expected ',' or ']' between rows"),
        ('{"id": 1}\n{"id": 2 "x": 3}\n', 2, "not valid JSON: Expecting ',' delimiter"),
        ('{"id": 1}\n{"id":\n\n 2,\n', 2, "the input ends inside this row: truncated?"),
        ('{"id": 1}\n{"id":\n\n 2,\n]\n', 5, "not valid JSON"),
        ('[{"id": 1}]\n{"id": 2}\n', 2, "text after the array's ']'"),
        ("{'id': 1}\n", 1, "not valid JSON"),
    ],
)
def test_text_that_is_not_rows_says_the_line(text: str, line: int, said: str) -> None:
    with pytest.raises(JsonRowError) as e:
        list(json_rows(io.StringIO(text)))
    assert e.value.line == line
    assert said in str(e.value)
    assert str(e.value).startswith(f"line {line}: ")


class _Tail(io.StringIO):
    """Text whose reader must stop at a line: reading past it fails the test."""

    def __init__(self, text: str, stop_after: int) -> None:
        super().__init__(text)
        self.stop_after = stop_after
        self.lines = 0

    def readline(self, size: int | None = -1, /) -> str:
        self.lines += 1
        assert self.lines <= self.stop_after, "read on past an error no more input mends"
        return super().readline(size)


def test_an_error_inside_a_line_is_said_without_reading_on() -> None:
    """A bad line 2 followed by 100,000 good ones took 82 s: each line read copied the text
    again, looking for an end the error could never have (and a pipe waited forever)."""
    text = '{"id": 1}\n{"id": 2 "x": 1}\n' + '{"id": 3}\n' * 100_000
    with pytest.raises(JsonRowError, match="line 2: not valid JSON: Expecting ','"):
        list(json_rows(_Tail(text, stop_after=3)))
    unterminated = '{"id": 1}\n{"name": "abc\n' + '{"id": 3}\n' * 10
    with pytest.raises(JsonRowError, match="line 2: not valid JSON"):
        list(json_rows(_Tail(unterminated, stop_after=3)))


def test_rows_before_a_broken_one_are_given_first() -> None:
    reader = json_rows(io.StringIO('{"id": 1}\n{"id": 2}\n{"id": \n'))
    assert [str(p) for p, _ in (next(reader), next(reader))] == ["line 1", "line 2"]
    with pytest.raises(JsonRowError, match="line 3: the input ends inside this row"):
        next(reader)


def test_text_that_is_not_utf8_says_the_line() -> None:
    stream = io.TextIOWrapper(io.BytesIO(b'{"id": 1}\n{"name": "\xff"}\n'), encoding="utf-8")
    with pytest.raises(JsonRowError, match=r"line \d: not UTF-8 text"):
        list(json_rows(stream))


def test_a_compact_array_on_one_long_line_is_read_in_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("raftlet.cli.row_input._CHUNK", 7)
    docs = [{"id": i, "name": "n" * (i % 13)} for i in range(200)]
    assert [doc for _, doc in rows(json.dumps(docs))] == docs


def test_an_unclosed_brace_is_not_read_without_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("raftlet.cli.row_input.MAX_ROW_TEXT", 1000)
    stream = io.StringIO('{"id": 1,\n' + '"name": "x",\n' * 100_000)
    with pytest.raises(JsonRowError, match="a row over 1000 bytes"):
        list(json_rows(stream))
    assert stream.tell() < 5000
    assert MAX_ROW_TEXT == 64 * 1024 * 1024
