"""Consensus metadata: Raft's persistent state other than the log (term, vote, the membership
and the latest one committed with the indexes of their entries, commit index), one small file
per replica, replaced atomically.

File: magic ``b"RLTMETA\\n"`` | version (u32 LE) | length (u32 LE) | crc32c(payload) (u32 LE)
| payload, a serialized ``ConsensusMetadataPB``.

A save writes a temporary file, fdatasyncs it, renames it over the old one and fsyncs the
directory, so a crash leaves either the old or the new file, never a mix.  A leftover
temporary file (a crash before the rename) is ignored and overwritten by the next save.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from dataclasses import dataclass, field

import crc32c
from google.protobuf.message import DecodeError

from raftlet.consensus.core.membership import ConfState, Membership
from raftlet.consensus.core.types import NO_NODE, HardState
from raftlet.consensus.log.errors import (
    MetadataCorruptionError,
    MetadataNewerFormat,
    newer_release,
)
from raftlet.consensus.log.segment import fsync_dir
from raftlet.proto import consensus_pb2 as pb

__all__ = ["ConsensusMetadata", "PersistentState"]

FILE_NAME = "consensus-meta"
TEMP_SUFFIX = ".tmp"
_MAGIC = b"RLTMETA\n"
_VERSION = 1
_HEAD = struct.Struct("<8sIII")
_MAX_PAYLOAD = 1 << 20


@dataclass(frozen=True, slots=True)
class PersistentState:
    current_term: int = 0
    voted_for: str = NO_NODE
    voters: tuple[str, ...] = field(default=())
    commit_index: int = 0
    # The membership is voters + learners, from the CONFIG entry at config_index (0: the
    # initial one); the committed_* fields are the latest one known committed.
    learners: tuple[str, ...] = field(default=())
    config_index: int = 0
    committed_voters: tuple[str, ...] = field(default=())
    committed_learners: tuple[str, ...] = field(default=())
    committed_config_index: int = 0

    def hard_state(self) -> HardState:
        return HardState(term=self.current_term, vote=self.voted_for, commit=self.commit_index)

    def with_hard_state(self, hard_state: HardState) -> PersistentState:
        return dataclasses.replace(
            self,
            current_term=hard_state.term,
            voted_for=hard_state.vote,
            commit_index=hard_state.commit,
        )

    def membership(self) -> Membership:
        return Membership(self.voters, self.learners)

    def committed_membership(self) -> tuple[int, Membership]:
        """The latest membership known committed with its entry's index (the membership in
        use, at index 0, for metadata saved before memberships changed)."""
        if not self.committed_voters:
            return 0, self.membership()
        return self.committed_config_index, Membership(
            self.committed_voters, self.committed_learners
        )

    def with_conf_state(self, conf: ConfState) -> PersistentState:
        return dataclasses.replace(
            self,
            voters=conf.membership.voters,
            learners=conf.membership.learners,
            config_index=conf.index,
            committed_voters=conf.committed.voters,
            committed_learners=conf.committed.learners,
            committed_config_index=conf.committed_index,
        )


class ConsensusMetadata:
    """The metadata of one replica.  ``load`` it; ``save`` replaces it durably.

    Not thread-safe: the driver saves under its consensus lock.
    """

    def __init__(self, directory: str, state: PersistentState, *, fresh: bool, sync: bool) -> None:
        self.directory = directory
        self.path = os.path.join(directory, FILE_NAME)
        self._state = state
        self._fresh = fresh
        self._sync = sync

    @classmethod
    def load(cls, directory: str | os.PathLike[str], *, sync: bool = True) -> ConsensusMetadata:
        """Read the metadata in ``directory``; a missing file is a fresh replica (term 0,
        no vote, no voters).  A damaged file raises MetadataCorruptionError."""
        path = os.fspath(directory)
        try:
            with open(os.path.join(path, FILE_NAME), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return cls(path, PersistentState(), fresh=True, sync=sync)
        return cls(path, decode(data, os.path.join(path, FILE_NAME)), fresh=False, sync=sync)

    @property
    def state(self) -> PersistentState:
        return self._state

    @property
    def fresh(self) -> bool:
        """True until something was saved: no metadata existed when loaded."""
        return self._fresh

    def hard_state(self) -> HardState:
        return self._state.hard_state()

    def save(self, state: PersistentState) -> None:
        """Durably replace the metadata with ``state`` (returns once it is on disk).  The
        directory must exist: one that vanished under a running replica (wiped by hand)
        fails the save -- made again here, it held a term and vote beside no log, and the
        replica reopened as a voter that had forgotten what it acknowledged."""
        tmp = self.path + TEMP_SUFFIX
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            data = encode(state)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self._sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        if self._sync:
            fsync_dir(self.directory)
        self._state = state
        self._fresh = False

    def save_hard_state(self, hard_state: HardState) -> None:
        """Persist a Ready's hard state, keeping the membership."""
        self.save(self._state.with_hard_state(hard_state))

    def save_conf_state(self, conf: ConfState, hard_state: HardState | None = None) -> None:
        """Persist a Ready's membership (and its hard state, if any) in one save."""
        state = self._state if hard_state is None else self._state.with_hard_state(hard_state)
        self.save(state.with_conf_state(conf))


def encode(state: PersistentState) -> bytes:
    payload = pb.ConsensusMetadataPB(
        current_term=state.current_term,
        voted_for=state.voted_for,
        voters=list(state.voters),
        commit_index=state.commit_index,
        learners=list(state.learners),
        config_index=state.config_index,
        committed_voters=list(state.committed_voters),
        committed_learners=list(state.committed_learners),
        committed_config_index=state.committed_config_index,
    ).SerializeToString()
    return _HEAD.pack(_MAGIC, _VERSION, len(payload), crc32c.crc32c(payload)) + payload


def decode(data: bytes, path: str) -> PersistentState:
    if len(data) < _HEAD.size:
        raise MetadataCorruptionError(path, 0, f"file too short ({len(data)} bytes)")
    magic, version, length, crc = _HEAD.unpack_from(data, 0)
    if magic != _MAGIC:
        raise MetadataCorruptionError(path, 0, f"bad magic {magic!r}")
    if version > _VERSION:
        raise MetadataNewerFormat(path, 8, newer_release(version, _VERSION))
    if version != _VERSION:
        raise MetadataCorruptionError(path, 8, f"unsupported version {version}")
    if length > _MAX_PAYLOAD or _HEAD.size + length != len(data):
        raise MetadataCorruptionError(
            path, 12, f"length {length} does not match file size {len(data)}"
        )
    payload = data[_HEAD.size :]
    if crc32c.crc32c(payload) != crc:
        raise MetadataCorruptionError(path, _HEAD.size, "checksum mismatch")
    try:
        msg = pb.ConsensusMetadataPB.FromString(payload)
    except DecodeError as exc:
        raise MetadataCorruptionError(path, _HEAD.size, f"bad payload ({exc})") from None
    return PersistentState(
        current_term=msg.current_term,
        voted_for=msg.voted_for,
        voters=tuple(msg.voters),
        commit_index=msg.commit_index,
        learners=tuple(msg.learners),
        config_index=msg.config_index,
        committed_voters=tuple(msg.committed_voters),
        committed_learners=tuple(msg.committed_learners),
        committed_config_index=msg.committed_config_index,
    )
