"""The cluster config: which servers exist, which tables they serve, and where each tablet lives.

One TOML file names the servers and the tables; every server, launcher, CLI command and
client reads it into the same model and derives the same tablet placement from it, so there is
no master. Modules, one idea each:

- ``model``: the frozen dataclasses (``ClusterConfig``, ``ServerConfig``, ``TableConfig``,
  ``RaftTimings``), valid by construction;
- ``validate``: the rules they are checked against (names, ``host:port``, counts, uniqueness);
- ``placement``: ``TabletPlacement`` and the placement function, ``tablet_id``;
- ``toml_read``: ``load_cluster_config``/``parse_cluster_config``, errors with ``file:line``;
- ``toml_write``: ``dump_cluster_config``/``write_cluster_config`` (needs ``tomli-w``, which
  the ``cli`` extra installs; imported only when writing);
- ``convert``: the wire form (``GetClusterConfigResponse``);
- ``digest``: digests of the parts every server must share, which ``ListTablets`` reports so
  the health check can name a server running on another copy of the file;
- ``errors``: ``ClusterConfigError`` and its ``NotInConfigError``.

Imports ``schema`` and ``proto`` only, and nothing outside the standard library at import
time, so the client can use it.
"""

from raftlet.cluster.errors import ClusterConfigError, NotInConfigError
from raftlet.cluster.model import ClusterConfig, RaftTimings, ServerConfig, TableConfig
from raftlet.cluster.placement import TabletPlacement, tablet_id
from raftlet.cluster.toml_read import load_cluster_config, parse_cluster_config
from raftlet.cluster.toml_write import dump_cluster_config, write_cluster_config
from raftlet.cluster.validate import (
    MAX_PARTITIONS,
    bare_host,
    host_port,
    is_loopback_addr,
    parse_host_port,
)

__all__ = [
    "MAX_PARTITIONS",
    "ClusterConfig",
    "ClusterConfigError",
    "NotInConfigError",
    "RaftTimings",
    "ServerConfig",
    "TableConfig",
    "TabletPlacement",
    "bare_host",
    "dump_cluster_config",
    "host_port",
    "is_loopback_addr",
    "load_cluster_config",
    "parse_cluster_config",
    "parse_host_port",
    "tablet_id",
    "write_cluster_config",
]

# Last, so the re-exports above stay at the top; see raftlet/__init__.py.
from raftlet import require_namespaced

require_namespaced(__name__)
