"""What a tablet replica's files take on disk: its WAL segments and its SQLite row store.

Read when asked -- a ``/metrics`` scrape, a ``/tablets`` page -- with one ``stat`` per file,
never kept up to date on the write path: a write costs the same whether anyone watches the
disk or not. A running replica's segments are the ones its open log lists (no directory is
read); a FAILED replica has no open log, so its ``wal`` directory is listed instead (one
``listdir`` of a few dozen names, and only while it is FAILED).

Sizes are file sizes (``st_size``), as ``/tablets`` has always shown ``log_bytes``: the
segment being written also holds up to ``--log_segment_size_bytes`` reserved with
``fallocate`` (``consensus.log.prealloc``), which ``du`` counts and these figures do not.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from raftlet.consensus.log.raft_storage import WAL_DIR
from raftlet.consensus.log.segment import parse_segment_name
from raftlet.tserver.bootstrap import STORE_FILE

__all__ = [
    "STORE_SUFFIXES",
    "DiskUsage",
    "directory_usage",
    "files_bytes",
    "store_bytes",
    "store_files",
    "tree_bytes",
]

# SQLite in WAL mode keeps the store in three files; its own -wal grows between checkpoints
# and can outweigh the main file, so leaving it out would hide exactly the growth to alert on.
STORE_SUFFIXES = ("", "-wal", "-shm")


@dataclass(frozen=True, slots=True)
class DiskUsage:
    log_bytes: int
    log_segments: int
    store_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.log_bytes + self.store_bytes


def files_bytes(paths: Iterable[str | os.PathLike[str]]) -> int:
    """The sum of the sizes of ``paths``; one that is gone counts 0 (log GC may delete a
    segment between its listing and its ``stat``, and SQLite removes its -wal on close)."""
    total = 0
    for path in paths:
        try:
            total += os.stat(path).st_size
        except OSError:
            continue
    return total


def store_files(store: Path) -> list[Path]:
    """The files of the SQLite store at ``store``: itself, its -wal and its -shm."""
    return [Path(f"{store}{suffix}") for suffix in STORE_SUFFIXES]


def store_bytes(store: Path) -> int:
    """What the SQLite store at ``store`` takes, its -wal and -shm included."""
    return files_bytes(store_files(store))


def directory_usage(directory: Path) -> DiskUsage:
    """The usage of the replica in ``directory`` read from the directory alone (a FAILED
    replica's, which has no open log); all 0 where it holds nothing readable."""
    wal = directory / WAL_DIR
    try:
        names = [n for n in os.listdir(wal) if parse_segment_name(n) is not None]
    except OSError:
        names = []
    return DiskUsage(
        log_bytes=files_bytes(wal / n for n in names),
        log_segments=len(names),
        store_bytes=store_bytes(directory / STORE_FILE),
    )


def tree_bytes(root: Path) -> int:
    """What the files under ``root`` take (0 if it does not exist): for the tablet-copy
    area, a handful of directories while copies run, empty otherwise.  A file or directory
    removed during the walk (a copy ending) counts 0."""
    total = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                total += tree_bytes(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total
