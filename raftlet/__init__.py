"""raftlet: a Raft-replicated tablet server modelled on the Apache Kudu tablet server.

Everything the distribution installs lives under this one name, so an application can use
``raftlet.client`` next to any other library:

- ``raftlet.client``: the Python client library (sessions, retries, scanners);
- ``raftlet.proto``: the wire protocol and its generated modules;
- ``raftlet.schema``: what client and server agree on (types, keys, partitioning, rows);
- ``raftlet.cluster``: the cluster config (servers, tables, placement), read from TOML by
  servers, launchers and clients alike;
- ``raftlet.consensus``: Raft (the sans-I/O core, the durable log, the threaded driver);
- ``raftlet.metrics``: striped counters, histograms, the profiled lock, exporters;
- ``raftlet.tserver``: the tablet server process;
- ``raftlet.deploy``: local and network-namespace launchers;
- ``raftlet.cli``: the ``raftlet`` command (also ``python -m raftlet``).

The repository keeps these as top-level folders; ``raftlet/`` links them in, and packaging
installs them here. Each subpackage refuses to import under its bare folder name, so no
module is ever loaded twice under two names.
"""

# The release, defined once in _version.py (pyproject.toml reads it from there): asking
# importlib.metadata instead cost every process that imports raftlet ~50 ms of CPU
# (email, zipfile and friends) before it did anything.
from raftlet._version import __version__ as __version__


def require_namespaced(name: str) -> None:
    """Raises ImportError unless ``name`` (a subpackage's ``__name__``) is under ``raftlet.``.

    Run from the repository root, ``import consensus`` would otherwise find the folder and
    load a second copy of every module, with its own classes and locks."""
    if not name.startswith("raftlet."):
        raise ImportError(f"import raftlet.{name}, not {name}: raftlet installs one namespace")
