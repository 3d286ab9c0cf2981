"""Majority arithmetic, pure (paper §5.2 votes, §5.3 commit)."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

__all__ = ["VoteResult", "committed_index", "quorum_size", "vote_result"]


class VoteResult(enum.Enum):
    PENDING = "PENDING"
    WON = "WON"
    LOST = "LOST"


def quorum_size(n_voters: int) -> int:
    return n_voters // 2 + 1


def committed_index(voters: Iterable[str], match: Mapping[str, int]) -> int:
    """The largest index that a majority of ``voters`` have matched."""
    indexes = sorted((match.get(v, 0) for v in voters), reverse=True)
    return indexes[quorum_size(len(indexes)) - 1]


def vote_result(voters: Iterable[str], votes: Mapping[str, bool]) -> VoteResult:
    """WON once a majority granted; LOST once a majority can no longer grant."""
    voters = list(voters)
    granted = sum(1 for v in voters if votes.get(v) is True)
    missing = sum(1 for v in voters if v not in votes)
    q = quorum_size(len(voters))
    if granted >= q:
        return VoteResult.WON
    if granted + missing >= q:
        return VoteResult.PENDING
    return VoteResult.LOST
