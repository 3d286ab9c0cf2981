"""A server's existing files made to agree with its umask: a data directory written before
``--umask`` existed kept every row readable by every user after the upgrade."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from raftlet.tserver.file_modes import apply_umask


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_bits_the_mask_forbids_are_taken_off_what_is_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    root = tmp_path / "ts1"
    (root / "kv-p0" / "wal").mkdir(parents=True)
    store = root / "kv-p0" / "store.sqlite"
    segment = root / "kv-p0" / "wal" / "wal-000001.seg"
    for f in (store, segment):
        f.write_bytes(b"rows")
        f.chmod(0o644)
    for d in (root, root / "kv-p0", root / "kv-p0" / "wal"):
        d.chmod(0o755)
    private = root / "kv-p0" / "consensus-meta"
    private.write_bytes(b"term")
    private.chmod(0o600)
    outside = tmp_path / "shared.txt"
    outside.write_bytes(b"not the server's")
    outside.chmod(0o644)
    (root / "link").symlink_to(outside)

    assert apply_umask(root, 0o077) == 5
    assert [_mode(p) for p in (store, segment, private)] == [0o600, 0o600, 0o600]
    assert [_mode(d) for d in (root, root / "kv-p0", root / "kv-p0" / "wal")] == [0o700] * 3
    assert _mode(outside) == 0o644  # a link's target is left alone
    assert "took the bits --umask 077 forbids off 5 file(s)" in caplog.text
    assert apply_umask(root, 0o077) == 0  # done once
    # A looser mask loosens nothing.
    assert apply_umask(root, 0o022) == 0
    assert _mode(store) == 0o600


def test_a_data_directory_not_made_yet_is_nothing_to_do(tmp_path: Path) -> None:
    assert apply_umask(tmp_path / "new", 0o077) == 0
