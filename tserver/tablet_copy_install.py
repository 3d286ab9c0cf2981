"""Installing a tablet copy: the new replica directory is built aside, then swapped in whole.

A copy arrives as a store file (``tablet_copy_client``) plus what the source said about it:
the applied entry it holds (index, term), the source's term and voters. Next to the store,
``build_replica_dir`` writes

- a log whose only entry is a stand-in NO_OP at (index, term): the leader's next append is
  checked against that term, and the store already holds everything up to it, so nothing
  before it is ever read or sent (``consensus.log.write_log_start``);
- consensus metadata: the commit index is the copy's index, and the term and vote are this
  replica's own when it is at the source's term -- a copy never makes a replica forget a
  vote it cast -- or else the source's term with a vote for the source, the leader of that
  term (harmless: it already won), so that a replica whose metadata was lost cannot vote
  twice in the term it learns.

``swap_in`` then replaces the live directory by two renames inside the data directory,
with the old one kept under ``.tablet-copy/<tablet>.replaced`` until the new one is in
place. A crash at any point leaves either the old replica or the new one, never a mix:
``recover_interrupted_copies`` (at server start) puts the old directory back if the new one
never arrived, and removes half-built staging directories and source snapshots. So the old
state stays intact unless a complete, verified copy replaced it. It keeps the note a copy
leaves while it runs (``note_copy_under_way``): a copy a crash cut short is begun again at
start (``interrupted_copies``), since no leader asks a replica that looks healthy again
before its abandoned session times out at the source.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from raftlet.consensus.core import Entry, EntryType
from raftlet.consensus.log import ConsensusMetadata, LogOptions, PersistentState, write_log_start
from raftlet.consensus.log.raft_storage import WAL_DIR
from raftlet.consensus.log.segment import fsync_dir, unused_path
from raftlet.tserver.remove_tree import remove_tree

__all__ = [
    "COPY_DIR",
    "CopiedState",
    "CopyNotNeeded",
    "CopyRefused",
    "SnapshotInfo",
    "build_replica_dir",
    "clear_replaced",
    "copy_ended",
    "installed_term_and_vote",
    "interrupted_copies",
    "note_copy_under_way",
    "outgoing_snapshot",
    "recover_interrupted_copies",
    "replaced_dir",
    "staging_dir",
    "swap_in",
]

logger = logging.getLogger(__name__)

# Under the server's data directory, so every rename stays within one file system; a
# dot-name, so nothing that lists replica directories ever takes it for a tablet.
COPY_DIR = ".tablet-copy"
_STAGING = ".staging"
_REPLACED = ".replaced"
_OUTGOING_PREFIX = "out-"
_UNDER_WAY = ".copying"


class CopyRefused(Exception):
    """This replica must not install the copy: it knows a newer term than the source's."""


class CopyNotNeeded(Exception):
    """This replica already holds the tablet as far as the copy reaches, up to ``index``
    (its commit index, or the copy's entry itself, which by Raft's log matching means the
    same log up to there): installing would only take back entries it may have
    acknowledged. The source is told it holds ``index``, and replication goes on from it."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index


class SnapshotInfo(NamedTuple):
    """What a source's store snapshot holds: its applied entry, the source's term, and the
    latest membership the source knows committed (with its CONFIG entry's index)."""

    # Shadows tuple.index(), which nothing calls on it.
    index: int  # type: ignore[assignment]
    term: int
    source_term: int
    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()
    config_index: int = 0


@dataclass(frozen=True, slots=True)
class CopiedState:
    """What a copy holds and where it came from."""

    index: int
    term: int
    source_uuid: str
    source_term: int
    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()
    config_index: int = 0


def staging_dir(data_dir: Path, tablet_id: str) -> Path:
    return data_dir / COPY_DIR / (tablet_id + _STAGING)


def replaced_dir(data_dir: Path, tablet_id: str) -> Path:
    return data_dir / COPY_DIR / (tablet_id + _REPLACED)


def outgoing_snapshot(data_dir: Path, session_id: str) -> Path:
    return data_dir / COPY_DIR / f"{_OUTGOING_PREFIX}{session_id}.sqlite"


def note_copy_under_way(data_dir: Path, tablet_id: str, sources: list[str]) -> None:
    """Leave a note that ``tablet_id`` is being copied from ``sources`` (removed by
    ``copy_ended``): one a crash leaves behind names a copy to begin again at start."""
    note = data_dir / COPY_DIR / (tablet_id + _UNDER_WAY)
    tmp = note.with_name(note.name + ".tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text("".join(s + "\n" for s in sources))
    os.replace(tmp, note)  # never a torn note


def copy_ended(data_dir: Path, tablet_id: str) -> None:
    (data_dir / COPY_DIR / (tablet_id + _UNDER_WAY)).unlink(missing_ok=True)


def interrupted_copies(data_dir: Path) -> dict[str, list[str]]:
    """Tablet -> the sources of every copy a crash cut short (their notes are removed)."""
    root = data_dir / COPY_DIR
    if not root.is_dir():
        return {}
    found: dict[str, list[str]] = {}
    for note in sorted(root.glob("*" + _UNDER_WAY)):
        try:
            sources = [line for line in note.read_text().split() if line]
        except (OSError, UnicodeDecodeError):
            sources = []
        note.unlink(missing_ok=True)
        found[note.name[: -len(_UNDER_WAY)]] = sources
    return found


def installed_term_and_vote(own: PersistentState | None, copied: CopiedState) -> tuple[int, str]:
    """The term and vote the installed replica starts with (see the module docstring)."""
    own_term = own.current_term if own is not None else 0
    if own_term > copied.source_term:
        raise CopyRefused(
            f"this replica is at term {own_term}, past the copy's source "
            f"({copied.source_uuid} at term {copied.source_term})"
        )
    if own is not None and own_term == copied.source_term:
        return own_term, own.voted_for
    return copied.source_term, copied.source_uuid


def build_replica_dir(
    staging: Path, copied: CopiedState, own: PersistentState | None, log_options: LogOptions
) -> None:
    """Complete the replica directory ``staging``, which already holds the verified store:
    its log start and metadata, all durable on return."""
    term, vote = installed_term_and_vote(own, copied)
    write_log_start(
        staging / WAL_DIR, Entry(copied.term, copied.index, EntryType.NO_OP), log_options
    )
    meta = ConsensusMetadata(str(staging), PersistentState(), fresh=True, sync=log_options.fsync)
    # The membership: the source's latest committed one. Its CONFIG entry may lie past the
    # copy's index; the leader sends it again with what follows (the entry is re-applied,
    # the same membership), and a log without it falls back to this committed one.
    meta.save(
        PersistentState(
            current_term=term,
            voted_for=vote,
            voters=copied.voters,
            commit_index=copied.index,
            learners=copied.learners,
            config_index=copied.config_index,
            committed_voters=copied.voters,
            committed_learners=copied.learners,
            committed_config_index=copied.config_index,
        )
    )


def clear_replaced(replaced: Path) -> None:
    """Remove what an earlier copy of the tablet replaced and could not remove (an
    immutable or read-only file?), or raise ``OSError`` saying what to do: the next copy
    needs its place, and downloading one only to fail at the swap repeated for ever."""
    if not replaced.exists():
        return
    try:
        remove_tree(replaced)
    except OSError as e:
        raise OSError(
            e.errno,
            f"{e.strerror}: {e.filename} stays from the replica an earlier tablet copy "
            f"replaced, and the next copy needs its place: remove {replaced} by hand "
            "(`chattr -i` a file made immutable); the copy is tried again by itself",
        ) from e


def swap_in(live: Path, staging: Path, replaced: Path) -> None:
    """Replace the directory ``live`` by ``staging`` (see the module docstring)."""
    clear_replaced(replaced)
    if live.exists():
        _carry_cut_bytes(live / WAL_DIR, staging / WAL_DIR)
        os.rename(live, replaced)
    os.rename(staging, live)
    fsync_dir(live.parent)
    fsync_dir(replaced.parent)
    shutil.rmtree(replaced, ignore_errors=True)
    if replaced.exists():  # the copy is in: only the old files stay behind, said so
        logger.warning(
            "tablet copy: the replaced replica %s could not all be removed (an immutable or "
            "read-only file?); remove it by hand -- the next copy of this tablet needs its "
            "place",
            replaced,
        )


def _carry_cut_bytes(old_wal: Path, new_wal: Path) -> None:
    """Move the bytes the old log cut at open (``wal-….seg.cut-at-OFFSET``) into the new
    replica's log directory: kept as evidence of damage a disk may have done, they went with
    the replaced replica -- and that damage (a synced record cut) is what ends in a copy."""
    kept = sorted(old_wal.glob("*.cut-at-*")) if old_wal.is_dir() else []
    if not kept or not new_wal.is_dir():
        return
    for path in kept:
        target = unused_path(new_wal / path.name)
        os.rename(path, target)
        logger.warning(
            "tablet copy: %s, cut from the replaced replica's log, is now %s", path.name, target
        )
    fsync_dir(new_wal)
    fsync_dir(old_wal)


def recover_interrupted_copies(data_dir: Path) -> list[str]:
    """Finish what a crash interrupted under ``data_dir``: a replaced directory whose live
    one is missing goes back; any other leftover is removed. Returns the tablet ids whose
    old directory was put back."""
    root = data_dir / COPY_DIR
    if not root.is_dir():
        return []
    restored: list[str] = []
    for entry in sorted(root.iterdir()):
        name = entry.name
        if name.endswith(_REPLACED):
            tablet_id = name[: -len(_REPLACED)]
            live = data_dir / tablet_id
            if live.exists():
                shutil.rmtree(entry, ignore_errors=True)  # the swap had finished
            else:
                os.rename(entry, live)
                restored.append(tablet_id)
                logger.warning(
                    "tablet %s: a tablet copy was interrupted mid-install; the old replica "
                    "is back in place",
                    tablet_id,
                )
        elif name.endswith(_UNDER_WAY):
            continue  # for the copier, which begins that copy again (interrupted_copies)
        elif entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)  # a copy that never completed
        else:
            entry.unlink(missing_ok=True)  # a source's snapshot of a session now gone
    fsync_dir(data_dir)
    return restored
