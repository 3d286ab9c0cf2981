"""The leader's check that every row of a write belongs to the tablet it was sent to.

A client routes each row by the hash of its key (``schema.partition``); nothing on the
server checked that it had. A row sent to the wrong tablet was stored there: a later insert
of the same key, routed right, succeeded in the right tablet, so a full scan returned that
key twice, and point lookups (which go to the right tablet) missed the stray row for good.

``check_rows_in_tablet`` runs in the prepare stage on the rows it has just decoded, before
anything is replicated, and raises ``InvalidRequest`` (INVALID_ARGUMENT) naming the first
misrouted row -- its position in the write and its key -- and the tablet it belongs to.

One wrong row fails the whole write, although bad rows are otherwise reported per row
(Kudu, which has a master to route by, reports a misrouted row per row too). A misrouted
row is not bad data but a client whose partitioning disagrees with the server's: a stale or
foreign cluster config (another partition count), a bug, or a forged request. The other
rows of that write were routed the same way, so storing them would be a guess; refusing
the write stores nothing, and INVALID_ARGUMENT tells the client not to retry the same
request, where a per-row error inside a successful answer is easy to miss.
"""

from __future__ import annotations

from collections.abc import Sequence

from raftlet.cluster.placement import tablet_id
from raftlet.schema.partition import key_partitions
from raftlet.schema.row_runs import RowRun
from raftlet.schema.rows import RowOp
from raftlet.schema.schema import Schema
from raftlet.tserver.errors import InvalidRequest

__all__ = ["check_rows_in_tablet"]

# A key is quoted in the error up to this many characters: the message travels in gRPC
# trailing metadata, which a client refuses above 8 KiB.
_MAX_KEY_CHARS = 100


def check_rows_in_tablet(
    schema: Schema,
    table: str,
    partition: int,
    num_partitions: int,
    rows: Sequence[RowRun | RowOp],
) -> None:
    """Raise ``InvalidRequest`` unless every row (decoded runs or row ops of one write)
    hashes to ``partition`` of ``num_partitions``."""
    if num_partitions == 1:
        return
    keys: list[Sequence[object]] = []
    indexes: list[int] = []
    for part in rows:
        if isinstance(part, RowRun):
            keys += part.params
            indexes += part.row_indexes
        else:
            keys.append(part.key)
            indexes.append(part.row_index)
    partitions = key_partitions(schema, keys, num_partitions)
    wrong = [i for i, p in enumerate(partitions) if p != partition]
    if not wrong:
        return
    first = min(wrong, key=indexes.__getitem__)
    index, key, p = indexes[first], keys[first][: schema.num_key_columns], partitions[first]
    raise InvalidRequest(
        f"row {index} (key {_show_key(key)}) belongs to tablet {tablet_id(table, p)}, not "
        f"{tablet_id(table, partition)} (partition {p} of {num_partitions} by its key's "
        f"hash); {len(wrong)} of the write's {len(keys)} valid rows are in other tablets. "
        "Nothing was written: the client's partitioning of table "
        f"{table!r} disagrees with the server's (a stale cluster config?)"
    )


def _show_key(key: Sequence[object]) -> str:
    text = repr(key[0]) if len(key) == 1 else repr(tuple(key))
    if len(text) > _MAX_KEY_CHARS:
        return f"{text[:_MAX_KEY_CHARS]}... ({len(text)} characters)"
    return text
