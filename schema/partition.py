"""Hash partitioning of a table's rows into tablets by primary key.

The client routes a row to a tablet with this function and the server checks (and places
tablets) with the same one, so the hash must be identical across processes, runs, machines
and Python versions: CRC-32 (zlib, IEEE polynomial) of the memcomparable key encoding.
Python's ``hash()`` is salted per process and would scatter a key differently each run.

Changing anything here re-homes existing rows; ``tests/unit/test_schema_partition.py`` pins
golden values so such a change cannot go unnoticed.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from operator import itemgetter

from raftlet.schema.keys import KeyEncodeError, encode_key
from raftlet.schema.predicates import Predicate, PredicateError, PredicateKind
from raftlet.schema.schema import Schema
from raftlet.schema.types import INTEGER_RANGES, Value

__all__ = [
    "KeyRouter",
    "key_partitions",
    "key_router",
    "partition_for_encoded_key",
    "partition_for_key",
    "partitions_for_predicates",
]

# More key combinations than this from IN-lists: not worth pruning, scan every tablet.
_MAX_PRUNED_KEYS = 1024

# row (column name -> value) -> (partition, encoded key); raises KeyEncodeError.
KeyRouter = Callable[[Mapping[str, object]], tuple[int, bytes]]


def partition_for_encoded_key(encoded_key: bytes, num_partitions: int) -> int:
    """The partition (0-based) of an already encoded key."""
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int):
        raise TypeError(f"num_partitions must be an int, got {type(num_partitions).__name__}")
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
    return zlib.crc32(encoded_key) % num_partitions


def partition_for_key(schema: Schema, key_values: Sequence[object], num_partitions: int) -> int:
    """The partition (0-based, < num_partitions) of the row with these key values.

    Raises ``KeyEncodeError`` if the values are not a key of the schema.
    """
    if type(num_partitions) is not int or num_partitions < 1:
        return partition_for_encoded_key(b"", num_partitions)  # raises the error it is
    return zlib.crc32(encode_key(schema, key_values)) % num_partitions


def key_partitions(
    schema: Schema, rows: Sequence[Sequence[object]], num_partitions: int
) -> list[int]:
    """The partition of each row, given as its key column values in key order, possibly
    followed by other values (a ``RowRun``'s params): what ``partition_for_key`` gives each
    key, computed for a whole write at once -- the server checks every row of every write
    against the tablet it was sent to. Raises ``KeyEncodeError`` for a key that is not one
    of the schema."""
    partition_for_encoded_key(b"", num_partitions)  # a bad count fails here, once
    crc32 = zlib.crc32
    nkeys = schema.num_key_columns
    first = schema.key_columns[0]
    if nkeys == 1 and first.type in INTEGER_RANGES and rows:
        # The usual key, one integer, encoded here as ``encode_key`` would (as in
        # ``key_router``): a quarter of the cost of calling it per row (~0.15 us a row).
        lo, hi = INTEGER_RANGES[first.type]
        width = (hi.bit_length() + 1) // 8
        try:
            values = list(map(itemgetter(0), rows))
        except IndexError:  # an empty row: the general encoder says what is wrong
            values = []
        if set(map(type, values)) == {int} and lo <= min(values) and max(values) <= hi:
            return [crc32((v - lo).to_bytes(width, "big")) % num_partitions for v in values]
    return [crc32(encode_key(schema, row[:nkeys])) % num_partitions for row in rows]


@lru_cache(maxsize=256)
def key_router(schema: Schema, num_partitions: int) -> KeyRouter:
    """A function from a row to its partition and encoded key, for a client routing every
    row it writes: the same answer as ``encode_key`` and ``partition_for_encoded_key``, with
    the common one-integer key taken without the general encoder. Raises
    ``KeyEncodeError`` for a row whose key is missing or invalid."""
    partition_for_encoded_key(b"", num_partitions)  # a bad count fails here, once
    names = [c.name for c in schema.key_columns]
    crc32 = zlib.crc32

    def general(row: Mapping[str, object]) -> tuple[int, bytes]:
        try:
            values = [row[name] for name in names]
        except KeyError as e:
            raise KeyEncodeError(f"key column {e.args[0]!r} not given") from None
        encoded = encode_key(schema, values)
        return crc32(encoded) % num_partitions, encoded

    key = schema.key_columns[0]
    if len(names) != 1 or key.type not in INTEGER_RANGES:
        return general
    name = key.name
    lo, hi = INTEGER_RANGES[key.type]
    width = (hi.bit_length() + 1) // 8

    def one_integer(row: Mapping[str, object]) -> tuple[int, bytes]:
        value = row.get(name)
        if type(value) is not int or not lo <= value <= hi:
            return general(row)
        encoded = (value - lo).to_bytes(width, "big")
        return crc32(encoded) % num_partitions, encoded

    return one_integer


def partitions_for_predicates(
    schema: Schema, predicates: Sequence[Predicate], num_partitions: int
) -> list[int] | None:
    """The partitions that can hold rows matching all of ``predicates`` (ANDed), sorted, when
    they fix every key column to one value (EQUALS) or a few (IN_LIST); None when they do
    not (every partition must be scanned). An empty list: no key can match (two EQUALS of
    one key column disagree). Predicates that do not validate leave it to the server to
    say so: None."""
    choices: dict[str, set[Value]] = {}
    for raw in predicates:
        try:
            p = raw.validate(schema)
        except PredicateError:
            return None
        if not schema.has_column(p.column) or not schema.column(p.column).is_key:
            continue
        if p.kind is PredicateKind.EQUALS or p.kind is PredicateKind.IN_LIST:
            fixed = set(p.values)
            choices[p.column] = choices[p.column] & fixed if p.column in choices else fixed
    names = [c.name for c in schema.key_columns]
    if any(name not in choices for name in names):
        return None
    combos = 1
    for name in names:
        combos *= len(choices[name])
    if combos > _MAX_PRUNED_KEYS:
        return None
    route = key_router(schema, num_partitions)
    found: set[int] = set()
    for key in itertools.product(*(sorted(choices[n], key=repr) for n in names)):
        try:
            found.add(route(dict(zip(names, key, strict=True)))[0])
        except KeyEncodeError:
            return None
    return sorted(found)
