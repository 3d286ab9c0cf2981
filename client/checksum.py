"""Comparing a tablet's replicas row for row (``Client.checksum``, ``raftlet cluster ksck
--checksum``): the leader places a checksum point in the log, every replica checksums its
rows when it applies that point (``tserver.checksum``), and the results are compared here.
The same index on every replica means the same rows -- unless a replica is damaged."""

from __future__ import annotations

import collections
from dataclasses import dataclass

__all__ = ["ReplicaChecksum", "TabletChecksum"]


@dataclass(frozen=True, slots=True)
class ReplicaChecksum:
    server: str
    rows: int = 0
    checksum: str = ""  # hex; "" when ``error`` says why there is none
    error: str = ""


@dataclass(frozen=True, slots=True)
class TabletChecksum:
    tablet_id: str
    index: int  # the checksum point every replica was asked about
    replicas: tuple[ReplicaChecksum, ...]
    # Why no replica was asked (no leader, no point placed); "" when they were.
    not_checked: str = ""

    @property
    def agreed(self) -> str | None:
        """The checksum most replicas have, if a strict majority has one; None otherwise."""
        counts = collections.Counter(r.checksum for r in self.replicas if r.checksum)
        if not counts:
            return None
        checksum, n = counts.most_common(1)[0]
        return checksum if 2 * n > len(self.replicas) else None

    @property
    def ok(self) -> bool:
        """Every replica answered, and all with the same checksum."""
        return bool(self.replicas) and all(
            r.checksum and r.checksum == self.replicas[0].checksum for r in self.replicas
        )

    @property
    def diverged(self) -> bool:
        """Two replicas gave different checksums: their rows differ.  (Not ``ok`` and not
        diverged: some replica gave none -- its server down, the replica FAILED -- and
        those that did agree.)"""
        return len({r.checksum for r in self.replicas if r.checksum}) > 1

    def suspects(self) -> list[ReplicaChecksum]:
        """Replicas that gave no checksum, or one unlike the majority's (all replicas with a
        checksum when there is no majority)."""
        agreed = self.agreed
        return [r for r in self.replicas if not r.checksum or r.checksum != agreed]
