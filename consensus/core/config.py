"""Configuration of one Raft node, validated in one place."""

from __future__ import annotations

from dataclasses import dataclass

from raftlet.consensus.core.errors import RaftConfigError
from raftlet.consensus.core.membership import Membership

__all__ = ["Config"]


@dataclass(frozen=True, slots=True)
class Config:
    # This node's id and the membership it starts with: the voters and the learners
    # (non-voters) of the latest configuration it persisted (``Ready.conf_state``).  This
    # node need not be among them: a learner, a replica created to join, or one removed.
    id: str
    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()
    # The index of the CONFIG entry that holds that membership (0: the initial one, in no
    # entry), and the latest membership known committed with its entry's index (None: the
    # same).  If the log no longer holds the entry at ``config_index`` (the process died
    # after persisting the membership, before the entry was durable), the node falls back
    # to the latest CONFIG entry its log holds above ``committed_config``, else to that.
    config_index: int = 0
    committed_config: tuple[int, Membership] | None = None
    # Nodes beyond the membership whose messages are stepped all the same (thesis §4.1): a
    # node whose log lags behind the change that added a server must still hear that
    # server as leader or candidate, or it could never catch up or help elect.  The driver
    # passes every server of the cluster; anyone else's message is dropped.
    peers: frozenset[str] = frozenset()
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
    # Cap on the entry bytes of a follower's APPENDs in flight (0: none).  The leader reads
    # and encodes what it sends under the driver's lock: a follower far behind is caught
    # up this many bytes (and one message) at a time, not max_inflight_msgs messages.
    max_inflight_bytes: int = 0
    # When the commit index moves, send every follower an append at once, even one with no
    # entries (etcd's behaviour).  False lets the new commit index ride on the next append
    # or heartbeat: under light load that halves the messages a follower handles per write,
    # at the cost of followers learning the commit up to a heartbeat later.
    broadcast_commit: bool = True
    # Every heartbeat starts a new read round (see Raft.read_index), so a quorum's answers
    # confirm rounds -- and a driver can renew a leader lease -- without any read.
    heartbeat_read_rounds: bool = False
    # Cap on the entry bytes handed out for applying and not yet reported applied (0: none,
    # and handing entries out is taking them as applied). With a cap, the driver reports
    # what its state machine applied (``RawNode.on_applied``): a follower far behind was
    # handed every committed entry at once, its whole backlog held in memory.
    max_applying_bytes: int = 0
    # Index already applied to the state machine before this start (the store's
    # applied index): committed entries are delivered from applied + 1.
    applied: int = 0
    # Seed of the randomized election timeout; None draws from the OS.
    seed: int | None = None

    def membership(self) -> Membership:
        return Membership(tuple(self.voters), tuple(self.learners))

    def validate(self) -> None:
        if not self.id:
            raise RaftConfigError("id must be non-empty")
        if len(set(self.voters)) != len(self.voters):
            raise RaftConfigError(f"duplicate voters in {self.voters!r}")
        why = self.membership().problem()
        if why is not None:
            raise RaftConfigError(why)
        if self.config_index < 0:
            raise RaftConfigError("config_index must be >= 0")
        if self.committed_config is not None:
            index, committed = self.committed_config
            why = committed.problem()
            if why is not None or not 0 <= index <= self.config_index:
                raise RaftConfigError(
                    f"committed config {self.committed_config!r} is not a membership at or "
                    f"below config_index {self.config_index}"
                )
        if self.heartbeat_tick <= 0:
            raise RaftConfigError("heartbeat_tick must be positive")
        if self.election_tick <= self.heartbeat_tick:
            raise RaftConfigError("election_tick must be greater than heartbeat_tick")
        if self.max_inflight_msgs <= 0:
            raise RaftConfigError("max_inflight_msgs must be positive")
        if self.max_size_per_msg <= 0:
            raise RaftConfigError("max_size_per_msg must be positive")
        if self.max_inflight_bytes < 0:
            raise RaftConfigError("max_inflight_bytes must be >= 0 (0: no cap)")
        if self.applied < 0:
            raise RaftConfigError("applied must be >= 0")
        if self.max_applying_bytes < 0:
            raise RaftConfigError("max_applying_bytes must be >= 0 (0: no cap)")
