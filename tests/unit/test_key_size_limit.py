"""A row's key is at most ``MAX_KEY_BYTES`` (16 KiB): a key of megabytes was accepted, and
every full scan of its tablet failed for good (a page carries the key twice, the row and
the resume key, over the message limit). Refused per row, the same by every decoder --
the client's, the per-cell form, the packed block's row-by-row and run decoders, alone and
joined -- and never for a key at the limit."""

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


def _unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a client that skips the check sends: the server must refuse it on its own."""
    monkeypatch.setattr(rows_module, "MAX_KEY_BYTES", 1 << 30)


def test_every_server_decoder_refuses_the_row_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        _unchecked(m)
        cells = [encode_row_op(SCHEMA, op, row) for op, row in ROWS]
        block = encode_row_block(SCHEMA, ROWS)
        small = encode_row_block(SCHEMA, [ROWS[2]])

    good, failures = decode_row_ops(SCHEMA, cells)
    assert [r.row_index for r in good] == [0, 2]
    assert [(f.row_index, f.code, f.message) for f in failures] == [
        (1, ErrorCode.INVALID_ROW, MESSAGE)
    ]
    good, failures = decode_row_block(SCHEMA, *block)
    assert [r.row_index for r in good] == [0, 2]
    assert [(f.row_index, f.code) for f in failures] == [(1, ErrorCode.INVALID_ROW)]
    runs, failures = decode_row_runs(SCHEMA, *block)
    assert sorted(i for run in runs for i in run.row_indexes) == [0, 2]
    assert [(f.row_index, f.code) for f in failures] == [(1, ErrorCode.INVALID_ROW)]
    # Joined with another block, as a busy tablet's batch decodes them.
    outcomes = decode_row_blocks(SCHEMA, [block, small, small])
    assert not isinstance(outcomes[0], Exception)
    runs, failures = outcomes[0]
    assert sorted(i for run in runs for i in run.row_indexes) == [0, 2]
    assert [(f.row_index, f.code) for f in failures] == [(1, ErrorCode.INVALID_ROW)]
    for outcome in outcomes[1:]:
        assert not isinstance(outcome, Exception)
        assert outcome[1] == []
