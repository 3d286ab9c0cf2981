"""A server's existing files made to agree with its umask (``--umask``).

The umask only shapes files made from now on: a data directory written before it existed,
under the shell's 022, kept every row, WAL segment and metadata file readable by every
user after the upgrade (review r27v). A server therefore takes group and other bits the
mask forbids off what it finds in its data directory as it starts.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

__all__ = ["apply_umask", "warn_if_world_readable"]

logger = logging.getLogger(__name__)


def apply_umask(root: Path, umask: int) -> int:
    """Take the bits ``umask`` forbids off every file and directory below ``root`` (and
    ``root``); returns how many changed. Links are left alone (their targets are not the
    server's to change); a file it may not change is logged, not fatal."""
    changed = 0
    refused: list[str] = []
    for path in _tree(root):
        try:
            st = os.lstat(path)
        except FileNotFoundError:  # gone since it was listed
            continue
        if stat.S_ISLNK(st.st_mode):
            continue
        mode = stat.S_IMODE(st.st_mode)
        wanted = mode & ~umask
        if wanted == mode:
            continue
        try:
            os.chmod(path, wanted)
        except OSError as e:
            refused.append(f"{path} ({e.strerror})")
            continue
        changed += 1
    if changed:
        logger.info("took the bits --umask %03o forbids off %d file(s) in %s", umask, changed, root)
    if refused:
        logger.warning(
            "could not take the bits --umask %03o forbids off %d file(s), e.g. %s",
            umask,
            len(refused),
            refused[0],
        )
    return changed


def _tree(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    paths = [str(root)]
    for top, dirs, files in os.walk(root):
        paths += [os.path.join(top, name) for name in (*dirs, *files)]
    return paths


def warn_if_world_readable(path: str, name: str, why: str) -> None:
    """A WARNING, "``name`` is readable by every user (mode ...): ``why``", if every user may
    read the secret at ``path`` (a private key, a tokens file). Not fatal: a mounted
    secret's mode is not always the server's to choose. Not for the group: Kubernetes
    mounts a secret 0440 for the pod's, which warned at every start."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return  # read a moment ago; a file gone since fails where it is used
    if mode & 0o007:
        logger.warning("%s is readable by every user (mode %o): %s", name, mode, why)
