"""Scan predicates: validation against the schema and the PredicatePB round trip."""

from __future__ import annotations

import datetime as dt

import pytest

from raftlet.proto import tablet_pb2
from raftlet.schema.predicates import MAX_IN_LIST, Predicate, PredicateError, PredicateKind
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType

S = Schema(
    [
        ColumnSchema("id", DataType.INT16, is_key=True),
        ColumnSchema("f", DataType.FLOAT, nullable=True),
        ColumnSchema("s", DataType.STRING, nullable=True),
        ColumnSchema("t", DataType.UNIXTIME_MICROS, nullable=True),
    ]
)


@pytest.mark.parametrize(
    "pred",
    [
        Predicate.equals("id", 3),
        Predicate.equals("s", "ü"),
        Predicate.range("id", 1, 5),
        Predicate.range("id", 1, 5, lower_inclusive=False, upper_inclusive=True),
        Predicate.range("id", lower=1),
        Predicate.range("id", upper=1, upper_inclusive=True),
        Predicate.in_list("s", ["a", "b"]),
        Predicate.in_list("id", []),
        Predicate.is_null("f"),
        Predicate.is_not_null("f"),
    ],
    ids=repr,
)
def test_pb_round_trip(pred: Predicate) -> None:
    wire = pred.to_pb(S).SerializeToString()
    back = Predicate.from_pb(S, tablet_pb2.PredicatePB.FromString(wire))
    assert back == pred.validate(S)


def test_validate_normalizes_values() -> None:
    p = Predicate.equals("f", 0.1).validate(S)
    assert p.values[0] != 0.1  # rounded to float32, like the stored values
    assert Predicate.equals("f", 1).validate(S).values == (1.0,)
    when = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    r = Predicate.range("t", lower=when).validate(S)  # type: ignore[arg-type]
    assert r.lower == 1577836800000000
    assert r.kind is PredicateKind.RANGE


@pytest.mark.parametrize(
    ("pred", "message"),
    [
        (Predicate.equals("nope", 1), "unknown column 'nope'"),
        (Predicate.equals("id", "1"), "'id': value: INT16 needs an int, got str"),
        (Predicate.equals("id", 1 << 20), "out of range for INT16"),
        (Predicate.equals("id", None), "NULL.*use IS NULL"),
        (Predicate.in_list("s", ["a", None]), "IN-list value is NULL"),
        (Predicate.in_list("s", ["a", 1]), "IN-list value: STRING needs a str"),
        (Predicate.in_list("id", range(MAX_IN_LIST + 1)), "at most"),
        (Predicate.range("id"), "RANGE needs a lower or an upper bound"),
        (Predicate.range("id", 1, "x"), "upper bound: INT16 needs an int"),
        (Predicate("id", PredicateKind.EQUALS, values=(1, 2)), "EQUALS takes one value"),
    ],
)
def test_invalid_predicates(pred: Predicate, message: str) -> None:
    with pytest.raises(PredicateError, match=message):
        pred.validate(S)


@pytest.mark.parametrize(
    ("pb", "message"),
    [
        (tablet_pb2.PredicatePB(column="id"), "no predicate kind set"),
        (tablet_pb2.PredicatePB(column="x", is_null=True), "unknown column 'x'"),
        (
            tablet_pb2.PredicatePB(column="id", equals=tablet_pb2.ValuePB(double_value=1.0)),
            "'id': value: INT16 travels as int_value, got double_value",
        ),
        (
            tablet_pb2.PredicatePB(column="id", equals=tablet_pb2.ValuePB()),
            "'id': value: no value given",
        ),
        (
            tablet_pb2.PredicatePB(
                column="id",
                range=tablet_pb2.PredicatePB.RangePB(lower=tablet_pb2.ValuePB(null_value=True)),
            ),
            "lower bound is NULL",
        ),
        (
            tablet_pb2.PredicatePB(column="id", range=tablet_pb2.PredicatePB.RangePB()),
            "RANGE needs a lower or an upper bound",
        ),
    ],
)
def test_invalid_predicate_pbs(pb: tablet_pb2.PredicatePB, message: str) -> None:
    with pytest.raises(PredicateError, match=message):
        Predicate.from_pb(S, pb)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Predicate.in_list("s", "abc"), r"IN list needs a list of values, got str 'abc'"),
        (lambda: Predicate.in_list("id", 5), r"IN list needs a list of values, got int 5"),
        (lambda: Predicate.in_list("s", b"ab"), r"got bytes"),
        (
            lambda: Predicate.range("id", 1, lower_inclusive="no").validate(S),  # type: ignore[arg-type]
            r"lower_inclusive must be True or False, got 'no'",
        ),
        (
            lambda: Predicate.range("id", upper=1, upper_inclusive=1).validate(S),  # type: ignore[arg-type]
            r"upper_inclusive must be True or False, got 1",
        ),
    ],
)
def test_misused_builders_are_refused_clearly(build: object, message: str) -> None:
    """in_list("k", "abc") was IN ('a', 'b', 'c'), in_list("k", 5) a bare TypeError, and
    lower_inclusive="no" was taken as True."""
    with pytest.raises(PredicateError, match=message):
        build()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("pred", "lower", "upper"),
    [
        # (bound, inclusive) of each side after validate; INT16 is [-32768, 32767].
        (Predicate.range("id", upper=1 << 20), None, (32767, True)),  # every row
        (Predicate.range("id", upper=-(1 << 20)), None, (-32768, False)),  # none
        (Predicate.range("id", lower=1 << 20), (32767, False), None),  # none
        (Predicate.range("id", lower=-(1 << 20), lower_inclusive=False), (-32768, True), None),
        (Predicate.range("id", 5, 1 << 70, upper_inclusive=False), (5, True), (32767, True)),
        (Predicate.range("t", lower=-(1 << 64)), (-(1 << 63), True), None),
        (Predicate.range("id", 3, 7), (3, True), (7, False)),  # in range: as given
    ],
    ids=repr,
)
def test_an_integer_bound_beyond_its_type_matches_what_it_would_in_the_integers(
    pred: Predicate, lower: tuple[int, bool] | None, upper: tuple[int, bool] | None
) -> None:
    """Review r31b: ``i8 < 1000`` was an error, where every row matches."""
    p = pred.validate(S)
    assert (p.lower, p.lower_inclusive) == (lower or (None, False))
    assert (p.upper, p.upper_inclusive) == (upper or (None, False))
    assert Predicate.from_pb(S, p.to_pb(S)) == p
