"""Reading the cluster config from TOML (the stdlib ``tomllib``), with ``file:line`` errors.

The file layout::

    [cluster]
    name = "demo"
    [raft]                      # optional, all have defaults
    tick_interval_ms = 100
    election_ticks = 10
    heartbeat_ticks = 3
    [[servers]]
    id = "ts1"
    rpc_addr = "127.0.0.1:7051"
    http_addr = "127.0.0.1:8051"
    token_rpc_addr = "127.0.0.1:9051"  # optional: TLS, bearer tokens, no client certificate
    data_dir = "ts1"            # optional; relative to the file's directory; default = id
    [[tables]]
    name = "kv"
    partitions = 2
    replication_factor = 3
    columns = [
      { name = "key", type = "INT64", key = true },
      { name = "value", type = "STRING", nullable = true },
    ]

The model's constructors check the values; this layer adds what only it can know: unknown
keys (with a did-you-mean), missing keys, wrong TOML types, and the line an error is on. Every
problem is one ``ClusterConfigError`` whose message names the field (``servers[1].rpc_addr``)
and, when read from a file, ``file:line``.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from pathlib import Path
from typing import Any, cast

from raftlet.cluster.errors import ClusterConfigError
from raftlet.cluster.model import ClusterConfig, RaftTimings, ServerConfig, TableConfig
from raftlet.schema.schema import ColumnSchema, Schema, SchemaError
from raftlet.schema.types import DataType

__all__ = ["load_cluster_config", "parse_cluster_config"]


def load_cluster_config(path: str | os.PathLike[str]) -> ClusterConfig:
    """Read and validate the TOML file at ``path``; data dirs resolve against its directory."""
    p = Path(path).absolute()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ClusterConfigError(
            f"cannot read the cluster config: {e.strerror or e}", source=str(path)
        ) from None
    except UnicodeDecodeError as e:
        raise ClusterConfigError(
            f"not UTF-8 text ({e.reason} at byte {e.start})", source=str(path)
        ) from None
    return _parse(text, p.parent, path=p, source=str(path))


def parse_cluster_config(text: str, base_dir: str | os.PathLike[str] = ".") -> ClusterConfig:
    """Parse and validate TOML ``text``; relative ``data_dir``s resolve against ``base_dir``."""
    return _parse(text, Path(base_dir), path=None, source=None)


def _parse(text: str, base_dir: Path, *, path: Path | None, source: str | None) -> ClusterConfig:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # tomllib's message already ends with "(at line N, column M)".
        raise ClusterConfigError(f"invalid TOML: {e}", source=source) from None
    try:
        return _build(doc, base_dir, path)
    except ClusterConfigError as e:
        line = e.line if e.line is not None else _Locator(text).line_of(e.field)
        raise ClusterConfigError(e.reason, e.field, source=source, line=line) from None


_TOP_KEYS = ("cluster", "raft", "servers", "tables")
_CLUSTER_KEYS = ("name",)
_RAFT_KEYS = ("tick_interval_ms", "election_ticks", "heartbeat_ticks")
_SERVER_KEYS = ("id", "rpc_addr", "http_addr", "token_rpc_addr", "data_dir")
_TABLE_KEYS = ("name", "partitions", "replication_factor", "columns")
_COLUMN_KEYS = ("name", "type", "key", "nullable")


class _Table:
    """One TOML table being read: typed getters that name the field in their errors."""

    def __init__(self, raw: object, where: str, allowed: tuple[str, ...], what: str) -> None:
        if not isinstance(raw, dict):
            raise ClusterConfigError(f"must be a table ({what}), got {_toml_type(raw)}", where)
        self.raw: dict[str, Any] = raw
        self.where = where
        for key in raw:
            if key not in allowed:
                hint = difflib.get_close_matches(key, allowed, n=1, cutoff=0.7)
                maybe = f"did you mean {hint[0]!r}? " if hint else ""
                raise ClusterConfigError(
                    f"unknown key {key!r} ({maybe}expected one of: {', '.join(allowed)})",
                    self.path(key),
                )

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, kind: type | tuple[type, ...], what: str, default: Any = ...) -> Any:
        if key not in self.raw:
            if default is ...:
                raise ClusterConfigError(f"missing (expected {what})", self.path(key))
            return default
        value = self.raw[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            shown = "" if isinstance(value, dict | list) else f" {value!r}"
            raise ClusterConfigError(
                f"must be {what}, got {_toml_type(value)}{shown}", self.path(key)
            )
        return value


def _toml_type(value: object) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        list: "an array",
        dict: "a table",
    }
    return next((n for t, n in names.items() if isinstance(value, t)), type(value).__name__)


def _build(doc: dict[str, Any], base_dir: Path, path: Path | None) -> ClusterConfig:
    top = _Table(doc, "", _TOP_KEYS, "the document")
    cluster = _Table(
        top.get("cluster", dict, "a [cluster] table"), "cluster", _CLUSTER_KEYS, "[cluster]"
    )
    name = cluster.get("name", str, "a string")

    raft_raw = _Table(top.get("raft", dict, "a [raft] table", {}), "raft", _RAFT_KEYS, "[raft]")
    defaults = RaftTimings()
    tick = raft_raw.get("tick_interval_ms", (int, float), "a number", defaults.tick_interval_ms)
    election = raft_raw.get("election_ticks", int, "an integer", defaults.election_ticks)
    heartbeat = raft_raw.get("heartbeat_ticks", int, "an integer", defaults.heartbeat_ticks)
    try:
        raft = RaftTimings(tick, election, heartbeat)
    except ClusterConfigError as e:
        raise e.within("raft") from None

    servers = []
    for i, raw in enumerate(_array_of_tables(top, "servers", "[[servers]]")):
        where = f"servers[{i}]"
        s = _Table(raw, where, _SERVER_KEYS, "[[servers]]")
        sid = s.get("id", str, "a string")
        data_dir = s.get("data_dir", str, "a string (a path)", sid)
        if not data_dir:
            raise ClusterConfigError("must not be empty", s.path("data_dir"))
        rpc_addr = s.get("rpc_addr", str, "a string 'host:port'")
        http_addr = s.get("http_addr", str, "a string 'host:port'")
        token_rpc_addr = s.get("token_rpc_addr", str, "a string 'host:port'", "")
        try:
            # Relative to the config file, so a cluster directory can be moved whole.
            where_data = base_dir / Path(data_dir).expanduser()
            servers.append(ServerConfig(sid, rpc_addr, http_addr, where_data, token_rpc_addr))
        except ClusterConfigError as e:
            raise e.within(where) from None

    tables = []
    for i, raw in enumerate(_array_of_tables(top, "tables", "[[tables]]", required=False)):
        where = f"tables[{i}]"
        t = _Table(raw, where, _TABLE_KEYS, "[[tables]]")
        tname = t.get("name", str, "a string")
        partitions = t.get("partitions", int, "an integer")
        rf = t.get("replication_factor", int, "an integer")
        columns = t.get("columns", list, "an array of column tables")
        cols = [_column(c, f"{where}.columns[{j}]") for j, c in enumerate(columns)]
        try:
            schema = Schema(cols)
        except SchemaError as e:
            # Schema's own message ("key column 'k' cannot be nullable") is the clear one.
            raise ClusterConfigError(str(e), f"{where}.columns") from None
        try:
            tables.append(TableConfig(tname, schema, partitions, rf))
        except ClusterConfigError as e:
            raise e.within(where) from None

    return ClusterConfig(name, tuple(servers), tuple(tables), raft, path)


def _array_of_tables(top: _Table, key: str, what: str, required: bool = True) -> list[Any]:
    value = top.get(key, list, f"an array of tables ({what})", ... if required else [])
    return cast(list[Any], value)


def _column(raw: object, where: str) -> ColumnSchema:
    c = _Table(raw, where, _COLUMN_KEYS, "{ name = ..., type = ... }")
    name = c.get("name", str, "a string")
    type_name = c.get("type", str, "a string naming a type")
    try:
        # Case-insensitive: "int64" cannot mean anything else.
        dtype = DataType[type_name.upper()]
    except KeyError:
        known = ", ".join(t.name for t in DataType)
        raise ClusterConfigError(
            f"unknown column type {type_name!r} (expected one of: {known})", f"{where}.type"
        ) from None
    return ColumnSchema(
        name,
        dtype,
        c.get("nullable", bool, "true or false", False),
        c.get("key", bool, "true or false", False),
    )


_HEADER = re.compile(r"\s*(\[\[?)\s*([A-Za-z0-9_.-]+)\s*\]\]?\s*(?:#.*)?\Z")
_FIELD_PART = re.compile(r"([A-Za-z0-9_.-]+?)(?:\[(\d+)\])?(?:\.|\Z)")


class _Locator:
    """Best-effort: the 1-based line of a field path such as ``servers[1].rpc_addr``.

    Understands the layout documented above, which ``toml_write`` writes too (``[table]``,
    ``[[array]]`` headers, ``key = value`` lines, one inline table per column); returns the
    nearest enclosing line it can be sure of, or None rather than a wrong line.
    """

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        # (line index, name, occurrence) of every header.
        self.headers: list[tuple[int, str, int]] = []
        seen: dict[str, int] = {}
        for i, line in enumerate(self.lines):
            m = _HEADER.match(line)
            if m:
                name = m.group(2)
                occurrence = seen.get(name, 0) if m.group(1) == "[[" else 0
                seen[name] = occurrence + 1
                self.headers.append((i, name, occurrence))

    def line_of(self, field_path: str) -> int | None:
        parts = [(m.group(1), m.group(2)) for m in _FIELD_PART.finditer(field_path) if m.group(1)]
        if not parts:
            return None
        (name, index), rest = parts[0], parts[1:]
        section = next(
            (h for h, n, occ in self.headers if n == name and occ == int(index or 0)), None
        )
        if section is None:
            # A top-level key, before any header (e.g. an unknown `foo = 1`).
            first = self.headers[0][0] if self.headers else len(self.lines)
            return self._key_line(name, 0, first)
        if not rest:
            return section + 1
        end = next((h for h, _, _ in self.headers if h > section), len(self.lines))
        key, key_index = rest[0]
        found = self._key_line(key, section + 1, end)
        if found is None:
            return section + 1
        if key_index is None:
            return found
        brace = self._nth_brace(found - 1, end, int(key_index))
        return brace + 1 if brace is not None else found

    def _key_line(self, key: str, start: int, end: int) -> int | None:
        pattern = re.compile(rf"\s*{re.escape(key)}\s*=")
        return next((i + 1 for i in range(start, end) if pattern.match(self.lines[i])), None)

    def _nth_brace(self, start: int, end: int, n: int) -> int | None:
        """The line of the n-th (0-based) '{' from line ``start``, outside strings/comments."""
        count = 0
        for i in range(start, end):
            quote = ""
            for ch in self.lines[i]:
                if quote:
                    quote = "" if ch == quote else quote
                elif ch in "\"'":
                    quote = ch
                elif ch == "#":
                    break
                elif ch == "{":
                    if count == n:
                        return i
                    count += 1
        return None
