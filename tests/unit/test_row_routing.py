"""tserver/row_routing.py: a write whose rows hash to another tablet is refused whole,
naming the first such row, its key and its tablet -- in both wire forms."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from raftlet.schema.partition import partition_for_key
from raftlet.schema.row_block import encode_row_block
from raftlet.schema.row_runs import RowRun, decode_row_runs
from raftlet.schema.rows import OpType, RowOp, decode_row_ops, encode_row_op
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from raftlet.tserver.errors import InvalidRequest
from raftlet.tserver.row_routing import check_rows_in_tablet

KV = Schema(
    [
        ColumnSchema("key", DataType.INT64, is_key=True),
        ColumnSchema("value", DataType.STRING, nullable=True),
    ]
)
NAMED = Schema(
    [
        ColumnSchema("tenant", DataType.STRING, is_key=True),
        ColumnSchema("id", DataType.INT32, is_key=True),
        ColumnSchema("v", DataType.INT64, nullable=True),
    ]
)
PARTITIONS = 3

Rows = Sequence[RowRun | RowOp]


def keys_in(partition: int, n: int, schema: Schema = KV) -> list[int]:
    found = [k for k in range(10_000) if partition_for_key(schema, [k], PARTITIONS) == partition]
    return found[:n]


def as_runs(keys: list[int], op: OpType = OpType.INSERT) -> Rows:
    rows, indirect = encode_row_block(KV, [(op, {"key": k, "value": f"v{k}"}) for k in keys])
    runs, failures = decode_row_runs(KV, rows, indirect)
    assert not failures
    return list(runs)


def as_ops(keys: list[int]) -> Rows:
    pbs = [encode_row_op(KV, OpType.UPSERT, {"key": k, "value": None}) for k in keys]
    good, failures = decode_row_ops(KV, pbs)
    assert not failures
    return list(good)


@pytest.mark.parametrize("form", [as_runs, as_ops])
def test_rows_of_the_tablet_pass(form: Callable[[list[int]], Rows]) -> None:
    rows = form(keys_in(1, 50))
    check_rows_in_tablet(KV, "kv", 1, PARTITIONS, rows)
    check_rows_in_tablet(KV, "kv", 1, PARTITIONS, [])


@pytest.mark.parametrize("form", [as_runs, as_ops])
def test_the_first_row_of_another_tablet_is_named_with_its_key_and_tablet(
    form: Callable[[list[int]], Rows],
) -> None:
    ours, theirs = keys_in(0, 10), keys_in(2, 2)
    keys = [*ours[:4], theirs[0], *ours[4:], theirs[1]]
    rows = form(keys)
    with pytest.raises(InvalidRequest) as info:
        check_rows_in_tablet(KV, "kv", 0, PARTITIONS, rows)
    message = info.value.message
    assert message.startswith(f"row 4 (key {theirs[0]}) belongs to tablet kv-p2, not kv-p0")
    assert "2 of the write's 12 valid rows are in other tablets" in message
    assert "Nothing was written" in message


def test_runs_of_different_kinds_are_all_checked() -> None:
    ours, theirs = keys_in(1, 3), keys_in(0, 1)
    rows, indirect = encode_row_block(
        KV,
        [(OpType.INSERT, {"key": k, "value": "x"}) for k in ours]
        + [(OpType.DELETE, {"key": theirs[0]})],
    )
    runs, _ = decode_row_runs(KV, rows, indirect)
    assert len(runs) == 2  # the misrouted row is alone in the second run
    with pytest.raises(
        InvalidRequest, match=f"row 3 \\(key {theirs[0]}\\) belongs to tablet kv-p0"
    ):
        check_rows_in_tablet(KV, "kv", 1, PARTITIONS, list(runs))


def test_a_table_of_one_tablet_holds_every_key() -> None:
    check_rows_in_tablet(KV, "kv", 0, 1, as_runs(list(range(100))))


def test_a_composite_key_is_shown_whole_and_a_long_one_cut() -> None:
    tenant = "t" * 500
    key = next(
        (tenant, i) for i in range(100) if partition_for_key(NAMED, [tenant, i], PARTITIONS) != 0
    )
    pbs = [encode_row_op(NAMED, OpType.INSERT, {"tenant": key[0], "id": key[1], "v": 1})]
    good, _ = decode_row_ops(NAMED, pbs)
    with pytest.raises(InvalidRequest) as info:
        check_rows_in_tablet(NAMED, "events", 0, PARTITIONS, list(good))
    message = info.value.message
    assert message.startswith("row 0 (key ('tttt")
    assert "... (" in message
    assert "characters)" in message
    # gRPC trailing metadata above 8 KiB would turn the answer into another error.
    assert len(message) < 1000
