"""The ``raftlet tserver`` command line: the flag table (``tserver.settings.FLAGS``) as
argparse arguments, and the settings they resolve to.

- ``add_tserver_arguments(parser)`` adds the flags to a parser, in help groups, each with
  its dashed alias (``--rpc-num-service-threads``). A value out of range is an argparse
  error: exit status 2 and one line naming the flag (``OneLineArgumentParser``).
- ``settings_from_args(parser, args)`` loads ``--config`` and resolves the settings
  (``ServerSettings.from_args``); a bad config or flag combination is the same one-line
  usage error.
- ``build_tserver_parser`` / ``parse_tserver_args``: the same as a standalone parser, for
  ``raftlet cluster up --tserver-flag`` and tests.

Nothing here imports rich, and ``tserver`` never imports this module: the command line is
the CLI's, the settings are the server's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from raftlet.cli.argparser import OneLineArgumentParser
from raftlet.cluster import ClusterConfigError, load_cluster_config
from raftlet.tserver.flag_spec import FlagError, FlagSpec, is_bool
from raftlet.tserver.settings import FLAGS, GROUP_HELP, ServerSettings

__all__ = [
    "TSERVER_DESCRIPTION",
    "TSERVER_EPILOG",
    "add_tserver_arguments",
    "add_tserver_command",
    "build_tserver_parser",
    "parse_tserver_args",
    "settings_from_args",
]


def _argparse_type(spec: FlagSpec) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return spec.parse(text)
        except ValueError as e:
            # ArgumentTypeError's message is printed as is ("argument --x: <message>").
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = spec.name
    return convert


def add_tserver_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every ``raftlet tserver`` flag to ``parser``, in help groups.

    Defaults of the parsed namespace are None (= "not given") for every flag except
    ``--config`` and ``--server_id``, which are required; ``ServerSettings.from_args``
    fills in the config's values and the built-in defaults.
    """
    groups: dict[str, argparse._ArgumentGroup] = {}
    for spec in FLAGS:
        if spec.group not in groups:
            groups[spec.group] = parser.add_argument_group(spec.group, GROUP_HELP[spec.group])
        # A boolean flag given alone means true (--insecure), as well as --insecure=false.
        boolean = spec.check is is_bool
        groups[spec.group].add_argument(
            *spec.option_strings,
            dest=spec.name,
            metavar=spec.metavar,
            type=_argparse_type(spec),
            required=spec.required,
            default=None,
            help=spec.help,
            nargs="?" if boolean else None,
            const=True if boolean else None,
        )


TSERVER_DESCRIPTION = """\
Run one raftlet tablet server in the foreground. It opens (or creates) the replicas that
--config places on --server_id, joins their Raft groups and serves gRPC until SIGTERM
(graceful) or SIGINT.
"""
TSERVER_EPILOG = """\
examples:
  raftlet tserver --config deploy/examples/cluster.toml --server_id ts1
  raftlet tserver --config cluster.toml --server_id ts1 --data_dir /var/lib/raftlet/ts1 \\
      --tls_cert server-ts1.crt --tls_key server-ts1.key --tls_ca ca.crt

Every flag also has a dashed spelling (--server-id = --server_id). Flags marked 'Settable at
runtime' can be changed without a restart through the admin service (SetFlag), e.g. to
inject disk latency in a test. A local cluster's servers are started for you by `raftlet
cluster up`.
"""


_PARSER_TEXT: dict[str, Any] = {
    "description": TSERVER_DESCRIPTION,
    "epilog": TSERVER_EPILOG,
    "formatter_class": argparse.RawDescriptionHelpFormatter,
    # Abbreviations (--rpc for --rpc_addr) break silently when a flag is added later.
    "allow_abbrev": False,
}


def build_tserver_parser(prog: str = "raftlet tserver") -> OneLineArgumentParser:
    """A standalone parser with the tserver flags (the CLI adds them to its subcommand)."""
    parser = OneLineArgumentParser(prog=prog, **_PARSER_TEXT)
    add_tserver_arguments(parser)
    return parser


def add_tserver_command(commands: Any, help_text: str) -> argparse.ArgumentParser:
    """The ``tserver`` command with its flags, under ``commands`` (argparse subparsers)."""
    parser: argparse.ArgumentParser = commands.add_parser("tserver", help=help_text, **_PARSER_TEXT)
    add_tserver_arguments(parser)
    # Errors in the tserver's flags are reported by its own parser (usage, exit 2).
    parser.set_defaults(subparser=parser)
    return parser


def settings_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ServerSettings:
    """Load ``--config`` and resolve the settings; any problem is ``parser.error`` (exit 2)."""
    try:
        config = load_cluster_config(args.config)
        return ServerSettings.from_args(args, config)
    except (ClusterConfigError, FlagError) as e:
        parser.error(str(e))


def parse_tserver_args(
    argv: Sequence[str] | None = None, prog: str = "raftlet tserver"
) -> ServerSettings:
    """Parse ``argv`` into validated settings, or exit 2 with one line on stderr."""
    parser = build_tserver_parser(prog)
    return settings_from_args(parser, parser.parse_args(argv))
