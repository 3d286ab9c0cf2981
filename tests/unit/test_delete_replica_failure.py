"""DeleteReplica of a replica whose files cannot all be removed (an immutable WAL segment, a
read-only mount), on a real in-process tablet server. It once dropped the replica from the
server's maps before the removal raised: the request failed INTERNAL with a traceback, the
replica was listed nowhere, a rerun said "holds no replica", and no command could delete
what was left. Now it stays listed FAILED, saying which file and what to do, and a rerun
once the file is removable deletes it."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftlet.consensus.log.raft_storage import WAL_DIR
from raftlet.proto import admin_pb2, tablet_pb2, tablet_pb2_grpc
from raftlet.tserver.bootstrap import TOMBSTONE_FILE
from raftlet.tserver.hosted_tablets import HostedTablets
from raftlet.tserver.tablet_copy_install import replaced_dir
from tests.unit.fsync_recorder import record_fsyncs
from tests.unit.test_admin_fuzz import RPC_TIMEOUT_S, InProcessServer, leading_server


@pytest.fixture
def ts(tmp_path: Path) -> Iterator[InProcessServer]:
    with leading_server(tmp_path) as server:
        yield server


def _listed(ts: InProcessServer) -> dict[str, tablet_pb2.TabletStatusPB]:
    stub = tablet_pb2_grpc.TabletServiceStub(ts.channel)
    answer = stub.ListTablets(tablet_pb2.ListTabletsRequest(), timeout=RPC_TIMEOUT_S)
    return {t.tablet_id: t for t in answer.tablets}


def _delete(ts: InProcessServer) -> None:
    request = admin_pb2.DeleteReplicaRequest(tablet_id=ts.tablet_id, force=True)
    ts.admin.DeleteReplica(request, timeout=RPC_TIMEOUT_S)


def test_a_replica_whose_files_cannot_be_removed_stays_listed_and_a_rerun_deletes_it(
    ts: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    tid = ts.tablet_id
    data_dir = ts.server.settings.data_dir
    directory = data_dir / tid
    stuck = next((directory / WAL_DIR).iterdir())
    real_unlink = os.unlink

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        # A file that will not go (chattr +i does this as root); rmtree names it by its
        # name alone, relative to a directory it holds open.
        if Path(path).name == stuck.name:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(grpc.RpcError) as refused:
        _delete(ts)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = refused.value.details() or ""
    assert f"could not remove {stuck} (Operation not permitted)" in details
    assert f"run `raftlet tablet remove-replica {tid} ts1` again" in details

    # Still there for the operator and the commands: FAILED, saying why, and still hosted.
    status = _listed(ts)[tid]
    assert status.state == tablet_pb2.TABLET_STATE_FAILED
    assert str(stuck) in status.failure_reason
    assert f"`raftlet tablet remove-replica {tid} ts1` again" in status.failure_reason
    assert tid in (HostedTablets.load(data_dir).hosted or ())
    assert ts.server.tablets_needing_repair() == []  # no copy into what is half deleted
    # Refused the same way again while the file stays.
    with pytest.raises(grpc.RpcError) as again:
        _delete(ts)
    assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    monkeypatch.setattr(os, "unlink", real_unlink)  # the operator fixed the file
    _delete(ts)
    assert tid not in _listed(ts)
    assert (directory / TOMBSTONE_FILE).exists()
    assert tid not in (HostedTablets.load(data_dir).hosted or ())


def test_a_failed_replica_whose_copy_is_blocked_says_so_in_its_status(
    ts: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leftover of an earlier copy that would not go failed every repair of the tablet,
    and its status kept the old reason: the operator never learnt the repair was stuck."""
    tid = ts.tablet_id
    leftover = replaced_dir(ts.server.settings.data_dir, tid)
    leftover.mkdir(parents=True)
    stuck = leftover / "wal-0000000000000001.seg"
    stuck.write_bytes(b"x")
    real_unlink = os.unlink

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path).name == stuck.name:  # rmtree unlinks by name, in a directory it holds
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    copier = ts.server.copier
    assert copier._copy(tid, ["ts1"]) is False
    note = copier.failure_note(tid, "the store file is damaged")
    assert note.startswith("the store file is damaged; its repair by tablet copy fails: ")
    assert str(stuck) in note
    assert f"remove {leftover} by hand" in note
    assert copier.failure_note("another", "why") == "why"


def test_a_tombstone_and_its_directory_entry_are_made_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written without an fsync, a power cut could take the tombstone back and leave an
    empty replica directory, which the next start opened as a replica again."""
    from raftlet.tserver import server

    synced = record_fsyncs(monkeypatch)
    replica = tmp_path / "kv-p0"
    (replica / "wal").mkdir(parents=True)
    server._tombstone(replica)
    assert (replica / TOMBSTONE_FILE).read_text() == "deleted from its group\n"
    assert any(p.name.startswith(TOMBSTONE_FILE) for p in synced), synced
    assert replica in synced, synced  # the tombstone's entry in it
    assert tmp_path in synced, synced  # the directory's own entry
