"""A server raises its open-file limit to the hard one, and refuses to start below what it
needs with one clear line (gRPC crashed with SIGSEGV out of descriptors at start)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from raftlet.tserver import open_files


def test_the_soft_limit_is_raised_to_the_hard_one(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = {"now": (300, 4096)}
    monkeypatch.setattr(resource, "getrlimit", lambda _r: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda _r, v: limits.update(now=v))
    assert open_files.raise_open_files_limit() == 4096
    assert limits["now"] == (4096, 4096)


def test_below_the_minimum_even_at_the_hard_limit_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _r: (24, 64))
    monkeypatch.setattr(resource, "setrlimit", lambda _r, _v: None)
    with pytest.raises(OSError, match=r"open-file limit is 64 \(hard 64\), below the 256"):
        open_files.raise_open_files_limit()


def test_a_server_under_a_tiny_limit_exits_with_one_line(tmp_path: Path) -> None:
    from raftlet.cluster import write_cluster_config
    from raftlet.deploy.local import new_config

    config = tmp_path / "cluster.toml"
    write_cluster_config(new_config(tmp_path, servers=3, tablets=1), config)

    def tiny_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    done = subprocess.run(
        [sys.executable, "-m", "raftlet", "tserver", "--config", str(config),
         "--server_id", "ts1"],
        capture_output=True, text=True, timeout=60, check=False, preexec_fn=tiny_limit,
    )  # fmt: skip
    assert done.returncode == 1, done
    assert done.stderr.strip().splitlines() == [
        "raftlet tserver: error: the open-file limit is 64 (hard 64), below the 256 a server "
        "needs: raise it (ulimit -n, LimitNOFILE= in systemd)"
    ]
    assert not any((tmp_path / "ts1").glob("*"))  # refused before it touched its directory
