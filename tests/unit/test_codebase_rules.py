"""Rules the code base keeps as it grows: one name per class, one place that opens gRPC
channels, and layering between the packages."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("cluster", "consensus", "tserver", "client", "cli", "deploy", "metrics", "schema")


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def test_no_two_classes_share_a_name() -> None:
    where: dict[str, list[str]] = collections.defaultdict(list)
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(str(path.relative_to(REPO)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not shared, shared


def test_only_the_client_librarys_pools_open_grpc_channels() -> None:
    allowed = {"client/channels.py", "client/aio_channels.py"}
    opening = [
        str(p.relative_to(REPO))
        for p in _modules()
        if "insecure_channel(" in p.read_text() or "secure_channel(" in p.read_text()
    ]
    assert set(opening) <= allowed, opening


def test_the_consensus_core_imports_nothing_of_the_project_but_itself() -> None:
    for path in (REPO / "consensus" / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("raftlet.")
            ):
                assert node.module.startswith("raftlet.consensus.core"), (path, node.module)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] not in ("threading", "socket", "time"), (
                        path,
                        alias.name,
                    )


def test_the_client_never_imports_the_server_side() -> None:
    server_side = ("raftlet.tserver", "raftlet.consensus", "raftlet.cli", "raftlet.deploy")
    for path in (REPO / "client").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                top = ".".join(node.module.split(".")[:2])
                assert top not in server_side, (path, node.module)
