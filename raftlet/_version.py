"""The release of raftlet: the only place it is written (pyproject.toml reads it)."""

__version__ = "0.2.0"
