"""A server's log lines carry their time in UTC, ISO 8601 with the zone said."""

from __future__ import annotations

import logging
import time

import pytest

from raftlet.tserver.main import LOG_FORMAT, UtcFormatter


def test_a_log_line_says_its_time_in_utc_whatever_the_hosts_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record = logging.LogRecord("raftlet.x", logging.INFO, __file__, 1, "hello", None, None)
    record.created, record.msecs = 1_796_000_000.25, 250.0  # 2026-11-30 00:53:20.250 UTC
    record.threadName = "MainThread"
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # nine hours from UTC: a local time would show
    time.tzset()
    try:
        line = UtcFormatter(LOG_FORMAT).format(record)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert line == "2026-11-30T00:53:20.250Z INFO MainThread raftlet.x: hello"
