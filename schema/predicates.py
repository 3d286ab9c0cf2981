"""Scan predicates: typed, validated against a schema, and to/from ``PredicatePB``.

Predicates of one scan are ANDed. Semantics follow SQL: no comparison matches NULL, so
EQUALS, RANGE and IN_LIST never return a row whose column is NULL; IS_NULL / IS_NOT_NULL
test for it. A bound or list value is normalized to the column type first (FLOAT rounds to
float32, as the stored values did), so comparisons happen between like values: a literal
means the value the column would store for it, as in Kudu. So ``k = 0.1`` finds the FLOAT
written as 0.1 (and so does ``k <= 0.1``), and ``k > 0.4999999999`` is ``k > 0.5`` (the
float32 nearest), which a stored 0.5 does not match. An integer range bound beyond its
column type's range matches what it would in the integers (``i8 < 1000``: every row but
NULLs; ``i8 > 1000``: none): it is moved to the range's end (``_clamped``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self

from raftlet.proto import tablet_pb2
from raftlet.schema.schema import Schema
from raftlet.schema.types import (
    INTEGER_RANGES,
    DataType,
    TypeMismatch,
    Value,
    normalize,
    value_from_pb,
    value_to_pb,
)

__all__ = ["MAX_IN_LIST", "Predicate", "PredicateError", "PredicateKind"]

# Each IN-list value becomes one SQL parameter; SQLite allows 32766 per statement.
MAX_IN_LIST = 10_000


class PredicateError(ValueError):
    """A predicate does not fit the schema (unknown column, wrong value type, bad shape)."""


def _clamped(dtype: DataType, bound: Value, inclusive: bool, *, lower: bool) -> tuple[Value, bool]:
    """An integer bound beyond its column type's range as the bound at that end of the range
    that matches the same rows: ``i8 < 1000`` is ``i8 <= 127`` (every row), ``i8 > 1000`` is
    ``i8 > 127`` (none). A program building predicates from its users' input had to clamp
    them per column type itself: such a bound was an error (review r31b)."""
    if dtype not in INTEGER_RANGES or not isinstance(bound, int) or isinstance(bound, bool):
        return bound, inclusive
    lo, hi = INTEGER_RANGES[dtype]
    if bound > hi:
        return hi, not lower
    if bound < lo:
        return lo, lower
    return bound, inclusive


class PredicateKind(enum.Enum):
    EQUALS = "equals"
    RANGE = "range"
    IN_LIST = "in_list"
    IS_NULL = "is_null"
    IS_NOT_NULL = "is_not_null"


@dataclass(frozen=True, slots=True)
class Predicate:
    """One filter on one column. Build with the class methods; ``validate`` before use.

    ``values`` is ``(v,)`` for EQUALS and the list for IN_LIST. A RANGE bound of None is
    open on that side (at least one side must be bounded).
    """

    column: str
    kind: PredicateKind
    values: tuple[Value, ...] = ()
    lower: Value = None
    lower_inclusive: bool = True
    upper: Value = None
    upper_inclusive: bool = False

    @classmethod
    def equals(cls, column: str, value: Value) -> Self:
        return cls(column, PredicateKind.EQUALS, values=(value,))

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
        """``lower <= column < upper`` by default; pass the flags for other bounds."""
        return cls(
            column,
            PredicateKind.RANGE,
            lower=lower,
            lower_inclusive=lower_inclusive,
            upper=upper,
            upper_inclusive=upper_inclusive,
        )

    @classmethod
    def in_list(cls, column: str, values: Iterable[Value]) -> Self:
        """``column IN values``; ``values`` is a list (or any iterable) of values, not one
        value: a str would otherwise be taken as the list of its characters."""
        if isinstance(values, str | bytes | bytearray | memoryview) or not isinstance(
            values, Iterable
        ):
            raise PredicateError(
                f"predicate on {column!r}: IN list needs a list of values, got "
                f"{type(values).__name__} {values!r:.60} (for one value use [value] or EQUALS)"
            )
        return cls(column, PredicateKind.IN_LIST, values=tuple(values))

    @classmethod
    def is_null(cls, column: str) -> Self:
        return cls(column, PredicateKind.IS_NULL)

    @classmethod
    def is_not_null(cls, column: str) -> Self:
        return cls(column, PredicateKind.IS_NOT_NULL)

    def validate(self, schema: Schema) -> Predicate:
        """A copy with every value normalized to the column type; ``PredicateError`` if invalid."""
        if not isinstance(self.column, str) or not schema.has_column(self.column):
            raise PredicateError(f"predicate on unknown column {self.column!r}")
        col = schema.column(self.column)
        kind = self.kind

        def norm(value: object, what: str) -> Value:
            if value is None:
                raise PredicateError(
                    f"predicate on {col.name!r}: {what} is NULL "
                    "(nothing compares equal to NULL; use IS NULL)"
                )
            try:
                return normalize(col.type, value)
            except TypeMismatch as e:
                raise PredicateError(f"predicate on {col.name!r}: {what}: {e}") from None

        if kind is PredicateKind.EQUALS:
            if len(self.values) != 1:
                raise PredicateError(f"predicate on {col.name!r}: EQUALS takes one value")
            return Predicate(col.name, kind, values=(norm(self.values[0], "value"),))
        if kind is PredicateKind.IN_LIST:
            if len(self.values) > MAX_IN_LIST:
                raise PredicateError(
                    f"predicate on {col.name!r}: IN list of {len(self.values)} values "
                    f"(at most {MAX_IN_LIST})"
                )
            return Predicate(
                col.name, kind, values=tuple(norm(v, "IN-list value") for v in self.values)
            )
        if kind is PredicateKind.RANGE:
            if self.lower is None and self.upper is None:
                raise PredicateError(
                    f"predicate on {col.name!r}: RANGE needs a lower or an upper bound"
                )
            for side, flag in (("lower", self.lower_inclusive), ("upper", self.upper_inclusive)):
                if not isinstance(flag, bool):
                    raise PredicateError(
                        f"predicate on {col.name!r}: {side}_inclusive must be True or False, "
                        f"got {flag!r}"
                    )
            low, low_in = _clamped(col.type, self.lower, self.lower_inclusive, lower=True)
            high, high_in = _clamped(col.type, self.upper, self.upper_inclusive, lower=False)
            lower = None if low is None else norm(low, "lower bound")
            upper = None if high is None else norm(high, "upper bound")
            # An open side's flag means nothing; False (the proto default) keeps equality exact.
            return Predicate(
                col.name,
                kind,
                lower=lower,
                lower_inclusive=lower is not None and bool(low_in),
                upper=upper,
                upper_inclusive=upper is not None and bool(high_in),
            )
        if kind in (PredicateKind.IS_NULL, PredicateKind.IS_NOT_NULL):
            return Predicate(col.name, kind)
        raise PredicateError(f"predicate on {col.name!r}: unknown kind {kind!r}")

    def to_pb(self, schema: Schema) -> tablet_pb2.PredicatePB:
        p = self.validate(schema)
        dtype = schema.column(p.column).type
        pb = tablet_pb2.PredicatePB(column=p.column)
        if p.kind is PredicateKind.EQUALS:
            value_to_pb(dtype, p.values[0], pb.equals)
        elif p.kind is PredicateKind.IN_LIST:
            pb.in_list.SetInParent()
            for v in p.values:
                value_to_pb(dtype, v, pb.in_list.values.add())
        elif p.kind is PredicateKind.RANGE:
            pb.range.SetInParent()
            if p.lower is not None:
                value_to_pb(dtype, p.lower, pb.range.lower)
                pb.range.lower_inclusive = p.lower_inclusive
            if p.upper is not None:
                value_to_pb(dtype, p.upper, pb.range.upper)
                pb.range.upper_inclusive = p.upper_inclusive
        elif p.kind is PredicateKind.IS_NULL:
            pb.is_null = True
        else:
            pb.is_not_null = True
        return pb

    @classmethod
    def from_pb(cls, schema: Schema, pb: tablet_pb2.PredicatePB) -> Predicate:
        """Decode and validate; ``PredicateError`` names the column and the problem."""
        if not schema.has_column(pb.column):
            raise PredicateError(f"predicate on unknown column {pb.column!r}")
        col = schema.column(pb.column)
        which = pb.WhichOneof("kind")

        def value(v: tablet_pb2.ValuePB, what: str) -> Value:
            try:
                decoded = value_from_pb(col.type, v)
            except TypeMismatch as e:
                raise PredicateError(f"predicate on {col.name!r}: {what}: {e}") from None
            if decoded is None:
                # Checked here because a None bound would otherwise read as "unbounded".
                raise PredicateError(
                    f"predicate on {col.name!r}: {what} is NULL (use IS NULL / IS NOT NULL)"
                )
            return decoded

        p: Predicate
        if which == "equals":
            p = cls.equals(col.name, value(pb.equals, "value"))
        elif which == "in_list":
            p = cls.in_list(col.name, (value(v, "IN-list value") for v in pb.in_list.values))
        elif which == "range":
            r = pb.range
            p = cls.range(
                col.name,
                value(r.lower, "lower bound") if r.HasField("lower") else None,
                value(r.upper, "upper bound") if r.HasField("upper") else None,
                lower_inclusive=r.lower_inclusive,
                upper_inclusive=r.upper_inclusive,
            )
        elif which == "is_null":
            p = cls.is_null(col.name)
        elif which == "is_not_null":
            p = cls.is_not_null(col.name)
        else:
            raise PredicateError(f"predicate on {col.name!r}: no predicate kind set")
        return p.validate(schema)
