"""The `raftlet` command run as a user runs it, for the tests that drive it: a process of
its own, stdout a pipe (plain output, no progress bar), no cluster named by the
environment of whoever runs the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120


def raftlet(
    *args: str, timeout: float = TIMEOUT_S, stdin: str | None = None, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    """``raftlet ARGS`` as a subprocess; ``stdin``: its input (None: that of the tests)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTLET_CLUSTER", "RAFTLET_SERVERS")}
    env.update(NO_COLOR="1", **extra_env)
    return subprocess.run(
        [sys.executable, "-m", "raftlet", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
        check=False,
    )


def rpc_addresses(data_dir: Path) -> list[str]:
    """The servers' RPC addresses in the ``cluster.toml`` of ``data_dir``."""
    text = (data_dir / "cluster.toml").read_text()
    return [line.split('"')[1] for line in text.splitlines() if line.startswith("rpc_addr")]


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    """``proc``'s stdout, once it exited 0 (else the assertion shows all it said)."""
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout
