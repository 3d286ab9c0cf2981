"""``raftlet leader-step-down TABLET [--to SERVER]``: move a tablet's leadership.

The current leader is asked to step down (to ``--to``, through Raft leadership transfer,
or to whoever wins the election that follows). The command then waits until a ready leader
other than the old one is seen, and reports the move, so a script can rely on leadership
having changed when it exits 0.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from raftlet.cli.common import (
    CliError,
    add_target_arguments,
    close_client,
    console,
    resolve_target,
    timeout_seconds,
)

if TYPE_CHECKING:
    from raftlet.client import Client

__all__ = ["add_parser", "current_leader", "run"]

_EPILOG = """\
examples:
  raftlet leader-step-down kv-p0 --data-dir ./c1
  raftlet leader-step-down kv-p0 --data-dir ./c1 --to ts3
  raftlet leader-step-down kv-p2 --servers 127.0.0.1:7051 --no-wait

Tablet ids are <table>-p<partition>; `raftlet cluster status` lists them with their leaders.
Writes in flight during the move are retried by clients (NOT_LEADER) and not lost.
"""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    p = commands.add_parser(
        "leader-step-down",
        help="make a tablet's leader step down (optionally to a given replica)",
        description=(
            "Ask the leader of TABLET to step down and wait until another replica leads it."
        ),
        epilog=_EPILOG,
        formatter_class=formatter,
        allow_abbrev=False,
    )
    p.add_argument("tablet", metavar="TABLET", help="tablet id, e.g. kv-p0")
    add_target_arguments(p)
    p.add_argument("--to", metavar="SERVER", help="the replica (server id) to hand leadership to")
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=20.0,
        metavar="S",
        help="seconds to wait for the new leader (default 20)",
    )
    p.add_argument("--no-wait", action="store_true", help="return once the leader has been asked")


def current_leader(
    config: Any,
    tablet_id: str,
    timeout_s: float,
    credentials: Any = None,
    token_ports: bool = False,
    why: list[str] | None = None,
) -> tuple[str, int] | None:
    """(leader id, term) of ``tablet_id`` as the servers report it, or None -- and then
    what the check says of the servers, added to ``why``: a client certificate every
    server refused read only as "no ready leader" (review r27a)."""
    from raftlet.client.health import ProbeOptions, check_cluster

    options = ProbeOptions(timeout_s=timeout_s, credentials=credentials, token_ports=token_ports)
    health = check_cluster(config, options)
    for t in health.tablets:
        if t.tablet_id == tablet_id and t.leader is not None:
            return t.leader, t.term
    if why is not None:
        why += [i for i in health.issues if i.startswith("server ")]
    return None


def _check_target_serves(
    config: Any, tablet: str, server: str, credentials: Any, token_ports: bool
) -> None:
    """``server``'s replica of ``tablet`` must be able to lead: a FAILED one (a full disk,
    say) or one on a server that does not answer cannot, and the wait for it ended in "may
    be down or behind", which sent an operator looking in the wrong place."""
    from raftlet.client.health import ProbeOptions, check_cluster

    options = ProbeOptions(timeout_s=3.0, credentials=credentials, token_ports=token_ports)
    health = check_cluster(config, options)
    for t in health.tablets:
        if t.tablet_id != tablet:
            continue
        state = next((r.state for r in t.replicas if r.server == server), "")
        if state == "FAILED":
            why = next((i for i in t.issues if i.startswith(f"replica on {server} is FAILED")), "")
            raise CliError(f"--to {server}: {why or f'its replica of {tablet} is FAILED'}")
        if state == "DOWN":
            raise CliError(f"--to {server}: its server does not answer, so it cannot lead {tablet}")


def _check_voter(client: Client, tablet: str, server: str, timeout_s: float) -> None:
    """``server`` must be a voter of ``tablet`` now -- the group as its leader sees it, not
    the placement in the config, which replicas moved since may have left behind."""
    from raftlet.client import RaftletError
    from raftlet.client.membership import leader_membership

    try:
        m = leader_membership(client, tablet, timeout_s)
    except RaftletError as e:
        raise CliError(f"{tablet}: its group could not be read: {e}") from None
    if server in m.voters:
        return
    what = "a learner (not yet a voter) of" if server in m.learners else "no member of"
    raise CliError(
        f"--to {server}: {what} {tablet}, and only a voter can lead (voters: {', '.join(m.voters)})"
    )


def run(args: argparse.Namespace) -> int:
    from raftlet.client import RaftletError
    from raftlet.client.tls import uses_token_ports

    target = resolve_target(args)
    config = target.config
    target.check_tablet(args.tablet)
    if args.to is not None:
        target.check_server(args.to, "--to: ")
    credentials = target.creds.channel_credentials()
    token_ports = uses_token_ports(target.creds.tls)
    why: list[str] = []
    before = current_leader(config, args.tablet, 3.0, credentials, token_ports, why)
    if before is None:
        note = f" ({'; '.join(why)})" if why else ""
        raise CliError(f"{args.tablet} has no ready leader to step down{note}")
    old, old_term = before
    if args.to == old:
        # What was asked for holds: a script moving leaders (an upgrade's) need not tell
        # this exit 1 from a failure.
        console().print(f"{args.tablet}: {args.to} already leads it (term {old_term})")
        return 0
    client = target.client(timeout_s=args.timeout)
    if args.to is not None:
        _check_voter(client, args.tablet, args.to, args.timeout)
        _check_target_serves(config, args.tablet, args.to, credentials, token_ports)
    try:
        client.leader_step_down(args.tablet, new_leader=args.to or "")
    except RaftletError as e:
        raise CliError(f"step-down of {args.tablet} failed: {e}") from None
    finally:
        close_client(client)
    out = console()
    if args.no_wait:
        out.print(f"{args.tablet}: asked leader {old} (term {old_term}) to step down")
        return 0
    deadline = time.monotonic() + args.timeout
    last: tuple[str, int] | None = before
    while time.monotonic() < deadline:
        now = current_leader(config, args.tablet, 2.0, credentials, token_ports)
        # A new term with a ready leader: the step-down happened. Without --to the old
        # leader may win the election that follows; that is a valid outcome, said as such.
        if now is not None and now[1] > old_term:
            new, term = now
            if args.to is not None and new != args.to:
                raise CliError(_not_the_one_asked(args.tablet, args.to, old, old_term, now))
            again = " (re-elected)" if new == old else ""
            out.print(
                f"{args.tablet}: leader {old} (term {old_term}) -> {new} (term {term}){again}",
                markup=False,
            )
            return 0
        last = now
        time.sleep(0.1)
    raise CliError(_no_new_leader(args.tablet, args.to, before, last, args.timeout))


# Where an operator sees why a replica did not take over: down, or its log behind.
_WHICH = "(`raftlet cluster status` shows which)"


def _not_the_one_asked(tablet: str, to: str, old: str, old_term: int, now: tuple[str, int]) -> str:
    """A new term began, led by another than ``--to``."""
    new, term = now
    if new == old:
        won = f"{old} was elected again (term {old_term} -> {term})"
    else:
        won = f"{new} took over instead (term {old_term} -> {term})"
    return f"{tablet}: {to} did not take over: {won}; {to} may be down or behind {_WHICH}"


def _no_new_leader(
    tablet: str,
    to: str | None,
    before: tuple[str, int],
    last: tuple[str, int] | None,
    timeout_s: float,
) -> str:
    """No new term with a ready leader within ``timeout_s``; ``last`` is what the servers
    said at the last look. A failed transfer leaves the old leader leading in its term, which
    "no new leader" alone told no one: it read as a tablet left without one."""
    old, old_term = before
    if to is not None:
        within = f"{tablet}: {to} did not take over within {timeout_s:g} s"
        behind = f"{to} may be down or behind"
    else:
        within = f"{tablet}: no other replica took over within {timeout_s:g} s"
        behind = "the others may be down or behind"
    if last == before:
        return f"{within}: {old} still leads (term {old_term}, unchanged); {behind} {_WHICH}"
    if last is None:
        return (
            f"{within}, and no replica leads now ({old} led in term {old_term}): an election "
            f"may be under way, or too few replicas answer {_WHICH}"
        )
    leader, term = last
    return (
        f"{within}: the servers name {leader} the leader in term {term} (was {old}, "
        f"term {old_term}; `raftlet cluster status` shows the replicas)"
    )
