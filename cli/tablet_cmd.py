"""``raftlet tablet add-replica / remove-replica / move-replica`` and ``raftlet cluster
replace-server``: move tablet replicas between servers (membership changes; the steps and
their rules: ``raftlet.client.membership``).

Each prints a line per step taken. Errors an operator can act on (unknown tablet or server,
a change already in progress, a target that holds a replica, no server left to move to, a
removed replica whose server could not remove its files) end the command with exit 1 and
the reason; a removed replica whose server is down is left for a rerun, with a line saying
so. A remove-replica that leaves the tablet fewer voters than its table's replication factor
is done all the same (an operator may mean it), with a warning on stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raftlet.cli import tablet_export_cmd
from raftlet.cli.common import (
    CliError,
    UsageError,
    add_target_arguments,
    close_client,
    console,
    print_out,
    resolve_target,
    timeout_seconds,
)

__all__ = ["add_parser", "add_replace_server_parser", "run", "run_replace_server"]

_EPILOG = """\
examples:
  raftlet cluster up --data-dir ./c1 --servers 4   # kv-p2 on ts1, ts2, ts3; not on ts4
  raftlet tablet add-replica kv-p2 ts4 --data-dir ./c1 --wait
  raftlet tablet remove-replica kv-p2 ts1 --data-dir ./c1 --wait
  raftlet tablet move-replica kv-p2 ts4 ts1 --data-dir ./c1

add-replica creates an empty replica on SERVER and adds it as a learner (a non-voter the
leader catches up); with --wait it waits until the learner caught up and promotes it to a
voter. remove-replica hands leadership to another voter first if SERVER leads; with --wait
it waits for the removal to commit and deletes the replica from SERVER if SERVER answers
(exit 1 if SERVER says it could not remove the files; a rerun once they are fixed deletes
them), and warns on stderr when the tablet is left fewer voters than its table's replication
factor. move-replica adds TO (caught up and promoted), then removes FROM and deletes its
replica, with or without --wait. One change at a time: a tablet whose last change is not
committed yet refuses another. A change of voters that would leave the group without a
majority of voters its leader heard from within an election timeout is refused, naming the
silent ones: removing a healthy voter while another is down would leave a group that can
commit nothing, not even the change that undoes it. Remove the one that is down instead, or
bring it back first.
"""

_REPLACE_EPILOG = """\
examples:
  raftlet cluster replace-server ts2 --data-dir ./c1

Moves every replica on SERVER -- which may be down for good -- to a live server that holds no
replica of its tablet, the least loaded first, one tablet at a time.

Started again under its id with its old data, SERVER opens the replicas this command could
not delete (it was down) as leftovers outside their groups (`raftlet cluster status` names
them; `raftlet tablet remove-replica TABLET SERVER`, or this command run again, deletes
them). With an empty data directory it hosts nothing: its peers say that each group placed
on it runs without it, so it makes none of those replicas (its log: "placed here, but its
group runs on other servers without this one: not made") and serves empty, as a new server
does; `raftlet tablet add-replica` or `move-replica` gives it replicas again. Only a tablet
this command could not move (it names them) still has SERVER in its group: its peers heard
from SERVER before, so that replica opens FAILED and is repaired by a copy from the leader.
"""


def _timeout(p: argparse.ArgumentParser, default: float) -> None:
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=default,
        metavar="S",
        help=f"seconds to wait for each step (default {default:g})",
    )


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    tablet = commands.add_parser(
        "tablet",
        help="move a tablet's replicas between servers; export a stopped server's replica",
        description="Add, remove and move the replicas of one tablet (membership changes), "
        "or read a stopped server's replica offline (export).",
        epilog=_EPILOG,
        formatter_class=formatter,
        allow_abbrev=False,
    )
    sub = tablet.add_subparsers(dest="tablet_command", metavar="ACTION", required=True)
    add = sub.add_parser(
        "add-replica",
        help="add a replica on SERVER (a learner; --wait: caught up and promoted to voter)",
        epilog=_EPILOG,
        formatter_class=formatter,
    )
    add.add_argument("tablet", metavar="TABLET", help="tablet id, e.g. kv-p0")
    add.add_argument("server", metavar="SERVER", help="server id to add a replica on")
    remove = sub.add_parser(
        "remove-replica",
        help="remove SERVER's replica (leadership moves first if it leads)",
        epilog=_EPILOG,
        formatter_class=formatter,
    )
    remove.add_argument("tablet", metavar="TABLET", help="tablet id, e.g. kv-p0")
    remove.add_argument("server", metavar="SERVER", help="server id whose replica leaves")
    move = sub.add_parser(
        "move-replica",
        help="move a replica from FROM to TO (add TO, then remove FROM)",
        epilog=_EPILOG,
        formatter_class=formatter,
    )
    move.add_argument("tablet", metavar="TABLET", help="tablet id, e.g. kv-p0")
    move.add_argument("source", metavar="FROM", help="server id the replica leaves")
    move.add_argument("target", metavar="TO", help="server id the replica moves to")
    for p in (add, remove, move):
        add_target_arguments(p)
        p.add_argument(
            "--wait",
            action="store_true",
            help="wait until the change is complete"
            if p is not move
            else "accepted for scripts: a move always waits until FROM is removed and deleted",
        )
        _timeout(p, 120.0)
    tablet_export_cmd.add_parser(sub, formatter)


def add_replace_server_parser(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "replace-server",
        help="move every replica off SERVER (which may be dead) to other servers",
        description="Move every replica on SERVER to a live server without one of its tablet.",
        epilog=_REPLACE_EPILOG,
        formatter_class=formatter,
    )
    p.add_argument("server", metavar="SERVER", help="the server id to empty")
    add_target_arguments(p)
    _timeout(p, 300.0)


def run(args: argparse.Namespace) -> int:
    from raftlet.client import RaftletError
    from raftlet.client import membership as mc

    if args.tablet_command == "export":  # offline: no cluster to name
        return tablet_export_cmd.run(args)
    out = console()

    def say(line: str) -> None:
        out.print(line, markup=False)

    target = resolve_target(args)
    # Names no config knows are usage errors (exit 2), as with leader-step-down and
    # --table: they exited 1 here (review r33a). Servers are judged by the config the
    # servers run (UnknownServer), which may be newer than a cluster.toml given here.
    target.check_tablet(args.tablet)
    client = target.client(timeout_s=min(args.timeout, 30.0))
    short = ""  # why the voters left are too few, for remove-replica alone: a move adds first
    try:
        if args.tablet_command == "add-replica":
            m = mc.add_replica(
                client, args.tablet, args.server, wait=args.wait, timeout_s=args.timeout, say=say
            )
        elif args.tablet_command == "remove-replica":
            m = mc.remove_replica(
                client, args.tablet, args.server, wait=args.wait, timeout_s=args.timeout, say=say
            )
            short = _short_of_factor(client, args.tablet, len(m.voters))
        else:
            # A move waits for its source's removal whatever --wait says: it waits for the
            # add's catch-up anyway, the slow part, and one that stopped short left the source
            # replica on its server for another command to delete (review r33a).
            m = mc.move_replica(
                client,
                args.tablet,
                args.source,
                args.target,
                wait=True,
                timeout_s=args.timeout,
                say=say,
            )
    except mc.UnknownServer as e:
        raise UsageError(str(e)) from None
    except RaftletError as e:
        raise CliError(f"{args.tablet}: {e}") from None
    except KeyboardInterrupt:
        _say_where_left(f"tablet {args.tablet_command}", f"{args.tablet}'s group")
        raise
    finally:
        close_client(client)
    learners = f"; learners {', '.join(m.learners)}" if m.learners else ""
    say(f"{args.tablet}: voters {', '.join(m.voters)}{learners} (leader {m.leader})")
    if short:
        # One line, unwrapped, as the CLI's errors are: a warning a log keeps whole.
        print_out(f"raftlet tablet remove-replica: warning: {short}", file=sys.stderr)
    return 0


def _say_where_left(command: str, group: str) -> None:
    """What an interrupted membership command may leave (an interrupt said only
    "interrupted", though a learner may have been left behind: review r30a)."""
    print_out(
        f"raftlet {command}: note: {group} may be left mid-change (a learner added, a "
        "replica not yet removed): `raftlet cluster status` shows it, and the same command "
        "run again finishes it",
        file=sys.stderr,
    )


def _short_of_factor(client: Any, tablet: str, voters: int) -> str:
    """Why ``voters`` are too few for ``tablet`` ("" if they are not): a removal that went
    below the replication factor printed only the voters left and exit 0, and one more
    failure then left the tablet without a leader."""
    from raftlet.client import RaftletError

    try:
        table = client.table_of(tablet)
        factor = int(client.replication_factor(table))
    except RaftletError:
        return ""  # the removal is done: a failed look-up must not turn it into a failure
    if voters >= factor:
        return ""
    # A majority of n voters survives (n - 1) // 2 of them failing.
    spare = (voters - 1) // 2
    if spare == 0:
        stops = "one more failed voter leaves it without a majority, and its writes stop"
    else:
        stops = (
            f"{spare + 1} more failed voters stop its writes "
            f"(with {factor} it would take {(factor - 1) // 2 + 1})"
        )
    return (
        f"{tablet} now has {voters} voter{'s' if voters != 1 else ''}, fewer than the "
        f"replication factor {factor} of table {table}: {stops}. "
        f"`raftlet tablet add-replica {tablet} SERVER` adds one back"
    )


def run_replace_server(args: argparse.Namespace) -> int:
    from raftlet.client import RaftletError
    from raftlet.client import membership as mc

    out = console()

    def say(line: str) -> None:
        out.print(line, markup=False)

    client = resolve_target(args).client(timeout_s=min(args.timeout, 30.0))
    try:
        moved = mc.replace_server(client, args.server, timeout_s=args.timeout, say=say)
    except mc.UnknownServer as e:
        raise UsageError(str(e)) from None
    except RaftletError as e:
        raise CliError(f"replacing {args.server}: {e}") from None
    except KeyboardInterrupt:
        _say_where_left("cluster replace-server", f"a group of {args.server}'s tablets")
        raise
    finally:
        close_client(client)
    # "" for a replica only removed: one too many, or a leftover no member of its group.
    to_others = sum(1 for target in moved.values() if target)
    parts = [f"{to_others} replica(s) moved"] if to_others else []
    if len(moved) > to_others:
        parts.append(f"{len(moved) - to_others} removed")
    say(f"{args.server}: {', '.join(parts)}" if parts else f"{args.server}: no replicas")
    return 0
