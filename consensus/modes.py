"""The consensus driver's modes, as flags name them: in a module of their own, without the
driver's imports, so the command line can offer them as choices without loading the log,
the core and the workers (`raftlet cluster up --term-check-mode`)."""

from __future__ import annotations

import enum

__all__ = ["LeaderReadMode", "TermCheckMode"]


class TermCheckMode(enum.Enum):
    """How a write checks leadership and binds its term: the immutable (term, role) snapshot
    (KUDU-2727's fix), or under the consensus lock (the old path, kept to compare)."""

    LOCKFREE = "lockfree"
    LOCKED = "locked"


class LeaderReadMode(enum.Enum):
    """How a leader confirms a linearizable read: a quorum round per read (batched), or a
    lease renewed by heartbeats (see ``ConsensusOptions.lease_duration_s``)."""

    READ_INDEX = "read_index"
    LEASE = "lease"
