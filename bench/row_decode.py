"""What decoding one-row blocks costs, one call per block against one call for many.

Why the prepare and apply stages decode the row blocks of a batch together
(``decode_row_blocks``): with single-row writes a block's fixed cost -- the layout, the
header check, building the run -- is most of its decoding, and a follower's apply pass or a
leader's prepare pass holds several such blocks. Prints microseconds per block for batches
of 1, 4, 16 and 64 one-row blocks (an INT64 key and a 100-byte STRING, the benches' rows),
best of the repetitions, and the ratio.

    python bench/row_decode.py [--blocks 1,4,16,64] [--calls 2000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import timeit

from raftlet.schema.row_block import encode_row_block
from raftlet.schema.row_runs import decode_row_blocks, decode_row_runs
from raftlet.schema.rows import OpType
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType

SCHEMA = Schema(
    [
        ColumnSchema("key", DataType.INT64, is_key=True),
        ColumnSchema("value", DataType.STRING, nullable=True),
    ]
)


def one_row_blocks(n: int) -> list[tuple[bytes, bytes]]:
    blocks = []
    for key in range(n):
        rows, indirect = encode_row_block(
            SCHEMA, [(OpType.INSERT, {"key": key, "value": "x" * 100})]
        )
        blocks.append((bytes(rows), bytes(indirect)))
    return blocks


def per_block_us(n: int, calls: int, repeat: int) -> tuple[float, float]:
    """(one call per block, one call for all) in microseconds per block."""
    blocks = one_row_blocks(n)

    def alone() -> None:
        for rows, indirect in blocks:
            decode_row_runs(SCHEMA, rows, indirect)

    def together() -> None:
        decode_row_blocks(SCHEMA, blocks)

    scale = 1e6 / (calls * n)
    return (
        min(timeit.repeat(alone, number=calls, repeat=repeat)) * scale,
        min(timeit.repeat(together, number=calls, repeat=repeat)) * scale,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", default="1,4,16,64", help="comma-separated batch sizes")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print("| one-row blocks per batch | µs/block, one call each | µs/block, together | ratio |")
    print("|---:|---:|---:|---:|")
    for n in (int(b) for b in args.blocks.split(",")):
        alone, together = per_block_us(n, args.calls, args.repeat)
        print(f"| {n} | {alone:.1f} | {together:.1f} | {alone / together:.2f} |")


if __name__ == "__main__":
    main()
