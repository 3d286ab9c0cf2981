"""Removing a directory tree so that a failure names the whole path of what stayed.

``shutil.rmtree`` removes relative to each parent directory, so its ``OSError`` names only
the file (``Operation not permitted: 'wal-0000000000000001.seg'``), which an operator
cannot find; here it names the path."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

__all__ = ["remove_tree"]


def remove_tree(directory: Path) -> None:
    """Remove ``directory`` and everything under it; ``OSError`` names the first path that
    could not be removed."""
    if sys.version_info >= (3, 12):
        shutil.rmtree(directory, onexc=_with_path)
    else:
        shutil.rmtree(directory, onerror=_with_path)


def _with_path(_function: object, path: str, info: object) -> None:
    exc = info if isinstance(info, BaseException) else info[1]  # type: ignore[index]
    if isinstance(exc, OSError):
        raise OSError(exc.errno, exc.strerror, path) from exc
    raise exc
