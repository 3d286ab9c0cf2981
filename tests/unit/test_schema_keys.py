"""Primary-key encoding: order-preserving, round-tripping, strict on decode."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlet.schema.keys import KeyDecodeError, KeyEncodeError, decode_key, encode_key
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType, Value
from tests.unit.schema_strategies import ALL_TYPES, key_schemas, keys_of, values_of


def single(dtype: DataType) -> Schema:
    return Schema([ColumnSchema("k", dtype, is_key=True)])


def pair(first: DataType, second: DataType) -> Schema:
    return Schema([ColumnSchema("a", first, is_key=True), ColumnSchema("b", second, is_key=True)])


def _cmp(a: Any, b: Any) -> int:
    return int(a > b) - int(a < b)


@given(st.data())
def test_every_type_alone_and_not_last_is_order_preserving_and_round_trips(
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(ALL_TYPES))
    a, b = data.draw(values_of(dtype)), data.draw(values_of(dtype))
    # Alone, the column is last (raw bytes); followed by another column it is escaped.
    for schema, ka, kb in [
        (single(dtype), (a,), (b,)),
        (pair(dtype, DataType.INT8), (a, 0), (b, 0)),
        (pair(dtype, DataType.STRING), (a, ""), (b, "\x00")),
    ]:
        ea, eb = encode_key(schema, ka), encode_key(schema, kb)
        assert _cmp(ea, eb) == _cmp(ka, kb)
        assert decode_key(schema, ea) == ka
        assert decode_key(schema, eb) == kb


@given(st.data())
def test_composite_keys_are_order_preserving_and_round_trip(data: st.DataObject) -> None:
    schema = data.draw(key_schemas())
    k1, k2 = data.draw(keys_of(schema)), data.draw(keys_of(schema))
    e1, e2 = encode_key(schema, k1), encode_key(schema, k2)
    assert _cmp(e1, e2) == _cmp(k1, k2)
    back = decode_key(schema, e1)
    assert back == k1
    assert [type(v) for v in back] == [type(v) for v in k1]


@given(st.data())
def test_sorting_by_encoding_equals_sorting_by_value(data: st.DataObject) -> None:
    schema = data.draw(key_schemas())
    keys = data.draw(st.lists(keys_of(schema), max_size=20))
    assert sorted(keys, key=lambda k: encode_key(schema, k)) == sorted(keys)


def test_prefix_strings_sort_before_longer_ones_in_any_position() -> None:
    s = pair(DataType.BINARY, DataType.INT8)
    ordered = [(b"", 127), (b"\x00", -128), (b"\x00\x00", 0), (b"\x00\x01", 0), (b"\x01", 0)]
    encoded = [encode_key(s, k) for k in ordered]
    assert encoded == sorted(encoded)
    assert len(set(encoded)) == len(encoded)


def test_float_keys_order_including_infinities_and_zero() -> None:
    for dtype in (DataType.FLOAT, DataType.DOUBLE):
        s = single(dtype)
        vals = [-math.inf, -1e30, -1.5, -1e-30, 0.0, 1e-30, 1.5, 1e30, math.inf]
        keys = [encode_key(s, (v,)) for v in vals]
        assert keys == sorted(keys)
        # -0.0 is 0.0 (as in SQLite): same key, same partition.
        assert encode_key(s, (-0.0,)) == encode_key(s, (0.0,))


def test_golden_encodings() -> None:
    # Resume keys and partitions depend on these bytes; changing them is a format change.
    s = Schema(
        [
            ColumnSchema("tenant", DataType.STRING, is_key=True),
            ColumnSchema("ts", DataType.UNIXTIME_MICROS, is_key=True),
        ]
    )
    assert encode_key(s, ("acme", 1700000000000000)).hex() == "61636d65000080060a24181e4000"
    assert encode_key(s, ("日本\x00", -5)).hex() == "e697a5e69cac000100007ffffffffffffffb"
    assert encode_key(single(DataType.INT64), (-1,)).hex() == "7fffffffffffffff"
    assert encode_key(single(DataType.INT8), (-128,)).hex() == "00"
    assert encode_key(single(DataType.INT16), (1,)).hex() == "8001"
    assert encode_key(single(DataType.BOOL), (True,)).hex() == "01"
    assert encode_key(single(DataType.DOUBLE), (1.0,)).hex() == "bff0000000000000"
    assert encode_key(single(DataType.FLOAT), (-1.0,)).hex() == "407fffff"
    assert encode_key(pair(DataType.BINARY, DataType.INT8), (b"\x00\x01", -128)).hex() == (
        "000101000000"
    )


@pytest.mark.parametrize(
    ("schema", "values", "message"),
    [
        (single(DataType.INT64), (), "a key has 1 columns, got 0 values"),
        (single(DataType.INT64), (1, 2), "got 2 values"),
        (single(DataType.INT64), (None,), "'k' cannot be null"),
        (single(DataType.INT8), (300,), "'k': 300 is out of range for INT8"),
        (single(DataType.STRING), (b"x",), "'k': STRING needs a str"),
        (single(DataType.DOUBLE), (math.nan,), "NaN"),
    ],
)
def test_encode_rejects_non_keys(schema: Schema, values: tuple[Value, ...], message: str) -> None:
    with pytest.raises(KeyEncodeError, match=message):
        encode_key(schema, values)


@pytest.mark.parametrize(
    ("schema", "data", "message"),
    [
        (single(DataType.INT64), b"\x80\x00", "truncated"),
        (single(DataType.INT64), bytes(9), "1 trailing bytes"),
        (single(DataType.BOOL), b"\x02", "bad BOOL byte"),
        (pair(DataType.STRING, DataType.INT8), b"abc", "unterminated"),
        (pair(DataType.STRING, DataType.INT8), b"a\x00\x05\x00\x00\x80", "bad escape"),
        (single(DataType.STRING), b"\xff\xfe", "not valid UTF-8"),
        (single(DataType.DOUBLE), b"\x7f\xff\xff\xff\xff\xff\xff\xff", "non-canonical"),
        (single(DataType.DOUBLE), b"\xff\xf8\x00\x00\x00\x00\x00\x00", "NaN"),
    ],
)
def test_decode_rejects_what_encode_never_makes(schema: Schema, data: bytes, message: str) -> None:
    with pytest.raises(KeyDecodeError, match=message):
        decode_key(schema, data)


@given(st.data())
def test_decode_of_arbitrary_bytes_never_crashes(data: st.DataObject) -> None:
    schema = data.draw(key_schemas())
    raw = data.draw(st.binary(max_size=40))
    try:
        key = decode_key(schema, raw)
    except KeyDecodeError:
        return
    # Whatever decodes must be canonical: it re-encodes to the same bytes.
    assert encode_key(schema, key) == raw
