"""What a piece of code fsyncs, for the tests that hold its durability steps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The path of every file or directory fsynced from now on (the fsync still happens)."""
    synced: list[Path] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return synced
