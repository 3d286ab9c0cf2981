"""A cluster config and a settings parser shared by the ``raftlet tserver`` flag tests."""

from __future__ import annotations

from pathlib import Path

from raftlet.cli.tserver_args import parse_tserver_args
from raftlet.tserver.settings import ServerSettings

MiB = 1 << 20

CONFIG = """\
[cluster]
name = "flags"

[raft]
tick_interval_ms = 50
election_ticks = 6

[[servers]]
id = "ts1"
rpc_addr = "127.0.0.1:7051"
http_addr = "127.0.0.1:8051"

[[servers]]
id = "ts2"
rpc_addr = "127.0.0.1:7052"
http_addr = "127.0.0.1:8052"
data_dir = "disks/two"

[[servers]]
id = "ts3"
rpc_addr = "127.0.0.1:7053"
http_addr = "127.0.0.1:8053"

[[tables]]
name = "kv"
partitions = 3
replication_factor = 2
columns = [{ name = "k", type = "INT64", key = true }]
"""


def write_config(directory: Path) -> Path:
    path = directory / "cluster.toml"
    path.write_text(CONFIG)
    return path


def parse(config_path: Path, *extra: str, server: str = "ts1") -> ServerSettings:
    return parse_tserver_args(["--config", str(config_path), "--server_id", server, *extra])
