"""One server per data directory, and always the same one.

Each replica's WAL directory has a lock of its own (``consensus.log``), but that came too
late and meant the wrong thing: a second ``raftlet tserver`` started on a running server's
``--data_dir`` found every WAL locked, took each tablet for damaged, and its repair copied
the tablets from their leaders *over the directories the running server was writing to* --
which then went on acknowledging appends into deleted files (a review lost 250 entries a
voter had acknowledged that way). And a data directory started under another
``--server_id`` opened that server's replicas as its own.

So before a server reads or writes anything under its data directory it takes an
exclusive ``flock`` on ``<data_dir>/server.lock`` -- released by the kernel however the
process ends, so a crash never leaves it behind -- and checks ``<data_dir>/server_id``:
written on the first start, refused ever after when it names another server.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from raftlet.consensus.log.segment import replace_durably

__all__ = ["ID_FILE", "LOCK_FILE", "DataDirLock", "ForeignDataDir"]


class ForeignDataDir(OSError):
    """The data directory is another server's: a configuration error, not a passing one
    (the server exits 2, which a supervisor does not restart on)."""


LOCK_FILE = "server.lock"
ID_FILE = "server_id"


class DataDirLock:
    """Held from before a server touches its data directory until it has stopped."""

    def __init__(self, data_dir: Path, fd: int) -> None:
        self.data_dir = data_dir
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: Path, server_id: str) -> DataDirLock:
        """Lock ``data_dir`` for ``server_id`` (making the directory if need be); an
        ``OSError`` that says why not otherwise."""
        where = f"--data_dir {data_dir}"
        if data_dir.exists() and not data_dir.is_dir():
            raise OSError(f"{where}: not a directory")
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                raise OSError(
                    f"{where} is in use by another process (pid {holder}): two servers "
                    f"must never share a data directory"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            _check_owner(data_dir, server_id, where)
        except BaseException:
            os.close(fd)
            raise
        return cls(data_dir, fd)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None


def _check_owner(data_dir: Path, server_id: str, where: str) -> None:
    path = data_dir / ID_FILE
    try:
        owner = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        # A first start, or a directory from before the file existed: it is ours now.
        replace_durably(path, f"{server_id}\n")
        return
    except (OSError, UnicodeDecodeError) as e:
        raise OSError(f"{where}: {ID_FILE} is unreadable ({e})") from None
    if not owner:
        # Torn by a crash of a filesystem that keeps no order, or emptied by hand.
        raise OSError(
            f"{where}: {ID_FILE} is empty; if this directory is {server_id}'s, write "
            f"'{server_id}' into {path}"
        )
    if owner != server_id:
        raise ForeignDataDir(
            f"{where} belongs to server {owner!r}, not {server_id!r}: start {owner} on it, "
            f"or give {server_id} a data directory of its own"
        )
