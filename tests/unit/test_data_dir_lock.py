"""DataDirLock: one holder per data directory, the owner's id kept in it, clear refusals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftlet.tserver.data_dir_lock import ID_FILE, LOCK_FILE, DataDirLock


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    first = DataDirLock.acquire(tmp_path / "d", "ts1")
    try:
        # flock is per open file: a second open in this same process conflicts, as a
        # second server process would.
        with pytest.raises(OSError, match=rf"is in use by another process \(pid {os.getpid()}\)"):
            DataDirLock.acquire(tmp_path / "d", "ts1")
    finally:
        first.release()
    DataDirLock.acquire(tmp_path / "d", "ts1").release()  # released: free again
    assert (tmp_path / "d" / LOCK_FILE).exists()


def test_the_first_start_records_the_owner_and_others_are_refused(tmp_path: Path) -> None:
    DataDirLock.acquire(tmp_path, "ts1").release()
    assert (tmp_path / ID_FILE).read_text() == "ts1\n"
    with pytest.raises(OSError, match=r"belongs to server 'ts1', not 'ts2'"):
        DataDirLock.acquire(tmp_path, "ts2")
    # A refused start leaves the lock free for the owner.
    DataDirLock.acquire(tmp_path, "ts1").release()


def test_a_data_dir_that_is_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(OSError, match=r"--data_dir .*/f: not a directory"):
        DataDirLock.acquire(tmp_path / "f", "ts1")


def test_a_directory_without_an_id_file_is_adopted(tmp_path: Path) -> None:
    # A data directory from before the file existed holds replicas already: it is its
    # server's from now on.
    (tmp_path / "kv-p0").mkdir()
    DataDirLock.acquire(tmp_path, "ts3").release()
    assert (tmp_path / ID_FILE).read_text() == "ts3\n"


def test_an_empty_id_file_is_named_with_what_to_do(tmp_path: Path) -> None:
    (tmp_path / ID_FILE).write_text("\n")
    with pytest.raises(OSError, match=rf"{ID_FILE} is empty; if this directory is ts3's"):
        DataDirLock.acquire(tmp_path, "ts3")
