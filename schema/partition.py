"""Hash partitioning of a table's rows into tablets by primary key.

The client routes a row to a tablet with this function and the server checks (and places
tablets) with the same one, so the hash must be identical across processes, runs, machines
and Python versions: CRC-32 (zlib, IEEE polynomial) of the memcomparable key encoding.
Python's ``hash()`` is salted per process and would scatter a key differently each run.

Changing anything here re-homes existing rows; ``tests/unit/test_schema_partition.py`` pins
golden values so such a change cannot go unnoticed.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from raftlet.schema.keys import encode_key
from raftlet.schema.schema import Schema

__all__ = ["partition_for_encoded_key", "partition_for_key"]


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
