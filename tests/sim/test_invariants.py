"""The invariant checker must catch each kind of violation: fed fabricated,
inconsistent states it fails, fed consistent ones it stays quiet.  Otherwise
every simulation test could pass vacuously."""

from __future__ import annotations

import pytest

from raftlet.consensus.core import (
    NO_NODE,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Membership,
    Role,
)
from tests.sim.cluster import SimCluster, SimConfig
from tests.sim.invariants import InvariantChecker, InvariantViolation
from tests.sim.network import NetConfig

REPLAY = "python -m tests.sim.run --scenario random --seed 42"
F, L = Role.FOLLOWER, Role.LEADER


def e(index: int, term: int, data: bytes = b"", kind: EntryType = EntryType.NORMAL) -> Entry:
    return Entry(term, index, kind, data)


@pytest.fixture
def chk() -> InvariantChecker:
    return InvariantChecker(REPLAY)


def node(
    chk: InvariantChecker,
    name: str,
    log: list[Entry],
    *,
    role: Role = F,
    term: int = 1,
    committed: int = 0,
    incarnation: int = 1,
) -> None:
    chk.observe_node(name, incarnation, role=role, term=term, committed=committed, log=log)


def test_consistent_history_passes(chk: InvariantChecker) -> None:
    log1 = [e(1, 1, kind=EntryType.NO_OP), e(2, 1, b"x")]
    node(chk, "a", log1, role=L, term=1, committed=2)
    node(chk, "b", log1[:1], committed=0)
    node(chk, "b", log1, committed=2)
    for n in ("a", "b"):
        for entry in log1:
            chk.observe_applied(n, 1, entry, term=1)
    chk.observe_persisted("a", HardState(1, "a", 2))
    chk.observe_persisted("a", HardState(2, NO_NODE, 2))
    chk.observe_persisted("a", HardState(2, "b", 2))
    log2 = [*log1, e(3, 2, kind=EntryType.NO_OP)]
    node(chk, "b", log2, role=L, term=2, committed=2)
    assert chk.leaders == {1: "a", 2: "b"}
    assert [x.index for x in chk.committed] == [1, 2]


def test_violation_message_has_replay_command(chk: InvariantChecker) -> None:
    node(chk, "a", [], role=L, term=3)
    with pytest.raises(InvariantViolation) as info:
        node(chk, "b", [], role=L, term=3)
    assert REPLAY in str(info.value)
    assert isinstance(info.value, AssertionError)


def test_two_leaders_in_one_term(chk: InvariantChecker) -> None:
    node(chk, "a", [], role=L, term=3)
    node(chk, "a", [], role=F, term=4)  # gone, but remembered
    with pytest.raises(InvariantViolation, match="two leaders in term 3"):
        node(chk, "b", [], role=L, term=3)


def test_same_index_and_term_different_entry(chk: InvariantChecker) -> None:
    node(chk, "a", [e(1, 1, b"x")])
    with pytest.raises(InvariantViolation, match="log matching"):
        node(chk, "b", [e(1, 1, b"y")])


def test_same_entry_different_prefix(chk: InvariantChecker) -> None:
    # (2, 2) is identical in both logs but its predecessors differ.
    node(chk, "a", [e(1, 1, b"x"), e(2, 2, b"z")])
    with pytest.raises(InvariantViolation, match="log matching"):
        node(chk, "b", [e(1, 2, b"w"), e(2, 2, b"z")])


def test_entry_rewritten_in_place_over_time(chk: InvariantChecker) -> None:
    node(chk, "a", [e(1, 1, b"x"), e(2, 1, b"y"), e(3, 1, b"z")])
    with pytest.raises(InvariantViolation, match="log matching"):
        node(chk, "a", [e(1, 1, b"x"), e(2, 1, b"q"), e(3, 1, b"z")])


def test_log_shape(chk: InvariantChecker) -> None:
    with pytest.raises(InvariantViolation, match="holds index"):
        node(chk, "a", [e(1, 1), e(3, 1)])
    with pytest.raises(InvariantViolation, match="term goes down"):
        node(chk, "b", [e(1, 2), e(2, 1)])


def test_leader_missing_committed_entry(chk: InvariantChecker) -> None:
    node(chk, "a", [e(1, 1, b"x")], committed=1, term=1)
    chk.observe_applied("a", 1, e(1, 1, b"x"), term=1)
    with pytest.raises(InvariantViolation, match="leader completeness"):
        node(chk, "b", [e(1, 2, kind=EntryType.NO_OP)], role=L, term=2)


def test_leader_elected_before_the_commit_became_known(chk: InvariantChecker) -> None:
    # b leads term 5 without entry 1; only later does a apply entry 1, committed
    # (at the latest) in term 3 < 5: b should have had it.
    node(chk, "b", [], role=L, term=5)
    node(chk, "a", [e(1, 1, b"x")], committed=1, term=3)
    with pytest.raises(InvariantViolation, match="leader completeness"):
        chk.observe_applied("a", 1, e(1, 1, b"x"), term=3)


def test_stale_leader_of_earlier_term_is_not_required_to_have_it(chk: InvariantChecker) -> None:
    node(chk, "b", [], role=L, term=2)
    node(chk, "a", [e(1, 3, b"x")], committed=1, term=3)
    chk.observe_applied("a", 1, e(1, 3, b"x"), term=3)  # committed in term 3 > 2


def test_state_machines_diverge(chk: InvariantChecker) -> None:
    node(chk, "a", [e(1, 1, b"x")], committed=1)
    chk.observe_applied("a", 1, e(1, 1, b"x"), term=1)
    node(chk, "b", [e(1, 1, b"x")], committed=1)
    with pytest.raises(InvariantViolation, match="state machines diverge"):
        chk.observe_applied("b", 1, e(1, 1, b"y"), term=1)


def test_state_machine_diverges_after_restart(chk: InvariantChecker) -> None:
    node(chk, "a", [e(1, 1, b"x")], committed=1)
    chk.observe_applied("a", 1, e(1, 1, b"x"), term=1)
    chk.observe_crash("a")
    node(chk, "a", [e(1, 2, b"y")], committed=0, term=2, incarnation=2)
    with pytest.raises(InvariantViolation, match="state machines diverge"):
        chk.observe_applied("a", 2, e(1, 2, b"y"), term=2)


def test_applied_out_of_order(chk: InvariantChecker) -> None:
    node(chk, "a", [e(1, 1), e(2, 1)], committed=2)
    with pytest.raises(InvariantViolation, match="applied index 2 after 0"):
        chk.observe_applied("a", 1, e(2, 1), term=1)


def test_committed_prefix_differs_from_applied(chk: InvariantChecker) -> None:
    node(chk, "a", [e(1, 1, b"x")], committed=1)
    chk.observe_applied("a", 1, e(1, 1, b"x"), term=1)
    with pytest.raises(InvariantViolation, match="committed entry at 1"):
        node(chk, "b", [e(1, 2, b"y")], committed=1, term=2)


def test_commit_index_goes_back(chk: InvariantChecker) -> None:
    log = [e(1, 1), e(2, 1), e(3, 1)]
    node(chk, "a", log, committed=3)
    node(chk, "a", log, committed=1, incarnation=2)  # a restart may forget it
    with pytest.raises(InvariantViolation, match="commit index went back"):
        node(chk, "a", log, committed=0, incarnation=2)


def test_volatile_term_goes_back(chk: InvariantChecker) -> None:
    node(chk, "a", [], term=4)
    with pytest.raises(InvariantViolation, match="term went back"):
        node(chk, "a", [], term=3)


def test_durable_term_goes_back(chk: InvariantChecker) -> None:
    chk.observe_persisted("a", HardState(4, "a", 0))
    with pytest.raises(InvariantViolation, match="durable term went back"):
        chk.observe_persisted("a", HardState(3, "a", 0))


def test_durable_vote_changes_within_term(chk: InvariantChecker) -> None:
    chk.observe_persisted("a", HardState(4, NO_NODE, 0))
    chk.observe_persisted("a", HardState(4, "b", 0))  # first vote of term 4: fine
    with pytest.raises(InvariantViolation, match="durable vote in term 4 changed"):
        chk.observe_persisted("a", HardState(4, "c", 0))


def test_cluster_catches_a_driver_that_forgets_votes() -> None:
    """End to end: a driver bug (a vote that is not really durable) lets a node
    vote twice in one term, and the running cluster reports it."""
    # Slow links (1.5 ticks a hop) leave room to crash n2 between its vote and
    # the new leader's first append; long timeouts keep the nodes from campaigning
    # on their own meanwhile.
    net = NetConfig(min_delay=15, max_delay=15)
    config = SimConfig(nodes=3, election_tick=50, pre_vote=False, check_quorum=False, net=net)
    c = SimCluster(7, config, "(test)")
    n1, n2, n3 = c.ids
    c.net.partition([[n1, n2], [n3]])
    c.nodes[n1].node().campaign()
    c.run_until(lambda: c.leaders() == [n1], 10)
    assert c.nodes[n2].storage.initial_state().vote == n1
    assert c.nodes[n2].storage.last_index() == 0  # the append is still in flight
    c.crash(n2)
    hs = c.nodes[n2].storage.initial_state()
    c.nodes[n2].storage.set_hard_state(HardState(hs.term, NO_NODE, hs.commit))  # the "bug"
    c.restart(n2)
    c.net.partition([[n2, n3], [n1]])
    c.nodes[n3].node().campaign()
    # Caught twice over: n2's durable vote changes within term 1, and n3 would
    # become a second leader of term 1.
    with pytest.raises(InvariantViolation, match=r"vote in term 1 changed|two leaders in term 1"):
        c.step(10)


# --- compacted logs and installed state machines -------------------------------------------


def _applied(chk: InvariantChecker, name: str, log: list[Entry]) -> None:
    node(chk, name, log, committed=len(log))
    for entry in log:
        chk.observe_applied(name, 1, entry, term=1)


def test_a_compacted_log_starts_with_a_committed_anchor(chk: InvariantChecker) -> None:
    log = [e(1, 1, kind=EntryType.NO_OP), e(2, 1, b"x"), e(3, 1, b"y")]
    _applied(chk, "a", log)
    node(chk, "a", log[1:], committed=3)  # GC discarded index 1
    # A copy's stand-in at index 2: same term, no data -- only index and term count.
    node(chk, "b", [e(2, 1, kind=EntryType.NO_OP), e(3, 1, b"y")], committed=2)
    with pytest.raises(InvariantViolation, match="log starts at"):
        node(chk, "c", [e(2, 2, kind=EntryType.NO_OP)], committed=2)
    with pytest.raises(InvariantViolation, match="past everything ever applied"):
        node(chk, "d", [e(9, 1)], committed=9)


def test_an_installed_state_must_be_a_prefix_and_applying_continues_from_it(
    chk: InvariantChecker,
) -> None:
    log = [e(1, 1, kind=EntryType.NO_OP), e(2, 1, b"x"), e(3, 1, b"y")]
    _applied(chk, "a", log)
    node(chk, "b", [e(2, 1, kind=EntryType.NO_OP), e(3, 1, b"y")], committed=2)
    chk.observe_state("b", 1, [(1, 1, b""), (2, 1, b"x")])
    chk.observe_applied("b", 1, log[2], term=1)
    node(chk, "c", [e(2, 1), e(3, 1, b"y")], committed=3)
    with pytest.raises(InvariantViolation, match="diverge at index 2"):
        chk.observe_state("c", 1, [(1, 1, b""), (2, 1, b"other")])
    with pytest.raises(InvariantViolation, match="position"):
        chk.observe_state("c", 1, [(1, 1, b""), (3, 1, b"y")])


def test_applying_past_a_hole_after_an_install_fails(chk: InvariantChecker) -> None:
    log = [e(1, 1, kind=EntryType.NO_OP), e(2, 1, b"x"), e(3, 1, b"y"), e(4, 1, b"z")]
    _applied(chk, "a", log)
    node(chk, "b", [e(2, 1), e(3, 1, b"y"), e(4, 1, b"z")], committed=4)
    chk.observe_state("b", 1, [(1, 1, b""), (2, 1, b"x")])
    with pytest.raises(InvariantViolation, match="a hole"):
        chk.observe_applied("b", 1, log[3], term=1)


# --- membership ----------------------------------------------------------------------------

M3 = Membership(("a", "b", "c"))
M3D = Membership(("a", "b", "c"), ("d",))  # d added as a learner
M4 = Membership(("a", "b", "c", "d"))  # d promoted
M3B = Membership(("a", "c", "d"))  # b removed


def cfg(index: int, term: int, m: Membership) -> Entry:
    return Entry(term, index, EntryType.CONFIG, m.encode())


def mnode(
    chk: InvariantChecker,
    name: str,
    log: list[Entry],
    uses: tuple[int, Membership],
    *,
    committed_conf: tuple[int, Membership] = (0, M3),
    role: Role = F,
    term: int = 1,
    committed: int = 0,
    incarnation: int = 1,
) -> None:
    """Observe ``name`` using membership ``uses`` (its entry's index, the membership) and
    reporting ``committed_conf`` as the latest committed one."""
    conf = ConfState(uses[1], uses[0], committed_conf[1], committed_conf[0])
    chk.observe_node(
        name,
        incarnation,
        role=role,
        term=term,
        committed=committed,
        log=log,
        membership=uses[1],
        conf=conf,
    )


def _grown(chk: InvariantChecker) -> list[Entry]:
    """a leads term 1 and commits: no-op, d added as a learner, x, d promoted."""
    chk.observe_config("a", 1, (0, M3))
    log = [e(1, 1, kind=EntryType.NO_OP)]
    mnode(chk, "a", log, (0, M3), role=L, committed=1)
    log = [*log, cfg(2, 1, M3D), e(3, 1, b"x")]
    mnode(chk, "a", log, (2, M3D), role=L, committed=1)
    mnode(chk, "a", log, (2, M3D), committed_conf=(2, M3D), role=L, committed=3)
    log = [*log, cfg(4, 1, M4)]
    mnode(chk, "a", log, (4, M4), committed_conf=(2, M3D), role=L, committed=3)
    mnode(chk, "a", log, (4, M4), committed_conf=(4, M4), role=L, committed=4)
    return log


def test_a_consistent_membership_history_passes(chk: InvariantChecker) -> None:
    log = _grown(chk)
    # A follower that restarts with the persisted membership its log holds.
    chk.observe_config("b", 1, (0, M3))
    mnode(chk, "b", log[:2], (2, M3D))
    chk.observe_config("b", 2, (2, M3D), (0, M3))
    mnode(chk, "b", log[:2], (2, M3D), incarnation=2)
    # Its persisted membership's entry is cut by a later leader: back to the committed one.
    mnode(chk, "b", [log[0], e(2, 2, kind=EntryType.NO_OP)], (0, M3), term=2, incarnation=2)
    # A removal, then a node that installs a copy whose membership lies past the copy's
    # index: the older CONFIG entry it receives after the copy does not take it back.
    log = [*log, cfg(5, 1, M3B)]
    mnode(chk, "a", log, (5, M3B), committed_conf=(5, M3B), role=L, committed=5)
    for entry in log:
        chk.observe_applied("a", 1, entry, term=1)
    chk.observe_config("c", 1, (0, M3))
    mnode(chk, "c", [], (0, M3))
    chk.observe_config("c", 1, (5, M3B))
    copy = [e(3, 1, kind=EntryType.NO_OP)]
    mnode(chk, "c", copy, (5, M3B), committed_conf=(5, M3B), committed=3)
    mnode(chk, "c", [*copy, *log[3:]], (5, M3B), committed_conf=(5, M3B), committed=5)
    mnode(chk, "c", log[4:], (5, M3B), committed_conf=(5, M3B), committed=5)  # log GC


def test_a_node_must_use_the_latest_config_entry_in_its_log(chk: InvariantChecker) -> None:
    chk.observe_config("a", 1, (0, M3))
    log = [e(1, 1, kind=EntryType.NO_OP), cfg(2, 1, M3D)]
    with pytest.raises(InvariantViolation, match=r"a uses voters a, b, c, but the latest"):
        mnode(chk, "a", log, (0, M3))


def test_the_reported_conf_state_must_name_the_entry_in_use(chk: InvariantChecker) -> None:
    chk.observe_config("a", 1, (0, M3))
    log = [e(1, 1, kind=EntryType.NO_OP), cfg(2, 1, M3D)]
    conf = ConfState(M3D, 1, M3, 0)  # the right membership, the wrong index
    with pytest.raises(InvariantViolation, match=r"reports .* at index 1 as its membership"):
        chk.observe_node("a", 1, role=F, term=1, committed=0, log=log, membership=M3D, conf=conf)


def test_an_uncommitted_membership_reported_as_committed(chk: InvariantChecker) -> None:
    chk.observe_config("a", 1, (0, M3))
    log = [e(1, 1, kind=EntryType.NO_OP), cfg(2, 1, M3D)]
    mnode(chk, "a", log, (2, M3D), committed=1)
    with pytest.raises(InvariantViolation, match="which no log held committed there"):
        mnode(chk, "a", log, (2, M3D), committed_conf=(2, M3D), committed=1)


def test_a_restart_from_an_uncommitted_membership_persisted_as_committed(
    chk: InvariantChecker,
) -> None:
    _grown(chk)
    with pytest.raises(InvariantViolation, match=r"persisted as committed .* no log held"):
        chk.observe_config("b", 2, (6, M3B), (6, M3B))


def test_an_unknown_initial_membership(chk: InvariantChecker) -> None:
    chk.observe_config("a", 1, (0, M3))
    with pytest.raises(InvariantViolation, match="which no node started with"):
        mnode(chk, "a", [], (0, M3), committed_conf=(0, M4))


def test_a_restore_that_keeps_the_old_membership(chk: InvariantChecker) -> None:
    log = _grown(chk)
    for entry in log:
        chk.observe_applied("a", 1, entry, term=1)
    chk.observe_config("c", 1, (0, M3))
    mnode(chk, "c", [], (0, M3))
    chk.observe_config("c", 1, (4, M4))  # the copy carried the membership at 4
    with pytest.raises(InvariantViolation, match="c uses voters a, b, c, but the latest"):
        mnode(chk, "c", [e(3, 1, kind=EntryType.NO_OP)], (0, M3), committed=3)


def test_an_older_config_entry_below_a_copys_membership_takes_it_back(
    chk: InvariantChecker,
) -> None:
    log = _grown(chk)
    for entry in log[:3]:
        chk.observe_applied("a", 1, entry, term=1)
    chk.observe_config("c", 1, (0, M3))
    mnode(chk, "c", [], (0, M3))
    chk.observe_config("c", 1, (4, M4))  # copy at 1, membership of index 4
    copy = [e(1, 1, kind=EntryType.NO_OP)]
    mnode(chk, "c", copy, (4, M4), committed_conf=(4, M4), committed=1)
    with pytest.raises(InvariantViolation, match="c uses voters a, b, c; learners d, but"):
        mnode(chk, "c", log, (2, M3D), committed_conf=(4, M4), committed=1)


def test_a_restart_falls_back_when_its_log_lacks_the_persisted_entry(
    chk: InvariantChecker,
) -> None:
    log = _grown(chk)
    chk.observe_config("b", 2, (2, M3D), (0, M3))  # entry 2 did not become durable
    mnode(chk, "b", log[:1], (0, M3), incarnation=2)  # fine: back to the committed one
    chk.observe_config("c", 2, (2, M3D), (0, M3))
    with pytest.raises(InvariantViolation, match="c uses voters a, b, c; learners d, but"):
        mnode(chk, "c", log[:1], (2, M3D), incarnation=2)


def test_a_restart_whose_persisted_entry_is_cut_falls_back(chk: InvariantChecker) -> None:
    log = _grown(chk)
    chk.observe_config("b", 2, (2, M3D), (0, M3))
    mnode(chk, "b", log[:2], (2, M3D), incarnation=2)
    cut = [log[0], e(2, 2, kind=EntryType.NO_OP)]
    with pytest.raises(InvariantViolation, match="b uses voters a, b, c; learners d, but"):
        mnode(chk, "b", cut, (2, M3D), term=2, incarnation=2)


def test_a_config_entry_must_be_one_change(chk: InvariantChecker) -> None:
    chk.observe_config("a", 1, (0, M3))
    two_voters = Membership(("a", "b", "c", "d", "e"))
    log = [e(1, 1, kind=EntryType.NO_OP), cfg(2, 1, two_voters)]
    with pytest.raises(InvariantViolation, match="no single change"):
        mnode(chk, "a", log, (2, two_voters))
    # A voter cannot be added directly either: only a learner can be promoted.
    other = InvariantChecker(REPLAY)
    other.observe_config("b", 1, (0, M3))
    with pytest.raises(InvariantViolation, match="no single change"):
        mnode(other, "b", [e(1, 1, kind=EntryType.NO_OP), cfg(2, 1, M4)], (2, M4))


def test_a_config_entry_must_hold_a_membership(chk: InvariantChecker) -> None:
    chk.observe_config("a", 1, (0, M3))
    log = [e(1, 1, kind=EntryType.NO_OP), e(2, 1, b"garbage", EntryType.CONFIG)]
    with pytest.raises(InvariantViolation, match="is no membership"):
        mnode(chk, "a", log, (0, M3))


def test_two_membership_changes_uncommitted_at_once(chk: InvariantChecker) -> None:
    chk.observe_config("a", 1, (0, M3))
    log = [e(1, 1, kind=EntryType.NO_OP), cfg(2, 1, M3D), cfg(3, 1, M4)]
    with pytest.raises(InvariantViolation, match="two membership changes uncommitted at once"):
        mnode(chk, "a", log, (3, M4), role=L, committed=1)


def test_a_leader_changes_membership_before_committing_in_its_term(
    chk: InvariantChecker,
) -> None:
    chk.observe_config("a", 1, (0, M3))
    log = [e(1, 1, kind=EntryType.NO_OP)]
    mnode(chk, "a", log, (0, M3), committed=1)
    log = [*log, e(2, 2, kind=EntryType.NO_OP)]
    mnode(chk, "a", log, (0, M3), role=L, term=2, committed=1)
    with pytest.raises(InvariantViolation, match="before it committed an entry of its term"):
        mnode(chk, "a", [*log, cfg(3, 2, M3D)], (3, M3D), role=L, term=2, committed=1)


def test_a_log_that_starts_past_a_committed_change(chk: InvariantChecker) -> None:
    log = _grown(chk)
    for entry in log:
        chk.observe_applied("a", 1, entry, term=1)
    # b restarts from a stale membership with a log that starts past the change at 4 (a
    # copy installed without its membership becoming durable, say).
    chk.observe_config("b", 2, (2, M3D), (2, M3D))
    with pytest.raises(InvariantViolation, match="past the committed membership change at 4"):
        mnode(chk, "b", [e(4, 1, kind=EntryType.NO_OP)], (2, M3D), committed=4, incarnation=2)
