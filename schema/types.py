"""Column types and the conversion of cell values between Python and ``ValuePB``.

A Python value of a column is one of: ``int`` (INT8..INT64, UNIXTIME_MICROS), ``float``
(FLOAT, DOUBLE), ``bool``, ``str``, ``bytes``, or ``None`` for SQL NULL. ``normalize`` is the
one place that decides whether a value fits a type; everything else (``ValuePB`` encoding, key
encoding, predicates, the store) goes through it, so client and server agree on what a value
is before it is hashed to a partition or compared in a store.

Two float rules come from the row store (SQLite) rather than from IEEE 754:

- NaN is rejected: SQLite silently stores a NaN as NULL, which would turn a write into a
  different write.
- -0.0 is stored as 0.0: SQLite compares them equal and does not keep the sign, so the key
  encoding (and so the partition) must not tell them apart either.
"""

from __future__ import annotations

import datetime as _dt
import enum
import math
import struct
from typing import TypeAlias

from raftlet.proto import tablet_pb2

__all__ = [
    "INTEGER_RANGES",
    "DataType",
    "TypeMismatch",
    "Value",
    "datetime_from_micros",
    "micros_from_datetime",
    "normalize",
    "value_from_pb",
    "value_to_pb",
]

# What a cell holds in Python. None is SQL NULL.
Value: TypeAlias = int | float | bool | str | bytes | None


class DataType(enum.IntEnum):
    """Column types; the numbers are those of ``tablet_pb2.DataType`` so a cast converts."""

    INT8 = tablet_pb2.INT8
    INT16 = tablet_pb2.INT16
    INT32 = tablet_pb2.INT32
    INT64 = tablet_pb2.INT64
    FLOAT = tablet_pb2.FLOAT
    DOUBLE = tablet_pb2.DOUBLE
    BOOL = tablet_pb2.BOOL
    STRING = tablet_pb2.STRING
    BINARY = tablet_pb2.BINARY
    # Microseconds since the Unix epoch, UTC, as a signed 64-bit integer.
    UNIXTIME_MICROS = tablet_pb2.UNIXTIME_MICROS

    @property
    def is_integer(self) -> bool:
        return self in INTEGER_RANGES


INTEGER_RANGES: dict[DataType, tuple[int, int]] = {
    DataType.INT8: (-(2**7), 2**7 - 1),
    DataType.INT16: (-(2**15), 2**15 - 1),
    DataType.INT32: (-(2**31), 2**31 - 1),
    DataType.INT64: (-(2**63), 2**63 - 1),
    DataType.UNIXTIME_MICROS: (-(2**63), 2**63 - 1),
}

# The ValuePB oneof member each type travels in.
_PB_MEMBER: dict[DataType, str] = {
    **dict.fromkeys(INTEGER_RANGES, "int_value"),
    DataType.FLOAT: "float_value",
    DataType.DOUBLE: "double_value",
    DataType.BOOL: "bool_value",
    DataType.STRING: "string_value",
    DataType.BINARY: "binary_value",
}

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_ONE_MICRO = _dt.timedelta(microseconds=1)


class TypeMismatch(ValueError):
    """A value does not fit a column type (wrong kind, or out of the type's range)."""


def micros_from_datetime(value: _dt.datetime) -> int:
    """Microseconds since the epoch of a timezone-aware datetime (exact, no float rounding)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise TypeMismatch("a naive datetime has no defined instant; give it a tzinfo")
    return (value - _EPOCH) // _ONE_MICRO


def datetime_from_micros(micros: int) -> _dt.datetime:
    """The UTC datetime of a UNIXTIME_MICROS value (OverflowError outside datetime's years)."""
    return _EPOCH + _dt.timedelta(microseconds=micros)


def _float32(value: float) -> float:
    try:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError:
        raise TypeMismatch(f"{value!r} is out of range for FLOAT") from None


def _int_text(value: float) -> str:
    """``value`` for an error message -- an int of thousands of digits as its size: Python
    refuses to print it at all (``sys.set_int_max_str_digits``), which turned the error into
    a ValueError of its own."""
    if isinstance(value, int) and value.bit_length() > 200:
        sign = "a negative" if value < 0 else "an"
        return f"{sign} integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return str(value)


def normalize(dtype: DataType, value: object) -> Value:
    """The canonical Python value of ``value`` in a column of type ``dtype``.

    None passes through (nullability is the column's business, not the type's). Ints are
    range-checked; FLOAT rounds to the nearest float32; an aware ``datetime`` is accepted for
    UNIXTIME_MICROS; ``bytearray``/``memoryview`` become ``bytes``. Raises ``TypeMismatch``.
    """
    if value is None:
        return None
    if dtype in INTEGER_RANGES:
        if dtype is DataType.UNIXTIME_MICROS and isinstance(value, _dt.datetime):
            value = micros_from_datetime(value)
        # bool is an int subclass; a True in an INT column is almost surely a bug.
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeMismatch(f"{dtype.name} needs an int, got {type(value).__name__}")
        lo, hi = INTEGER_RANGES[dtype]
        if not lo <= value <= hi:
            raise TypeMismatch(f"{_int_text(value)} is out of range for {dtype.name} [{lo}, {hi}]")
        return int(value)
    if dtype is DataType.FLOAT or dtype is DataType.DOUBLE:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise TypeMismatch(f"{dtype.name} needs a float, got {type(value).__name__}")
        try:
            f = float(value)
        except OverflowError:
            raise TypeMismatch(f"{_int_text(value)} is out of range for {dtype.name}") from None
        if math.isnan(f):
            raise TypeMismatch(f"NaN is not supported in {dtype.name} (SQLite stores it as NULL)")
        if dtype is DataType.FLOAT:
            f = _float32(f)
        return f + 0.0  # -0.0 + 0.0 == +0.0: see the module docstring
    if dtype is DataType.BOOL:
        if not isinstance(value, bool):
            raise TypeMismatch(f"BOOL needs a bool, got {type(value).__name__}")
        return value
    if dtype is DataType.STRING:
        if not isinstance(value, str):
            raise TypeMismatch(f"STRING needs a str, got {type(value).__name__}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TypeMismatch(f"STRING is not valid UTF-8: {e.reason}") from None
        return value
    if dtype is DataType.BINARY:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeMismatch(f"BINARY needs bytes, got {type(value).__name__}")
        return bytes(value)
    raise TypeMismatch(f"unknown data type {dtype!r}")


def value_to_pb(
    dtype: DataType, value: object, out: tablet_pb2.ValuePB | None = None
) -> tablet_pb2.ValuePB:
    """Encode ``value`` (normalized first) into ``out`` or a new ``ValuePB``; None → null."""
    pb = tablet_pb2.ValuePB() if out is None else out
    v = normalize(dtype, value)
    if v is None:
        pb.null_value = True
    else:
        setattr(pb, _PB_MEMBER[dtype], v)
    return pb


def value_from_pb(dtype: DataType, pb: tablet_pb2.ValuePB) -> Value:
    """Decode a ``ValuePB`` of a column of type ``dtype``; a null is None.

    Raises ``TypeMismatch`` when no member is set, when the member does not match the type
    (no silent widening: a DOUBLE sent for a FLOAT column is a client bug), or when the value
    is out of the type's range.
    """
    member = pb.WhichOneof("value")
    if member is None:
        raise TypeMismatch("no value given")
    if member == "null_value":
        return None
    expected = _PB_MEMBER.get(dtype)
    if member != expected:
        raise TypeMismatch(f"{dtype.name} travels as {expected}, got {member}")
    return normalize(dtype, getattr(pb, member))
