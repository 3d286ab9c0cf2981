"""Membership changes in the core (thesis §4.1): learners, promotion, removal, one change at
a time, the removed leader stepping down, and what a restart or a cut log does to them."""

from __future__ import annotations

import pytest

from raftlet.consensus.core import (
    Config,
    ConfigChange,
    ConfigChangeDeferred,
    ConfigChangeRefused,
    ConfigChangeType,
    Entry,
    EntryType,
    HardState,
    Membership,
    MemoryStorage,
    Message,
    MessageType,
    RawNode,
    Role,
)
from tests.unit.raft_harness import IDS3, Network, Node, data_entries, new_node

ADD = ConfigChangeType.ADD_LEARNER
PROMOTE = ConfigChangeType.PROMOTE
REMOVE = ConfigChangeType.REMOVE


def _cluster(*extra: str) -> Network:
    """a, b, c voting, ``extra`` nodes started outside the group (as a replica created to
    join is), and a elected with its no-op committed everywhere."""
    net = Network([*(new_node(i) for i in IDS3), *(new_node(i) for i in extra)])
    net.campaign("a")
    assert net.leader().id == "a"
    return net


def _change(net: Network, node: str, kind: ConfigChangeType, target: str) -> Entry:
    leader = net[node]
    entry = leader.raw.propose_config_change(ConfigChange(kind, target))
    net.deliver(leader.drain())
    return entry


def _committed(node: Node, entry: Entry) -> bool:
    return node.raft.log.committed >= entry.index


def test_a_learner_catches_up_but_never_votes_campaigns_or_counts() -> None:
    net = _cluster("d")
    net.propose("a", b"x")
    entry = _change(net, "a", ADD, "d")
    assert entry.type is EntryType.CONFIG
    for n in ("a", "b", "c", "d"):
        assert net[n].raft.membership == Membership(IDS3, ("d",)), n
        assert _committed(net[n], entry), n
    assert net["d"].raft.log.all_entries() == net["a"].raft.log.all_entries()
    assert data_entries(net["d"].applied) == [b"x"]

    # Not counted toward a commit: with b and c away, a and its learner commit nothing.
    net.isolate("b")
    net.isolate("c")
    y = net.propose("a", b"y")
    assert net["d"].raft.log.last_index() == y.index
    assert not _committed(net["a"], y)
    # A learner never campaigns, however long it hears nothing.
    net.isolate("a")
    net.tick("d", 50)
    assert net["d"].role is Role.FOLLOWER
    assert net.sent(MessageType.VOTE, src="d") == net.sent(MessageType.PRE_VOTE, src="d") == 0
    # And a candidate does not ask it for a vote.
    net.heal()
    net.campaign("b")
    assert net.leader().id == "b"
    assert net.sent(MessageType.VOTE, dst="d") == 0


def test_only_one_change_at_a_time() -> None:
    net = _cluster("d", "e")
    net.drop("a", "b")
    net.drop("a", "c")
    first = _change(net, "a", ADD, "d")
    assert not _committed(net["a"], first)
    with pytest.raises(ConfigChangeRefused, match="in progress"):
        net["a"].raw.propose_config_change(ConfigChange(ADD, "e"))
    net.heal()
    net.tick("a")  # a heartbeat; the answers bring b and c the entry
    assert _committed(net["a"], first)
    _change(net, "a", ADD, "e")
    assert net["a"].raft.membership == Membership(IDS3, ("d", "e"))


def test_no_change_before_the_leader_committed_an_entry_of_its_term() -> None:
    a = new_node("a")
    a.elect()  # its no-op is not acknowledged by anyone
    # Deferred: a moment later it may take it, and the client retries (not an operator's
    # conflict, which a change in progress is).
    with pytest.raises(ConfigChangeDeferred, match="not committed an entry of its term"):
        a.raw.propose_config_change(ConfigChange(ADD, "d"))
    b = new_node("b")
    b.elect_and_commit_noop()
    assert b.raw.propose_config_change(ConfigChange(ADD, "d")).type is EntryType.CONFIG


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (ConfigChange(ADD, "b"), "already a member"),
        (ConfigChange(PROMOTE, "b"), "not a learner"),
        (ConfigChange(PROMOTE, "z"), "not a learner"),
        (ConfigChange(REMOVE, "z"), "not a member"),
    ],
)
def test_changes_that_do_not_fit_are_refused(change: ConfigChange, why: str) -> None:
    net = _cluster()
    last = net["a"].raft.log.last_index()
    with pytest.raises(ConfigChangeRefused, match=why):
        net["a"].raw.propose_config_change(change)
    assert net["a"].raft.log.last_index() == last


def test_the_only_voter_cannot_be_removed() -> None:
    a = new_node("a", ("a",))
    a.campaign()
    with pytest.raises(ConfigChangeRefused, match="only voter"):
        a.raw.propose_config_change(ConfigChange(REMOVE, "a"))


def test_a_promoted_learner_counts_toward_the_majority() -> None:
    net = _cluster("d")
    _change(net, "a", ADD, "d")
    promote = _change(net, "a", PROMOTE, "d")
    assert _committed(net["a"], promote)
    assert net["d"].raft.voters == ("a", "b", "c", "d")
    # Four voters: a majority is three, so a and d alone commit nothing...
    net.isolate("b")
    net.isolate("c")
    y = net.propose("a", b"y")
    assert not _committed(net["a"], y)
    # ...and a third voter is enough.
    net.heal()
    net.isolate("b")
    net.tick("a")
    assert _committed(net["a"], y)


def test_a_removed_voter_neither_counts_nor_campaigns() -> None:
    net = _cluster()
    removal = _change(net, "a", REMOVE, "c")
    assert _committed(net["a"], removal)
    assert net["c"].raft.voters == ("a", "b")
    net.isolate("c")
    y = net.propose("a", b"y")
    assert _committed(net["a"], y)  # a and b are the majority now
    net.tick("c", 50)
    assert net.sent(MessageType.VOTE, src="c") == 0
    # Whatever it sends now, the others drop: it is no member of theirs.
    net.heal()
    assert net["a"].raft.prs.keys() == {"a", "b"}


def test_a_removed_leader_replicates_until_the_removal_commits_then_hands_over() -> None:
    net = _cluster()
    net.drop("a", "b")
    net.drop("a", "c")
    removal = _change(net, "a", REMOVE, "a")
    # Not a voter of its own log's membership: it does not count itself, so nothing commits,
    # but it leads on, and takes writes that the next leader keeps.
    assert net["a"].role is Role.LEADER
    assert not _committed(net["a"], removal)
    x = net["a"].raw.propose(b"x")
    net.heal()
    net.tick("a")
    # b and c acknowledged: the removal is committed, a stepped down and told a caught-up
    # voter to campaign at once.
    assert net["a"].role is Role.FOLLOWER
    assert net.sent(MessageType.TIMEOUT_NOW, src="a") == 1
    leader = net.leader()
    assert leader.id in ("b", "c")
    assert leader.raft.voters == ("b", "c")
    z = net.propose(leader.id, b"z")
    for n in ("b", "c"):
        assert data_entries(net[n].applied) == [b"x", b"z"], n
        assert _committed(net[n], z)
    assert x.index < z.index
    # The removed node never campaigns again.
    net.isolate("a")
    net.tick("a", 50)
    assert net["a"].role is Role.FOLLOWER


def test_a_cut_config_entry_is_undone() -> None:
    net = _cluster("d")
    net.isolate("a")
    pending = _change(net, "a", ADD, "d")
    assert net["a"].raft.membership == Membership(IDS3, ("d",))
    net.campaign("b")
    assert net.leaders() == ["a", "b"] or net.leaders() == ["b", "a"]
    net.propose("b", b"y")
    net.heal()
    net.tick("b")
    # b's entries replaced a's uncommitted config entry, and with it its membership.
    assert net["a"].role is Role.FOLLOWER
    assert net["a"].raft.log.term(pending.index) == net["b"].term
    assert net["a"].raft.membership == Membership(IDS3)
    assert net["a"].conf is not None
    assert net["a"].conf.index == 0


def test_the_ready_carries_the_membership_to_persist() -> None:
    net = _cluster("d")
    a = net["a"]
    entry = a.raw.propose_config_change(ConfigChange(ADD, "d"))
    rd = a.raw.ready()
    assert rd.conf_state is not None
    assert rd.conf_state.membership == Membership(IDS3, ("d",))
    assert rd.conf_state.index == entry.index
    assert rd.conf_state.committed_index == 0
    assert rd.entries[-1] == entry
    a.persist(rd)
    a.raw.on_persisted(rd)
    net.deliver(rd.messages)
    net.deliver(a.drain())
    assert a.conf is not None
    assert (a.conf.committed_index, a.conf.committed) == (entry.index, Membership(IDS3, ("d",)))


def test_a_restart_restores_the_persisted_membership() -> None:
    net = _cluster("d")
    _change(net, "a", ADD, "d")
    _change(net, "a", PROMOTE, "d")
    net.crash("b")
    b = net.restart("b")
    assert b.raft.voters == ("a", "b", "c", "d")
    net.isolate("c")
    y = net.propose("a", b"y")
    assert _committed(net["a"], y)  # a, b and d: a majority of four


def _config(voters: tuple[str, ...], index: int, committed: tuple[int, Membership]) -> Config:
    return Config(
        id="a",
        voters=voters,
        config_index=index,
        committed_config=committed,
        pre_vote=False,
        check_quorum=False,
        seed=1,
    )


def test_a_membership_whose_entry_the_crash_took_falls_back_to_the_log() -> None:
    """The driver persists a membership before its entry is durable; if the process dies in
    between, the node starts from what its log holds."""
    four = Membership(("a", "b", "c", "d"))
    storage = MemoryStorage()
    storage.append([Entry(1, 1, EntryType.NO_OP), Entry(1, 2)])
    lost = RawNode(_config(four.voters, 3, (0, Membership(IDS3))), storage)
    assert lost.raft.membership == Membership(IDS3)
    # A CONFIG entry the log does hold, above the committed one, is the one in use.
    learner = Membership(IDS3, ("d",))
    storage.append([Entry(1, 3, EntryType.CONFIG, learner.encode())])
    held = RawNode(_config(four.voters, 4, (0, Membership(IDS3))), storage)
    assert held.raft.membership == learner
    assert held.conf_state().index == 3


def test_membership_payload_round_trips_and_refuses_garbage() -> None:
    m = Membership(("b", "a"), ("d",))
    assert Membership.decode(m.encode()) == Membership(("a", "b"), ("d",))
    for bad in (b"", b"{}", b'{"voters": []}', b'{"voters": ["a"], "learners": ["a"]}', b"\xff"):
        with pytest.raises(ValueError, match=r"."):
            Membership.decode(bad)


def _entry(term: int, index: int, m: Membership | None = None) -> Entry:
    """A NORMAL entry, or the CONFIG entry of membership ``m``."""
    if m is None:
        return Entry(term, index, EntryType.NORMAL, b"x%d" % index)
    return Entry(term, index, EntryType.CONFIG, m.encode())


def test_an_uncommitted_config_is_never_persisted_as_committed_behind_a_lagging_commit() -> None:
    # After a restart the node's own commit index (saved only with term and vote) may lag
    # the config it persisted as committed. conf_state() then named the *latest* config
    # committed; once persisted, a later leader's truncation of that entry could not undo
    # it, and the node used a membership its log no longer held.
    m10 = Membership(("a", "b", "c"), ("d",))  # committed before the crash
    m12 = Membership(("a", "b", "c", "d"))  # uncommitted
    m12b = Membership(("a", "b"), ("d",))  # another leader's, uncommitted too

    storage = MemoryStorage()
    storage.append([_entry(1, i) for i in range(1, 10)])
    storage.append([_entry(2, 10, m10), _entry(2, 11), _entry(2, 12, m12)])
    storage.set_hard_state(HardState(term=2, vote="a", commit=5))
    node = _restarted_c(storage, m12, 12, (10, m10), applied=8)
    # A leader of term 4, its commit behind, replaces 11..12; its 12 is another change.
    _append_to_c(
        node, "b", 4, after=(10, 2), entries=[_entry(3, 11), _entry(3, 12, m12b)], commit=8
    )
    rd = node.ready()
    assert (rd.conf_state.committed_index, rd.conf_state.committed) == (10, m10)
    storage.set_hard_state(rd.hard_state)
    storage.append(rd.entries)
    node.on_persisted(rd)
    # Restarted from what was persisted, a leader of term 5 replaces entry 12: the change
    # is undone, back to the committed membership.
    conf = rd.conf_state
    again = _restarted_c(
        storage, conf.membership, conf.index, (conf.committed_index, conf.committed), applied=8
    )
    _append_to_c(again, "a", 5, after=(11, 3), entries=[Entry(5, 12, EntryType.NO_OP)], commit=8)
    assert again.raft.membership == m10


def test_a_copy_installs_the_membership_it_was_taken_under() -> None:
    # A node cut off while its group grew from three voters to five gets a copy: with the
    # membership it had kept, it won an election on the votes of two of the real five.
    ids = ("a", "b", "c")
    nodes = [new_node(i, ids, peers=frozenset("abcde")) for i in (*ids, "d", "e")]
    net = Network(nodes)
    net.campaign("a")
    net.isolate("c")
    a = net["a"]
    for kind, server in [
        (ConfigChangeType.ADD_LEARNER, "d"),
        (ConfigChangeType.PROMOTE, "d"),
        (ConfigChangeType.ADD_LEARNER, "e"),
        (ConfigChangeType.PROMOTE, "e"),
    ]:
        a.raw.propose_config_change(ConfigChange(kind, server))
        net.deliver(a.drain())
    for i in range(5):
        net.propose("a", b"w%d" % i)
    index = a.raft.log.committed
    conf = a.raw.conf_state()
    c = net["c"]
    c.storage.apply_snapshot(index, a.raft.log.term(index))
    assert c.raw.restore(index, a.raft.log.term(index), (conf.committed_index, conf.committed))
    c.drain()
    assert c.raft.voters == a.raft.voters == ("a", "b", "c", "d", "e")
    # Only b hears it now: two votes of five elect nobody.
    net.heal()
    net.isolate("c")
    net.cut.discard(("c", "b"))
    net.cut.discard(("b", "c"))
    net.crash("a")
    net.campaign("c")
    assert c.role is not Role.LEADER


def test_config_entries_below_a_copys_membership_do_not_take_it_back() -> None:
    # A copy installs the leader's committed membership, whose entry may lie past the
    # copy's own index; the entries after the copy then bring older CONFIG entries, which
    # the copy's membership covers already.
    m4 = Membership(("a", "b", "c"), ("d",))
    m5 = Membership(("a", "b", "c", "d"))
    storage = MemoryStorage()
    storage.apply_snapshot(10, 1)
    node = _restarted_c(storage, m5, 12, (12, m5), applied=10)
    entries = [Entry(1, 11, EntryType.CONFIG, m4.encode())]
    _append_to_c(node, "a", 2, after=(10, 1), entries=entries, commit=11)
    assert node.raft.membership == m5


def test_a_cut_after_a_restart_falls_back_to_the_change_between_committed_and_latest() -> None:
    # Persisted: committed m10 (the node's commit lagged), latest m14. Its log also holds
    # m12, committed by the leader (which appended m14 only after m12 committed): when a
    # later leader replaces 14, the node must use m12 -- the latest CONFIG entry its log
    # holds -- not go back to m10, which its log has moved past.
    m10 = Membership(("a", "b", "c"))
    m12 = Membership(("a", "b", "c"), ("d",))
    m14 = Membership(("a", "b", "c", "d"))

    storage = MemoryStorage()
    storage.append([_entry(1, i) for i in range(1, 10)])
    storage.append([_entry(2, 10, m10), _entry(2, 11), _entry(2, 12, m12), _entry(2, 13)])
    storage.append([_entry(2, 14, m14)])
    storage.set_hard_state(HardState(term=2, vote="a", commit=5))
    node = _restarted_c(storage, m14, 14, (10, m10), applied=5)
    assert node.raft.membership == m14
    _append_to_c(node, "b", 3, after=(13, 2), entries=[Entry(3, 14, EntryType.NO_OP)], commit=9)
    assert node.raft.membership == m12


def _restarted_c(
    storage: MemoryStorage,
    uses: Membership,
    config_index: int,
    committed: tuple[int, Membership],
    applied: int,
) -> RawNode:
    """Node c started on ``storage`` with what it persisted: the membership it ``uses``
    (entry ``config_index``) and its ``committed`` one."""
    config = Config(
        id="c", voters=uses.voters, learners=uses.learners, config_index=config_index,
        committed_config=committed, applied=applied, pre_vote=False, check_quorum=False, seed=1,
    )  # fmt: skip
    return RawNode(config, storage)


def _append_to_c(
    node: RawNode,
    leader: str,
    term: int,
    *,
    after: tuple[int, int],
    entries: list[Entry],
    commit: int,
) -> None:
    """An APPEND from ``leader`` of ``term``: ``entries`` after (index, term) ``after``."""
    index, log_term = after
    node.step(
        Message(MessageType.APPEND, leader, "c", term, log_term=log_term, index=index,
                entries=tuple(entries), commit=commit)
    )  # fmt: skip


def _election_tick(net: Network) -> int:
    return net["a"].raft.config.election_tick


def test_removing_a_voter_while_another_does_not_answer_is_refused() -> None:
    """etcd's strict reconfiguration check: with c silent for an election timeout, removing
    b would leave a and c -- one of two answering, no majority -- and the group could then
    commit nothing, the change that would undo it included.  Removing c itself is fine."""
    net = _cluster()
    net.isolate("c")
    net.tick("a", _election_tick(net) + 1)  # b answers the heartbeats; c hears none
    assert net.leader().id == "a"
    with pytest.raises(ConfigChangeRefused, match=r"1 of the new group's 2 voters answering \(c "):
        _change(net, "a", REMOVE, "b")
    assert net["a"].raft.membership.voters == IDS3  # nothing appended
    entry = _change(net, "a", REMOVE, "c")
    assert _committed(net["a"], entry)
    assert net["a"].raft.membership.voters == ("a", "b")


def test_a_voter_silent_for_less_than_an_election_timeout_still_counts() -> None:
    """A heartbeat or two without an answer is no verdict: the last answer counts for an
    election timeout."""
    net = _cluster()
    net.tick("a", net["a"].raft.config.heartbeat_tick)  # c and b answer
    net.isolate("c")
    net.tick("a", _election_tick(net) - 1)
    entry = _change(net, "a", REMOVE, "b")
    assert entry.index == net["a"].raft.log.last_index()


def test_promoting_a_learner_that_does_not_answer_is_refused() -> None:
    """Four voters need three: with c down, promoting a silent learner d would leave two."""
    net = _cluster("d")
    _change(net, "a", ADD, "d")
    net.isolate("c")
    net.isolate("d")
    net.tick("a", _election_tick(net) + 1)
    with pytest.raises(ConfigChangeRefused, match=r"2 of the new group's 4 voters answering"):
        _change(net, "a", PROMOTE, "d")
    net.heal()
    net.isolate("c")
    net.tick("a", net["a"].raft.config.heartbeat_tick)  # d answers again
    entry = _change(net, "a", PROMOTE, "d")
    assert net["a"].raft.membership.voters == ("a", "b", "c", "d")
    assert entry.type is EntryType.CONFIG


def test_answers_from_before_a_stall_do_not_count_for_a_change() -> None:
    """After the process stalled for an election timeout, what a leader heard before says
    nothing about now: until a peer answers again it is not counted."""
    net = _cluster()
    net.tick("a", net["a"].raft.config.heartbeat_tick)  # b and c answer
    net.isolate("c")
    net["a"].raw.on_stall(_election_tick(net))
    net.deliver(net["a"].drain())  # the heartbeat it sends at once: b answers, c cannot
    with pytest.raises(ConfigChangeRefused, match=r"\(c not heard from"):
        _change(net, "a", REMOVE, "b")


def test_a_check_of_a_change_appends_nothing_and_refuses_as_the_change_would() -> None:
    """``check_config_change``: what a caller asks before moving leadership for a change."""
    net = _cluster()
    leader = net["a"].raw
    last = net["a"].raft.log.last_index()
    assert leader.check_config_change(ConfigChange(REMOVE, "c")) == Membership(("a", "b"), ())
    assert net["a"].raft.log.last_index() == last
    assert net["a"].raft.membership.voters == IDS3
    net.isolate("c")
    net.tick("a", _election_tick(net) + 1)
    with pytest.raises(ConfigChangeRefused, match=r"\(c not heard from"):
        leader.check_config_change(ConfigChange(REMOVE, "a"))
    with pytest.raises(ConfigChangeRefused, match="is not a member"):
        leader.check_config_change(ConfigChange(REMOVE, "z"))
    assert net["a"].raft.log.last_index() == last
