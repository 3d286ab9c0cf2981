"""Typed errors the core raises to its driver (never for a peer's bad message:
those are answered or dropped, because a remote node must not crash us)."""

from __future__ import annotations

__all__ = [
    "ConfigChangeRefused",
    "NotLeaderError",
    "ProposalDropped",
    "RaftConfigError",
    "TermMismatch",
]


class RaftConfigError(ValueError):
    """The core was configured inconsistently (see ``Config.validate``)."""


class ProposalDropped(Exception):
    """A proposal was not appended to the log; nothing about it is durable."""


class ConfigChangeRefused(ProposalDropped):
    """A membership change was refused: another is not committed yet, this leader has not
    committed an entry of its term, a leadership transfer is under way, the voters that
    answer lately would be no majority of the new membership, or the change does not fit
    the current membership (the message says which).  Nothing was appended."""


class ConfigChangeDeferred(ConfigChangeRefused):
    """A membership change this leader cannot take *yet*, though it may in a moment: it is
    handing leadership over, or has not committed an entry of its term. A caller retries
    (another change not committed yet is ``ConfigChangeRefused``: another operator's)."""


class NotLeaderError(ProposalDropped):
    """This node is not the leader; ``leader_id`` is the known leader or ''."""

    def __init__(self, leader_id: str, term: int) -> None:
        super().__init__(f"not the leader (term {term}, leader {leader_id or 'unknown'})")
        self.leader_id = leader_id
        self.term = term


class TermMismatch(ProposalDropped):
    """The proposal was bound to a term the leader is no longer in.

    This is what makes a lock-free leadership check safe: a check that read a
    stale (term, role) snapshot binds its write to that term, and the append
    under the lock refuses it if the term has since moved.
    """

    def __init__(self, expected_term: int, current_term: int, leader_id: str) -> None:
        super().__init__(f"term moved from {expected_term} to {current_term}")
        self.expected_term = expected_term
        self.current_term = current_term
        self.leader_id = leader_id
