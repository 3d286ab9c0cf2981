"""What one scan request may ask for: the bounds client and server both check.

A scan's predicates are ANDed into one SQL statement, whose expression depth SQLite caps at
1000 and whose parameters (one per bound or IN-list value) it caps at 32766 in a default
build; past either the statement fails to prepare. The bounds below stay well inside both, so
a request within them always runs and one beyond them is refused with what is wrong, before
any value is decoded. The row limit is a count of rows: one past ``MAX_SCAN_LIMIT`` is more
rows than any tablet could hold, so it says nothing but overflows SQLite's 64-bit integers
(0 means no limit).
"""

from __future__ import annotations

from collections.abc import Sequence

from raftlet.proto import tablet_pb2

__all__ = [
    "MAX_PREDICATES",
    "MAX_PREDICATE_VALUES",
    "MAX_SCAN_LIMIT",
    "predicate_values",
    "scan_bounds_error",
]

MAX_PREDICATES = 256
# Bounds and IN-list values of all the predicates of one scan together.
MAX_PREDICATE_VALUES = 20_000
MAX_SCAN_LIMIT = 2**53


def predicate_values(p: tablet_pb2.PredicatePB) -> int:
    """How many values (SQL parameters) ``p`` carries."""
    kind = p.WhichOneof("kind")
    if kind == "in_list":
        return len(p.in_list.values)
    if kind == "range":
        return int(p.range.HasField("lower")) + int(p.range.HasField("upper"))
    return 1 if kind == "equals" else 0


def scan_bounds_error(predicates: Sequence[tablet_pb2.PredicatePB], limit: int) -> str | None:
    """What is wrong with a scan of ``predicates`` and a row ``limit`` (0: none), or None if
    it is within the bounds. Counts only: the values themselves are not decoded."""
    if len(predicates) > MAX_PREDICATES:
        return f"{len(predicates)} predicates: a scan takes at most {MAX_PREDICATES}"
    values = sum(map(predicate_values, predicates))
    if values > MAX_PREDICATE_VALUES:
        return (
            f"the predicates carry {values} values: a scan takes at most "
            f"{MAX_PREDICATE_VALUES} in all"
        )
    if not 0 <= limit <= MAX_SCAN_LIMIT:
        return f"limit {limit} is out of range: 0 (no limit) to {MAX_SCAN_LIMIT} rows"
    return None
