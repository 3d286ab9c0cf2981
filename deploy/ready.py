"""Waiting for a started ``raftlet tserver`` to print its "ready" line.

A server prints it on stdout once it serves; the launchers that send stdout to a file of its
own (``deploy.netns``, ``chaos.proxy_cluster``) wait for it here.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

__all__ = ["wait_ready_line"]


def wait_ready_line(
    out_path: Path, proc: subprocess.Popen[bytes] | None, timeout_s: float
) -> str | None:
    """Wait until ``out_path`` holds the ready line: None once it does, otherwise why it never
    will ("exited with N before ready", "not ready after T s") for the caller's error."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError):
            if "ready" in out_path.read_text(errors="replace"):
                return None
        if proc is None or proc.poll() is not None:
            code = proc.returncode if proc is not None else None
            return f"exited with {code} before ready"
        if time.monotonic() > deadline:
            return f"not ready after {timeout_s} s"
        time.sleep(0.05)
