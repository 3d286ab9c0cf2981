"""The client's constructors are typed for an application's type checker: the keywords that
``Client.from_config`` and ``AsyncClient.connect``/``from_config`` pass on are the
constructor's, so a misspelt one is a mypy error where it is written, not a TypeError at
run time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

APP = """\
from raftlet.client import Client
from raftlet.client.aio import AsyncClient

good = Client.from_config("c.toml", timeout_s=3.0, token="t")
bad = Client.from_config("c.toml", timout_s=3.0)
a_good = AsyncClient.connect("h:1", rpc_timeout_s=1.0, tcp_writes=False)
a_bad = AsyncClient.connect("h:1", rpc_timeout=1.0)
f_good = AsyncClient.from_config("c.toml", max_batch_rows=10)
f_bad = AsyncClient.from_config("c.toml", timeout_s="3")
reveal_type(good)
"""


def test_misspelt_and_mistyped_keywords_are_type_errors(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    app = tmp_path / "app.py"
    app.write_text(APP)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(app),
        ],
        cwd=REPO,  # raftlet/ resolves to the checkout's package
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = {int(line.split(":")[1]) for line in proc.stdout.splitlines() if ": error:" in line}
    assert errors == {5, 7, 9}, proc.stdout
    assert 'Revealed type is "raftlet.client.client.Client"' in proc.stdout, proc.stdout
