"""``--peer_addresses``: where a tablet server dials its peers instead of their config
addresses -- parsing, validation against the config (each mistake one usage line, exit 2),
the read-only settings value, and how GetFlags renders it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from raftlet.cli.tserver_args import parse_tserver_args
from raftlet.cluster import load_cluster_config
from raftlet.tserver.flag_registry import FlagRegistry
from raftlet.tserver.flag_spec import FlagError
from raftlet.tserver.settings import ServerSettings
from tests.unit.tserver_settings_helpers import parse, write_config


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    return write_config(tmp_path)


def usage_error(capsys: pytest.CaptureFixture[str], config_path: Path, value: str) -> str:
    """``--peer_addresses value`` on ts1 must exit 2 with one line; that line."""
    argv = ["--config", str(config_path), "--server_id", "ts1", "--peer_addresses", value]
    with pytest.raises(SystemExit) as exc:
        parse_tserver_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


def test_default_dials_every_peer_at_its_config_address(config_path: Path) -> None:
    s = parse(config_path)
    assert dict(s.peer_addresses) == {}
    assert s.peer_addr("ts2") == "127.0.0.1:7052"
    assert s.peer_addr("ts3") == "127.0.0.1:7053"


def test_named_peers_are_dialled_at_the_given_address(config_path: Path) -> None:
    s = parse(config_path, "--peer_addresses", " ts2=127.0.0.1:17052 , ts3=[::1]:17053")
    assert s.peer_addresses == {"ts2": "127.0.0.1:17052", "ts3": "[::1]:17053"}
    assert s.peer_addr("ts2") == "127.0.0.1:17052"
    assert s.peer_addr("ts3") == "[::1]:17053"


def test_a_peer_not_named_keeps_its_config_address(config_path: Path) -> None:
    s = parse(config_path, "--peer-addresses=ts3=localhost:9000")
    assert s.peer_addr("ts2") == "127.0.0.1:7052"
    assert s.peer_addr("ts3") == "localhost:9000"


def test_an_empty_value_overrides_nothing(config_path: Path) -> None:
    # A launcher may pass the flag to every server, empty for one with nothing to proxy.
    assert dict(parse(config_path, "--peer_addresses=").peer_addresses) == {}


BAD = [
    ("ts9=127.0.0.1:1", "--peer_addresses: unknown server id 'ts9' (known: ts1, ts2, ts3)"),
    ("ts1=127.0.0.1:1", "--peer_addresses: 'ts1' is this server itself"),
    ("ts2=127.0.0.1:1,ts2=127.0.0.1:2", "server id 'ts2' is given twice"),
    ("ts2=localhost", "ts2: 'localhost' is not host:port"),
    ("ts2=127.0.0.1:0", "ts2: '127.0.0.1:0': port must be a number in 1..65535"),
    ("ts2=::1:7", "an IPv6 address needs brackets"),
    ("ts2", "'ts2' is not ID=HOST:PORT"),
    ("=127.0.0.1:1", "'=127.0.0.1:1' is not ID=HOST:PORT"),
    ("ts2=127.0.0.1:1,,ts3=127.0.0.1:2", "'' is not ID=HOST:PORT"),
]


@pytest.mark.parametrize(("value", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_is_one_usage_line(
    config_path: Path, capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    err = usage_error(capsys, config_path, value)
    assert err.startswith("raftlet tserver: error: ")
    assert message in err
    assert "peer_addresses" in err


def test_settings_built_directly_are_checked_too(config_path: Path) -> None:
    config = load_cluster_config(config_path)
    base = ServerSettings("ts1", config, Path("/d"), "127.0.0.1:1", "127.0.0.1:2")
    with pytest.raises(FlagError, match=r"^--peer_addresses: unknown server id 'nope'"):
        dataclasses.replace(base, peer_addresses={"nope": "127.0.0.1:5"})
    with pytest.raises(FlagError, match=r"^--peer_addresses: 'ts1' is this server itself"):
        dataclasses.replace(base, peer_addresses={"ts1": "127.0.0.1:5"})
    with pytest.raises(FlagError, match=r"^--peer_addresses: ts2: 'x' is not host:port"):
        dataclasses.replace(base, peer_addresses={"ts2": "x"})
    with pytest.raises(FlagError, match=r"^--peer_addresses: expected a mapping"):
        dataclasses.replace(base, peer_addresses="ts2=127.0.0.1:5")  # type: ignore[arg-type]


def test_the_settings_value_is_a_read_only_copy(config_path: Path) -> None:
    config = load_cluster_config(config_path)
    given = {"ts2": "127.0.0.1:5"}
    s = ServerSettings(
        "ts1", config, Path("/d"), "127.0.0.1:1", "127.0.0.1:2", peer_addresses=given
    )
    given["ts3"] = "127.0.0.1:6"  # the caller's dict changing later changes nothing
    assert s.peer_addresses == {"ts2": "127.0.0.1:5"}
    with pytest.raises(TypeError):
        s.peer_addresses["ts3"] = "127.0.0.1:6"  # type: ignore[index]
    # Equal settings stay equal, and replace() keeps the value.
    assert dataclasses.replace(s) == s


def test_get_flags_renders_it_as_on_the_command_line(config_path: Path) -> None:
    s = parse(config_path, "--peer_addresses", "ts2=127.0.0.1:17052,ts3=127.0.0.1:17053")
    registry = FlagRegistry.from_settings(s)
    assert registry.render(["peer_addresses"]) == {
        "peer_addresses": "ts2=127.0.0.1:17052,ts3=127.0.0.1:17053"
    }
    assert not registry.is_runtime("peer_addresses")
    with pytest.raises(FlagError, match="cannot be changed at runtime"):
        registry.set("peer_addresses", "ts2=127.0.0.1:1")
    assert FlagRegistry.from_settings(parse(config_path)).render(["peer_addresses"]) == {
        "peer_addresses": ""
    }
