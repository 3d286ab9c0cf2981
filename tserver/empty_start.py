"""What a server that starts with an empty data directory learns from its peers.

An empty data directory is a new server -- started for the first time, or added to the
cluster config -- or one whose directory was wiped or replaced while it was a member of
tablet groups.  The server cannot tell which by itself, so it asks every peer's
``ListTablets`` (``gather_answers``), again every second until every peer or a majority of
them answered, one says the server ran before, or ``--empty_dir_wait_s`` (30 s) ran out --
a wiped server booted before its peers (a power cut, say) would otherwise take itself for
a new one:

- a group that runs without this server (its membership leaves it out) is not joined: a
  server added to a running cluster gets replicas by ``move-replica`` or ``add-replica``;
- a peer that has heard from this server before (``servers_heard_from``,
  ``tserver.servers_heard``) means it ran, and may have voted and acknowledged entries it
  no longer holds: its replicas open FAILED, to be repaired by tablet copy, and none is
  made afresh;
- some peers answered and none heard from it: a new server (a WARNING names those that
  did not answer; the others took in their records every 10 s, so they knew what those
  heard unless they had been down together). A peer that was wiped itself
  (``wiped_at_start``) knows nothing of the time before, so its answer does not count:
  two servers wiped at once, one a new cluster's leader, the other taken for new on its
  word and the word of a lagging follower that had not heard from it yet, elected that
  follower and lost every acknowledged row;
- no answer at all within the wait: nothing is decided, and nothing made. The server
  serves with no replica of its own and asks again every second until a peer answers
  (``TabletServer._decide_when_a_peer_answers``), then decides as above. Taking itself
  for new there once lost every acknowledged row (a wiped server booted before its peers,
  made voters that forgot their votes, and elected an empty leader with a lagging peer);
  and a new cluster whose servers all start together still starts: each waits out the
  wait, serves, and then hears the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from raftlet.proto import consensus_pb2, tablet_pb2

__all__ = ["NO_PEERS", "PeersView", "can_decide", "counted", "gather_answers", "read_peers"]

# How long to wait between two rounds of asking the peers that did not answer.
_ASK_AGAIN_S = 1.0

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeersView:
    """What the answering peers say of this server's groups."""

    # Tablets placed here whose group runs without this server.
    without_me: frozenset[str] = frozenset()
    # Tablets whose group, as the peers list it, has this server as a member.
    with_me: frozenset[str] = frozenset()
    # Peers that heard from this server before: it is not new, its data directory was wiped.
    heard_by: frozenset[str] = frozenset()
    # The voters of each group in ``with_me`` as a peer listed them (a leader's first):
    # where a FAILED replica of a group moved off its placement finds a copy.
    voters: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


# Nobody asked: a server with replicas, or a record of those it hosts.
NO_PEERS = PeersView()


def read_peers(
    server_id: str, placed: Iterable[str], answers: Iterable[tablet_pb2.ListTabletsResponse]
) -> PeersView:
    """The view of ``server_id`` from its peers' ``answers``, with a WARNING for each
    placed group it will not join."""
    without_me: set[str] = set()
    with_me: set[str] = set()
    heard_by: set[str] = set()
    voters: dict[str, tuple[str, ...]] = {}
    for listed in answers:
        if server_id in listed.servers_heard_from:
            heard_by.add(listed.server_uuid)
        for t in listed.tablets:
            members = {*t.voters, *t.learners}
            if server_id in members:
                with_me.add(t.tablet_id)
                if t.tablet_id not in voters or t.role == consensus_pb2.LEADER:
                    voters[t.tablet_id] = tuple(t.voters)
            elif members:
                without_me.add(t.tablet_id)
    # One peer that says the group runs without this server is enough (another may lag
    # behind the change that removed it): joining would make a leftover nobody answers.
    with_me -= without_me
    without_me &= set(placed)
    for tid in sorted(without_me):
        logger.warning(
            "tablet %s: placed here, but its group runs on other servers without this "
            "one: not made (a server added to a cluster gets replicas by `raftlet tablet "
            "move-replica` or `add-replica`)",
            tid,
        )
    return PeersView(
        frozenset(without_me),
        frozenset(with_me),
        frozenset(heard_by),
        {tid: v for tid, v in voters.items() if tid in with_me},
    )


def counted(
    answers: Iterable[tablet_pb2.ListTabletsResponse],
) -> list[tablet_pb2.ListTabletsResponse]:
    """The answers that can tell a new server: those of peers not wiped themselves."""
    return [a for a in answers if not a.wiped_at_start]


def can_decide(
    server_id: str,
    peers: int,
    answers: Collection[tablet_pb2.ListTabletsResponse],
    *,
    waited: bool,
) -> bool:
    """Whether ``answers`` (of ``peers`` peers) tell ``server_id`` whether it ran: one heard
    from it; or every peer, or a majority, answered that was not wiped itself -- each took
    in the others' records while they ran, and the missing may be new servers waiting for
    their own peers (servers added together each waited out the whole wait for the others).
    Once the wait is over (``waited``), the word of those that answered, unless one of the
    answers was a wiped peer's: then a majority of the others is needed, however long that
    takes (with the majority of the servers wiped, the one left may lag)."""
    if any(server_id in a.servers_heard_from for a in answers):
        return True
    knowing = counted(answers)
    if len(knowing) == peers or 2 * len(knowing) > peers:
        return True
    return waited and bool(knowing) and len(knowing) == len(answers)


def gather_answers(
    server_id: str,
    peers: Collection[str],
    ask: Callable[[Collection[str]], Mapping[str, tablet_pb2.ListTabletsResponse]],
    wait_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
    stopped: Callable[[], bool] = lambda: False,
) -> list[tablet_pb2.ListTabletsResponse]:
    """The ``ListTablets`` answers of ``peers`` to an empty ``server_id``: ``ask(ids)``
    answers those of ``ids`` that answered, and is asked again, for the rest, every second
    until all or a majority answered, one says ``server_id`` ran (that decides it),
    ``wait_s`` ran out,
    or ``stopped()`` (the server is asked to stop: ``sleep`` should wake for it); a WARNING
    names the peers that did not answer."""
    deadline = clock() + wait_s
    answers: dict[str, tablet_pb2.ListTabletsResponse] = {}
    waiting_said = False
    while True:
        answers.update(ask([p for p in peers if p not in answers]))
        missing = sorted(p for p in peers if p not in answers)
        if can_decide(server_id, len(peers), answers.values(), waited=False):
            break
        if stopped():
            return list(answers.values())
        left = deadline - clock()
        if left <= 0:
            break
        if not waiting_said:
            logger.warning(
                "the data directory is empty: waiting up to %.0f s for %s to answer, which "
                "tell a new server from one whose data directory was wiped",
                left,
                ", ".join(missing),
            )
            waiting_said = True
        sleep(min(_ASK_AGAIN_S, left))
    missing = sorted(p for p in peers if p not in answers)
    heard = any(server_id in a.servers_heard_from for a in answers.values())
    wiped = sorted(a.server_uuid for a in answers.values() if a.wiped_at_start)
    if wiped and wait_s > 0 and not heard:
        logger.warning(
            "%s started from a wiped data directory and cannot tell whether this server ran "
            "before: only the word of the others counts",
            ", ".join(wiped),
        )
    missing = sorted(set(missing) | set(wiped))
    if missing and wait_s > 0 and not heard:  # 0: the caller knows it makes a new cluster
        if can_decide(server_id, len(peers), answers.values(), waited=True):
            logger.warning(
                "%s did not answer: this server is taken for a new one on the word of %s, "
                "which never heard from it (nor from a peer that did)",
                ", ".join(missing),
                ", ".join(sorted(a.server_uuid for a in counted(answers.values()))),
            )
        elif wiped:
            logger.warning(
                "no majority of the peers not wiped themselves answered within %g s: no "
                "replica is made until one does (with a majority of servers wiped, the one "
                "left may lag behind what was acknowledged); it serves meanwhile, and asks "
                "again every second",
                wait_s,
            )
        else:
            logger.warning(
                "none of %s answered within %g s: no replica is made until one does -- "
                "whether this server is new or its data directory was wiped is theirs to "
                "tell; it serves meanwhile, and asks again every second",
                ", ".join(missing),
                wait_s,
            )
    return list(answers.values())
