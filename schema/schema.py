"""Table schemas: the columns, their types, and which of them form the primary key."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import cast

from raftlet.proto import tablet_pb2
from raftlet.schema.types import DataType

__all__ = ["MAX_COLUMNS", "MAX_COLUMN_NAME_LENGTH", "ColumnSchema", "Schema", "SchemaError"]

MAX_COLUMN_NAME_LENGTH = 128
# A tablet's rows are one SQLite table with exactly the schema's columns (tserver/store/sql.py),
# and SQLite refuses a table of more than SQLITE_MAX_COLUMN (2000 in default builds): past it
# every replica of the table would fail at creation, for good.
MAX_COLUMNS = 2000
# ASCII only: names become quoted SQL identifiers and travel in every CellPB, and a
# Unicode-normalization mismatch between two clients would be a silent "unknown column".
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class SchemaError(ValueError):
    """A schema (or a column of it) is invalid, or a name does not resolve in it."""


@dataclass(frozen=True, slots=True)
class ColumnSchema:
    name: str
    type: DataType
    nullable: bool = False
    is_key: bool = False

    def to_pb(self) -> tablet_pb2.ColumnSchemaPB:
        return tablet_pb2.ColumnSchemaPB(
            name=self.name,
            type=cast(tablet_pb2.DataType, int(self.type)),
            nullable=self.nullable,
            is_key=self.is_key,
        )

    @classmethod
    def from_pb(cls, pb: tablet_pb2.ColumnSchemaPB) -> ColumnSchema:
        try:
            dtype = DataType(pb.type)
        except ValueError:
            raise SchemaError(f"column {pb.name!r}: unknown data type {pb.type}") from None
        return cls(pb.name, dtype, pb.nullable, pb.is_key)


class Schema:
    """An immutable, validated list of columns; key columns first, in primary-key order.

    Invariants (checked by the constructor, which raises ``SchemaError``): at least one key
    column and at most ``MAX_COLUMNS`` columns; key columns form a prefix and are not
    nullable; every name is an ASCII identifier of at most ``MAX_COLUMN_NAME_LENGTH``
    characters; names are unique ignoring case (SQL identifiers are case-insensitive, so "Id"
    and "id" would be one column in the store).
    """

    __slots__ = ("_by_name", "_hash", "columns", "fingerprint", "fixed_key_bytes", "key_columns")

    def __init__(self, columns: Iterable[ColumnSchema]) -> None:
        cols = tuple(columns)
        if not cols:
            raise SchemaError("a schema needs at least one column")
        if len(cols) > MAX_COLUMNS:
            raise SchemaError(
                f"a schema has at most {MAX_COLUMNS} columns (the tablet store, SQLite, holds "
                f"no more in one table), this one has {len(cols)}: split the columns into "
                "several tables"
            )
        seen: dict[str, str] = {}
        for i, col in enumerate(cols):
            if not isinstance(col, ColumnSchema):
                raise SchemaError(f"column {i} is a {type(col).__name__}, not a ColumnSchema")
            if not isinstance(col.name, str) or not _IDENTIFIER.match(col.name):
                raise SchemaError(
                    f"column {i}: name {col.name!r} is not an identifier "
                    "(ASCII letters, digits and '_', not starting with a digit)"
                )
            if len(col.name) > MAX_COLUMN_NAME_LENGTH:
                raise SchemaError(
                    f"column {col.name!r}: name longer than {MAX_COLUMN_NAME_LENGTH} characters"
                )
            folded = col.name.lower()
            if folded in seen:
                raise SchemaError(
                    f"duplicate column name {col.name!r} (clashes with {seen[folded]!r}; "
                    "names are compared ignoring case)"
                )
            seen[folded] = col.name
            if not isinstance(col.type, DataType):
                raise SchemaError(f"column {col.name!r}: unknown data type {col.type!r}")
            if col.is_key and col.nullable:
                raise SchemaError(f"key column {col.name!r} cannot be nullable")
        num_keys = sum(1 for c in cols if c.is_key)
        if num_keys == 0:
            raise SchemaError("a schema needs at least one key column")
        if not all(c.is_key for c in cols[:num_keys]):
            first_value = next(c.name for c in cols if not c.is_key)
            raise SchemaError(
                f"key columns must come first: non-key column {first_value!r} precedes a key column"
            )
        self.columns: tuple[ColumnSchema, ...] = cols
        self.key_columns: tuple[ColumnSchema, ...] = cols[:num_keys]
        # A key's size as ``rows.MAX_KEY_BYTES`` counts it (8 a column) when no key column
        # is a string or binary; None when each key must be measured.
        variable = any(c.type in (DataType.STRING, DataType.BINARY) for c in self.key_columns)
        self.fixed_key_bytes: int | None = None if variable else 8 * num_keys
        self._by_name: dict[str, int] = {c.name: i for i, c in enumerate(cols)}
        # Schemas key many caches (row layouts, packers); hashing the columns each time
        # cost a client more than packing its row.
        self._hash = hash(cols)
        self.fingerprint = _fingerprint(cols)

    @classmethod
    def from_pb(cls, pb: tablet_pb2.SchemaPB) -> Schema:
        return cls(ColumnSchema.from_pb(c) for c in pb.columns)

    def to_pb(self) -> tablet_pb2.SchemaPB:
        return tablet_pb2.SchemaPB(columns=[c.to_pb() for c in self.columns])

    @property
    def num_key_columns(self) -> int:
        return len(self.key_columns)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def has_column(self, name: str) -> bool:
        return name in self._by_name

    def index_of(self, name: str) -> int:
        """Position of the column ``name`` (exact, case-sensitive match); SchemaError if absent."""
        try:
            return self._by_name[name]
        except KeyError:
            raise SchemaError(f"unknown column {name!r}") from None

    def column(self, name: str) -> ColumnSchema:
        return self.columns[self.index_of(name)]

    def __iter__(self) -> Iterator[ColumnSchema]:
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.columns == other.columns

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Schema], tuple[tuple[ColumnSchema, ...]]]:
        # Rebuilt, not copied: the cached hash is only valid in the process that made it.
        return (Schema, (self.columns,))

    def __repr__(self) -> str:
        return f"Schema({self.describe()})"

    def describe(self) -> str:
        """One line for error messages, e.g. ``id INT64 KEY, v STRING NULL``."""
        parts = []
        for c in self.columns:
            flags = " KEY" if c.is_key else (" NULL" if c.nullable else " NOT NULL")
            parts.append(f"{c.name} {c.type.name}{flags}")
        return ", ".join(parts)


def _fingerprint(cols: tuple[ColumnSchema, ...]) -> int:
    """A nonzero 64-bit digest of what decides how a row is packed and read: each column's
    name, type number, key and nullability, in order. Writes, their log entries and scans
    carry it (``WriteRequest.schema_fingerprint``), so that a replica never reads rows
    packed for another schema as its own: of the same width, they decode without an error
    into other values. Its text is its own, not ``describe()``'s, whose wording may
    change: servers of two versions must agree on it."""
    text = ",".join(f"{c.name}:{int(c.type)}:{int(c.is_key)}:{int(c.nullable)}" for c in cols)
    digest = hashlib.blake2b(text.encode(), digest_size=8, person=b"raftlet-schema").digest()
    return int.from_bytes(digest, "little") or 1
