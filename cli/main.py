"""Entry point of the ``raftlet`` console script.

Subcommands are added here as the packages they wire together land: ``tserver`` runs one
tablet server in the foreground.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Sequence

from tserver.flags import add_tserver_arguments, settings_from_args


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
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    tserver = commands.add_parser(
        "tserver",
        help="run one tablet server in the foreground",
        description="Run one tablet server in the foreground until SIGTERM or SIGINT.",
        allow_abbrev=False,
    )
    add_tserver_arguments(tserver)
    # Errors in the tserver's flags are reported by its own parser (usage, exit 2).
    tserver.set_defaults(subparser=tserver)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "tserver":
        from tserver.main import run  # the server's imports only when serving

        return run(settings_from_args(args.subparser, args))
    # With no command, show what there is.
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
