"""The SQL the tablet store runs, built from a ``Schema``.

Only identifiers are spliced into statement text, and only after ``quote_ident`` (a schema's
names are validated identifiers already; quoting keeps that from being load-bearing). Every
value is a ``?`` parameter. Statement text depends only on the schema and on which columns an
operation names, so the sqlite3 module's statement cache turns repeats into re-executions of
one prepared statement.
"""

from __future__ import annotations

from collections.abc import Sequence

from raftlet.schema.predicates import Predicate, PredicateKind
from raftlet.schema.schema import Schema
from raftlet.schema.types import DataType, Value

__all__ = [
    "META_TABLE",
    "ROWS_TABLE",
    "SQL_TYPES",
    "SqlBuilder",
    "from_sql",
    "projected_at",
    "quote_ident",
    "to_sql",
]

ROWS_TABLE = "tablet_rows"
META_TABLE = "raftlet_meta"

SQL_TYPES: dict[DataType, str] = {
    DataType.INT8: "INTEGER",
    DataType.INT16: "INTEGER",
    DataType.INT32: "INTEGER",
    DataType.INT64: "INTEGER",
    DataType.UNIXTIME_MICROS: "INTEGER",
    DataType.BOOL: "INTEGER",
    DataType.FLOAT: "REAL",
    DataType.DOUBLE: "REAL",
    DataType.STRING: "TEXT",
    DataType.BINARY: "BLOB",
}

SqlValue = int | float | str | bytes | None


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def to_sql(value: Value) -> SqlValue:
    """A normalized Python value as a SQLite parameter (a bool is stored as 0/1)."""
    if isinstance(value, bool):
        return int(value)
    return value


def from_sql(dtype: DataType, value: SqlValue) -> Value:
    if value is None:
        return None
    if dtype is DataType.BOOL:
        return bool(value)
    if dtype is DataType.FLOAT or dtype is DataType.DOUBLE:
        # REAL affinity returns floats, but a value written by another tool could be integral.
        return float(value)
    return value


class SqlBuilder:
    """Statement text for one schema."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self._keys = [quote_ident(c.name) for c in schema.key_columns]
        self._key_list = ", ".join(self._keys)
        self._key_where = " AND ".join(f"{k} = ?" for k in self._keys)
        self._table = quote_ident(ROWS_TABLE)
        # (statement kind, value columns) -> text; bounded by the column subsets clients use.
        self._cache: dict[tuple[str, tuple[str, ...]], str] = {}

    def create_table(self) -> str:
        cols = [
            f"{quote_ident(c.name)} {SQL_TYPES[c.type]}{'' if c.nullable else ' NOT NULL'}"
            for c in self.schema.columns
        ]
        # An ordinary rowid table: a single integer key is the rowid itself, any other key a
        # unique index beside the table. WITHOUT ROWID keeps rows in the key's b-tree, whose
        # cells hold at most ~1,000 bytes of a 4 KiB page: a 1 KB row put its last bytes on
        # an overflow page of their own, and such a store took 4.7 times its rows' size
        # (review r33a). A rowid table's cells fill their pages; the statements are the same
        # for both, and stores made WITHOUT ROWID keep working.
        return f"CREATE TABLE {self._table} ({', '.join(cols)}, PRIMARY KEY ({self._key_list}))"

    def insert(self, value_columns: tuple[str, ...]) -> str:
        sql = self._cache.get(("insert", value_columns))
        if sql is None:
            cols = self._keys + [quote_ident(c) for c in value_columns]
            marks = ", ".join("?" * len(cols))
            sql = f"INSERT INTO {self._table} ({', '.join(cols)}) VALUES ({marks})"
            self._cache["insert", value_columns] = sql
        return sql

    def upsert(self, value_columns: tuple[str, ...]) -> str:
        sql = self._cache.get(("upsert", value_columns))
        if sql is None:
            sql = self.insert(value_columns) + f" ON CONFLICT ({self._key_list}) "
            if value_columns:
                sets = ", ".join(
                    f"{quote_ident(c)} = excluded.{quote_ident(c)}" for c in value_columns
                )
                sql += f"DO UPDATE SET {sets}"
            else:
                sql += "DO NOTHING"
            self._cache["upsert", value_columns] = sql
        return sql

    def update(self, value_columns: tuple[str, ...]) -> str:
        sql = self._cache.get(("update", value_columns))
        if sql is None:
            sets = ", ".join(f"{quote_ident(c)} = ?" for c in value_columns)
            sql = f"UPDATE {self._table} SET {sets} WHERE {self._key_where}"
            self._cache["update", value_columns] = sql
        return sql

    def delete(self) -> str:
        return f"DELETE FROM {self._table} WHERE {self._key_where}"

    def count(self) -> str:
        return f"SELECT count(*) FROM {self._table}"

    def select(
        self,
        projection: Sequence[str],
        predicates: Sequence[Predicate],
        *,
        resume: bool,
        limit: bool,
    ) -> tuple[str, list[SqlValue]]:
        """SELECT key columns then the columns of ``projection`` that are not key columns
        (``projected_at`` says where each one is), in key order; returns (sql, params).

        ``resume`` adds ``(key columns) > (?, ...)`` — SQLite's row-value comparison, which
        it answers with a seek on the primary key — whose parameters the caller appends,
        followed by the LIMIT parameter when ``limit``.
        """
        keys = {c.name for c in self.schema.key_columns}
        others = [quote_ident(c) for c in projection if c not in keys]
        select_list = ", ".join(self._keys + others)
        where: list[str] = []
        params: list[SqlValue] = []
        for p in predicates:
            clause, ps = predicate_sql(p)
            where.append(clause)
            params.extend(ps)
        if resume:
            marks = ", ".join("?" * len(self._keys))
            where.append(f"({self._key_list}) > ({marks})")
        sql = f"SELECT {select_list} FROM {self._table}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY {self._key_list}"
        if limit:
            sql += " LIMIT ?"
        return sql, params


def projected_at(schema: Schema, projection: Sequence[str]) -> tuple[int, ...]:
    """Where each column of ``projection`` is in a row ``SqlBuilder.select`` returns: a key
    column is read once, with the key, whether projected or not."""
    nkeys = schema.num_key_columns
    keys = {c.name: i for i, c in enumerate(schema.key_columns)}
    at: list[int] = []
    n = nkeys
    for c in projection:
        if c in keys:
            at.append(keys[c])
        else:
            at.append(n)
            n += 1
    return tuple(at)


def predicate_sql(p: Predicate) -> tuple[str, list[SqlValue]]:
    """The WHERE clause of one validated predicate and its parameters."""
    col = quote_ident(p.column)
    if p.kind is PredicateKind.EQUALS:
        return f"{col} = ?", [to_sql(p.values[0])]
    if p.kind is PredicateKind.IN_LIST:
        if not p.values:
            return "0", []
        return f"{col} IN ({', '.join('?' * len(p.values))})", [to_sql(v) for v in p.values]
    if p.kind is PredicateKind.RANGE:
        parts: list[str] = []
        params: list[SqlValue] = []
        if p.lower is not None:
            parts.append(f"{col} {'>=' if p.lower_inclusive else '>'} ?")
            params.append(to_sql(p.lower))
        if p.upper is not None:
            parts.append(f"{col} {'<=' if p.upper_inclusive else '<'} ?")
            params.append(to_sql(p.upper))
        return "(" + " AND ".join(parts) + ")", params
    if p.kind is PredicateKind.IS_NULL:
        return f"{col} IS NULL", []
    return f"{col} IS NOT NULL", []
