"""Helpers for the tests that keep ``bench/*.py`` from rotting: import a bench script as a
module (for its pure parts), or run it on a tiny workload and read back its tables."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_bench(script: str) -> ModuleType:
    """``bench/<script>`` as a module named ``bench_<stem>``."""
    name = f"bench_{Path(script).stem}"
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / script)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    path = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path  # scripts put the repository or bench/ first
    return module


def run_bench(script: str, *args: str, directory: Path, timeout: float = 120) -> str:
    """Run ``bench/<script> args --dir directory`` and return what it printed; checks that
    it removed every file it made there."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args, "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    ).stdout
    assert list(directory.iterdir()) == []  # everything it made is gone
    return out


def tables(out: str) -> list[list[list[str]]]:
    """The cells of each printed table's rows, header left out."""
    found: list[list[list[str]]] = []
    rows: list[list[str]] | None = None
    for line in out.splitlines():
        if not line.startswith("|"):
            rows = None
            continue
        if rows is None:  # a header
            rows = []
            found.append(rows)
        elif "---" not in line:
            rows.append([cell.strip() for cell in line.split("|")[1:-1]])
    return found
