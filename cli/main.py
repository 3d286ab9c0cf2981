"""Entry point of the ``raftlet`` console script.

Subcommands are added here as the packages they wire together land; for now the command
only reports its version.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Sequence


def _version() -> str:
    try:
        return importlib.metadata.version("raftlet")
    except importlib.metadata.PackageNotFoundError:  # running from a tree that is not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftlet",
        description="raftlet: a Raft-replicated tablet server.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    parser.parse_args(argv)
    # No subcommands yet: with no arguments, show what there is.
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
