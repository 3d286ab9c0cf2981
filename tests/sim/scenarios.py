"""Simulation scenarios, each a function of a seed that raises AssertionError
(with a replay command) on failure and returns the run's statistics.

The pytest files and the CLI (``python -m tests.sim.run``) call the same
functions, so every failure the tests report can be replayed from the command
line exactly.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

from raftlet.consensus.core import (
    ConfigChange,
    ConfigChangeType,
    Message,
    MessageType,
    Role,
)
from tests.sim.cluster import LivenessFailure, SimCluster, SimConfig
from tests.sim.network import NetConfig
from tests.sim.tablet_copy import CopyKind, CopyMsg

__all__ = [
    "SCENARIOS",
    "RandomParams",
    "Stats",
    "elect",
    "one",
    "random_fault",
    "replay_command",
    "run_random",
    "settle",
]


@dataclass(slots=True)
class Stats:
    elections: int = 0
    commits: int = 0
    ticks: int = 0
    crashes: int = 0
    partitions: int = 0
    dropped: int = 0
    duplicated: int = 0
    delayed: int = 0
    messages: int = 0
    blocked: int = 0
    checks: int = 0
    # Log GC and tablet copy: compactions, copy sessions started, copies installed and
    # refused, chunks sent, randomly lost and duplicated on the way.
    compactions: int = 0
    copies: int = 0
    installs: int = 0
    refused: int = 0
    chunks: int = 0
    chunks_lost: int = 0
    chunks_duplicated: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, c: SimCluster, **extra: int) -> Stats:
        return cls(
            elections=c.elections(),
            commits=len(c.checker.committed),
            ticks=c.ticks,
            crashes=c.crashes,
            partitions=c.net.partitions,
            dropped=c.net.dropped,
            duplicated=c.net.duplicated,
            delayed=c.net.delayed,
            messages=sum(c.net.sent.values()),
            blocked=c.net.blocked,
            checks=c.checker.checks,
            compactions=c.compactions,
            copies=c.copies.stats["sessions"],
            installs=c.copies.stats["installs"],
            refused=c.copies.stats["refused"],
            chunks=c.copies.stats["chunks_sent"],
            chunks_lost=c.net.dropped_by[CopyKind.CHUNK.value],
            chunks_duplicated=c.net.duplicated_by[CopyKind.CHUNK.value],
            extra=dict(extra),
        )

    def faults(self) -> int:
        return self.crashes + self.partitions + self.dropped + self.duplicated + self.delayed


def replay_command(scenario: str, seed: int, *args: str) -> str:
    return " ".join(["python -m tests.sim.run", "--scenario", scenario, "--seed", str(seed), *args])


# --- the random schedule -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RandomParams:
    """Everything that shapes a random schedule besides the seed."""

    nodes: int = 3
    steps: int = 200
    drop: float = 0.0
    dup: float = 0.0
    long_delay: float = 0.0
    max_delay: int = 4
    persist_delay: int = 0
    # Per-tick probabilities of a connectivity change, a crash, a proposal.
    partition_rate: float = 0.0
    crash_rate: float = 0.0
    propose_rate: float = 0.3
    # Per-tick probability that the leader hands leadership to a random peer.
    transfer_rate: float = 0.0
    pre_vote: bool = True
    check_quorum: bool = True
    # Flow control: small values exercise probe/replicate and split APPENDs.
    max_inflight: int = 256
    max_msg_bytes: int = 1 << 20
    # False: the commit index rides on the next append or heartbeat (the server's setting).
    broadcast_commit: bool = True
    # Log GC's retention cap (SimConfig.retention): > 0 compacts past lagging voters, so
    # they catch up through copies of the tablet.  0: GC waits for every voter.
    retention: int = 0

    @classmethod
    def from_seed(cls, seed: int, steps: int = 200) -> RandomParams:
        """Fault parameters drawn from the seed (for ``run --seeds N``)."""
        r = random.Random(seed ^ 0x5EED)
        return cls(
            nodes=r.choice((3, 3, 5)),
            steps=steps,
            drop=r.choice((0.0, 0.02, 0.1)),
            dup=r.choice((0.0, 0.05)),
            long_delay=r.choice((0.0, 0.01, 0.05)),
            max_delay=r.choice((2, 4, 10)),
            persist_delay=r.choice((0, 3, 8)),
            partition_rate=r.choice((0.0, 0.02, 0.05)),
            crash_rate=r.choice((0.0, 0.01, 0.03)),
            propose_rate=r.choice((0.1, 0.3, 0.8)),
            transfer_rate=r.choice((0.0, 0.0, 0.01)),
            pre_vote=r.random() < 0.8,
            check_quorum=r.random() < 0.8,
            max_inflight=r.choice((1, 4, 256)),
            max_msg_bytes=r.choice((64, 1 << 20)),
            broadcast_commit=r.random() < 0.5,
            retention=r.choice((0, 0, 5, 20)),  # drawn last: earlier draws keep their values
        )

    def cli_args(self) -> list[str]:
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            out += [flag, str(int(value) if isinstance(value, bool) else value)]
        return out

    def sim_config(self) -> SimConfig:
        return SimConfig(
            nodes=self.nodes,
            pre_vote=self.pre_vote,
            check_quorum=self.check_quorum,
            persist_delay=self.persist_delay,
            max_inflight_msgs=self.max_inflight,
            max_size_per_msg=self.max_msg_bytes,
            broadcast_commit=self.broadcast_commit,
            retention=self.retention,
            net=NetConfig(
                drop=self.drop,
                dup=self.dup,
                max_delay=self.max_delay,
                long_delay=self.long_delay,
            ),
        )


def random_fault(c: SimCluster) -> None:
    """One random change of connectivity, aimed at the leader half the time
    (cutting off followers rarely forces an election)."""
    r, ids = c.rng, list(c.ids)
    lead = c.leader()
    target = lead if lead is not None and r.random() < 0.5 else r.choice(ids)
    kind = r.randrange(5)
    if kind == 0:
        c.net.heal()
    elif kind == 1:
        c.net.isolate(target)
    elif kind == 2:
        c.net.reconnect(r.choice(ids))
    elif kind == 3:
        r.shuffle(ids)
        cut = r.randint(1, len(ids) - 1)
        c.net.partition([ids[:cut], ids[cut:]])
    else:
        # The bridge node talks to both halves, which cannot talk to each other.
        middle = target if r.random() < 0.5 else r.choice(ids)
        rest = [i for i in ids if i != middle]
        r.shuffle(rest)
        half = len(rest) // 2
        c.net.bridge(middle, rest[:half], rest[half:])


def settle(c: SimCluster, max_ticks: int | None = None) -> int:
    """Heal everything, restart every node, make the network reliable, and wait
    until one leader has everyone applying all it committed."""
    c.net.heal()
    c.net.config = NetConfig(max_delay=c.net.config.max_delay)
    for i in c.ids:
        c.restart(i)
    limit = max_ticks if max_ticks is not None else 30 * c.config.election_tick
    return c.run_until(c.converged, limit, "convergence after healing")


def run_random(seed: int, p: RandomParams) -> Stats:
    """Random faults and proposals for ``p.steps`` ticks, then heal and require
    that the cluster converges with every committed entry applied everywhere."""
    replay = replay_command("random", seed, *p.cli_args())
    c = SimCluster(seed, p.sim_config(), replay)
    r = c.rng
    proposed = 0
    # Keep at most a minority down, so the schedule does not spend itself waiting.
    max_down = (p.nodes - 1) // 2
    for _ in range(p.steps):
        if p.partition_rate and r.random() < p.partition_rate:
            random_fault(c)
        if p.crash_rate and r.random() < p.crash_rate:
            live = c.live()
            # Now and then take down one more than a quorum can spare.
            if len(c.ids) - len(live) < max_down + (r.random() < 0.2):
                lead = c.leader()
                c.crash(lead if lead is not None and r.random() < 0.5 else r.choice(live))
        for i in c.ids:
            if not c.nodes[i].alive and r.random() < 0.1:
                c.restart(i)
        if r.random() < p.propose_rate:
            batch = [b"r%d" % (proposed + k) for k in range(1 if r.random() < 0.8 else 5)]
            proposed += len(batch)
            c.propose_to_leader(*batch)
        if p.transfer_rate and r.random() < p.transfer_rate:
            lead = c.leader()
            if lead is not None:
                c.transfer(lead, r.choice([i for i in c.ids if i != lead]))
        c.step()
    settle(c)
    c.assert_all_applied(c.committed_data())
    return Stats.of(c, proposed=proposed)


# --- named scenarios (MIT 6.824 lab 2 in spirit) -----------------------------------------------


def _cluster(name: str, seed: int, config: SimConfig) -> SimCluster:
    return SimCluster(seed, config, replay_command(name, seed))


def _check(c: SimCluster, ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(f"{what}\n  state: {c.describe()}\n  replay: {c.replay}")


def elect(c: SimCluster, among: Sequence[str] | None = None, max_ticks: int | None = None) -> str:
    """Wait for a leader that every node of ``among`` (default: all live) follows."""
    limit = max_ticks if max_ticks is not None else 10 * c.config.election_tick
    c.run_until(lambda: c.stable_leader(among) is not None, limit, f"a leader of {among or 'all'}")
    lead = c.stable_leader(among)
    assert lead is not None
    return lead


def one(
    c: SimCluster, data: bytes, among: Sequence[str] | None = None, max_ticks: int = 300
) -> None:
    """What a client does (the lab's ``one()``): submit ``data`` to the current
    leader among ``among`` (default: all), again to any later leader whose log
    lacks it, until every node of ``among`` applied it."""
    nodes = list(among) if among is not None else list(c.ids)

    for _ in range(max_ticks):
        if all(data in c.applied_data(i) for i in nodes):
            return
        lead = c.leader(nodes)
        if lead is not None and all(e.data != data for e in c.log(lead)):
            c.propose(lead, data)
        c.step()
    _check(c, False, f"{data!r} was not applied on all of {nodes} within {max_ticks} ticks")


def scenario_initial_election(seed: int) -> Stats:
    c = _cluster("initial_election", seed, SimConfig(nodes=3))
    lead = elect(c)
    term = c.term(lead)
    # With no faults nothing may disturb it: same leader, same term, for long.
    c.step(5 * c.config.election_tick)
    _check(c, c.leaders() == [lead], f"leader changed from {lead}")
    _check(c, all(c.term(i) == term for i in c.ids), f"term moved from {term}")
    return Stats.of(c)


def scenario_reelection(seed: int) -> Stats:
    c = _cluster("reelection", seed, SimConfig(nodes=3))
    et = c.config.election_tick
    l1 = elect(c)
    c.net.isolate(l1)
    rest = [i for i in c.ids if i != l1]
    l2 = elect(c, rest)
    _check(c, l2 != l1, "the isolated leader cannot lead the others")
    # The old leader rejoins: it must follow, not disturb, the new one.
    c.net.heal()
    c.step(3 * et)
    _check(c, c.stable_leader() == l2, f"{l2} should still lead after {l1} rejoined")
    # No quorum anywhere: nobody may (stay) leader.
    c.net.partition([])
    c.step(3 * et)
    _check(c, not c.leaders(), "a leader without a quorum")
    # Quorum restored between two nodes, then for everyone.
    pair = c.rng.sample(list(c.ids), 2)
    c.net.partition([pair])
    elect(c, pair)
    c.net.heal()
    elect(c)
    return Stats.of(c)


def scenario_no_quorum(seed: int) -> Stats:
    c = _cluster("no_quorum", seed, SimConfig(nodes=5))
    lead = elect(c)
    one(c, b"nq-first")
    cut = c.rng.sample([i for i in c.ids if i != lead], 3)
    for f in cut:
        c.net.isolate(f)
    before = max(c.committed(i) for i in c.ids)
    datas = [b"nq-%d" % k for k in range(3)]
    for d in datas:
        _check(c, c.propose(lead, d) is not None, f"{lead} refused a proposal while leading")
    c.step(3 * c.config.election_tick)
    _check(c, max(c.committed(i) for i in c.ids) == before, "committed without a quorum")
    _check(c, not any(d in c.committed_data() for d in datas), "applied without a quorum")
    # Reconnected, the cluster commits again: each proposal either survived in the
    # new leader's log or was discarded and is submitted again, as a client would.
    c.net.heal()
    for d in datas:
        one(c, d)
    c.assert_all_applied(datas)
    return Stats.of(c)


def scenario_rejoin(seed: int) -> Stats:
    c = _cluster("rejoin", seed, SimConfig(nodes=3))
    l1 = elect(c)
    one(c, b"rj-101")
    c.net.isolate(l1)
    stale = [b"rj-stale-%d" % k for k in range(3)]
    for d in stale:
        c.propose(l1, d)
    rest = [i for i in c.ids if i != l1]
    l2 = elect(c, rest)
    one(c, b"rj-103", rest)
    # The new leader goes away and the old one comes back: its stale entries
    # must give way to the committed ones of the later term.
    third = next(i for i in rest if i != l2)
    c.net.partition([[l1, third], [l2]])
    one(c, b"rj-104", [l1, third])
    c.net.heal()
    one(c, b"rj-105")
    lead = elect(c)
    _check(c, c.nodes[l1].node().raft.lead == lead, f"{l1} does not follow {lead}")
    _check(c, not set(stale) & set(c.committed_data()), "a stale uncommitted entry was applied")
    return Stats.of(c)


def scenario_fast_backup(seed: int, count: int = 60) -> Stats:
    c = _cluster("fast_backup", seed, SimConfig(nodes=5))
    lead = elect(c)
    one(c, b"fb-first")
    ids = [i for i in c.ids if i != lead]
    c.rng.shuffle(ids)
    minority, majority = [lead, ids[0]], ids[1:]
    c.net.partition([minority, majority])
    stale = [b"fb-stale-%d" % k for k in range(count)]
    for d in stale:
        c.propose(lead, d)
    c.step(2)
    l2 = elect(c, majority)
    fresh = [b"fb-new-%d" % k for k in range(count)]
    for d in fresh:
        c.propose(l2, d)
    c.run_until(
        lambda: all(c.applied_index(i) >= c.committed(l2) > count for i in majority),
        50,
        "majority commits the new entries",
    )
    # A leader elected now starts probing the minority at its own log's end, far
    # beyond where the logs match: the repair must skip the conflict in big steps.
    c.crash(l2)
    c.restart(l2)
    elect(c, majority)
    # From here on, count how often the minority turns an APPEND down.
    rejects: Counter[str] = Counter()
    appends: Counter[str] = Counter()

    def count_traffic(m: Message) -> None:
        if m.type is MessageType.APPEND_RESPONSE and m.reject and m.src in minority:
            rejects[m.src] += 1
        if m.type is MessageType.APPEND and m.dst in minority and m.entries:
            appends[m.dst] += 1

    c.observers.append(count_traffic)
    c.net.heal()
    c.run_until(c.converged, 10 * c.config.election_tick, "the minority is repaired")
    c.assert_all_applied(fresh)
    _check(c, not set(stale) & set(c.committed_data()), "a stale uncommitted entry was applied")
    # Entry-by-entry backtracking would need ~count round trips per follower.
    total = sum(rejects.values())
    _check(c, total > 0, "the minority was never probed beyond its log: scenario is vacuous")
    _check(c, total <= 6, f"repair took {dict(rejects)} rejected APPENDs (fast backup broken?)")
    return Stats.of(c, rejections=total, repair_appends=sum(appends.values()))


def _win(c: SimCluster, node: str, attempts: int = 3) -> None:
    """Campaign at ``node`` until it leads (a first try may lose to a vote
    already cast in the next term)."""
    for _ in range(attempts):
        c.campaign(node)
        try:
            c.run_until(lambda: node in c.leaders(), 5)
            return
        except LivenessFailure:
            continue
    _check(c, False, f"{node} could not win an election")


def scenario_figure8(seed: int) -> Stats:
    """Figure 8 of the Raft paper, scripted.  A leader must not count replicas to
    commit an entry of an earlier term: here X (index 2, term 1) reaches a
    majority under the leader of term 3, yet a node holding a term-2 entry at
    index 2 can still be elected and overwrite it.  A core that committed X by
    counting would lose a committed entry (leader completeness catches it)."""
    # One entry per APPEND and 1.5 ticks per hop leave room to crash a leader
    # between replicating X and replicating its own no-op; long timeouts and no
    # pre-vote/check-quorum leave the elections to the script.
    net = NetConfig(min_delay=15, max_delay=15)
    config = SimConfig(
        nodes=5,
        election_tick=50,
        pre_vote=False,
        check_quorum=False,
        max_size_per_msg=1,
        net=net,
    )
    c = _cluster("figure8", seed, config)
    s1, s2, s3, s4, s5 = c.ids
    _win(c, s1)
    c.run_until(lambda: all(c.applied_index(i) >= 1 for i in c.ids), 10, "no-op of term 1")
    # (a) s1 replicates X to s2 only, then crashes.
    c.net.partition([[s1, s2], [s3, s4, s5]])
    x = c.propose(s1, b"X")
    _check(c, x is not None and x.index == 2, f"X landed at {x}")
    c.run_until(lambda: c.nodes[s2].storage.last_index() >= 2, 10, "X on s2")
    c.crash(s1)
    # (b) s5 wins with s3 and s4; its no-op at index 2 reaches no one.
    c.net.partition([[s3, s4, s5]])
    _win(c, s5)
    c.net.isolate(s5)
    c.crash(s5)
    _check(c, c.nodes[s3].storage.last_index() == 1, "s5's entry must not have spread")
    # (c) s1 restarts, wins with s2 and s3, and copies X to s3: X is on a
    # majority (s1, s2, s3) but must not count as committed.
    c.restart(s1)
    c.net.partition([[s1, s2, s3]])
    _win(c, s1)
    raft1 = c.nodes[s1].node().raft
    c.run_until(lambda: raft1.prs[s3].match >= 2, 20, "X acknowledged by s3")
    _check(c, c.nodes[s3].storage.last_index() == 2, "s3 must not have s1's no-op yet")
    c.crash(s1)
    # (d) s5 restarts and wins with s3 and s4: its term-2 entry beats X.
    c.restart(s5)
    c.net.partition([[s3, s4, s5]])
    _win(c, s5)
    c.run_until(lambda: c.nodes[s3].storage.term(2) == c.nodes[s5].storage.term(2), 20, "repair")
    _check(c, b"X" not in c.committed_data(), "X was applied although it was never committed")
    settle(c)
    return Stats.of(c)


def scenario_durable_ack(seed: int) -> Stats:
    """A follower acknowledges entries only once they are durable.  Followers
    with slow disks receive X; both crash before writing it, and so does the
    leader.  Had they acknowledged early, the leader would have committed and
    applied X, and the followers' new leader (without X) would break leader
    completeness."""
    c = _cluster("durable_ack", seed, SimConfig(nodes=3))
    lead = elect(c)
    one(c, b"first")
    followers = [i for i in c.ids if i != lead]
    for f in followers:
        c.nodes[f].disk_latency = (100, 100)  # 10 ticks per write
    x = c.propose(lead, b"X")
    _check(c, x is not None, f"{lead} refused X")
    c.step(3)
    _check(c, all(c.nodes[f].node().raft.log.last_index() >= 3 for f in followers), "X sent")
    for i in c.ids:
        c.crash(i)
    for f in followers:
        c.nodes[f].disk_latency = None
        c.restart(f)
    elect(c, followers)
    _check(c, b"X" not in c.committed_data(), "X was applied before a majority stored it")
    settle(c)
    return Stats.of(c)


def scenario_figure8_unreliable(seed: int, ticks: int = 400) -> Stats:
    config = SimConfig(
        nodes=5,
        persist_delay=5,
        net=NetConfig(drop=0.1, dup=0.02, max_delay=10, long_delay=0.1, long_delay_max=300),
    )
    c = _cluster("figure8_unreliable", seed, config)
    r = c.rng
    proposed = 0
    for _ in range(ticks):
        if r.random() < 0.5:
            proposed += 1
            c.propose_to_leader(b"f8-%d" % proposed)
        lead = c.leader()
        if lead is not None and r.random() < 0.1:
            c.crash(lead)
        down = [i for i in c.ids if not c.nodes[i].alive]
        if len(down) > 2 or (down and r.random() < 0.1):
            c.restart(r.choice(down))
        c.step()
    settle(c)
    one(c, b"f8-final")
    c.assert_all_applied(c.committed_data())
    return Stats.of(c, proposed=proposed)


def scenario_churn(seed: int, ticks: int = 400) -> Stats:
    config = SimConfig(nodes=5, persist_delay=4, net=NetConfig(drop=0.05, max_delay=6))
    c = _cluster("churn", seed, config)
    r = c.rng
    proposed = 0
    for _ in range(ticks):
        live = c.live()
        if live and r.random() < 0.06:
            c.crash(r.choice(live))
        down = [i for i in c.ids if not c.nodes[i].alive]
        if down and r.random() < 0.15:
            c.restart(r.choice(down))
        if r.random() < 0.03:
            random_fault(c)
        for _ in range(r.randrange(3)):
            proposed += 1
            c.propose_to_leader(b"ch-%d" % proposed)
        c.step()
    settle(c)
    c.assert_all_applied(c.committed_data())
    return Stats.of(c, proposed=proposed)


def scenario_unreliable_agreement(seed: int, values: int = 50) -> Stats:
    config = SimConfig(
        nodes=5, persist_delay=3, net=NetConfig(drop=0.1, dup=0.1, max_delay=10, long_delay=0.02)
    )
    c = _cluster("unreliable_agreement", seed, config)
    # Five concurrent clients, each submitting its values in order and
    # resubmitting to a new leader whose log lacks the current one.
    queues = [[b"ua-%d-%d" % (k, v) for v in range(values // 5)] for k in range(5)]
    for _ in range(1500):
        for q in queues:
            while q and all(q[0] in c.applied_data(i) for i in c.ids):
                q.pop(0)
        if not any(queues):
            break
        lead = c.leader()
        if lead is not None:
            in_log = {e.data for e in c.log(lead)}
            for q in queues:
                if q and q[0] not in in_log:
                    c.propose(lead, q[0])
        c.step()
    _check(c, not any(queues), f"values never applied everywhere: {[q[:1] for q in queues]}")
    return Stats.of(c)


def _committed(c: SimCluster, node: str, index: int) -> Callable[[], bool]:
    return lambda: c.committed(node) >= index


def _applied_everywhere(c: SimCluster, index: int) -> Callable[[], bool]:
    return lambda: all(c.applied_index(i) >= index for i in c.ids)


def scenario_first_leader(seed: int, nodes: int = 3) -> Stats:
    """No faults: a leader everyone follows within 5 election timeouts."""
    c = _cluster(f"first_leader{nodes}", seed, SimConfig(nodes=nodes))
    took = c.run_until(lambda: c.stable_leader() is not None, 5 * c.config.election_tick)
    return Stats.of(c, first_leader_ticks=took)


def scenario_liveness(seed: int, nodes: int = 3, proposals: int = 20) -> Stats:
    """No faults: a leader within 5 election timeouts, every proposal committed
    within 3 ticks and applied everywhere within 5."""
    c = _cluster(f"liveness{nodes}", seed, SimConfig(nodes=nodes, persist_delay=3))
    et = c.config.election_tick
    first = c.run_until(lambda: c.stable_leader() is not None, 5 * et, "first leader")
    worst_commit = worst_apply = 0
    for k in range(proposals):
        c.step(c.rng.randrange(5))
        lead = c.stable_leader()
        _check(c, lead is not None, "the leader went away without any fault")
        assert lead is not None
        e = c.propose(lead, b"lv-%d" % k)
        _check(c, e is not None, f"{lead} refused a proposal")
        assert e is not None
        commit_took = c.run_until(_committed(c, lead, e.index), 3, f"commit of {e.index}")
        worst_commit = max(worst_commit, commit_took)
        took = c.run_until(_applied_everywhere(c, e.index), 5, f"apply of {e.index}")
        worst_apply = max(worst_apply, took)
    return Stats.of(
        c, first_leader_ticks=first, worst_commit_ticks=worst_commit, worst_apply=worst_apply
    )


def scenario_prevote_isolated_follower(seed: int) -> Stats:
    c = _cluster("prevote_isolated_follower", seed, SimConfig(nodes=3))
    et = c.config.election_tick
    lead = elect(c)
    term = c.term(lead)
    f = c.rng.choice([i for i in c.ids if i != lead])
    c.net.isolate(f)
    c.step(20 * et)
    _check(c, c.term(f) == term, f"isolated {f} bumped its term despite pre-vote")
    c.net.heal()
    c.step(5 * et)
    _check(c, c.stable_leader() == lead, f"{f} rejoining disturbed leader {lead}")
    _check(c, all(c.term(i) == term for i in c.ids), "rejoin moved the term")
    return Stats.of(c)


def scenario_no_prevote_isolated_follower(seed: int) -> Stats:
    """The control experiment: without pre-vote the isolated node's term climbs
    (so the pre-vote scenario does test something)."""
    c = _cluster("no_prevote_isolated_follower", seed, SimConfig(nodes=3, pre_vote=False))
    lead = elect(c)
    term = c.term(lead)
    f = c.rng.choice([i for i in c.ids if i != lead])
    c.net.isolate(f)
    c.step(20 * c.config.election_tick)
    _check(c, c.term(f) > term + 5, f"without pre-vote {f} should have campaigned")
    c.net.heal()
    elect(c)
    return Stats.of(c)


def scenario_check_quorum(seed: int) -> Stats:
    c = _cluster("check_quorum", seed, SimConfig(nodes=3))
    et = c.config.election_tick
    lead = elect(c)
    term = c.term(lead)
    c.net.isolate(lead)
    # The leader checks its quorum once per election timeout; the first check
    # after the cut may still count pre-cut responses, the second may not.
    took = c.run_until(lambda: lead not in c.leaders(), 2 * et + 1, f"{lead} steps down")
    rest = [i for i in c.ids if i != lead]
    elect(c, rest)
    c.step(5 * et)
    _check(c, c.term(lead) == term, f"isolated ex-leader {lead} bumped its term")
    c.net.heal()
    elect(c)
    return Stats.of(c, step_down_ticks=took)


# --- log GC and tablet copy --------------------------------------------------------------

# 10% loss, 5% duplication, reordering by up to six ticks: what copies must get through.
SNAP_NET = NetConfig(drop=0.1, dup=0.05, max_delay=6, long_delay=0.02, long_delay_max=60)


def snap_config() -> SimConfig:
    # A short retention cap and small chunks: a follower that misses ~60 entries needs a
    # copy, and a copy of ~100 entries is ~100 chunks.
    return SimConfig(nodes=3, persist_delay=3, retention=10, chunk_bytes=32, net=SNAP_NET)


def _write(c: SimCluster, prefix: bytes, n: int) -> None:
    """Propose ``n`` entries to whoever leads, one a tick (a leader change may lose some)."""
    for k in range(n):
        c.propose_to_leader(b"%s-%d" % (prefix, k))
        c.step()


def _compacted_past(c: SimCluster, node: str) -> Callable[[], bool]:
    """Every other node's log starts beyond ``node``'s end: only a copy can catch it up."""
    others = [i for i in c.ids if i != node]
    last = c.nodes[node].storage
    return lambda: all(c.nodes[i].storage.first_index() > last.last_index() + 1 for i in others)


def _caught_up(c: SimCluster, node: str, among: Sequence[str] | None = None) -> Callable[[], bool]:
    def check() -> bool:
        lead = c.stable_leader(among)
        return lead is not None and lead != node and c.applied_index(node) >= c.committed(lead)

    return check


def _check_same_state(c: SimCluster) -> None:
    """Every state machine -- applied entry by entry or installed from a copy -- is the same."""
    states = {i: c.nodes[i].applied for i in c.ids}
    first = states[c.ids[0]]
    for i, state in states.items():
        _check(c, state == first, f"{i}'s state machine differs from {c.ids[0]}'s")


def scenario_snapshot_catchup(seed: int, crash: bool = False) -> Stats:
    """A follower is cut off (``crash``: crashed) while the others write on and compact their
    logs past it (retention cap); back, on a network that loses, duplicates and reorders, it
    can only catch up through a chunked copy of the tablet.  In the crash variant it crashes
    again while a copy to it is under way: the leader must see the copy fail."""
    c = _cluster("snapshot_restart" if crash else "snapshot_partition", seed, snap_config())
    lead = elect(c)
    f = c.rng.choice([i for i in c.ids if i != lead])
    if crash:
        c.crash(f)
    else:
        c.net.isolate(f)
    _write(c, b"sc", 60)
    c.run_until(_compacted_past(c, f), 100, f"the others compact past {f}")
    aborted = 0
    if crash:
        c.restart(f)
        copying = lambda: any(c.copies.active(i, f) for i in c.ids)  # noqa: E731
        c.run_until(lambda: copying() or _caught_up(c, f)(), 100, f"a copy to {f}")
        if copying():
            before = c.copies.stats["aborted_by_crash"]
            c.crash(f)
            aborted = c.copies.stats["aborted_by_crash"] - before
            _check(c, aborted == 1, "the follower's crash did not fail the copy to it")
            c.step(5)
            c.restart(f)
    else:
        c.net.reconnect(f)
    _write(c, b"sc-more", 20)  # writes go on while it catches up
    c.run_until(_caught_up(c, f), 400, f"{f} catches up")
    _check(c, c.copies.installs_by[f] > 0, f"{f} caught up without a copy: vacuous")
    settle(c)
    c.assert_all_applied(c.committed_data())
    _check_same_state(c)
    return Stats.of(c, aborted_by_crash=aborted)


def scenario_snapshot_leader_change(seed: int) -> Stats:
    """The leader is cut off just after the first chunk of its copy reached the lagging
    follower: its session is abandoned (it steps down) or fails (times out), the follower
    gives the partial copy up, and the next leader's copy catches it up."""
    c = _cluster("snapshot_leader_change", seed, snap_config())
    lead = elect(c)
    f = c.rng.choice([i for i in c.ids if i != lead])
    c.net.isolate(f)
    _write(c, b"lc", 60)
    c.run_until(_compacted_past(c, f), 100, f"the others compact past {f}")
    cut: list[str] = []

    def cut_sender(m: CopyMsg) -> None:
        if not cut and m.type is CopyKind.CHUNK and m.dst == f:
            cut.append(m.src)
            c.net.isolate(m.src)  # the chunks still in flight are lost with it

    c.copy_observers.append(cut_sender)
    c.net.reconnect(f)
    c.run_until(lambda: bool(cut), 100, f"a chunk reaches {f}")
    old = cut[0]
    ended = lambda: not c.copies.active(old, f)  # noqa: E731
    c.run_until(ended, 5 * c.config.election_tick, f"{old}'s session ends")
    c.run_until(_caught_up(c, f, [i for i in c.ids if i != old]), 400, f"{f} catches up")
    installed = [src for src, dst, _ in c.copies.installed if dst == f]
    _check(c, bool(installed) and installed[-1] != old, f"{f} installed copies from {installed}")
    s = c.copies.stats
    _check(c, s["abandoned"] + s["timeouts"] > 0, f"{old}'s session neither abandoned nor failed")
    settle(c)
    c.assert_all_applied(c.committed_data())
    _check_same_state(c)
    return Stats.of(c, abandoned=s["abandoned"], given_up=s["given_up"])


# --- membership changes (thesis §4.1) -------------------------------------------------------


def _random_change(c: SimCluster, lead: str) -> ConfigChange:
    """A change that fits the leader's membership: add an outsider as learner, promote a
    learner, or remove a member (the leader itself too), keeping two voters at least."""
    m = c.nodes[lead].node().raft.membership
    r = c.rng
    outsiders = [i for i in c.ids if i not in m.members()]
    options: list[ConfigChange] = []
    if outsiders:
        options.append(ConfigChange(ConfigChangeType.ADD_LEARNER, r.choice(outsiders)))
    if m.learners:
        options.append(ConfigChange(ConfigChangeType.PROMOTE, r.choice(m.learners)))
        options.append(ConfigChange(ConfigChangeType.REMOVE, r.choice(m.learners)))
    if len(m.voters) > 2:
        options.append(ConfigChange(ConfigChangeType.REMOVE, r.choice(m.voters)))
    return r.choice(options)


def _group_converged(c: SimCluster) -> bool:
    """One stable leader that every member of its membership follows, all of them having
    applied everything it committed."""
    lead = c.leader()
    if lead is None:
        return False
    members = c.members(lead)
    if c.stable_leader(members) != lead:
        return False
    commit = c.committed(lead)
    return all(c.nodes[i].alive and c.applied_index(i) == commit for i in members)


def scenario_membership(seed: int, ticks: int = 600) -> Stats:
    """Five nodes, three voting at first: nodes join as learners, get promoted, members
    (leaders too) are removed and come back, one change at a time, while links fail,
    nodes crash and messages are lost.  Figure 3's properties hold throughout (the checker
    runs after every event), and the final group converges with every committed entry
    applied by every member."""
    config = SimConfig(nodes=5, voters=3, persist_delay=3, net=NetConfig(drop=0.05, max_delay=6))
    c = _cluster("membership", seed, config)
    r = c.rng
    proposed = changes = refused = 0
    for _ in range(ticks):
        if r.random() < 0.03:
            random_fault(c)
        live = c.live()
        if len(live) > 3 and r.random() < 0.02:
            c.crash(r.choice(live))
        down = [i for i in c.ids if not c.nodes[i].alive]
        if down and r.random() < 0.1:
            c.restart(r.choice(down))
        if r.random() < 0.5:
            proposed += 1
            c.propose_to_leader(b"m-%d" % proposed)
        lead = c.leader()
        if lead is not None and r.random() < 0.08:
            if c.change(lead, _random_change(c, lead)) is None:
                refused += 1
            else:
                changes += 1
        c.step()
    c.net.heal()
    c.net.config = NetConfig(max_delay=c.net.config.max_delay)
    for i in c.ids:
        c.restart(i)
    c.run_until(lambda: _group_converged(c), 40 * c.config.election_tick, "group convergence")
    lead = c.leader()
    assert lead is not None
    committed = c.committed_data()
    for i in c.members(lead):
        have = set(c.applied_data(i))
        _check(c, all(d in have for d in committed), f"member {i} lacks committed entries")
    return Stats.of(c, proposed=proposed, changes=changes, refused=refused)


def scenario_move_under_partition(seed: int) -> Stats:
    """Scripted: move a replica (add n4 as learner, promote it, remove the leader n1) while
    a follower is cut off, then heal: the removed leader steps down once its removal
    commits, a member leads, and everyone of the new group applies every write."""
    c = _cluster("move_under_partition", seed, SimConfig(nodes=4, voters=3, persist_delay=2))
    lead = elect(c, among=("n1", "n2", "n3"))
    if lead != "n1":
        c.transfer(lead, "n1")
        c.run_until(lambda: c.stable_leader(("n1", "n2", "n3")) == "n1", 200, "n1 leads")
    one(c, b"before", among=("n1", "n2", "n3"))
    c.net.isolate("n3")
    for change in (
        ConfigChange(ConfigChangeType.ADD_LEARNER, "n4"),
        ConfigChange(ConfigChangeType.PROMOTE, "n4"),
    ):
        entry = c.change("n1", change)
        _check(c, entry is not None, f"{change} refused")
        assert entry is not None
        # One at a time: nothing more until this one is committed.
        _check(c, c.change("n1", change) is None, "a second change was accepted")
        c.run_until(_committed(c, "n1", entry.index), 200, f"{change} committed")
    one(c, b"during", among=("n1", "n2", "n4"))
    removal = c.change("n1", ConfigChange(ConfigChangeType.REMOVE, "n1"))
    _check(c, removal is not None, "the removal of the leader was refused")
    c.run_until(lambda: c.nodes["n1"].node().raft.role is not Role.LEADER, 200, "n1 steps down")
    c.net.heal()
    group = ("n2", "n3", "n4")
    new_lead = elect(c, among=group, max_ticks=300)
    _check(c, new_lead in group, f"{new_lead} leads, not a member")
    one(c, b"after", among=group)
    for i in group:
        _check(c, c.members(i) == group, f"{i} uses {c.members(i)}")
        _check(
            c,
            [d for d in c.applied_data(i) if d in (b"before", b"during", b"after")]
            == [b"before", b"during", b"after"],
            f"{i} applied {c.applied_data(i)}",
        )
    return Stats.of(c)


SCENARIOS: dict[str, Callable[[int], Stats]] = {
    "initial_election": scenario_initial_election,
    "reelection": scenario_reelection,
    "no_quorum": scenario_no_quorum,
    "rejoin": scenario_rejoin,
    "fast_backup": scenario_fast_backup,
    "figure8": scenario_figure8,
    "durable_ack": scenario_durable_ack,
    "figure8_unreliable": scenario_figure8_unreliable,
    "churn": scenario_churn,
    "unreliable_agreement": scenario_unreliable_agreement,
    "first_leader3": lambda seed: scenario_first_leader(seed, 3),
    "first_leader5": lambda seed: scenario_first_leader(seed, 5),
    "liveness3": lambda seed: scenario_liveness(seed, 3),
    "liveness5": lambda seed: scenario_liveness(seed, 5),
    "prevote_isolated_follower": scenario_prevote_isolated_follower,
    "no_prevote_isolated_follower": scenario_no_prevote_isolated_follower,
    "check_quorum": scenario_check_quorum,
    "snapshot_partition": scenario_snapshot_catchup,
    "snapshot_restart": lambda seed: scenario_snapshot_catchup(seed, crash=True),
    "snapshot_leader_change": scenario_snapshot_leader_change,
    "membership": scenario_membership,
    "move_under_partition": scenario_move_under_partition,
}
