"""Consensus metadata: atomic, checksummed, and a missing file is a fresh replica."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftlet.consensus.core.types import HardState
from raftlet.consensus.log import ConsensusMetadata, MetadataCorruptionError, PersistentState
from raftlet.consensus.log import metadata as metadata_module

STATE = PersistentState(current_term=7, voted_for="b", voters=("a", "b", "c"), commit_index=42)


def test_missing_file_is_a_fresh_replica(tmp_path: Path) -> None:
    meta = ConsensusMetadata.load(tmp_path)
    assert meta.fresh
    assert meta.state == PersistentState()
    assert meta.hard_state() == HardState()


def test_round_trip(tmp_path: Path) -> None:
    ConsensusMetadata.load(tmp_path).save(STATE)
    meta = ConsensusMetadata.load(tmp_path)
    assert not meta.fresh
    assert meta.state == STATE
    assert meta.hard_state() == HardState(term=7, vote="b", commit=42)


def test_save_hard_state_keeps_the_voters(tmp_path: Path) -> None:
    meta = ConsensusMetadata.load(tmp_path)
    meta.save(STATE)
    meta.save_hard_state(HardState(term=8, vote="", commit=50))
    again = ConsensusMetadata.load(tmp_path).state
    assert again == PersistentState(
        current_term=8, voted_for="", voters=STATE.voters, commit_index=50
    )


def test_save_leaves_no_temporary_file(tmp_path: Path) -> None:
    ConsensusMetadata.load(tmp_path).save(STATE)
    assert sorted(os.listdir(tmp_path)) == [metadata_module.FILE_NAME]


def test_leftover_temporary_file_is_ignored(tmp_path: Path) -> None:
    tmp = tmp_path / (metadata_module.FILE_NAME + metadata_module.TEMP_SUFFIX)
    tmp.write_bytes(b"half a file from a crash before the rename")
    assert ConsensusMetadata.load(tmp_path).fresh
    ConsensusMetadata.load(tmp_path).save(STATE)
    tmp.write_bytes(b"another crash")
    assert ConsensusMetadata.load(tmp_path).state == STATE
    ConsensusMetadata.load(tmp_path).save(PersistentState(current_term=9))
    assert ConsensusMetadata.load(tmp_path).state.current_term == 9


def test_crash_before_the_rename_keeps_the_old_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meta = ConsensusMetadata.load(tmp_path)
    meta.save(STATE)

    def crash(src: str, dst: str) -> None:
        raise OSError("power cut")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        meta.save(PersistentState(current_term=99))
    monkeypatch.undo()
    assert ConsensusMetadata.load(tmp_path).state == STATE


def test_save_syncs_the_file_and_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_fsync = os.fsync
    real_replace = os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync-file" if os.path.isfile(f"/proc/self/fd/{fd}") else "fsync-dir")
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        calls.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    ConsensusMetadata.load(tmp_path).save(STATE)
    assert calls == ["fsync-file", "rename", "fsync-dir"]


@pytest.mark.parametrize(
    ("damage", "offset"),
    [
        (lambda b: b[:-1], 12),  # truncated
        (lambda b: b[:10], 0),  # shorter than the header
        (lambda b: b"X" + b[1:], 0),  # magic
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), 20),  # payload bit flip
        (lambda b: b[:12] + bytes([b[12] ^ 4]) + b[13:], 12),  # length field
        (lambda b: b + b"\0", 12),  # trailing garbage
    ],
)
def test_a_damaged_file_is_an_error_naming_it(tmp_path: Path, damage: object, offset: int) -> None:
    ConsensusMetadata.load(tmp_path).save(STATE)
    path = tmp_path / metadata_module.FILE_NAME
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    with pytest.raises(MetadataCorruptionError) as exc:
        ConsensusMetadata.load(tmp_path)
    assert exc.value.path == str(path)
    assert exc.value.offset == offset
    assert str(path) in str(exc.value)


def test_a_save_into_a_directory_that_vanished_fails_and_makes_nothing(tmp_path: Path) -> None:
    """A replica directory wiped under a running server: its next save (a new term, a
    clean stop) once made the directory again with a term and vote in it -- and nothing
    else, so the replica reopened as a voter that forgot what it acknowledged."""
    directory = tmp_path / "kv-p0"
    directory.mkdir()
    meta = ConsensusMetadata.load(directory)
    meta.save(STATE)
    for child in directory.iterdir():
        child.unlink()
    directory.rmdir()
    with pytest.raises(FileNotFoundError):
        meta.save(STATE)
    assert not directory.exists()
