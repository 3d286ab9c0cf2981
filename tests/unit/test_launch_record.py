"""``deploy.local``'s record of the server flags a cluster last started with (``launch.json``):
a cluster started by a build from before the record, and stopped by this one, lost its
flags on the next `up` without a word; they are taken from the state file now."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlet.deploy import local
from raftlet.deploy.local import LAUNCH_FILE, ServerProcess

_LaunchOptions = local._LaunchOptions

RAN_WITH = [
    "--tls_cert", "/c/tls/server-ts1.crt", "--tls_key", "/c/tls/server-ts1.key",
    "--tls_ca", "/c/tls/ca.crt", "--empty_dir_wait_s=0", "--cpu_affinity", "auto",
    "--result_tracker_max_clients=4000", "--term_check_mode", "locked",
    "--log_inject_latency_ms", "20",
]  # fmt: skip


def _server(flags: list[str]) -> ServerProcess:
    argv = ("python", "-m", "raftlet", "tserver", "--config", "/c/cluster.toml")
    return ServerProcess(
        id="ts1",
        pid=1,
        rpc_addr="127.0.0.1:1",
        http_addr="127.0.0.1:2",
        log=Path("/c/ts1.log"),
        argv=(*argv, "--server_id", "ts1", *flags),
        started_at="",
    )


def test_the_options_are_read_back_from_the_flags_a_server_ran_with() -> None:
    options = _LaunchOptions.from_flags(RAN_WITH)
    assert options == _LaunchOptions(("--result_tracker_max_clients=4000",), "locked", 20.0)


def test_a_cluster_without_a_record_gets_one_from_its_state_and_a_record_is_kept(
    tmp_path: Path,
) -> None:
    _LaunchOptions.keep_from(tmp_path, [_server(RAN_WITH)])
    assert _LaunchOptions.recorded(tmp_path) == _LaunchOptions.from_flags(RAN_WITH)
    _LaunchOptions.keep_from(tmp_path, [_server(["--log_level=ERROR"])])  # not overwritten
    assert _LaunchOptions.recorded(tmp_path) == _LaunchOptions.from_flags(RAN_WITH)


def test_a_restart_with_no_record_at_all_says_so(tmp_path: Path) -> None:
    said: list[str] = []
    given = _LaunchOptions(("--log_level=ERROR",))
    assert local._options_again(tmp_path, given, said.append) == given
    assert said == [
        f"no record of the server flags of its last start ({LAUNCH_FILE}): starting it with "
        "only those this command gives"
    ]


def test_keeping_the_record_never_fails_a_stop(tmp_path: Path) -> None:
    """`down` keeps the record on its way: a directory already removed (`down --remove-data`
    ran first) made `down` itself fail."""
    _LaunchOptions.keep_from(tmp_path / "gone", [_server(RAN_WITH)])
    assert not (tmp_path / "gone").exists()


def test_remove_data_that_cannot_remove_a_directory_keeps_the_cluster_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server directory that is a mount point cannot be removed (EBUSY): --remove-data
    once printed a traceback and left a directory without its cluster.toml, which no later
    `cluster` command would take. Now it removes what it can, says what it could not, and
    keeps the cluster's files, so that the same command works once the mount is gone."""
    import errno
    import os

    from raftlet.cli.cluster_cmd import _remove_data
    from raftlet.cli.common import CliError

    root = tmp_path / "c1"
    for name in ("ts1", "ts2"):
        (root / name / "kv-p0").mkdir(parents=True)
        (root / name / "kv-p0" / "store.sqlite").write_bytes(b"x")
    for name in (local.CONFIG_FILE, local.STATE_FILE, local.MADE_BY_UP_FILE, "ts1.log"):
        (root / name).write_text("")
    busy = str(root / "ts2")
    rmdir = os.rmdir

    def mounted(path: object, *args: object, **kwargs: object) -> None:
        if os.fspath(path) == busy or (os.fspath(path) == "ts2" and kwargs.get("dir_fd")):
            raise OSError(errno.EBUSY, "Device or resource busy", busy)
        rmdir(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rmdir", mounted)
    with pytest.raises(CliError) as info:
        _remove_data(root)
    assert "ts2: Device or resource busy" in str(info.value)
    assert f"{local.CONFIG_FILE} kept so this can run again" in str(info.value)
    left = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    assert left == sorted([local.CONFIG_FILE, local.STATE_FILE, local.MADE_BY_UP_FILE, "ts2"])
    monkeypatch.setattr(os, "rmdir", rmdir)
    _remove_data(root)
    assert not root.exists()
