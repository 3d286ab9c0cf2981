"""The reason a replica that failed to open gives names a full disk: SQLite says "disk I/O
error" when it cannot make its -wal file there, which reads as failing hardware."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from raftlet.tserver import failed_tablet
from raftlet.tserver.failed_tablet import FailedTablet, open_or_fail
from raftlet.tserver.store import StoreError


def _fail() -> None:
    raise StoreError("tablet store x/store.sqlite: opening failed: disk I/O error")


def _opened_with_free(directory: Path, free: int, monkeypatch: pytest.MonkeyPatch) -> str:
    real = os.statvfs

    def statvfs(path: object) -> object:
        if os.fspath(path) == str(directory):  # type: ignore[call-overload]
            return SimpleNamespace(f_bavail=free, f_frsize=1)
        return real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(failed_tablet.os, "statvfs", statvfs)
    got = open_or_fail(
        _fail, tablet_id="kv-p0", table="kv", partition=0, voters=("ts1",), directory=directory
    )
    assert isinstance(got, FailedTablet)
    return got.reason


def test_an_open_failure_on_a_full_disk_says_how_little_is_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = _opened_with_free(tmp_path, 4096, monkeypatch)
    assert reason.startswith("StoreError: tablet store x/store.sqlite: opening failed")
    assert f"the filesystem holding {tmp_path} has 4,096 bytes free: a full disk?" in reason


def test_with_room_on_the_disk_the_reason_is_the_error_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = _opened_with_free(tmp_path, 10 << 30, monkeypatch)
    assert reason == "StoreError: tablet store x/store.sqlite: opening failed: disk I/O error"


def test_a_directory_that_is_gone_is_looked_up_through_its_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _opened_with_free(tmp_path, 4096, monkeypatch)  # tmp_path's filesystem is full
    got = open_or_fail(
        _fail,
        tablet_id="kv-p0",
        table="kv",
        partition=0,
        voters=("ts1",),
        directory=tmp_path / "gone",
    )
    assert isinstance(got, FailedTablet)
    assert f"the filesystem holding {tmp_path / 'gone'} has 4,096 bytes free" in got.reason
