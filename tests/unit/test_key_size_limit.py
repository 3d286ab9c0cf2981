"""A row's key is at most ``MAX_KEY_BYTES`` (16 KiB): a key of megabytes was accepted, and
every full scan of its tablet failed for good (a page carries the key twice, the row and
the resume key, over the message limit). The client refuses such an INSERT or UPSERT per
row, in every encoder, never a key at the limit; the leader refuses the write whole
(``test_tablet_replica``). The decoders of committed entries check no key size: entries an
older leader wrote before the limit existed must apply on every replica as they did on it
-- a new replica dropped those rows, and replicas of mixed versions diverged."""

from __future__ import annotations

import pytest

from raftlet.schema import rows as rows_module
from raftlet.schema.row_block import decode_row_block, encode_row_block
from raftlet.schema.row_runs import decode_row_blocks, decode_row_runs
from raftlet.schema.rows import (
    MAX_KEY_BYTES,
    ErrorCode,
    OpType,
    RowOpError,
    decode_row_ops,
    encode_row_op,
)
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType

SCHEMA = Schema(
    [
        ColumnSchema("k", DataType.STRING, is_key=True),
        ColumnSchema("n", DataType.INT64, is_key=True),
        ColumnSchema("v", DataType.STRING, nullable=True),
    ]
)
AT_LIMIT = "é" * ((MAX_KEY_BYTES - 8) // 2)  # 2 bytes a character, + 8 for the INT64
OVER = AT_LIMIT + "x"
ROWS = [
    (OpType.UPSERT, {"k": AT_LIMIT, "n": 1, "v": "at the limit"}),
    (OpType.UPSERT, {"k": OVER, "n": 2, "v": "one byte over"}),
    (OpType.UPSERT, {"k": "small", "n": 3, "v": None}),
]
MESSAGE = f"the key is {MAX_KEY_BYTES + 1} bytes, over the {MAX_KEY_BYTES}-byte limit"


def test_the_client_refuses_a_key_over_the_limit_before_sending() -> None:
    encode_row_op(SCHEMA, OpType.UPSERT, ROWS[0][1])
    with pytest.raises(RowOpError, match=MESSAGE):
        encode_row_op(SCHEMA, OpType.UPSERT, ROWS[1][1])
    with pytest.raises(RowOpError, match=MESSAGE):
        encode_row_block(SCHEMA, ROWS)


def test_an_update_or_delete_may_name_a_long_key_stored_before_the_limit() -> None:
    for op in (OpType.UPDATE, OpType.DELETE):
        row = {"k": OVER, "n": 2} | ({"v": "x"} if op is OpType.UPDATE else {})
        encode_row_op(SCHEMA, op, row)
        encode_row_block(SCHEMA, [(op, row)])


def _unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """What an older version sent and logged: no key limit."""
    monkeypatch.setattr(rows_module, "MAX_KEY_BYTES", 1 << 30)


def test_every_decoder_of_committed_entries_takes_the_row_as_it_was_logged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with monkeypatch.context() as m:
        _unchecked(m)
        cells = [encode_row_op(SCHEMA, op, row) for op, row in ROWS]
        block = encode_row_block(SCHEMA, ROWS)
        small = encode_row_block(SCHEMA, [ROWS[2]])

    # The per-cell form as the store applies it, and as a client validates it.
    good, failures = decode_row_ops(SCHEMA, cells, key_limit=False)
    assert ([r.row_index for r in good], failures) == ([0, 1, 2], [])
    good, failures = decode_row_ops(SCHEMA, cells)
    assert [(f.row_index, f.code, f.message) for f in failures] == [
        (1, ErrorCode.INVALID_ROW, MESSAGE)
    ]
    good, failures = decode_row_block(SCHEMA, *block)
    assert ([r.row_index for r in good], failures) == ([0, 1, 2], [])
    runs, failures = decode_row_runs(SCHEMA, *block)
    assert (sorted(i for run in runs for i in run.row_indexes), failures) == ([0, 1, 2], [])
    # Joined with another block, as a busy tablet's batch decodes them.
    outcomes = decode_row_blocks(SCHEMA, [block, small, small])
    for outcome, rows in zip(outcomes, ([0, 1, 2], [0], [0]), strict=True):
        assert not isinstance(outcome, Exception)
        runs, failures = outcome
        assert (sorted(i for run in runs for i in run.row_indexes), failures) == (rows, [])
