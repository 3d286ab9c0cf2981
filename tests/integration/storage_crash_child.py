"""A single-replica write loop at full speed, to be SIGKILLed by test_storage_crash.

It opens (and so recovers) the replica in DIR, makes itself leader of a one-voter Raft
group, and then forever proposes writes, hands each Ready's entries to the WAL's group
commit (several readies in flight), and applies what commits to the store.  After an
entry is durable it prints ``ACK <index> <term>`` on stdout: the parent holds the replica
to every acknowledged entry.  It prints ``READY <replayed>`` once open.
"""

from __future__ import annotations

import queue
import sys
from collections.abc import Callable

from raftlet.consensus.core import Config, Entry, RawNode, Ready
from raftlet.consensus.log.options import LogOptions
from raftlet.proto import tablet_pb2
from raftlet.schema.row_block import encode_row_block
from raftlet.schema.rows import OpType, encode_row_op
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from raftlet.tserver.bootstrap import apply_entries, open_replica

SCHEMA = Schema(
    [
        ColumnSchema("k", DataType.INT64, is_key=True),
        ColumnSchema("v", DataType.STRING, nullable=True),
    ]
)
ROWS_PER_ENTRY = 3
MAX_IN_FLIGHT = 8
APPLY_LUMP = 24
VOTER = "n1"


def write_for(index: int) -> bytes:
    """The write an entry at ``index`` carries: keys unique to the index, so a double
    apply shows up as KEY_EXISTS and a lost one as a missing key. Odd indexes carry their
    rows as a packed row block, even ones in the per-cell form: recovery replays both."""
    op = tablet_pb2.WriteOperationPB()
    rows = [
        {"k": index * 1000 + j, "v": f"value-{index}-{j}-" + "x" * (index % 50)}
        for j in range(ROWS_PER_ENTRY)
    ]
    if index % 2:
        op.row_block.rows, op.row_block.indirect = encode_row_block(
            SCHEMA, [(OpType.INSERT, row) for row in rows]
        )
    else:
        op.ops.extend(encode_row_op(SCHEMA, OpType.INSERT, row) for row in rows)
    return op.SerializeToString()


def _report_to(
    durable: queue.Queue[tuple[Ready, BaseException | None]], rd: Ready
) -> Callable[[BaseException | None], None]:
    # Runs on the WAL's appender thread; the core is only touched by the main thread.
    def callback(error: BaseException | None) -> None:
        durable.put((rd, error))

    return callback


def main(directory: str) -> None:
    opened = open_replica(directory, SCHEMA, [VOTER], LogOptions(segment_size_bytes=64 * 1024))
    store, storage = opened.store, opened.storage
    node = RawNode(
        Config(id=VOTER, voters=(VOTER,), applied=store.applied_index(), seed=1), storage
    )
    node.campaign()
    print(f"READY {opened.replayed}", flush=True)
    durable: queue.Queue[tuple[Ready, BaseException | None]] = queue.Queue()
    in_flight = 0
    readies = 0
    to_apply: list[Entry] = []
    while True:
        if in_flight < MAX_IN_FLIGHT:
            node.propose(write_for(node.raft.log.last_index() + 1))
        rd = node.ready()
        readies += 1
        if rd.hard_state is not None and (rd.must_sync or readies % 7 == 0):
            # Term and vote must be durable before anything depends on them; the commit
            # index only now and then, so recovery sees a lagging one too.
            storage.save_hard_state(rd.hard_state)
        # Apply in lumps, so a kill often finds the saved commit index ahead of the store
        # and opening has to replay from the log.
        to_apply.extend(rd.committed_entries)
        if len(to_apply) >= APPLY_LUMP:
            for result in apply_entries(store, to_apply):
                if result.row_errors:
                    raise SystemExit(f"entry {result.index} failed rows: {result.row_errors}")
            node.on_applied(to_apply[-1].index)
            to_apply = []
        if rd.entries:
            in_flight += 1
            storage.append_async(rd.entries, _report_to(durable, rd))
        else:
            node.on_persisted(rd)
        # Block for an acknowledgement only when the pipeline is full.
        while in_flight and (in_flight >= MAX_IN_FLIGHT or not durable.empty()):
            done, error = durable.get()
            if error is not None:
                raise SystemExit(f"WAL append failed: {error!r}")
            in_flight -= 1
            node.on_persisted(done)
            last = done.entries[-1]
            print(f"ACK {last.index} {last.term}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
