"""A server stopped on purpose first hands the tablets it leads to their followers.

Without it, SIGTERM (``cluster down --server``, a rolling restart, systemd, Kubernetes) left
each tablet the server led without a leader until a follower's election timeout ran out:
every write to those tablets stalled 1.3-2.3 s, as long as after a crash.  With it, each
leader sends TIMEOUT_NOW (a leadership transfer, thesis §3.10) to its most caught-up
follower among those that answered the last heartbeats, which campaigns at once; writes
that arrive meanwhile are refused as "handing leadership over" and their clients retry on
the new leader.  A tablet with no such follower (the others are down or already stopped)
is not handed over.

The wait is bounded: a transfer whose target does not take over within an election timeout
is abandoned by the core (the follower stopped meanwhile, as in a whole-cluster ``cluster
down``), and the server stops anyway after ``wait_s``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from raftlet.consensus.core import Role
from raftlet.consensus.raft_consensus import RaftConsensus

__all__ = ["HANDOVER_WAIT_S", "hand_over_leaderships"]

logger = logging.getLogger(__name__)

# Longer than a transfer takes when the target is caught up (one round trip and a vote
# round), and than the core's election timeout, after which it abandons a transfer.
HANDOVER_WAIT_S = 3.0
# How often the wait looks at the leaders' published (term, role): the transfers happen on
# the replicas' own threads, and a stopping server has nothing else to do meanwhile.
_POLL_S = 0.01


async def hand_over_leaderships(
    replicas: Iterable[RaftConsensus], wait_s: float = HANDOVER_WAIT_S, why: str = ""
) -> int:
    """Ask every replica that leads to hand leadership to a follower that answers, and wait
    until each has stepped down or given up, or ``wait_s`` passed.  Returns how many a
    successor took over. ``why``: the reason, when the server is not stopping (its logs
    say so then, and a tablet no follower took is asked again, not warned of)."""
    loop = asyncio.get_running_loop()
    asked: list[RaftConsensus] = []
    terms: dict[str, int] = {}  # group -> the term it led when asked
    for consensus in replicas:
        snapshot = consensus.snapshot
        if snapshot.role is not Role.LEADER:
            continue
        try:
            # Takes the consensus lock: off the event loop, which answers peers meanwhile.
            target = await loop.run_in_executor(None, consensus.hand_over, why or "stopping")
        except Exception as e:  # a failed replica: stop anyway
            logger.info("%s: not handing leadership over: %s", consensus.group_id, e)
            continue
        if target:
            asked.append(consensus)
            terms[consensus.group_id] = snapshot.term
    deadline = loop.time() + wait_s
    pending = asked
    while pending and loop.time() < deadline:
        # Until each stepped down -- the successor's vote request reached it, and the vote is
        # what the successor needed from it -- or the core abandoned the transfer (still
        # leading, no longer transferring).  Waiting to hear the successor lead would wait
        # out ``wait_s`` whenever the successor is stopping too.
        pending = [c for c in pending if _handing_over(c)]
        if pending:
            await asyncio.sleep(_POLL_S)
    # Handed over: it follows in a later term, the one its successor campaigned in.  A
    # leader that stepped down in its own term lost its quorum (the others silent).
    handed = [c.group_id for c in asked if _followed_on(c, terms[c.group_id])]
    if handed:
        logger.info(
            "handed leadership of %d tablet(s) over %s: %s",
            len(handed),
            f"({why})" if why else "before stopping",
            ", ".join(handed),
        )
    kept = [c.group_id for c in asked if c.group_id not in handed]
    if kept and why:
        logger.info("no follower took over %s yet (%s)", ", ".join(kept), why)
    elif kept:
        logger.warning(
            "no follower took over %s: stopping anyway, and their followers elect a leader "
            "after an election timeout",
            ", ".join(kept),
        )
    return len(handed)


def _followed_on(consensus: RaftConsensus, term: int) -> bool:
    snapshot = consensus.snapshot
    return snapshot.role is not Role.LEADER and snapshot.term > term


def _handing_over(consensus: RaftConsensus) -> bool:
    snapshot = consensus.snapshot
    return snapshot.role is Role.LEADER and snapshot.transferring
