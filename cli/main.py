"""Entry point of the ``raftlet`` console script.

Commands:

- ``tserver``: run one tablet server in the foreground (``tserver.main``);
- ``cluster up | status | down``: a local multi-server cluster (``cli.cluster_cmd``,
  ``deploy.local``) and a ksck-style health check (``client.health``); ``cluster
  replace-server`` (``cli.tablet_cmd``) and ``cluster balance-leaders``
  (``cli.leader_balance``);
- ``tablet add-replica | remove-replica | move-replica | export``: move a tablet's replicas
  (``cli.tablet_cmd``), read a stopped server's replica offline (``cli.tablet_export_cmd``);
- ``write``: a load generator (``cli.write_cmd``); ``row``: write chosen rows
  (``cli.row_cmd``); ``scan``: read rows (``cli.scan_cmd``);
- ``metrics``: key server metrics in human units (``cli.metrics_cmd``);
- ``leader-step-down``: move a tablet's leadership (``cli.admin_cmd``);
- ``certs create``: a CA and TLS certificates for servers and clients (``cli.certs_cmd``);
- ``chaos``: faults against a throw-away cluster under load, checked for linearizability
  (``cli.chaos_cmd``, ``chaos``);
- ``completion bash|zsh``: a shell completion script (``cli.completion_cmd``).

Conventions every command keeps: argparse throughout (the same ``OneLineArgumentParser``
as ``raftlet tserver``, so every usage error is one line); exit status 0 on success, 1 when
the operation failed, 2 for usage errors; an expected failure is one line on stderr,
``raftlet <command>: error: <what>``, never a traceback. Output nobody reads (a pipe whose
reader left, as with `| head -1`) goes to /dev/null from then on, and the command carries
on to its own exit status: one that changes something never stops halfway for it, and
``cluster status`` still answers its verdict (``cli.common.console``, ``print_out``). Only
``scan``, ``metrics`` and ``completion``, which merely print what they read, stop then,
with exit 0. A command's heavy imports wait until it runs, so ``raftlet tserver`` does
not load rich or the client, and the other commands do not load the server's settings
(the consensus driver and the log: ~0.1 s of CPU, a fifth of a command's start-up).
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys
from collections.abc import Sequence

import raftlet
from raftlet.cli.argparser import OneLineArgumentParser
from raftlet.tserver.grpc_logging import import_grpc_quietly, set_grpc_verbosity


class _Formatter(argparse.HelpFormatter):
    """Wraps one-paragraph descriptions, keeps multi-line texts (the epilogs' example
    blocks) as written; wider help columns."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=100)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


_EPILOG = """\
quick start:
  raftlet cluster up --data-dir ./c1                 # 3 local servers, table kv
  raftlet write --data-dir ./c1 --duration 10 --threads 8
  raftlet row upsert kv key=7 value=hello --data-dir ./c1
  raftlet scan kv --data-dir ./c1 --where "key < 100" --limit 10
  raftlet metrics --data-dir ./c1
  raftlet cluster status --data-dir ./c1
  raftlet cluster down --data-dir ./c1

Client commands name the cluster with exactly one of --data-dir DIR, --cluster FILE or
--servers HOST:PORT,... (or $RAFTLET_CLUSTER / $RAFTLET_SERVERS). Exit status: 0 success,
1 the operation failed, 2 usage error, 130 interrupted (Ctrl-C or SIGTERM).
Run `raftlet COMMAND --help` for a command's options and examples.
"""


def build_parser(*, server_flags: bool = True) -> argparse.ArgumentParser:
    """The whole command line. Without ``server_flags`` the ``tserver`` command is listed
    but takes no flags: they come from the server's settings, whose imports (the consensus
    driver, the log) were a fifth of every other command's start-up."""
    from raftlet.cli import (
        admin_cmd,
        certs_cmd,
        chaos_cmd,
        cluster_cmd,
        completion_cmd,
        metrics_cmd,
        row_cmd,
        scan_cmd,
        tablet_cmd,
        write_cmd,
    )

    parser = OneLineArgumentParser(
        prog="raftlet",
        description="raftlet: a Raft-replicated tablet server, and the tools to run and use it.",
        epilog=_EPILOG,
        formatter_class=_Formatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {raftlet.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    server_help = "run one tablet server in the foreground"
    if server_flags:
        from raftlet.cli.tserver_args import add_tserver_command

        add_tserver_command(commands, server_help)
    else:
        commands.add_parser("tserver", help=server_help)
    cluster_cmd.add_parsers(commands, _Formatter)
    write_cmd.add_parser(commands, _Formatter)
    row_cmd.add_parser(commands, _Formatter)
    scan_cmd.add_parser(commands, _Formatter)
    metrics_cmd.add_parser(commands, _Formatter)
    admin_cmd.add_parser(commands, _Formatter)
    tablet_cmd.add_parser(commands, _Formatter)
    certs_cmd.add_parser(commands, _Formatter)
    chaos_cmd.add_parser(commands, _Formatter)
    completion_cmd.add_parser(commands, _Formatter)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # Before parsing: an argument's converter may import the client, and with it grpc. The
    # options before a command take no values, so its name is the first word without a dash.
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in (None, "tserver", "completion"):
        import_grpc_quietly()
    parser = build_parser(server_flags=command in ("tserver", "completion"))
    args = parser.parse_args(argv)
    if args.command == "tserver":
        from raftlet.cli.tserver_args import settings_from_args

        settings = settings_from_args(args.subparser, args)
        # Read by gRPC once, at import: before the server's imports (tserver.grpc_logging).
        set_grpc_verbosity(settings.log_level)
        from raftlet.tserver.main import run  # the server's imports only when serving

        return run(settings)
    if args.command is None:
        # With no command, show what there is.
        parser.print_help()
        return 0
    if args.command == "completion":
        from raftlet.cli import completion_cmd

        try:
            return completion_cmd.run(args, parser)
        except BrokenPipeError:
            # `raftlet completion bash | true`: the reader left; not an error of ours.
            from raftlet.cli.common import stdout_gone

            stdout_gone()
            return 0
    return _run_command(args)


# Commands whose whole job is to print what they read: once nobody reads, they may stop
# (`raftlet scan … | head`) with exit 0. Every other command -- all that change something,
# and `cluster status`, whose exit status is its verdict -- carries on, its output dropped.
_STOP_WHEN_UNREAD = frozenset({"scan", "metrics", "tablet export"})
# A write that failed for want of room, or a device that failed: the output (`scan
# --format json > file` on a full disk) or a file the command uses. One line, no traceback.
_DEVICE_FAILED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def _run_command(args: argparse.Namespace) -> int:
    from raftlet.cli import (
        admin_cmd,
        certs_cmd,
        chaos_cmd,
        cluster_cmd,
        metrics_cmd,
        row_cmd,
        scan_cmd,
        tablet_cmd,
        write_cmd,
    )
    from raftlet.cli.common import CliError, stdout_gone

    runners = {
        "chaos": chaos_cmd.run,
        "cluster": cluster_cmd.run,
        "write": write_cmd.run,
        "row": row_cmd.run,
        "scan": scan_cmd.run,
        "metrics": metrics_cmd.run,
        "leader-step-down": admin_cmd.run,
        "tablet": tablet_cmd.run,
        "certs": certs_cmd.run,
    }
    name = args.command
    if args.command == "cluster":
        name = f"cluster {args.cluster_command}"
    elif args.command == "certs":
        name = f"certs {args.certs_command}"
    elif args.command == "tablet":
        name = f"tablet {args.tablet_command}"
    elif args.command == "row":
        name = f"row {args.row_command}"
    # SIGTERM (a CI runner's timeout, `kill`) gets the same orderly stop as Ctrl-C: `cluster
    # up` stops the servers it started, chaos its faults and namespaces, write its load.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        try:
            return runners[args.command](args)
        finally:
            _flush_stdout()
    except CliError as e:
        _fail(name, str(e))
        return e.exit_code
    except KeyboardInterrupt:
        _fail(name, "interrupted")
        return 130
    except BrokenPipeError:
        if name not in _STOP_WHEN_UNREAD:
            # Every other command's output carries on into /dev/null once unread
            # (common.console, print_out): a broken pipe here is not stdout's, and no
            # success -- it once turned `cluster up | head -1`, whose servers were stopped
            # again, into exit 0.
            raise
        # `raftlet scan … | head`: the reader left; that is not an error of ours.
        stdout_gone()
        return 0
    except OSError as e:
        if e.errno not in _DEVICE_FAILED:
            raise
        if e.filename:
            _fail(name, f"{e.filename}: {e.strerror}")
        else:
            stdout_gone()  # most likely the output: what is still buffered would fail at exit
            _fail(name, f"{e.strerror} (writing its output, or a file it uses)")
        return 1
    except Exception as e:
        # A client error that escaped a command's handling is still one line; anything
        # else is a bug and keeps its traceback.
        from raftlet.client import RaftletError

        if isinstance(e, RaftletError):
            _fail(name, str(e))
            return 1
        raise


def _flush_stdout() -> None:
    """What print() left buffered goes out now, where a reader gone is caught, not at exit
    (an exit status 120 and an "Exception ignored" message)."""
    from raftlet.cli.common import stdout_gone

    try:
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_gone()


def _raise_interrupt(_sig: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _fail(command: str, message: str) -> None:
    from raftlet.cli.common import print_out

    one_line = " ".join(message.split())
    # stderr may be a closed pipe too (`2>&1 | head -1`): the exit status still says it.
    print_out(f"raftlet {command}: error: {one_line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
