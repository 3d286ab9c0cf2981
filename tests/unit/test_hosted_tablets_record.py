"""The hosted-tablets record on a full disk: a server restarts on one (the record it would
write says what it says already), and a write that fails names the file and leaves no
temporary file behind."""

from __future__ import annotations

import builtins
import errno
from pathlib import Path

import pytest

from raftlet.consensus.log import segment as segment_module
from raftlet.tserver import hosted_tablets
from raftlet.tserver.hosted_tablets import HOSTED_TABLETS_FILE, HostedTablets


def test_an_unchanged_record_is_not_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    HostedTablets.save(tmp_path, {"kv-p0", "kv-p1"}, {"kv-p0", "kv-p1"})
    before = (tmp_path / HOSTED_TABLETS_FILE).stat()
    monkeypatch.setattr(
        hosted_tablets,
        "replace_durably",
        lambda *_a: pytest.fail("rewrote a record that says the same"),
    )
    HostedTablets.save(tmp_path, {"kv-p1", "kv-p0"}, {"kv-p0", "kv-p1"})
    assert (tmp_path / HOSTED_TABLETS_FILE).stat().st_ino == before.st_ino
    assert HostedTablets.load(tmp_path).hosted == {"kv-p0", "kv-p1"}


def test_a_failed_write_names_the_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    HostedTablets.save(tmp_path, {"kv-p0"}, {"kv-p0"})
    monkeypatch.setattr(segment_module, "open", _NoSpace, raising=False)
    with pytest.raises(OSError, match=f"writing .*{HOSTED_TABLETS_FILE}: No space left"):
        HostedTablets.save(tmp_path, {"kv-p0", "kv-p1"}, {"kv-p0", "kv-p1"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [HOSTED_TABLETS_FILE]
    assert HostedTablets.load(tmp_path).hosted == {"kv-p0"}  # the old record stands


class _NoSpace:
    """``open`` of a file on a full disk: what it is given never reaches the disk."""

    def __init__(self, path: Path, mode: str, encoding: str) -> None:
        self._f = builtins.open(path, mode, encoding=encoding)  # noqa: SIM115 (closed by __exit__)

    def __enter__(self) -> _NoSpace:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def write(self, text: str) -> None:
        self._f.write(text)

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def fileno(self) -> int:
        return self._f.fileno()
