"""``/readyz``: whether this server could be taken down now without leaving a tablet short
of working voters -- the readiness a rolling restart or a drain waits for.

``/healthz`` says only that the process serves its status pages; a server that had just
started was "ready" by it while its replicas were still catching up, so a StatefulSet's
rolling update moved on to the next server and left tablets without a majority that could
commit (review r34b). Ready means every replica here that is a member of its group is
working: not FAILED, not being replaced by a tablet copy, with a leader -- itself, ready
to take writes, or one it heard from, whose log it holds to within ``READY_LAG_ENTRIES``
of the commit index that leader last told it (``leader_commit``, from its heartbeats; a
leader that predates the field tells 0, and its followers count as caught up).
A leftover (a replica no member of its group) does not count. Everything is read from what
the replicas published (``TabletReplica.ready_status``, at most a second or so old), never
under a consensus lock nor from a file: a probe must not hang behind a slow disk.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from raftlet.consensus.core.types import Role

__all__ = ["READY_LAG_ENTRIES", "not_ready"]

# How far a follower's log may end below its leader's commit and count as caught up: under
# load a healthy follower is always a few entries behind what the leader last said.
READY_LAG_ENTRIES = 1000


def not_ready(
    server_id: str, statuses: Iterable[Mapping[str, object]], copying: Iterable[str] = ()
) -> list[str]:
    """Why this server is not ready, a line per replica ([] when it is): ``statuses`` are
    its replicas' published statuses (``status_pages.tablet_statuses``), ``copying`` the
    tablets a copy is bringing here."""
    reasons = [f"{tid}: a tablet copy is under way" for tid in copying]
    for st in statuses:
        tid = st.get("tablet_id")
        members = [*_ids(st.get("voters")), *_ids(st.get("learners"))]
        if members and server_id not in members:
            continue  # a leftover, FAILED or not: no group counts on it
        if st.get("failed"):
            # Not why: the page is open to anyone (probes carry no credentials), and a
            # failure names files; /tablets says it to readers.
            reasons.append(f"{tid}: FAILED (/tablets says why)")
            continue
        role, leader = st.get("role"), st.get("leader")
        if role == Role.LEADER.value:
            if not st.get("leader_ready"):
                reasons.append(f"{tid}: leads, but has not yet committed an entry of its term")
            continue
        if not leader:
            reasons.append(f"{tid}: no leader known ({role})")
            continue
        if st.get("leader_commit_of") != leader:
            reasons.append(f"{tid}: has not yet heard how far its leader {leader} has committed")
            continue
        lag = _int(st.get("leader_commit")) - _int(st.get("last_index"))
        if lag > READY_LAG_ENTRIES:
            reasons.append(f"{tid}: catching up, {lag:,} entries behind its leader {leader}")
    return reasons


def _ids(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list | tuple) else []


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0
