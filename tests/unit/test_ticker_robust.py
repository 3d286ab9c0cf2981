"""The ticker cannot be killed by its own wait or a failing clock (either left a server
that answered RPCs but never ticked: no heartbeat, no election), and a process that stalls
on every tick logs it once a minute, with a count, not once a tick."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from raftlet.consensus.ticker import ManualTicker, Ticker
from tests.waiting import wait_for


class _RecordingStop:
    """The ticker's stop event, recording the waits asked of it (and what they raised)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.waits: list[float] = []
        self.errors: list[BaseException] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout if timeout is not None else -1.0)
        try:
            return self._event.wait(timeout)
        except BaseException as e:  # what a real wait past TIMEOUT_MAX raises
            self.errors.append(e)
            raise

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


def test_an_interval_longer_than_a_wait_can_be_does_not_kill_the_ticker() -> None:
    ticker = Ticker(1e10)  # --tick_interval_ms=1e13 once: OverflowError in the thread
    stop = _RecordingStop()
    ticker._stopping = stop  # type: ignore[assignment]
    ticker.start()
    try:
        wait_for(lambda: bool(stop.waits), what="the ticker's first wait")
    finally:
        ticker.stop()
    assert stop.errors == []
    assert stop.waits[0] <= threading.TIMEOUT_MAX


def test_a_ticker_whose_clock_fails_logs_an_error_and_ticks_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = {"n": 0}

    def clock() -> float:
        calls["n"] += 1
        if calls["n"] == 4:  # once, a few calls in
            raise RuntimeError("clock_gettime failed")
        return time.monotonic()

    ticker = Ticker(0.002, clock=clock)
    ticks: list[int] = []
    ticker.register(ticks.append)
    with caplog.at_level(logging.ERROR, logger="raftlet.consensus.ticker"):
        ticker.start()
        try:
            wait_for(lambda: calls["n"] > 4 and len(ticks) >= 10, what="ticks after the error")
        finally:
            ticker.stop()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "the Raft ticker failed; it ticks on" in errors[0].getMessage()
    assert errors[0].exc_info is not None


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_stalls_on_every_tick_are_logged_once_a_minute_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ticker = ManualTicker()
    clock = _Clock()
    ticker._log_clock = clock
    seen: list[float] = []
    ticker.register(lambda _n: None, seen.append)
    with caplog.at_level(logging.WARNING, logger="raftlet.consensus.ticker"):
        for i in range(1000):  # 0.001 ms ticks: every one of them "late"
            ticker.report_stall(0.001 + i / 1e6)
            clock.now += 0.01
        clock.now += 60.0  # a minute on: the next stall is logged, with the count
        ticker.report_stall(0.002)
    lines = [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]
    assert len(lines) == 2, lines[:5]
    # Every line, the first too, names the likely causes, and the lease clause is true in
    # the default read mode, where there is no lease.
    causes = (
        "; likely causes: the machine is overloaded, the process was paused or swapped out, "
        "or --tick_interval_ms is shorter than the process can keep; any leader lease ends "
        "(leases exist only with --leader_read_mode=lease)"
    )
    assert lines[0] == "the process stalled: a tick came 0.001 s late" + causes
    assert lines[1] == (
        "the process stalled: a tick came 0.002 s late (999 more since the last report, the "
        "longest 0.002 s late)" + causes
    )
    # Counting and the callbacks (leases end) are not rate-limited: only the log is.
    assert ticker.stalls == 1001
    assert len(seen) == 1001
