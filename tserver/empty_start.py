"""What a server that starts with an empty data directory learns from its peers.

An empty data directory is a new server -- started for the first time, or added to the
cluster config -- or one whose directory was wiped or replaced while it was a member of
tablet groups.  The server cannot tell which by itself, so it asks every peer's
``ListTablets`` once, briefly (a peer that does not answer tells nothing):

- a group that runs without this server (its membership leaves it out) is not joined: a
  server added to a running cluster gets replicas by ``move-replica`` or ``add-replica``;
- a peer that has heard from this server before (``servers_heard_from``,
  ``tserver.servers_heard``) means it ran, and may have voted and acknowledged entries it
  no longer holds: its replicas open FAILED, to be repaired by tablet copy, and none is
  made afresh.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from raftlet.proto import tablet_pb2

__all__ = ["NO_PEERS", "PeersView", "read_peers"]

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
    for listed in answers:
        if server_id in listed.servers_heard_from:
            heard_by.add(listed.server_uuid)
        for t in listed.tablets:
            members = {*t.voters, *t.learners}
            if server_id in members:
                with_me.add(t.tablet_id)
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
    return PeersView(frozenset(without_me), frozenset(with_me), frozenset(heard_by))
