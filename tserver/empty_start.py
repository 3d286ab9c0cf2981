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
  heard unless they had been down together);
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

__all__ = ["NO_PEERS", "PeersView", "gather_answers", "read_peers"]

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
        if (
            not missing
            or any(server_id in a.servers_heard_from for a in answers.values())
            # A majority is enough: each took in the others' records while they ran, and
            # the missing may be new servers waiting for their own peers (servers added
            # together each waited out the whole wait for the others).
            or 2 * len(answers) > len(peers)
        ):
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
    if missing and wait_s > 0 and not heard:  # 0: the caller knows it makes a new cluster
        if answers:
            logger.warning(
                "%s did not answer: this server is taken for a new one on the word of %s, "
                "which never heard from it (nor from a peer that did)",
                ", ".join(missing),
                ", ".join(sorted(answers)),
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
