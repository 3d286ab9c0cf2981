"""Injected WAL latency (``--log_inject_latency_ms``) is bounded and can be called off.

A probe set 20000 ms, then 0, and the next write still took 17 s: the appender was asleep
in ``time.sleep`` and saw the reset only when it woke. Now the sleep waits on a condition
that an options change wakes, and re-reads the options.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from pathlib import Path

import pytest

from raftlet.consensus.core.types import Entry
from raftlet.consensus.log.log import Log
from raftlet.consensus.log.options import MAX_INJECT_LATENCY_MS, LogOptions
from tests.waiting import wait_for

LONG_MS = 5000.0


def _in_injected_sleep(log: Log) -> bool:
    """True while the log's appender is inside ``_inject_latency`` (read off its stack, so
    the test knows the sleep has begun rather than guessing with a delay)."""
    ident = log._appender_ident
    frame = sys._current_frames().get(ident) if ident is not None else None
    while frame is not None:
        if frame.f_code.co_name == "_inject_latency":
            return True
        frame = frame.f_back
    return False


def _append(log: Log, index: int) -> threading.Event:
    done = threading.Event()
    log.append_async([Entry(1, index, data=b"x")], lambda _err: done.set())
    return done


def test_a_lower_latency_ends_a_sleep_under_way(tmp_path: Path) -> None:
    with Log.open(tmp_path, LogOptions(fsync=False, inject_latency_ms=LONG_MS)) as log:
        t0 = time.monotonic()
        first = _append(log, 1)
        wait_for(lambda: _in_injected_sleep(log), what="the appender asleep in the injection")
        log.options = dataclasses.replace(log.options, inject_latency_ms=0.0)
        assert first.wait(LONG_MS / 1000)
        # A correctness bound, not a performance claim: well before the 5 s it was set to.
        assert time.monotonic() - t0 < LONG_MS / 1000 / 2
        # And the next write does not sleep at all.
        t1 = time.monotonic()
        assert _append(log, 2).wait(LONG_MS / 1000)
        assert time.monotonic() - t1 < LONG_MS / 1000 / 2


def test_a_lowered_latency_still_counts_the_time_already_slept(tmp_path: Path) -> None:
    # 5000 -> 300 ms: the sleep ends 300 ms after it began, not 300 ms after the change.
    with Log.open(tmp_path, LogOptions(fsync=False, inject_latency_ms=LONG_MS)) as log:
        first = _append(log, 1)
        wait_for(lambda: _in_injected_sleep(log), what="the appender asleep in the injection")
        t0 = time.monotonic()
        log.options = dataclasses.replace(log.options, inject_latency_ms=300.0)
        assert first.wait(LONG_MS / 1000)
        assert time.monotonic() - t0 < LONG_MS / 1000 / 2


def test_close_ends_an_injected_sleep(tmp_path: Path) -> None:
    log = Log.open(tmp_path, LogOptions(fsync=False, inject_latency_ms=LONG_MS))
    first = _append(log, 1)
    wait_for(lambda: _in_injected_sleep(log), what="the appender asleep in the injection")
    t0 = time.monotonic()
    log.close()
    assert first.is_set()  # close still finishes (and reports) what was queued
    assert time.monotonic() - t0 < LONG_MS / 1000 / 2


@pytest.mark.parametrize("field", ["inject_latency_ms", "inject_latency_jitter_ms"])
@pytest.mark.parametrize(
    "value", [-1.0, MAX_INJECT_LATENCY_MS + 1, 1e12, float("nan"), float("inf")]
)
def test_log_options_refuse_latency_out_of_range(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=r"injected latency must be in 0\.\.10000 ms"):
        LogOptions(**{field: value})  # type: ignore[arg-type]


def test_log_options_take_the_bounds() -> None:
    LogOptions(inject_latency_ms=0.0, inject_latency_jitter_ms=MAX_INJECT_LATENCY_MS)
    LogOptions(inject_latency_ms=MAX_INJECT_LATENCY_MS, inject_latency_jitter_ms=0.0)
