"""``raftlet cluster balance-leaders``: spread the tablets' leaders evenly over the servers.

Leadership stays where elections put it. After rolling restarts and step-downs a
long-running review found all four leaders of a cluster on one server, which then did twice
the work of the others: nothing moved them back. This command reads where the leaders are
(``client.health``, the same probe as ``cluster status``), plans moves that leave no
server leading two tablets more than another (``plan_moves``, pure), and carries them out
one tablet at a time: a leadership transfer to the chosen voter, then a wait until it leads.
Only servers that answer take leaders, and only voters whose replica is healthy and caught
up (state OK); a move that does not happen is reported and the rest go on.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from typing import Any

from raftlet.cli.common import (
    CliError,
    add_target_arguments,
    close_client,
    console,
    resolve_target,
    timeout_seconds,
)

__all__ = ["add_parser", "plan_moves", "run"]

_EPILOG = """\
examples:
  raftlet cluster balance-leaders --data-dir ./c1
  raftlet cluster balance-leaders --data-dir ./c1 --dry-run   # only print the moves

Leaders end up unevenly spread after restarts and step-downs (an election picks whoever
times out first); a server leading more tablets does more of the work. Writes in flight
during a move are retried by clients (NOT_LEADER) and not lost.
"""

# A move is (tablet, from server, to server).
Move = tuple[str, str, str]


def add_parser(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "balance-leaders",
        help="move tablet leaderships so that every server leads about as many",
        description=(
            "Move leaderships (Raft leadership transfers) until no server leads two "
            "tablets more than another, among the servers that answer."
        ),
        epilog=_EPILOG,
        formatter_class=formatter,
    )
    add_target_arguments(p)
    p.add_argument("--dry-run", action="store_true", help="print the moves, make none")
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=20.0,
        metavar="S",
        help="seconds to wait for each move's new leader (default 20)",
    )


def plan_moves(
    leaders: Mapping[str, str], voters: Mapping[str, Sequence[str]], servers: Sequence[str]
) -> list[Move]:
    """The moves that leave no server of ``servers`` leading two tablets more than another,
    as far as each tablet's ``voters`` allow: each goes from a server leading the most to
    the one leading the fewest among its tablet's voters, and only where that one leads at
    least two fewer (so every move lowers the sum of squared counts, and the loop ends).
    Leaders on servers not in ``servers`` stay, and count for nothing."""
    counts = dict.fromkeys(servers, 0)
    led = {t: s for t, s in leaders.items() if s in counts}
    for server in led.values():
        counts[server] += 1
    moves: list[Move] = []
    while True:
        move = _one_move(led, voters, counts)
        if move is None:
            return moves
        tablet, src, dst = move
        counts[src] -= 1
        counts[dst] += 1
        led[tablet] = dst
        moves.append(move)


def _one_move(
    led: Mapping[str, str], voters: Mapping[str, Sequence[str]], counts: Mapping[str, int]
) -> Move | None:
    for src in sorted(counts, key=lambda s: (-counts[s], s)):
        for tablet in sorted(t for t, s in led.items() if s == src):
            options = [
                v
                for v in voters.get(tablet, ())
                if v in counts and v != src and counts[v] <= counts[src] - 2
            ]
            if options:
                return tablet, src, min(options, key=lambda v: (counts[v], v))
    return None


def run(args: argparse.Namespace) -> int:
    from raftlet.cli.admin_cmd import current_leader
    from raftlet.client import RaftletError
    from raftlet.client.health import ProbeOptions, check_cluster
    from raftlet.client.tls import uses_token_ports

    target = resolve_target(args)
    config = target.config
    credentials = target.creds.channel_credentials()
    token_ports = uses_token_ports(target.creds.tls)
    options = ProbeOptions(timeout_s=3.0, credentials=credentials, token_ports=token_ports)
    health = check_cluster(config, options)
    up = [s.id for s in health.servers if s.state == "UP"]
    leaders = {t.tablet_id: t.leader for t in health.tablets if t.leader is not None}
    voters = {
        t.tablet_id: [r.server for r in t.replicas if r.state == "OK" and r.role != "LEARNER"]
        for t in health.tablets
    }
    out = console()
    away = [s.id for s in health.servers if s.state != "UP"]
    note = f" ({', '.join(away)} not answering: given no leader)" if away else ""
    out.print(f"leaders now: {_spread(leaders, up)}{note}", markup=False)
    moves = plan_moves(leaders, voters, up)
    if not moves:
        out.print("balanced: no move would even them out further", markup=False)
        return 0
    for tablet, src, dst in moves:
        verb = "would move" if args.dry_run else "moving"
        out.print(f"{verb} {tablet}: {src} -> {dst}", markup=False)
    if args.dry_run:
        return 0
    client = target.client(timeout_s=args.timeout)
    failed: list[str] = []
    try:
        for tablet, src, dst in moves:
            try:
                client.leader_step_down(tablet, new_leader=dst)
            except RaftletError as e:
                failed.append(f"{tablet} ({src} -> {dst}): {e}")
                continue
            deadline = time.monotonic() + args.timeout
            now = None
            while time.monotonic() < deadline:
                now = current_leader(config, tablet, 2.0, credentials, token_ports)
                if now is not None and now[0] == dst:
                    break
                time.sleep(0.1)
            else:
                who = now[0] if now is not None else "no replica"
                failed.append(
                    f"{tablet}: {dst} did not take over within {args.timeout:g} s ({who} leads)"
                )
    finally:
        close_client(client)
    after = check_cluster(config, options)
    now_leaders = {t.tablet_id: t.leader for t in after.tablets if t.leader is not None}
    out.print(f"leaders after: {_spread(now_leaders, up)}", markup=False)
    if failed:
        raise CliError("some leaderships did not move: " + "; ".join(failed))
    return 0


def _spread(leaders: Mapping[str, str], servers: Sequence[str]) -> str:
    counts = dict.fromkeys(servers, 0)
    for server in leaders.values():
        counts[server] = counts.get(server, 0) + 1
    return ", ".join(f"{s} {n}" for s, n in sorted(counts.items()))
