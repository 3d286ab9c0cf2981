"""Configuration of one Raft node, validated in one place."""

from __future__ import annotations

from dataclasses import dataclass

from raftlet.consensus.core.errors import RaftConfigError

__all__ = ["Config"]


@dataclass(frozen=True, slots=True)
class Config:
    # This node's id and the ids of every voter in the group (itself included).
    id: str
    voters: tuple[str, ...]
    # A follower that hears nothing for a random number of ticks in
    # [election_tick, 2 * election_tick) campaigns (paper §5.2).
    election_tick: int = 10
    # A leader sends heartbeats every heartbeat_tick ticks.
    heartbeat_tick: int = 1
    # Pre-vote (thesis §9.6): a node first asks whether it could win before it
    # bumps its term, so a partitioned node rejoining does not depose a leader.
    pre_vote: bool = True
    # Check-quorum (thesis §6.2): a leader that has not heard from a majority
    # within an election timeout steps down; followers that heard from a leader
    # within the timeout ignore vote requests (a leader lease).
    check_quorum: bool = True
    # At most this many APPEND messages in flight per follower in replicate state.
    max_inflight_msgs: int = 256
    # Cap on the entry bytes of one APPEND message (at least one entry is sent).
    max_size_per_msg: int = 1 << 20
    # When the commit index moves, send every follower an append at once, even one with no
    # entries (etcd's behaviour).  False lets the new commit index ride on the next append
    # or heartbeat: under light load that halves the messages a follower handles per write,
    # at the cost of followers learning the commit up to a heartbeat later.
    broadcast_commit: bool = True
    # Every heartbeat starts a new read round (see Raft.read_index), so a quorum's answers
    # confirm rounds -- and a driver can renew a leader lease -- without any read.
    heartbeat_read_rounds: bool = False
    # Index already applied to the state machine before this start (the store's
    # applied index): committed entries are delivered from applied + 1.
    applied: int = 0
    # Seed of the randomized election timeout; None draws from the OS.
    seed: int | None = None

    def validate(self) -> None:
        if not self.id:
            raise RaftConfigError("id must be non-empty")
        if self.id not in self.voters:
            raise RaftConfigError(f"id {self.id!r} is not among the voters {self.voters!r}")
        if len(set(self.voters)) != len(self.voters):
            raise RaftConfigError(f"duplicate voters in {self.voters!r}")
        if self.heartbeat_tick <= 0:
            raise RaftConfigError("heartbeat_tick must be positive")
        if self.election_tick <= self.heartbeat_tick:
            raise RaftConfigError("election_tick must be greater than heartbeat_tick")
        if self.max_inflight_msgs <= 0:
            raise RaftConfigError("max_inflight_msgs must be positive")
        if self.max_size_per_msg <= 0:
            raise RaftConfigError("max_size_per_msg must be positive")
        if self.applied < 0:
            raise RaftConfigError("applied must be >= 0")
