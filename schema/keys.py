"""Order-preserving ("memcomparable") byte encoding of a primary key.

``encode_key(schema, k1) < encode_key(schema, k2)`` (as bytes) exactly when ``k1 < k2`` in
the primary-key order the store sorts by, and equal keys encode equally. So an encoded key
can serve as an opaque scan resume key and as the input of the partition hash, and both
client and server derive the same bytes from the same key.

Per column, in key order (Kudu's encoding):

- integers and UNIXTIME_MICROS: big-endian, fixed width, sign bit flipped, so two's
  complement order becomes unsigned byte order;
- BOOL: one byte, 0 or 1;
- FLOAT / DOUBLE: the IEEE 754 bits big-endian, with the sign bit flipped for positives and
  all bits flipped for negatives (NaN is never a value; -0.0 is normalized to 0.0);
- STRING (UTF-8) and BINARY: in any column but the last, every 0x00 becomes 0x00 0x01 and
  the value ends with 0x00 0x00, so a shorter value sorts first and the decoder finds the
  end; the last column is the raw bytes, since nothing follows that could be confused with
  it. Byte order of UTF-8 is code-point order, which is also SQLite's BINARY collation.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import lru_cache

from raftlet.schema.schema import Schema
from raftlet.schema.types import INTEGER_RANGES, DataType, TypeMismatch, Value, normalize

__all__ = ["KeyDecodeError", "KeyEncodeError", "decode_key", "encode_key"]

_INT_WIDTH = {
    DataType.INT8: 1,
    DataType.INT16: 2,
    DataType.INT32: 4,
    DataType.INT64: 8,
    DataType.UNIXTIME_MICROS: 8,
}
_FLOAT_FORMAT = {DataType.FLOAT: (">f", ">I", 4), DataType.DOUBLE: (">d", ">Q", 8)}


class KeyEncodeError(ValueError):
    """The values given do not form a key of the schema."""


class KeyDecodeError(ValueError):
    """The bytes are not an encoded key of the schema (e.g. a forged or foreign resume key)."""


def encode_key(schema: Schema, key_values: Sequence[object]) -> bytes:
    """Encode one value per key column, in key order. None is never part of a key."""
    keys = schema.key_columns
    if len(key_values) != len(keys):
        raise KeyEncodeError(f"a key has {len(keys)} columns, got {len(key_values)} values")
    ints = _int_key(schema)
    if ints is not None:  # the usual key: integers, encoded without normalize
        fast = b""
        for (lo, hi, width), raw in zip(ints, key_values, strict=True):
            if type(raw) is not int or not lo <= raw <= hi:
                break
            fast += (raw - lo).to_bytes(width, "big")
        else:
            return fast
    out = bytearray()
    last = len(keys) - 1
    for i, (col, raw) in enumerate(zip(keys, key_values, strict=True)):
        try:
            value = normalize(col.type, raw)
        except TypeMismatch as e:
            raise KeyEncodeError(f"key column {col.name!r}: {e}") from None
        if value is None:
            raise KeyEncodeError(f"key column {col.name!r} cannot be null")
        _encode_one(out, col.type, value, is_last=i == last)
    return bytes(out)


@lru_cache(maxsize=64)
def _int_key(schema: Schema) -> tuple[tuple[int, int, int], ...] | None:
    """(lowest, highest, width) of each key column if all are integers, else None. An
    integer's encoding is ``value - lowest``, big-endian: the sign bit flipped."""
    if not all(c.type in _INT_WIDTH for c in schema.key_columns):
        return None
    return tuple((*INTEGER_RANGES[c.type], _INT_WIDTH[c.type]) for c in schema.key_columns)


def _encode_one(out: bytearray, dtype: DataType, value: Value, *, is_last: bool) -> None:
    if dtype in _INT_WIDTH:
        assert isinstance(value, int)
        width = _INT_WIDTH[dtype]
        out += (value + (1 << (8 * width - 1))).to_bytes(width, "big")
    elif dtype is DataType.BOOL:
        out.append(1 if value else 0)
    elif dtype in _FLOAT_FORMAT:
        assert isinstance(value, float)
        ffmt, ifmt, width = _FLOAT_FORMAT[dtype]
        (bits,) = struct.unpack(ifmt, struct.pack(ffmt, value))
        sign = 1 << (8 * width - 1)
        bits = bits ^ ((1 << (8 * width)) - 1) if bits & sign else bits | sign
        out += bits.to_bytes(width, "big")
    else:
        data = value.encode("utf-8") if isinstance(value, str) else value
        assert isinstance(data, bytes)
        if is_last:
            out += data
        else:
            out += data.replace(b"\x00", b"\x00\x01")
            out += b"\x00\x00"


def decode_key(schema: Schema, data: bytes) -> tuple[Value, ...]:
    """The key values encoded in ``data``; ``KeyDecodeError`` if it is not a valid encoding.

    Strict: trailing bytes, a bad escape, or a non-canonical value are errors, because a
    resume key comes back from a client and must not silently mean some other key.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise KeyDecodeError(f"an encoded key is bytes, got {type(data).__name__}")
    buf = bytes(data)
    pos = 0
    values: list[Value] = []
    keys = schema.key_columns
    last = len(keys) - 1
    for i, col in enumerate(keys):
        value, pos = _decode_one(buf, pos, col.type, is_last=i == last, name=col.name)
        values.append(value)
    if pos != len(buf):
        raise KeyDecodeError(f"{len(buf) - pos} trailing bytes after the key")
    return tuple(values)


def _take(buf: bytes, pos: int, width: int, name: str) -> bytes:
    if pos + width > len(buf):
        raise KeyDecodeError(f"key column {name!r}: truncated")
    return buf[pos : pos + width]


def _decode_one(
    buf: bytes, pos: int, dtype: DataType, *, is_last: bool, name: str
) -> tuple[Value, int]:
    value: Value
    if dtype in _INT_WIDTH:
        width = _INT_WIDTH[dtype]
        value = int.from_bytes(_take(buf, pos, width, name), "big") - (1 << (8 * width - 1))
        lo, hi = INTEGER_RANGES[dtype]
        assert lo <= value <= hi  # any width-byte string decodes into range
        return value, pos + width
    if dtype is DataType.BOOL:
        b = _take(buf, pos, 1, name)[0]
        if b > 1:
            raise KeyDecodeError(f"key column {name!r}: bad BOOL byte {b}")
        return b == 1, pos + 1
    if dtype in _FLOAT_FORMAT:
        ffmt, ifmt, width = _FLOAT_FORMAT[dtype]
        bits = int.from_bytes(_take(buf, pos, width, name), "big")
        sign = 1 << (8 * width - 1)
        bits = bits ^ sign if bits & sign else bits ^ ((1 << (8 * width)) - 1)
        (value,) = struct.unpack(ffmt, struct.pack(ifmt, bits))
        try:
            canonical = normalize(dtype, value)
        except TypeMismatch as e:
            raise KeyDecodeError(f"key column {name!r}: {e}") from None
        if struct.pack(ffmt, canonical) != struct.pack(ffmt, value):
            raise KeyDecodeError(f"key column {name!r}: non-canonical {dtype.name}")
        return canonical, pos + width
    if is_last:
        data, pos = buf[pos:], len(buf)
    else:
        parts = bytearray()
        while True:
            nul = buf.find(b"\x00", pos)
            if nul < 0 or nul + 1 >= len(buf):
                raise KeyDecodeError(f"key column {name!r}: unterminated {dtype.name}")
            parts += buf[pos:nul]
            marker = buf[nul + 1]
            pos = nul + 2
            if marker == 0:
                break
            if marker != 1:
                raise KeyDecodeError(f"key column {name!r}: bad escape 0x00 0x{marker:02x}")
            parts.append(0)
        data = bytes(parts)
    if dtype is DataType.STRING:
        try:
            return data.decode("utf-8"), pos
        except UnicodeDecodeError:
            raise KeyDecodeError(f"key column {name!r}: STRING is not valid UTF-8") from None
    return data, pos
