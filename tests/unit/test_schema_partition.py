"""Hash partitioning: deterministic, in range, and pinned by golden values."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlet.schema.keys import KeyEncodeError, encode_key
from raftlet.schema.partition import (
    key_partitions,
    key_router,
    partition_for_encoded_key,
    partition_for_key,
    partitions_for_predicates,
)
from raftlet.schema.predicates import Predicate
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType, Value
from tests.unit.schema_strategies import key_schemas, keys_of

ID = Schema([ColumnSchema("id", DataType.INT64, is_key=True)])
TS = Schema(
    [
        ColumnSchema("tenant", DataType.STRING, is_key=True),
        ColumnSchema("ts", DataType.UNIXTIME_MICROS, is_key=True),
        ColumnSchema("v", DataType.DOUBLE, nullable=True),
    ]
)
BIN = Schema(
    [ColumnSchema("b", DataType.BINARY, is_key=True), ColumnSchema("i", DataType.INT8, is_key=True)]
)
COUNTS = (1, 2, 3, 7, 16, 1000)

# If this table changes, every existing row of every table moves to another tablet. Do not
# "fix" the numbers: fix the code.
GOLDEN: list[tuple[Schema, tuple[Value, ...], list[int]]] = [
    (ID, (0,), [0, 1, 0, 6, 3, 283]),
    (ID, (1,), [0, 1, 1, 5, 5, 293]),
    (ID, (-1,), [0, 0, 1, 2, 6, 934]),
    (ID, (2**63 - 1,), [0, 0, 1, 4, 12, 692]),
    (ID, (123456789,), [0, 1, 0, 1, 3, 27]),
    (TS, ("acme", 1700000000000000), [0, 1, 2, 6, 9, 649]),
    (TS, ("", 0), [0, 0, 0, 5, 12, 732]),
    (TS, ("日本\x00", -5), [0, 0, 0, 1, 14, 222]),
    (BIN, (b"\x00\x01", -128), [0, 0, 1, 3, 6, 614]),
]


@pytest.mark.parametrize(("schema", "key", "expected"), GOLDEN)
def test_golden_partitions(schema: Schema, key: tuple[Value, ...], expected: list[int]) -> None:
    assert [partition_for_key(schema, key, n) for n in COUNTS] == expected


def test_partitions_do_not_depend_on_the_process() -> None:
    # hash() is salted per process; a fresh interpreter with another PYTHONHASHSEED must agree.
    code = (
        "from tests.unit.test_schema_partition import GOLDEN, COUNTS\n"
        "from raftlet.schema.partition import partition_for_key\n"
        "print([[partition_for_key(s, k, n) for n in COUNTS] for s, k, _ in GOLDEN])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        cwd=Path(__file__).resolve().parents[2],
    ).stdout
    assert out.strip() == str([g[2] for g in GOLDEN])


@given(st.data())
def test_partition_is_in_range_and_a_function_of_the_encoded_key(data: st.DataObject) -> None:
    schema = data.draw(key_schemas())
    key = data.draw(keys_of(schema))
    n = data.draw(st.integers(1, 10_000))
    p = partition_for_key(schema, key, n)
    assert 0 <= p < n
    assert p == partition_for_encoded_key(encode_key(schema, key), n)
    assert p == partition_for_key(schema, list(key), n)


def test_keys_spread_over_partitions() -> None:
    counts = [0] * 8
    for i in range(8000):
        counts[partition_for_key(ID, (i,), 8)] += 1
    assert min(counts) > 800, counts


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        partition_for_key(ID, (1,), 0)
    with pytest.raises(TypeError, match="must be an int"):
        partition_for_key(ID, (1,), 2.0)  # type: ignore[arg-type]
    with pytest.raises(KeyEncodeError):
        partition_for_key(ID, ("x",), 2)


@given(st.data(), st.integers(1, 64))
def test_a_key_router_agrees_with_encode_key_and_partition_for_key(
    data: st.DataObject, partitions: int
) -> None:
    schema = data.draw(key_schemas())
    key = data.draw(keys_of(schema))
    row = dict(zip((c.name for c in schema.key_columns), key, strict=True))
    assert key_router(schema, partitions)(row) == (
        partition_for_key(schema, key, partitions),
        encode_key(schema, key),
    )


@given(st.data(), st.integers(1, 64))
def test_key_partitions_of_a_write_agree_with_partition_for_key(
    data: st.DataObject, partitions: int
) -> None:
    """What the server checks a write's rows with: one partition per row, the key first in
    each row and other values after it (a decoded run's params)."""
    schema = data.draw(key_schemas())
    keys = data.draw(st.lists(keys_of(schema), max_size=20))
    rows = [(*key, "other", 7) for key in keys]
    expected = [partition_for_key(schema, key, partitions) for key in keys]
    assert key_partitions(schema, rows, partitions) == expected
    assert key_partitions(schema, keys, partitions) == expected


@pytest.mark.parametrize("bad", [(True,), (2**63,), ("7",), (None,), ()])
def test_key_partitions_refuse_what_encode_key_refuses(bad: tuple[object, ...]) -> None:
    # One bad key among good ones leaves the one-integer fast path for the general one.
    with pytest.raises(KeyEncodeError):
        key_partitions(ID, [(1,), bad, (2,)], 4)
    assert key_partitions(ID, [(1,), (2,)], 4) == [partition_for_key(ID, [k], 4) for k in (1, 2)]
    with pytest.raises(ValueError, match="at least 1"):
        key_partitions(ID, [(1,)], 0)


@pytest.mark.parametrize(
    "row", [{}, {"id": None}, {"id": True}, {"id": 2**63}, {"id": "7"}, {"x": 1}]
)
def test_a_key_router_refuses_what_encode_key_refuses(row: dict[str, object]) -> None:
    with pytest.raises(KeyEncodeError):
        key_router(ID, 4)(row)
    assert key_router(ID, 4)({"id": 7}) == (
        partition_for_key(ID, [7], 4),
        encode_key(ID, [7]),
    )


@given(st.data(), st.integers(1, 16))
def test_equality_on_the_whole_key_prunes_to_the_keys_partition(
    data: st.DataObject, partitions: int
) -> None:
    schema = data.draw(key_schemas())
    key = data.draw(keys_of(schema))
    preds = [Predicate.equals(c.name, v) for c, v in zip(schema.key_columns, key, strict=True)]
    preds.append(Predicate.is_null("val"))  # a non-key predicate changes nothing
    assert partitions_for_predicates(schema, preds, partitions) == [
        partition_for_key(schema, key, partitions)
    ]
    # Without one of the key columns fixed, every partition must be scanned.
    assert partitions_for_predicates(schema, preds[1:], partitions) is None


def test_in_lists_prune_to_their_keys_partitions_and_contradictions_to_none() -> None:
    keys = [1, 5, 9, 12]
    expected = sorted({partition_for_key(ID, [k], 8) for k in keys})
    assert partitions_for_predicates(ID, [Predicate.in_list("id", keys)], 8) == expected
    both = [Predicate.in_list("id", keys), Predicate.equals("id", 5)]
    assert partitions_for_predicates(ID, both, 8) == [partition_for_key(ID, [5], 8)]
    clash = [Predicate.equals("id", 5), Predicate.equals("id", 6)]
    assert partitions_for_predicates(ID, clash, 8) == []
    assert partitions_for_predicates(ID, [Predicate.range("id", 1, 5)], 8) is None
    assert partitions_for_predicates(ID, [Predicate.equals("id", "x")], 8) is None  # invalid
    assert partitions_for_predicates(ID, [Predicate.in_list("id", range(5000))], 8) is None
