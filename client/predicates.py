"""The client's ``Predicate`` (class ``ScanPredicate``: no two classes of the codebase share
a name): the schema layer's, whose constructors refuse a predicate malformed in itself with
the client's ``InvalidArgument``. ``except RaftletError`` missed the schema layer's
``PredicateError`` (a ``ValueError``) that ``Predicate.in_list("v", "abc")`` raised (review
r30b), and a column that was no name, or a range with no bound, passed until the scan.
What needs the table's schema -- an unknown column, a value of the wrong type -- ``scan``
checks, also raising ``InvalidArgument``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Self

from raftlet.client.errors import InvalidArgument
from raftlet.schema import predicates
from raftlet.schema.predicates import PredicateError
from raftlet.schema.types import Value

__all__ = ["Predicate", "ScanPredicate"]


def _named(column: object) -> None:
    if not isinstance(column, str) or not column:
        raise InvalidArgument(f"a predicate's column is a column name, got {column!r:.60}")


class ScanPredicate(predicates.Predicate):
    """One filter on one column, built with the class methods (``equals``, ``range``,
    ``in_list``, ``is_null``, ``is_not_null``); ``scan``'s ``predicates`` takes a list."""

    __slots__ = ()

    @classmethod
    def equals(cls, column: str, value: Value) -> Self:
        """``column = value``. A value no row of the column could hold (300 for an INT8) is
        InvalidArgument when the scan is sent, as in ``in_list`` -- unlike a ``range``
        bound, which is clamped."""
        _named(column)
        return super().equals(column, value)

    @classmethod
    def range(
        cls,
        column: str,
        lower: Value = None,
        upper: Value = None,
        *,
        lower_inclusive: bool = True,
        upper_inclusive: bool = False,
    ) -> Self:
        """``lower <= column < upper`` by default; pass the flags for other bounds. One
        bound may be None (open on that side), not both. A FLOAT bound means the float32
        the column would store for it (``range("f", upper=0.1, upper_inclusive=True)``
        finds a FLOAT written as 0.1); an integer bound beyond the column's type matches
        every row or none."""
        _named(column)
        if lower is None and upper is None:
            raise InvalidArgument(
                f"predicate on {column!r}: a range needs a lower or an upper bound"
            )
        return super().range(
            column, lower, upper, lower_inclusive=lower_inclusive, upper_inclusive=upper_inclusive
        )

    @classmethod
    def in_list(cls, column: str, values: Iterable[Value]) -> Self:
        """``column IN values``; ``values`` is a list (or any iterable) of values, not one
        value: a str would otherwise be taken as the list of its characters. A value no row
        of the column could hold is InvalidArgument, as in ``equals``."""
        _named(column)
        try:
            return super().in_list(column, values)
        except PredicateError as e:
            raise InvalidArgument(str(e)) from None

    @classmethod
    def is_null(cls, column: str) -> Self:
        _named(column)
        return super().is_null(column)

    @classmethod
    def is_not_null(cls, column: str) -> Self:
        _named(column)
        return super().is_not_null(column)


Predicate = ScanPredicate
