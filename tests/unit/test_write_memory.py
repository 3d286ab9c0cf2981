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
from raftlet.tserver.write_memory import WRITE_OVERHEAD_BYTES, MemoryLimitExceeded, WriteMemory

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
