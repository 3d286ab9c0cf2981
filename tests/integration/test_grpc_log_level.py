"""``--log_level`` reaches gRPC's own C core (``tserver.grpc_logging``): it takes
``GRPC_VERBOSITY`` from the environment once, so the server sets it before grpc starts --
before, a server run at ERROR still logged gRPC's INFO lines, in gRPC's own format.

``GRPC_TRACE=http`` makes the core log every HTTP/2 transport step at its INFO level: lines
that appear or not by the server's ``--log_level`` alone."""

from __future__ import annotations

import re
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
