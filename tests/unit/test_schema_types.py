"""Column types: what fits, what does not, and the ValuePB round trip."""

from __future__ import annotations

import datetime as dt
import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlet.proto import tablet_pb2
from raftlet.schema.types import (
    INTEGER_RANGES,
    DataType,
    TypeMismatch,
    datetime_from_micros,
    micros_from_datetime,
    normalize,
    value_from_pb,
    value_to_pb,
)
from tests.unit.schema_strategies import ALL_TYPES, values_of


def test_datatype_numbers_match_the_proto_enum() -> None:
    for t in DataType:
        assert tablet_pb2.DataType.Name(int(t)) == t.name


@pytest.mark.parametrize("dtype", ALL_TYPES, ids=lambda t: t.name)
def test_null_round_trips_for_every_type(dtype: DataType) -> None:
    pb = value_to_pb(dtype, None)
    assert pb.WhichOneof("value") == "null_value"
    assert value_from_pb(dtype, pb) is None


@given(st.data())
def test_every_type_round_trips_through_valuepb(data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from(ALL_TYPES))
    value = data.draw(values_of(dtype))
    wire = value_to_pb(dtype, value).SerializeToString()
    back = value_from_pb(dtype, tablet_pb2.ValuePB.FromString(wire))
    assert back == value
    assert type(back) is type(value)


@pytest.mark.parametrize(("dtype", "bounds"), list(INTEGER_RANGES.items()), ids=lambda x: str(x))
def test_integer_ranges_are_inclusive_and_checked(dtype: DataType, bounds: tuple[int, int]) -> None:
    lo, hi = bounds
    for v in (lo, hi):
        assert value_from_pb(dtype, value_to_pb(dtype, v)) == v
    for v in (lo - 1, hi + 1):
        with pytest.raises(TypeMismatch, match="out of range"):
            normalize(dtype, v)


def test_small_int_out_of_range_on_the_wire_is_a_mismatch() -> None:
    pb = tablet_pb2.ValuePB(int_value=128)
    with pytest.raises(TypeMismatch, match=r"out of range for INT8"):
        value_from_pb(DataType.INT8, pb)
    assert value_from_pb(DataType.INT16, pb) == 128


def test_bool_is_not_an_int_and_int_is_not_a_bool() -> None:
    with pytest.raises(TypeMismatch, match="INT32 needs an int, got bool"):
        normalize(DataType.INT32, True)
    with pytest.raises(TypeMismatch, match="BOOL needs a bool, got int"):
        normalize(DataType.BOOL, 1)
    with pytest.raises(TypeMismatch, match="DOUBLE needs a float, got bool"):
        normalize(DataType.DOUBLE, False)


def test_float_rounds_to_float32() -> None:
    v = normalize(DataType.FLOAT, 0.1)
    assert v == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert v != 0.1
    assert normalize(DataType.DOUBLE, 0.1) == 0.1
    # The wire carries float32 for FLOAT; the value must survive it unchanged.
    pb = tablet_pb2.ValuePB.FromString(value_to_pb(DataType.FLOAT, 0.1).SerializeToString())
    assert value_from_pb(DataType.FLOAT, pb) == v


def test_float_range_and_specials() -> None:
    with pytest.raises(TypeMismatch, match="out of range for FLOAT"):
        normalize(DataType.FLOAT, 1e39)
    assert normalize(DataType.FLOAT, math.inf) == math.inf
    assert normalize(DataType.DOUBLE, -math.inf) == -math.inf
    assert normalize(DataType.DOUBLE, 3) == 3.0
    assert isinstance(normalize(DataType.DOUBLE, 3), float)
    with pytest.raises(TypeMismatch, match="out of range for DOUBLE"):
        normalize(DataType.DOUBLE, 10**400)


@pytest.mark.parametrize("dtype", [DataType.INT64, DataType.INT8, DataType.DOUBLE])
def test_an_int_too_long_to_print_is_a_type_mismatch(dtype: DataType) -> None:
    # Python will not print an int of over 4,300 digits: the error's own message raised
    # a ValueError that was no TypeMismatch (so no RowError to the client's caller).
    for value in (10**5000, -(10**5000)):
        with pytest.raises(
            TypeMismatch, match=f"integer of about 5001 digits is out of range for {dtype.name}"
        ):
            normalize(dtype, value)


@pytest.mark.parametrize("dtype", [DataType.FLOAT, DataType.DOUBLE])
def test_nan_is_rejected_because_sqlite_would_store_null(dtype: DataType) -> None:
    with pytest.raises(TypeMismatch, match="NaN"):
        normalize(dtype, math.nan)
    pb = tablet_pb2.ValuePB()
    setattr(pb, "float_value" if dtype is DataType.FLOAT else "double_value", math.nan)
    with pytest.raises(TypeMismatch, match="NaN"):
        value_from_pb(dtype, pb)


@pytest.mark.parametrize("dtype", [DataType.FLOAT, DataType.DOUBLE])
def test_negative_zero_becomes_zero(dtype: DataType) -> None:
    v = normalize(dtype, -0.0)
    assert v == 0.0
    assert isinstance(v, float)
    assert math.copysign(1.0, v) == 1.0


def test_strings_are_unicode_and_must_encode_as_utf8() -> None:
    s = "naïve / 日本語 / 🦀 / \x00 inside"
    assert value_from_pb(DataType.STRING, value_to_pb(DataType.STRING, s)) == s
    with pytest.raises(TypeMismatch, match="UTF-8"):
        normalize(DataType.STRING, "lone \udc80 surrogate")
    with pytest.raises(TypeMismatch, match="STRING needs a str, got bytes"):
        normalize(DataType.STRING, b"bytes")


def test_binary_keeps_every_byte() -> None:
    b = bytes(range(256)) + b"\x00\x00"
    assert value_from_pb(DataType.BINARY, value_to_pb(DataType.BINARY, b)) == b
    assert normalize(DataType.BINARY, bytearray(b"\x00a")) == b"\x00a"
    assert normalize(DataType.BINARY, memoryview(b"xy")) == b"xy"
    with pytest.raises(TypeMismatch, match="BINARY needs bytes, got str"):
        normalize(DataType.BINARY, "text")


def test_timestamps() -> None:
    t = dt.datetime(2024, 2, 29, 12, 30, 15, 123456, tzinfo=dt.UTC)
    micros = micros_from_datetime(t)
    assert micros == 1709209815123456
    assert normalize(DataType.UNIXTIME_MICROS, t) == micros
    assert datetime_from_micros(micros) == t
    before_epoch = dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)
    assert micros_from_datetime(before_epoch) == -1
    other_zone = t.astimezone(dt.timezone(dt.timedelta(hours=5, minutes=30)))
    assert micros_from_datetime(other_zone) == micros
    with pytest.raises(TypeMismatch, match="naive"):
        normalize(DataType.UNIXTIME_MICROS, dt.datetime(2024, 1, 1))
    lo, hi = INTEGER_RANGES[DataType.UNIXTIME_MICROS]
    assert value_from_pb(DataType.UNIXTIME_MICROS, value_to_pb(DataType.UNIXTIME_MICROS, lo)) == lo
    assert value_from_pb(DataType.UNIXTIME_MICROS, value_to_pb(DataType.UNIXTIME_MICROS, hi)) == hi


@pytest.mark.parametrize(
    ("dtype", "pb", "message"),
    [
        (DataType.INT64, tablet_pb2.ValuePB(), "no value given"),
        (DataType.INT64, tablet_pb2.ValuePB(string_value="1"), "int_value, got string_value"),
        (DataType.FLOAT, tablet_pb2.ValuePB(double_value=1.0), "float_value, got double_value"),
        (DataType.DOUBLE, tablet_pb2.ValuePB(float_value=1.0), "double_value, got float_value"),
        (DataType.STRING, tablet_pb2.ValuePB(binary_value=b"x"), "string_value, got binary_value"),
        (DataType.BINARY, tablet_pb2.ValuePB(string_value="x"), "binary_value, got string_value"),
        (DataType.BOOL, tablet_pb2.ValuePB(int_value=1), "bool_value, got int_value"),
    ],
)
def test_wrong_valuepb_member_is_a_mismatch(
    dtype: DataType, pb: tablet_pb2.ValuePB, message: str
) -> None:
    with pytest.raises(TypeMismatch, match=message):
        value_from_pb(dtype, pb)
