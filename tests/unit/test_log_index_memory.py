"""The log index's records cost a few dozen bytes each, not an object each: a leader whose
follower was down for five minutes held ~240,000 records of every tablet, and grew 70 MiB
doing so (review r31a; ~160 bytes a record as objects)."""

from __future__ import annotations

import tracemalloc

from raftlet.consensus.log.index import LogIndex, Rec

RECORDS = 50_000


def test_a_record_costs_under_sixty_four_bytes_with_its_entry() -> None:
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        index = LogIndex(1)
        for i in range(1, RECORDS + 1):
            index.append_one(7)
            index.add_record(Rec(i, 1, 1 + i // 10_000, 1_000_000 + 150 * i, 150))
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (after - before) / RECORDS < 64
    # And the records read back as they went in, GC and all.
    k = index.first_rec_after_segment(3)
    assert index.rec_at(k).first == 30_000
    index.drop_prefix(k)
    assert (index.first, index.rec_count()) == (30_000, RECORDS - 30_000 + 1)
    position, rec = index.locate(40_000)
    assert (position, rec.first, rec.seq, rec.offset, rec.frame_size) == (
        10_000,
        40_000,
        5,
        1_000_000 + 150 * 40_000,
        150,
    )
    assert index.live_end(position) == 40_000
