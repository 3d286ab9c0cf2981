"""Group membership: who votes, who only follows, and how it changes (thesis §4.1, §4.2.1).

A ``Membership`` is the voters plus the learners (non-voters: they receive every entry but
never vote, never campaign, and count for no majority).  It changes one server at a time by a
``ConfigChange`` carried in a CONFIG log entry: add a learner, promote a learner to voter,
remove a member.  Any two majorities of configurations one such change apart overlap, which
is what lets a node switch to a configuration as soon as the entry is in its log, committed
or not.

The entry's payload is ``Membership.encode()``: JSON (``{"voters": [...], "learners": [...]}``),
so the core reads it without the project's protobuf; lists are sorted, so equal memberships
encode to equal bytes on every replica.

``ConfState`` is what a driver persists beside the hard state: the membership a node uses
(the latest in its log) and the latest one known committed, each with the index of its entry
(0: the initial configuration, in no entry).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

from raftlet.consensus.core.errors import ConfigChangeRefused

__all__ = ["ConfState", "ConfigChange", "ConfigChangeType", "Membership"]


@dataclass(frozen=True, slots=True)
class Membership:
    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()

    def members(self) -> tuple[str, ...]:
        return self.voters + self.learners

    def problem(self) -> str | None:
        """Why this cannot be a group's membership, or None."""
        if not self.voters:
            return "a membership needs at least one voter"
        everyone = self.members()
        if any(not isinstance(n, str) or not n for n in everyone):
            return f"member ids must be non-empty strings: {everyone!r}"
        if len(set(everyone)) != len(everyone):
            return f"duplicate members in voters {self.voters!r} and learners {self.learners!r}"
        return None

    def encode(self) -> bytes:
        body = {"voters": sorted(self.voters), "learners": sorted(self.learners)}
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Membership:
        """The membership a CONFIG entry carries; ValueError if it is none."""
        try:
            body = json.loads(data)
            membership = cls(tuple(body["voters"]), tuple(body.get("learners", ())))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a membership: {e}") from None
        why = membership.problem()
        if why is not None:
            raise ValueError(why)
        return membership


class ConfigChangeType(enum.Enum):
    ADD_LEARNER = "ADD_LEARNER"
    PROMOTE = "PROMOTE"
    REMOVE = "REMOVE"


@dataclass(frozen=True, slots=True)
class ConfigChange:
    type: ConfigChangeType
    node: str

    def apply(self, m: Membership) -> Membership:
        """The membership after this change; ``ConfigChangeRefused`` says why it cannot be."""
        node = self.node
        if not node:
            raise ConfigChangeRefused("a config change needs a node id")
        if self.type is ConfigChangeType.ADD_LEARNER:
            if node in m.members():
                raise ConfigChangeRefused(f"{node} is already a member ({_describe(m)})")
            return Membership(m.voters, tuple(sorted((*m.learners, node))))
        if self.type is ConfigChangeType.PROMOTE:
            if node not in m.learners:
                raise ConfigChangeRefused(f"{node} is not a learner ({_describe(m)})")
            learners = tuple(n for n in m.learners if n != node)
            return Membership(tuple(sorted((*m.voters, node))), learners)
        if node not in m.members():
            raise ConfigChangeRefused(f"{node} is not a member ({_describe(m)})")
        if m.voters == (node,):
            raise ConfigChangeRefused(f"{node} is the only voter: it cannot be removed")
        return Membership(
            tuple(n for n in m.voters if n != node), tuple(n for n in m.learners if n != node)
        )


@dataclass(frozen=True, slots=True)
class ConfState:
    membership: Membership
    index: int
    committed: Membership
    committed_index: int


def _describe(m: Membership) -> str:
    learners = f"; learners {', '.join(m.learners)}" if m.learners else ""
    return f"voters {', '.join(m.voters)}{learners}"
