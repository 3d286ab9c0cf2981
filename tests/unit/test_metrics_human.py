"""Human units and UTC times on status pages."""

from __future__ import annotations

import pytest

from raftlet.metrics.human import human_bytes, human_duration, utc_time


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (5 << 20, "5.0 MiB")],
)
def test_bytes_in_binary_units(n: int, text: str) -> None:
    assert human_bytes(n) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59.9, "59s"), (61, "1m 1s"), (3725, "1h 2m"), (90061, "1d 1h")],
)
def test_durations_keep_the_two_largest_units(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


def test_times_are_utc_and_never_is_empty() -> None:
    assert utc_time(0) == ""
    assert utc_time(1_764_594_309) == "2025-12-01 13:05:09 UTC"
