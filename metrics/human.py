"""Numbers and times as people read them on status pages: binary units, short durations,
UTC timestamps (a page read from another time zone must not need converting)."""

from __future__ import annotations

import datetime

__all__ = ["cut", "human_bytes", "human_duration", "utc_time"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float) -> str:
    """``1536`` → ``"1.5 KiB"``; whole bytes below 1 KiB."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_duration(seconds: float) -> str:
    """``3725`` → ``"1h 2m 5s"``; the two largest units only, so it stays short."""
    s = max(0, int(seconds))
    parts = [(s // 86400, "d"), (s // 3600 % 24, "h"), (s // 60 % 60, "m"), (s % 60, "s")]
    shown = [f"{v}{u}" for v, u in parts if v]
    return " ".join(shown[:2]) or "0s"


def utc_time(epoch_s: float) -> str:
    """Seconds since the epoch as ``2026-12-01 13:05:09 UTC``; empty for 0 (never)."""
    if not epoch_s:
        return ""
    moment = datetime.datetime.fromtimestamp(epoch_s, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def cut(text: str) -> str:
    """``text`` for an error message: a value or name of thousands of characters was
    echoed whole (review r28v, r29v)."""
    return text if len(text) <= 80 else f"{text[:60]}...({len(text)} characters)"
