"""The installed distribution: one top-level package, `raftlet`, and a client that needs only
grpcio, protobuf and tenacity.

The wheel is built from a copy of the tree (setuptools writes build/ and *.egg-info next to
its sources), with the venv's setuptools and no network.
"""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = REPO / "raftlet"
LINKED = sorted(p.name for p in NAMESPACE.iterdir() if p.is_symlink())
# What an application may already have installed under these names (proto-plus, schema,
# metrics on PyPI): raftlet must not install any of them at the top level.
GENERIC_NAMES = {
    "proto",
    "schema",
    "metrics",
    "cluster",
    "client",
    "cli",
    "deploy",
    "chaos",
    "consensus",
    "tserver",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "data")
    shutil.copytree(NAMESPACE, src / "raftlet", symlinks=True, ignore=ignore)
    for name in LINKED:
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(out)],
        check=True,
        timeout=120,
    )  # fmt: skip
    (path,) = out.glob("raftlet-*.whl")
    return zipfile.ZipFile(path)


def test_the_links_cover_every_package_folder() -> None:
    assert set(LINKED) == GENERIC_NAMES
    for name in LINKED:
        assert (NAMESPACE / name).resolve() == REPO / name


def test_wheel_installs_only_the_raftlet_package(wheel: zipfile.ZipFile) -> None:
    top = {n.split("/")[0] for n in wheel.namelist() if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"raftlet"}
    assert not GENERIC_NAMES & top
    names = set(wheel.namelist())
    assert "raftlet/py.typed" in names
    assert "raftlet/__main__.py" in names
    for name in LINKED:
        assert f"raftlet/{name}/__init__.py" in names
    assert "raftlet/proto/tablet_pb2.py" in names
    assert "raftlet/proto/tablet.proto" in names


def test_wheel_metadata_keeps_server_and_cli_dependencies_in_extras(
    wheel: zipfile.ZipFile,
) -> None:
    (meta_name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    meta = email.parser.Parser().parsestr(wheel.read(meta_name).decode())
    requires = meta.get_all("Requires-Dist") or []
    base = sorted(r.split(">")[0].split("<")[0].strip() for r in requires if "extra ==" not in r)
    assert base == ["grpcio", "protobuf", "tenacity"]
    assert {"server", "cli"} <= set(meta.get_all("Provides-Extra") or [])
    # raftlet.cluster writes cluster.toml with tomli-w; only the cli extra needs that.
    assert any(r.startswith("tomli-w") and 'extra == "cli"' in r for r in requires)
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "raftlet = raftlet.cli.main:main" in wheel.read(entry_points).decode()


def test_the_wheel_says_the_release_raftlet_says(wheel: zipfile.ZipFile) -> None:
    """One place holds the release (raftlet/_version.py); servers report it to each other
    and to `cluster status`, so the package's metadata must say the same."""
    import raftlet

    (meta_name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    meta = email.parser.Parser().parsestr(wheel.read(meta_name).decode())
    assert meta["Version"] == raftlet.__version__
    assert wheel.filename is not None
    assert f"raftlet-{raftlet.__version__}-" in Path(wheel.filename).name


def test_importing_raftlet_does_not_load_importlib_metadata(tmp_path: Path) -> None:
    # It cost every process ~50 ms of CPU before it did anything (the release came from it).
    done = _python("import sys, raftlet; print('importlib.metadata' in sys.modules)", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("name", sorted(GENERIC_NAMES))
def test_a_folder_does_not_import_under_its_bare_name(name: str) -> None:
    # From the repository root the folder is on sys.path; it must still refuse, or every
    # module could load twice (two classes, two locks, two metric registries).
    result = _python(f"import {name}", cwd=REPO)
    assert result.returncode != 0
    assert f"import raftlet.{name}, not {name}" in result.stderr


def test_the_client_imports_no_server_or_cli_dependency(tmp_path: Path) -> None:
    # (grpc itself probes for grpc_health and grpc_reflection when they are installed.)
    heavy = (
        "crc32c",
        "cryptography",
        "prometheus_client",
        "rich",
        "sqlite3",
        "tomli_w",
        "raftlet.tserver",
        "raftlet.cli",
        "raftlet.deploy",
    )
    code = f"import sys, raftlet.client; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    result = _python(code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_the_client_reads_cluster_toml_with_raftlet_cluster(tmp_path: Path) -> None:
    # Client.from_config loads the file with the servers' model; importing it must not bring
    # the TOML writer's dependency (tomli-w, cli extra) along.
    code = (
        "import sys, raftlet.client, raftlet.client.client as c, raftlet.cluster; "
        "print(c.load_cluster_config is raftlet.cluster.load_cluster_config, "
        "'tomli_w' in sys.modules)"
    )
    result = _python(code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False"]


def test_python_dash_m_raftlet_is_the_cli(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "raftlet", "--version"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "raftlet" in result.stdout
