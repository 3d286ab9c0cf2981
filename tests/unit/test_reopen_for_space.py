"""A replica whose log failed for want of disk space is opened again, as a restart would,
once its data directory has room: when a majority's disks filled together there was no
leader to copy from, and the tablet stayed down until someone restarted servers (review
r34a)."""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from raftlet.consensus.log.errors import LogFailedError
from raftlet.consensus.raft_consensus import out_of_space
from raftlet.tserver import server as server_module
from tests.unit.test_admin_fuzz import InProcessServer, leading_server
from tests.waiting import wait_for


def _enospc() -> LogFailedError:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise LogFailedError("log x: the log has failed") from e
    except LogFailedError as wrapped:
        return wrapped


def test_out_of_space_is_told_through_wrappers() -> None:
    assert out_of_space(_enospc())
    assert out_of_space(OSError(errno.EDQUOT, "Disk quota exceeded"))
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorname = "SQLITE_FULL"  # type: ignore[attr-defined]
    assert out_of_space(full)
    assert not out_of_space(OSError(errno.EIO, "Input/output error"))
    assert not out_of_space(LogFailedError("damaged"))


@pytest.fixture
def ts(tmp_path: Path) -> Iterator[InProcessServer]:
    with leading_server(tmp_path) as server:
        yield server


def test_a_log_failed_for_want_of_space_is_reopened_once_there_is_room(
    ts: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ts.server
    replica = server.replicas[ts.tablet_id]
    # Still full (the server's own repair pass runs meanwhile too): left as it is.
    full = SimpleNamespace(free=server.log_options.segment_size_bytes)
    real = server_module.shutil.disk_usage
    monkeypatch.setattr(server_module.shutil, "disk_usage", lambda _path: full)
    replica.consensus.log_failed(_enospc())
    wait_for(lambda: replica.failure_reason() is not None, what="the log fails")
    assert server.reopen_logs_failed_for_space() == []
    assert server.replicas[ts.tablet_id] is replica
    # Room again: opened anew (by this call, or by the repair pass before it), leading and
    # taking writes.
    monkeypatch.setattr(server_module.shutil, "disk_usage", real)
    wait_for(
        lambda: (
            bool(server.reopen_logs_failed_for_space())
            or server.replicas.get(ts.tablet_id) not in (None, replica)
        ),
        what="the replica reopened",
    )
    reopened = server.replicas[ts.tablet_id]
    assert reopened is not replica
    assert reopened.failure_reason() is None
    wait_for(lambda: ts.consensus_state().leader_uuid == "ts1", what="ts1 leads again")
    # A log that failed otherwise waits for a copy, as before.
    reopened.consensus.log_failed(LogFailedError("damaged"))
    wait_for(lambda: reopened.failure_reason() is not None, what="the log fails")
    assert server.reopen_logs_failed_for_space() == []
