"""``--log_level`` reaches gRPC's own C core (``tserver.grpc_logging``): it takes
``GRPC_VERBOSITY`` from the environment once, so the server sets it before grpc starts --
before, a server run at ERROR still logged gRPC's INFO lines, in gRPC's own format.

``GRPC_TRACE=http`` makes the core log every HTTP/2 transport step at its INFO level: lines
that appear or not by the server's ``--log_level`` alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.tserver_cluster import running_cluster

pytestmark = pytest.mark.integration

# gRPC core's line format: severity letter, MMDD, time, thread id, source file and line.
GRPC_CORE_LINE = re.compile(r"^[DIWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w./-]+\.cc:\d+\]", re.M)


def _server_log(root: Path, level: str) -> str:
    with running_cluster(root, n_servers=1, partitions=1, flags=[f"--log_level={level}"]) as c:
        c.wait_leaders()  # RPCs to the server: HTTP/2 traffic its core traces
        (server,) = c.servers.values()
        return server.log_path.read_text(errors="replace")


@pytest.mark.parametrize("level", ["INFO", "ERROR"])
def test_above_debug_grpc_core_logs_no_info_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, level: str
) -> None:
    monkeypatch.setenv("GRPC_TRACE", "http")
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    text = _server_log(tmp_path, level)
    found = GRPC_CORE_LINE.search(text)
    assert found is None, text[max(0, found.start() - 200) : found.start() + 300]


def test_at_debug_grpc_core_logs_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPC_TRACE", "http")
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    assert GRPC_CORE_LINE.search(_server_log(tmp_path, "DEBUG"))


def test_a_client_command_leaves_the_choice_to_the_servers_it_starts() -> None:
    """``import_grpc_quietly`` quiets the command's own core, not its children's: ``cluster
    up`` and ``chaos`` start servers that choose by their ``--log_level``."""
    probe = (
        "import os, sys\n"
        "from raftlet.tserver.grpc_logging import import_grpc_quietly\n"
        "import_grpc_quietly()\n"
        "print('grpc' in sys.modules, os.environ.get('GRPC_VERBOSITY'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "None"]
    env["GRPC_VERBOSITY"] = "DEBUG"
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "DEBUG"]
