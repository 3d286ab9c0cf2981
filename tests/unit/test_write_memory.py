"""The server's budget for admitted writes (``tserver.write_memory``), and how a refusal
reaches a client: RESOURCE_EXHAUSTED with MEMORY_LIMIT, retried with backoff."""

from __future__ import annotations

import logging
import threading

import grpc
import pytest

from raftlet.client.retry import Action, Cause, classify_error_pb, classify_status
from raftlet.proto.common_pb2 import ServerErrorPB
from raftlet.tserver.rpc_dispatch import status_for
from raftlet.tserver.write_memory import (
    RESERVATION_S,
    WRITE_OVERHEAD_BYTES,
    MemoryLimitExceeded,
    WriteMemory,
)

LIMIT = 1 << 20


def test_a_write_is_charged_its_bytes_and_the_overhead_until_it_gives_them_back() -> None:
    memory = WriteMemory(LIMIT)
    a = memory.take(1000)
    b = memory.take(500)
    assert (a, b) == (1000 + WRITE_OVERHEAD_BYTES, 500 + WRITE_OVERHEAD_BYTES)
    assert memory.held() == a + b
    memory.give(a)
    memory.give(b)
    assert memory.held() == 0


def test_past_the_limit_a_write_is_refused_and_counted_and_nothing_is_charged() -> None:
    memory = WriteMemory(LIMIT)
    charge = memory.take(LIMIT - WRITE_OVERHEAD_BYTES - 10)
    with pytest.raises(MemoryLimitExceeded, match=r"--write_memory_limit_bytes=1048576"):
        memory.take(100)
    assert memory.held() == charge
    assert memory.refusals.value() == 1
    memory.give(charge)
    memory.give(memory.take(100))  # room again once the first is answered
    assert memory.held() == 0


def test_a_server_that_holds_nothing_admits_a_write_larger_than_the_limit() -> None:
    memory = WriteMemory(LIMIT)
    charge = memory.take(4 * LIMIT)
    with pytest.raises(MemoryLimitExceeded):
        memory.take(1)
    memory.give(charge)
    assert memory.held() == 0


def test_a_refused_write_keeps_room_for_itself_against_a_stream_of_small_ones() -> None:
    """Small writes kept coming and each found room first: 8 MB batches failed 7 times
    in 8 against a stream of 4 KB writes."""
    now = [0.0]
    memory = WriteMemory(LIMIT, clock=lambda: now[0])
    small = 10_000
    held = [memory.take(small) for _ in range(60)]  # ~720 KB of 1 MiB
    with pytest.raises(MemoryLimitExceeded):
        memory.take(400_000)
    # Room is kept for it: a small write that fits the budget alone does not get in.
    with pytest.raises(MemoryLimitExceeded, match="with 402048 kept for a larger write"):
        memory.take(small)
    for charge in held[:40]:
        memory.give(charge)
    now[0] += 0.4  # its retry, after a backoff
    big = memory.take(400_000)
    memory.take(small)  # it went: the room is free for all again
    memory.give(big)


def test_a_reservation_ends_when_its_writer_stops_retrying() -> None:
    now = [0.0]
    memory = WriteMemory(LIMIT, clock=lambda: now[0])
    held = memory.take(LIMIT // 2)
    with pytest.raises(MemoryLimitExceeded):
        memory.take(LIMIT)
    with pytest.raises(MemoryLimitExceeded):
        memory.take(1000)
    now[0] += RESERVATION_S
    memory.take(1000)  # nobody came back for the room
    memory.give(held)


def test_a_write_larger_than_the_limit_goes_once_the_server_drains() -> None:
    now = [0.0]
    memory = WriteMemory(LIMIT, clock=lambda: now[0])
    held = memory.take(1000)
    with pytest.raises(MemoryLimitExceeded):
        memory.take(2 * LIMIT)
    with pytest.raises(MemoryLimitExceeded):  # none after it, while it waits
        memory.take(1000)
    memory.give(held)
    with pytest.raises(MemoryLimitExceeded):  # nor on an empty server: the room is its
        memory.take(1000)
    memory.give(memory.take(2 * LIMIT))
    memory.give(memory.take(1000))
    assert memory.held() == 0


def test_refusals_are_logged_at_most_once_a_minute_with_how_many_were_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    memory = WriteMemory(LIMIT, clock=lambda: now[0])
    memory.take(LIMIT)
    caplog.set_level(logging.WARNING, logger="raftlet.tserver.write_memory")
    for _ in range(3):
        with pytest.raises(MemoryLimitExceeded):
            memory.take(1)
    assert len(caplog.records) == 1
    now[0] += 61
    with pytest.raises(MemoryLimitExceeded):
        memory.take(1)
    assert len(caplog.records) == 2
    assert "2 more since the last warning" in caplog.records[1].getMessage()
    assert memory.refusals.value() == 4


def test_takes_and_gives_from_many_threads_balance() -> None:
    memory = WriteMemory(1 << 40)
    start = threading.Barrier(4)

    def churn() -> None:
        start.wait()
        for n in range(5000):
            memory.give(memory.take(n))

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert memory.held() == 0


def test_a_refusal_is_resource_exhausted_and_the_client_backs_off_on_the_same_server() -> None:
    code, message, error = status_for(MemoryLimitExceeded("full"))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error is not None
    assert error.code == ServerErrorPB.MEMORY_LIMIT
    assert classify_status(code, error, message) == (Cause.RESOURCE_EXHAUSTED, Action.BACKOFF_SAME)
    # In a write stream's result item, the same.
    assert classify_error_pb(error).action is Action.BACKOFF_SAME


def test_a_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        WriteMemory(0)
