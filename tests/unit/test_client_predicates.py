"""The client's ``Predicate`` refuses a predicate malformed in itself with ``InvalidArgument``,
a ``RaftletError`` (review r30b: ``Predicate.in_list("value", "abc")`` raised the schema
layer's ``PredicateError``, which ``except RaftletError`` missed, and a non-name column or a
range with no bound passed until the scan)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from raftlet.client import InvalidArgument, Predicate, RaftletError
from raftlet.schema import predicates as schema_predicates
from tests.unit.client_fakes import KV_SCHEMA


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Predicate.in_list("value", "abc"), "IN list needs a list of values, got str"),
        (lambda: Predicate.in_list("key", 5), "IN list needs a list of values, got int 5"),
        (lambda: Predicate.equals(5, 1), "a predicate's column is a column name, got 5"),  # type: ignore[arg-type]
        (lambda: Predicate.is_null(""), "a predicate's column is a column name, got ''"),
        (lambda: Predicate.range("key"), "a range needs a lower or an upper bound"),
    ],
)
def test_a_malformed_predicate_is_an_invalid_argument(
    make: Callable[[], Predicate], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message) as raised:
        make()
    assert isinstance(raised.value, RaftletError)


def test_the_client_predicates_are_the_schema_layers() -> None:
    """What the scan encodes: the same predicates, normalized by the schema."""
    made = [
        Predicate.equals("key", 3),
        Predicate.range("key", 1, upper=9, upper_inclusive=True),
        Predicate.in_list("key", iter([1, 2])),
        Predicate.is_null("value"),
        Predicate.is_not_null("value"),
    ]
    assert all(isinstance(p, schema_predicates.Predicate) for p in made)
    assert [p.to_pb(KV_SCHEMA) for p in made] == [
        schema_predicates.Predicate.equals("key", 3).to_pb(KV_SCHEMA),
        schema_predicates.Predicate.range("key", 1, 9, upper_inclusive=True).to_pb(KV_SCHEMA),
        schema_predicates.Predicate.in_list("key", [1, 2]).to_pb(KV_SCHEMA),
        schema_predicates.Predicate.is_null("value").to_pb(KV_SCHEMA),
        schema_predicates.Predicate.is_not_null("value").to_pb(KV_SCHEMA),
    ]
