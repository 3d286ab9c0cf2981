"""``raftlet cluster balance-leaders``: spread the tablets' leaders evenly over the servers.

Leadership stays where elections put it. After rolling restarts and step-downs a
long-running review found all four leaders of a cluster on one server, which then did twice
the work of the others: nothing moved them back. This command reads where the leaders are
(``client.health``, the same probe as ``cluster status``), plans moves that leave no
server leading two tablets more than another where the replicas' placement allows it
(``plan_moves``, pure), and carries them out one tablet at a time: a leadership transfer
to the chosen voter, then a wait until it leads (ended early, saying so, if the voter
stops answering). Only servers that answer and hold a voter count and take leaders,
and only voters whose replica is healthy and caught up (state OK); a move that does not
happen is reported and the rest go on. Where the placement leaves a server leading two
more than another, the output says so and why (``imbalance_left``).

A move may be a chain: with leaders ts1 1, ts2 1, ts3 2, ts4 0 and no replica on ts4 of
ts3's tablets, ts1 passes one of its tablets to ts4 and ts3 one of its to ts1. Planning only
direct moves stopped there and reported ts3 2, ts4 0 as balanced.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
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
    from raftlet.client.health import ClusterLayout, ProbeOptions

__all__ = ["add_parser", "imbalance_left", "plan_moves", "run"]

_EPILOG = """\
examples:
  raftlet cluster balance-leaders --data-dir ./c1
  raftlet cluster balance-leaders --data-dir ./c1 --dry-run   # only print the moves

Leaders end up unevenly spread after restarts and step-downs (an election picks whoever
times out first); a server leading more tablets does more of the work. Writes in flight
during a move are retried by clients (NOT_LEADER) and not lost.
"""

# A move's target that has not answered the probe for this long is taken for down: a
# transfer to it cannot happen, and a restart is shorter.
_SILENT_TARGET_S = 5.0

# A move is (tablet, from server, to server).
Move = tuple[str, str, str]


def add_parser(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "balance-leaders",
        help="move tablet leaderships so that every server leads about as many",
        description=(
            "Move leaderships (Raft leadership transfers) until no server leads two "
            "tablets more than another, among the servers that answer, as far as where "
            "the tablets' replicas are allows: a leadership moves only to a server holding "
            "a caught-up voter replica of its tablet, possibly through a chain of moves "
            "over other servers. What it could not even out is printed with the reason."
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
    as far as each tablet's ``voters`` allow. Each step takes one leadership off a server
    leading the most and gives one to a server leading at least two fewer: directly, or
    where no tablet of the first has a voter on the second, by a chain of moves through
    other servers (``_one_chain``), which keep their count. So every step lowers the sum of
    squared counts, and the loop ends: when no chain is left from any server to one leading
    two fewer. Leaders on servers not in ``servers`` stay, and count for nothing."""
    counts = dict.fromkeys(servers, 0)
    led = {t: s for t, s in leaders.items() if s in counts}
    for server in led.values():
        counts[server] += 1
    moves: list[Move] = []
    while True:
        chain = _one_chain(led, voters, counts)
        if not chain:
            return moves
        counts[chain[-1][1]] -= 1  # the first giver (the chain runs from the taker back)
        counts[chain[0][2]] += 1
        for tablet, _, dst in chain:
            led[tablet] = dst
        moves.extend(chain)


def _one_chain(
    led: Mapping[str, str], voters: Mapping[str, Sequence[str]], counts: Mapping[str, int]
) -> list[Move]:
    """Moves carrying one leadership from a server leading the most to one leading at least
    two fewer, [] if there is none. Ordered from the taker's end: each server in between
    first gives a leadership away and then takes one, so none of them ever leads more than
    it did, and a chain cut short by a failed move leaves no server leading more than the
    busiest did."""
    for src in sorted(counts, key=lambda s: (-counts[s], s)):
        reached = _reachable(src, led, voters, counts)
        takers = [d for d in reached if counts[d] <= counts[src] - 2]
        if not takers:
            continue
        dst = min(takers, key=lambda d: (counts[d], len(_path(reached, d)), d))
        return list(reversed(_path(reached, dst)))
    return []


# For each server reached, the move that reached it: (tablet, from server, to server).
Reached = dict[str, Move]


def _reachable(
    src: str, led: Mapping[str, str], voters: Mapping[str, Sequence[str]], counts: Mapping[str, int]
) -> Reached:
    """Every server a leadership of ``src`` can reach by moves, breadth first (so by the
    fewest moves), each with the move that reached it."""
    by_leader: dict[str, list[str]] = {}
    for tablet, server in sorted(led.items()):
        by_leader.setdefault(server, []).append(tablet)
    reached: Reached = {}
    frontier = [src]
    while frontier:
        following = []
        for server in frontier:
            for tablet in by_leader.get(server, ()):
                for v in sorted(voters.get(tablet, ())):
                    if v in counts and v != src and v not in reached:
                        reached[v] = (tablet, server, v)
                        following.append(v)
        frontier = following
    return reached


def _path(reached: Reached, dst: str) -> list[Move]:
    """The moves from the search's start to ``dst``, in order."""
    path = [reached[dst]]
    while path[-1][1] in reached:
        path.append(reached[path[-1][1]])
    return list(reversed(path))


def imbalance_left(
    leaders: Mapping[str, str], voters: Mapping[str, Sequence[str]], servers: Sequence[str]
) -> str | None:
    """Why ``leaders`` (as ``plan_moves`` leaves them) still has a server of ``servers``
    leading two more than another, or None if none does: no chain of moves reaches the
    server leading the fewest from the one leading the most."""
    counts = dict.fromkeys(servers, 0)
    led = {t: s for t, s in leaders.items() if s in counts}
    for server in led.values():
        counts[server] += 1
    if not counts:
        return None
    most = min(counts, key=lambda s: (-counts[s], s))
    fewest = min(counts, key=lambda s: (counts[s], s))
    if counts[most] - counts[fewest] < 2:
        return None
    return (
        f"{most} still leads {counts[most]} and {fewest} {counts[fewest]}: no leadership can "
        f"pass from {most} to {fewest}, directly or through other servers ({fewest} holds no "
        f"caught-up voter replica of a tablet led by {most} or by a server it could hand one "
        "to); add a replica there (raftlet tablet add-replica) to even them out"
    )


def run(args: argparse.Namespace) -> int:
    from raftlet.client import RaftletError
    from raftlet.client.health import ProbeOptions, check_cluster, replica_present
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
    # A server that holds no voter (one a replace-server emptied) can lead nothing: counted,
    # its 0 leaders read as an imbalance to fix by adding replicas back (review r30a).
    holding = {
        r.server
        for t in health.tablets
        for r in t.replicas
        if r.role != "LEARNER" and replica_present(r.state)
    }
    empty = [s for s in up if s not in holding]
    up = [s for s in up if s in holding]
    out = console()
    away = [s.id for s in health.servers if s.state != "UP"]
    notes = [f"{', '.join(away)} not answering: given no leader"] if away else []
    notes += [f"{', '.join(empty)} holding no voter: left out"] if empty else []
    note = f" ({'; '.join(notes)})" if notes else ""
    out.print(f"leaders now: {_spread(leaders, up)}{note}", markup=False)
    moves = plan_moves(leaders, voters, up)
    planned = {**leaders, **{tablet: dst for tablet, _, dst in moves}}
    left = imbalance_left(planned, voters, up)
    if not moves:
        if left is None:
            out.print("balanced: no move would even them out further", markup=False)
        else:
            out.print(f"not balanced, and no move can change that: {left}", markup=False)
        return 0
    for tablet, src, dst in moves:
        verb = "would move" if args.dry_run else "moving"
        out.print(f"{verb} {tablet}: {src} -> {dst}", markup=False)
    if left is not None:
        out.print(f"the moves leave it unbalanced: {left}", markup=False)
    if args.dry_run:
        out.print(f"leaders after them: {_spread(planned, up)}", markup=False)
        return 0
    client = target.client(timeout_s=args.timeout)
    probe = ProbeOptions(timeout_s=2.0, credentials=credentials, token_ports=token_ports)
    failed: list[str] = []
    try:
        for tablet, src, dst in moves:
            try:
                client.leader_step_down(tablet, new_leader=dst)
            except RaftletError as e:
                failed.append(f"{tablet} ({src} -> {dst}): {e}")
                continue
            if (why := _wait_taken_over(config, tablet, dst, args.timeout, probe)) is not None:
                failed.append(f"{tablet}: {why}")
    finally:
        close_client(client)
    after = check_cluster(config, options)
    now_leaders = {t.tablet_id: t.leader for t in after.tablets if t.leader is not None}
    out.print(f"leaders after: {_spread(now_leaders, up)}", markup=False)
    if not failed and left is None and _uneven(now_leaders, up):
        # Every move was made, yet an election elsewhere (a server restarting, a step-down)
        # moved a leadership meanwhile: say so rather than leave "leaders after" unexplained.
        out.print(
            "leaders changed while moving (an election elsewhere): run it again", markup=False
        )
    if failed:
        raise CliError("some leaderships did not move: " + "; ".join(failed))
    return 0


def _wait_taken_over(
    config: ClusterLayout, tablet: str, dst: str, timeout_s: float, probe: ProbeOptions
) -> str | None:
    """None once ``dst`` leads ``tablet``, else why not: it did not within ``timeout_s``, or
    it stopped answering for ``_SILENT_TARGET_S`` (a move to a killed server waited out the
    whole timeout and did not say the server was down: review r30a)."""
    from raftlet.client.health import check_cluster

    deadline = time.monotonic() + timeout_s
    answered = time.monotonic()
    while True:
        health = check_cluster(config, probe)
        leader = next((t.leader for t in health.tablets if t.tablet_id == tablet), None)
        if leader == dst:
            return None
        who = leader or "no replica"
        target = next(s for s in health.servers if s.id == dst)
        if target.state != "DOWN":
            answered = time.monotonic()
        elif time.monotonic() - answered >= _SILENT_TARGET_S:
            return f"{dst} stopped answering ({target.error}): is it down? ({who} leads)"
        if time.monotonic() >= deadline:
            return f"{dst} did not take over within {timeout_s:g} s ({who} leads)"
        time.sleep(0.1)


def _uneven(leaders: Mapping[str, str], servers: Sequence[str]) -> bool:
    counts = dict.fromkeys(servers, 0)
    for server in leaders.values():
        if server in counts:
            counts[server] += 1
    return bool(counts) and max(counts.values()) - min(counts.values()) >= 2


def _spread(leaders: Mapping[str, str], servers: Sequence[str]) -> str:
    counts = dict.fromkeys(servers, 0)
    for server in leaders.values():
        counts[server] = counts.get(server, 0) + 1
    return ", ".join(f"{s} {n}" for s, n in sorted(counts.items()))
