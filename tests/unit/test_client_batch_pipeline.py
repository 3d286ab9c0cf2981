"""The batch pipeline: windows of batches in flight per tablet, writes of one key kept in
order, batches cut by rows and by bytes, and an outcome for every row whatever happens."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from raftlet.client.batch_pipeline import BatchPipeline
from raftlet.client.errors import ClientClosed, RaftletError
from raftlet.client.write_batch import Operation
from raftlet.schema.rows import OpType
from tests.unit.client_fakes import KV_SCHEMA
from tests.waiting import wait_for

TIMEOUT = 10.0


def _op(index: int, key: int, tablet: str = "t0", nbytes: int = 10) -> Operation:
    return Operation(
        index,
        "kv",
        OpType.UPSERT,
        {"key": key},
        tablet,
        KV_SCHEMA,
        (b"r" * nbytes, b""),
        key.to_bytes(8, "big"),
        nbytes=nbytes,
    )


@dataclass
class _Harness:
    """A pipeline whose sends block until the test releases them."""

    window: int = 2
    max_rows: int = 2
    max_bytes: int = 1 << 20
    cond: threading.Condition = field(default_factory=threading.Condition)
    sent: list[list[int]] = field(default_factory=list)  # op indexes per batch, in send order
    release: dict[int, threading.Event] = field(default_factory=dict)  # by first index
    done: list[int] = field(default_factory=list)
    errors: list[RaftletError] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.executor = ThreadPoolExecutor(8)
        self.pipeline = BatchPipeline(
            self.cond,
            self.executor,
            self._send,
            self._on_done,
            max_rows=self.max_rows,
            max_bytes=self.max_bytes,
            window=self.window,
        )

    def _send(self, tablet_id: str, ops: list[Operation]) -> list[RaftletError]:
        gate = threading.Event()
        with self.cond:
            self.sent.append([op.index for op in ops])
            self.release[ops[0].index] = gate
            self.cond.notify_all()
        assert gate.wait(TIMEOUT)
        return []

    def _on_done(self, ops: list[Operation], errors: list[RaftletError]) -> None:
        self.done += [op.index for op in ops]
        self.errors += errors

    def add(self, *ops: Operation) -> None:
        with self.cond:
            self.pipeline.add_all(ops)

    def wait_sent(self, n: int) -> None:
        wait_for(lambda: len(self.sent) >= n, TIMEOUT, what=f"{n} batches sent")

    def finish(self, first_index: int) -> None:
        wait_for(lambda: first_index in self.release, TIMEOUT, what=f"batch {first_index}")
        self.release[first_index].set()

    def lowest(self) -> int | None:
        with self.cond:
            return self.pipeline.lowest_unfinished()

    def close(self) -> None:
        for gate in list(self.release.values()):
            gate.set()
        self.executor.shutdown(wait=True)


@pytest.fixture
def harness() -> _Harness:
    h = _Harness()
    yield h  # type: ignore[misc]
    h.close()


def test_a_tablet_has_at_most_a_window_of_batches_in_flight(harness: _Harness) -> None:
    harness.add(*(_op(i, key=i) for i in range(6)))  # three batches of two
    harness.wait_sent(2)
    assert sorted(harness.sent) == [[0, 1], [2, 3]]  # two pool threads: either may run first
    with harness.cond:
        assert harness.pipeline.in_flight() == 2
    harness.finish(2)  # the second answers first: the third may go
    harness.wait_sent(3)
    assert harness.sent[2] == [4, 5]
    assert harness.lowest() == 0  # the first is still unanswered
    harness.finish(0)
    harness.finish(4)
    wait_for(lambda: harness.lowest() is None, TIMEOUT, what="all answered")
    assert sorted(harness.done) == list(range(6))


def test_a_batch_waits_for_a_batch_in_flight_that_writes_one_of_its_keys(
    harness: _Harness,
) -> None:
    harness.add(_op(0, key=1), _op(1, key=2), _op(2, key=2), _op(3, key=3), _op(4, key=4))
    harness.wait_sent(1)
    # [2, 3] shares key 2 with [0, 1]: it waits although the window has room, and [4]
    # waits behind it so that batches still start in call order.
    with harness.cond:
        assert harness.pipeline.in_flight() == 1
    assert harness.sent == [[0, 1]]
    harness.finish(0)
    harness.wait_sent(3)
    assert sorted(harness.sent[1:]) == [[2, 3], [4]]


def test_tablets_do_not_wait_for_each_other(harness: _Harness) -> None:
    harness.add(*(_op(i, key=1, tablet="t0") for i in range(6)))  # one key: one at a time
    harness.add(_op(6, key=1, tablet="t1"))
    harness.wait_sent(2)
    assert sorted(map(tuple, harness.sent)) == [(0, 1), (6,)]


def test_batches_are_cut_by_bytes_and_a_large_row_goes_alone() -> None:
    h = _Harness(window=8, max_rows=100, max_bytes=100)
    try:
        h.add(_op(0, 0, nbytes=40), _op(1, 1, nbytes=40), _op(2, 2, nbytes=40))
        h.add(_op(3, 3, nbytes=500), _op(4, 4, nbytes=10))
        h.wait_sent(4)
        assert sorted(h.sent) == [[0, 1], [2], [3], [4]]
    finally:
        h.close()


def test_a_closed_executor_gives_every_row_an_error_not_a_hang(harness: _Harness) -> None:
    harness.executor.shutdown()
    harness.add(_op(0, 0), _op(1, 1), _op(2, 2))
    assert harness.lowest() is None
    assert sorted(harness.done) == [0, 1, 2]
    assert {type(e) for e in harness.errors} == {ClientClosed}
    assert sorted(e.row_index for e in harness.errors if e.row_index is not None) == [0, 1, 2]


def test_open_batches_wait_for_close_open() -> None:
    h = _Harness(max_rows=10)
    try:
        with h.cond:
            h.pipeline.add(_op(0, 0))
            assert h.pipeline.has_open()
            assert h.pipeline.lowest_unfinished() == 0
        assert h.sent == []
        with h.cond:
            h.pipeline.close_open()
        h.wait_sent(1)
        assert h.sent == [[0]]
    finally:
        h.close()
