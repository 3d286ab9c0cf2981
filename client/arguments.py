"""Checks of the arguments an application passes, made before any call: a wrong one is an
``InvalidArgument`` naming it, never an ``AttributeError`` from deep inside, an overflow in
a clock, or a wait that never ends (a ``nan`` timeout compares false with everything)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from raftlet.client.errors import InvalidArgument
from raftlet.schema.rows import OpType

__all__ = ["MAX_TIMEOUT_S", "check_timeout", "op_type_of", "row_of"]

# The longest timeout taken: far past any operation, and well inside what the clocks and
# waits it ends up in accept (1e300 s overflows them).
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def check_timeout(value: object, name: str = "timeout_s") -> float:
    """``value`` as seconds, if it is a number in (0, ``MAX_TIMEOUT_S``]."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or math.isnan(value)
        or not 0 < value <= MAX_TIMEOUT_S
    ):
        raise InvalidArgument(
            f"{name} must be positive seconds, at most {MAX_TIMEOUT_S:g} (a week), got {value!r}"
        )
    return float(value)


def op_type_of(value: object) -> OpType:
    """``value`` as an ``OpType`` (or its number)."""
    if type(value) is OpType:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value in set(OpType):
        return OpType(value)
    names = ", ".join(f"OpType.{t.name}" for t in OpType)
    raise InvalidArgument(f"{value!r} is not an operation type ({names})")


def row_of(value: object) -> dict[str, object]:
    """A copy of the row ``value`` (the caller may reuse its dict; errors report what was
    written), if it is a mapping of column name to value."""
    if not isinstance(value, Mapping):
        raise InvalidArgument(
            f"a row is a mapping of column name to value, e.g. {{'id': 1}}; "
            f"got {type(value).__name__} {value!r:.60}"
        )
    return dict(value)
