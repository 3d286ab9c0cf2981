"""Writing the cluster config as TOML that ``toml_read`` reads back equal (with ``tomli-w``).

The layout is the one ``toml_read`` documents: ``[cluster]``, ``[raft]``, one ``[[servers]]``
block per server, one ``[[tables]]`` block per table with one inline table per column (unless
a column does not fit on a 100-character line: tomli-w then writes that table's columns as
``[[tables.columns]]`` blocks, which read the same). ``tomli-w`` formats every value (escaping
included), so a name or path with quotes, control characters or non-ASCII text round-trips.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from raftlet.cluster.errors import ClusterConfigError
from raftlet.cluster.model import ClusterConfig
from raftlet.schema.schema import ColumnSchema

__all__ = ["dump_cluster_config", "write_cluster_config"]

_PREAMBLE = (
    "# raftlet cluster config: the servers, the tables, and (derived from both) where\n"
    "# every tablet lives. Relative data_dir paths are relative to this file's directory.\n"
    "\n"
)


def dump_cluster_config(
    config: ClusterConfig, base_dir: str | os.PathLike[str] | None = None
) -> str:
    """TOML text that ``parse_cluster_config(text, base_dir)`` reads back equal to ``config``.

    Data dirs under ``base_dir`` (default: the directory of ``config.path``, if any) are
    written relative to it, so the directory holding the file and the data can be moved.
    """
    # Imported here, not at the top: the client reads configs with the package but never
    # writes one, and its install (the base dependencies) does not include tomli-w.
    try:
        import tomli_w
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "writing a cluster config needs tomli-w (pip install 'raftlet[cli]')", name=e.name
        ) from e

    if base_dir is None and config.path is not None:
        base_dir = config.path.parent
    base = Path(base_dir) if base_dir is not None else None
    r = config.raft
    head = {
        "cluster": {"name": config.name},
        "raft": {
            "tick_interval_ms": r.tick_interval_ms,
            "election_ticks": r.election_ticks,
            "heartbeat_ticks": r.heartbeat_ticks,
        },
    }
    servers = [
        {
            "id": s.id,
            "rpc_addr": s.rpc_addr,
            "http_addr": s.http_addr,
            **({"token_rpc_addr": s.token_rpc_addr} if s.token_rpc_addr else {}),
            "data_dir": _relative(s.data_dir, base),
        }
        for s in config.servers
    ]
    tables = [
        {
            "name": t.name,
            "partitions": t.partitions,
            "replication_factor": t.replication_factor,
            "columns": [_column(c) for c in t.schema.columns],
        }
        for t in config.tables
    ]
    _refuse_surrogates([head, servers, tables])
    parts = [_PREAMBLE, tomli_w.dumps(head, indent=2)]
    # tomli-w writes an array of small tables as inline tables in one `servers = [...]`; a
    # [[servers]] block each is the documented layout, and the one _Locator finds lines in.
    parts += [f"\n[[servers]]\n{tomli_w.dumps(s, indent=2)}" for s in servers]
    if tables:
        # A table never fits inline (its columns array spans lines), so tomli-w gives each
        # one a [[tables]] block of its own.
        parts.append("\n" + tomli_w.dumps({"tables": tables}, indent=2))
    return "".join(parts)


def write_cluster_config(config: ClusterConfig, path: str | os.PathLike[str]) -> ClusterConfig:
    """Write ``config`` to ``path`` atomically and durably (a reader never sees half a file;
    a crash leaves the old file or the new one). Returns the config with ``path`` set."""
    target = Path(path).absolute()
    text = dump_cluster_config(config, target.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        # The rename is durable only once the directory is: a power cut could otherwise
        # bring back the old config beside data made for the new one.
        dir_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dataclasses.replace(config, path=target)


def _column(column: ColumnSchema) -> dict[str, Any]:
    out: dict[str, Any] = {"name": column.name, "type": column.type.name}
    # Only the non-default flags, so a column reads as it would be written by hand.
    if column.is_key:
        out["key"] = True
    if column.nullable:
        out["nullable"] = True
    return out


def _relative(path: Path, base: Path | None) -> str:
    if base is not None:
        try:
            return path.relative_to(base).as_posix() or "."
        except ValueError:
            pass
    return str(path)


def _refuse_surrogates(value: object) -> None:
    """TOML's \\u escapes must be Unicode scalar values, so a lone surrogate (a path read
    with surrogateescape, say) cannot be written; tomli-w would let it through to fail as
    a UnicodeEncodeError when the file is written."""
    if isinstance(value, str):
        if any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
            raise ClusterConfigError(
                f"{value!r} contains a lone surrogate and cannot be written as TOML"
            )
    elif isinstance(value, dict):
        _refuse_surrogates(list(value.values()))
    elif isinstance(value, Iterable):
        for item in value:
            _refuse_surrogates(item)
