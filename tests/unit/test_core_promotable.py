"""``set_promotable``: how the driver tells the core that its replica failed.

A node that is not promotable never campaigns (its timeout, a TIMEOUT_NOW), and a leader
made not promotable leaves at once: through a leadership transfer to a follower whose log
matches its own, if there is one, else by a plain step-down.  Being made promotable again
lets it campaign as before.
"""

from __future__ import annotations

import pytest

from raftlet.consensus.core import NO_NODE, Message, MessageType, ProposalDropped, Role
from tests.unit.raft_harness import Network, new_node

TN = MessageType.TIMEOUT_NOW
PV = MessageType.PRE_VOTE
V = MessageType.VOTE


def test_a_follower_that_is_not_promotable_never_campaigns() -> None:
    a = new_node("a", check_quorum=True, pre_vote=True)
    a.raw.set_promotable(False)
    out = a.tick(5 * a.config.election_tick)
    assert out == []
    assert (a.role, a.term) == (Role.FOLLOWER, 0)
    a.raw.campaign()
    assert a.drain() == []
    assert a.role is Role.FOLLOWER


def test_promotable_again_campaigns_on_its_timeout() -> None:
    a = new_node("a", check_quorum=True, pre_vote=True)
    a.raw.set_promotable(False)
    a.tick(3 * a.config.election_tick)
    a.raw.set_promotable(True)
    out = a.tick(2 * a.config.election_tick)
    assert any(m.type is PV for m in out)
    assert a.role is Role.PRE_CANDIDATE


def test_a_leader_made_not_promotable_transfers_to_a_caught_up_follower() -> None:
    net = Network.create(check_quorum=True, pre_vote=True)
    net.campaign("a")
    net.propose("a", b"x")
    assert net["a"].role is Role.LEADER
    net["a"].raw.set_promotable(False)
    # It stops leading before a single message has left: no proposal is accepted now.
    assert net["a"].role is Role.FOLLOWER
    assert net["a"].term == 1
    with pytest.raises(ProposalDropped):
        net["a"].raw.propose(b"y")
    net.deliver(net["a"].drain())
    assert net.sent(TN, "a") == 1
    new_leader = [n for n in ("b", "c") if net[n].role is Role.LEADER]
    assert len(new_leader) == 1
    assert net[new_leader[0]].term == 2
    assert net.sent(PV, new_leader[0]) == 0  # asked to take over: no pre-vote round
    # The old leader follows the new one and keeps its log (nothing committed is lost).
    assert net["a"].raw.soft_state().leader_id == new_leader[0]
    assert net["a"].role is Role.FOLLOWER
    assert b"x" in [e.data for e in net["a"].raft.log.all_entries()]


def test_a_leader_with_no_caught_up_follower_steps_down_plainly() -> None:
    net = Network.create(check_quorum=True, pre_vote=True)
    net.campaign("a")
    net.isolate("b")
    net.isolate("c")
    net.propose("a", b"x")  # in a's log only
    a = net["a"]
    a.raw.set_promotable(False)
    out = a.drain()
    assert [m for m in out if m.type is TN] == []
    assert (a.role, a.raw.soft_state().leader_id) == (Role.FOLLOWER, NO_NODE)
    # Term and vote are kept: nothing new to persist for the step-down.
    assert a.raw.hard_state().term == 1
    assert a.raw.hard_state().vote == "a"


def test_not_promotable_ignores_timeout_now() -> None:
    net = Network.create(check_quorum=True, pre_vote=True)
    net.campaign("a")
    b = net["b"]
    b.raw.set_promotable(False)
    out = b.step(Message(TN, src="a", dst="b", term=1))
    assert [m for m in out if m.type is V] == []
    assert b.role is Role.FOLLOWER
    assert b.term == 1


def test_a_candidate_made_not_promotable_gives_up_its_election() -> None:
    a = new_node("a", check_quorum=True, pre_vote=False)
    a.campaign()
    assert a.role is Role.CANDIDATE
    a.raw.set_promotable(False)
    assert a.role is Role.FOLLOWER
    assert a.raw.hard_state().vote == "a"  # its own vote in this term stands
    # A late vote for the abandoned election makes nothing of it.
    a.step(Message(MessageType.VOTE_RESPONSE, src="b", dst="a", term=1))
    assert a.role is Role.FOLLOWER


@pytest.mark.parametrize("seed", range(40))
def test_a_voter_that_will_not_campaign_lets_go_of_a_dead_leader(seed: int) -> None:
    # It re-armed its dead leader's lease at every timeout and dropped the other voter's
    # (pre-)votes: with three voters and the leader gone, one in four seeds never elected
    # anyone again. Having heard nothing for a timeout, it forgets that leader.
    ids = ("a", "b", "c")
    net = Network(
        [new_node(i, ids, pre_vote=True, check_quorum=True, seed=seed * 7 + ord(i)) for i in ids]
    )
    net.campaign("a")
    net.tick_all(3)
    net["c"].raw.set_promotable(False)
    net.crash("a")
    for _ in range(20 * 10):  # twenty election timeouts
        net.tick_all(1)
        if net["b"].role is Role.LEADER:
            break
    assert net["b"].role is Role.LEADER
