"""The Raft paper, §5.3 (log replication), sentence by sentence, including Figure 7.

Each test's docstring quotes the sentence it checks.  Pre-vote and check-quorum are
off: this is the algorithm as the paper states it.
"""

from __future__ import annotations

import pytest

from raftlet.consensus.core import Entry, EntryType, Message, MessageType, Role
from tests.unit.raft_harness import (
    IDS5,
    Network,
    Node,
    accept,
    data_entries,
    entries_of_terms,
    new_node,
)

A = MessageType.APPEND
AR = MessageType.APPEND_RESPONSE
HB = MessageType.HEARTBEAT


def _ready_leader(node_id: str = "a", voters: tuple[str, ...] = ("a", "b", "c")) -> Node:
    """A leader of term 1 whose no-op every follower has acknowledged."""
    node = new_node(node_id, voters)
    node.elect_and_commit_noop()
    return node


def _ack_all(leader: Node, msgs: list[Message], rounds: int = 10) -> None:
    """Acknowledge every APPEND the leader sends, as a perfect follower would."""
    for _ in range(rounds):
        appends = [m for m in msgs if m.type is A]
        if not appends:
            return
        msgs = []
        for m in appends:
            msgs += leader.step(accept(m))


def _idx_terms(entries: list[Entry] | tuple[Entry, ...]) -> list[tuple[int, int]]:
    return [(e.index, e.term) for e in entries]


# --- the leader ----------------------------------------------------------------------


def test_leader_appends_then_replicates_in_parallel() -> None:
    """§5.3: "The leader appends the command to its log as a new entry, then issues
    AppendEntries RPCs in parallel to each of the other servers to replicate the entry."
    Figure 2: prevLogIndex/prevLogTerm are the "index [and term] of log entry
    immediately preceding new ones"; leaderCommit is the "leader's commitIndex"."""
    leader = _ready_leader()
    li = leader.raft.log.last_index()
    entry = leader.raw.propose(b"x")
    assert entry == Entry(1, li + 1, EntryType.NORMAL, b"x")
    assert leader.raft.log.last_index() == li + 1
    rd = leader.raw.ready()
    assert rd.entries == (entry,)
    assert rd.must_sync
    assert sorted(
        (m.type, m.dst, m.term, m.index, m.log_term, m.entries, m.commit) for m in rd.messages
    ) == [
        (A, "b", 1, li, 1, (entry,), li),
        (A, "c", 1, li, 1, (entry,), li),
    ]
    # Not committed by the proposal alone.
    assert leader.raft.log.committed == li
    assert rd.committed_entries == ()


_ACK_CASES = [
    (1, set(), True),
    (3, set(), False),
    (3, {"b"}, True),
    (3, {"b", "c"}, True),
    (5, set(), False),
    (5, {"b"}, False),
    (5, {"b", "c"}, True),
    (5, {"b", "c", "d"}, True),
    (5, {"b", "c", "d", "e"}, True),
]


@pytest.mark.parametrize(("size", "acceptors", "committed"), _ACK_CASES)
def test_entry_committed_once_replicated_on_majority(
    size: int, acceptors: set[str], committed: bool
) -> None:
    """§5.3: "A log entry is committed once the leader that created the entry has
    replicated it on a majority of the servers." """
    leader = _ready_leader("a", IDS5[:size])
    li = leader.raft.log.last_index()
    leader.raw.propose(b"x")
    out = leader.drain()
    for m in out:
        if m.type is A and m.dst in acceptors:
            leader.step(accept(m))
    assert (leader.raft.log.committed > li) is committed
    assert (b"x" in data_entries(leader.applied)) is committed


def test_leader_commits_applies_and_advertises_commit_index() -> None:
    """§5.3: "The leader keeps track of the highest index it knows to be committed, and
    it includes that index in future AppendEntries RPCs (including heartbeats) so that
    the other servers eventually find out." """
    leader = _ready_leader()
    li = leader.raft.log.last_index()
    leader.raw.propose(b"x")
    out = leader.drain()
    after: list[Message] = []
    for m in out:
        if m.type is A:
            after += leader.step(accept(m))
    assert leader.raft.log.committed == li + 1
    assert data_entries(leader.applied) == [b"x"]
    # The next APPENDs and heartbeats carry the new commit index.
    assert {m.commit for m in after if m.type is A} == {li + 1}
    beats = leader.tick()
    assert sorted((m.dst, m.commit) for m in beats if m.type is HB) == [
        ("b", li + 1),
        ("c", li + 1),
    ]
    leader.raw.propose(b"y")
    assert {m.commit for m in leader.drain() if m.type is A} == {li + 1}


def test_heartbeat_commit_never_exceeds_follower_match() -> None:
    """§5.3: "it includes that index in future AppendEntries RPCs (including
    heartbeats)" — but a heartbeat carries no entries and no prevLog check, so it may only
    advertise a commit the follower is known to hold (min(commit, match))."""
    leader = new_node("a")
    for m in leader.elect():
        if m.dst == "b":
            leader.step(accept(m))
    assert leader.raft.log.committed == 1
    beats = leader.tick()
    assert sorted((m.dst, m.commit) for m in beats if m.type is HB) == [("b", 1), ("c", 0)]


_PRIOR_LOGS: list[list[int]] = [[], [2], [1, 2], [1]]


@pytest.mark.parametrize("prior", _PRIOR_LOGS)
def test_commit_includes_preceding_entries_of_previous_leaders(prior: list[int]) -> None:
    """§5.3: "This also commits all preceding entries in the leader's log, including
    entries created by previous leaders." ... "Once a follower learns that a log entry
    is committed, it applies the entry to its local state machine (in log order)." """
    leader = new_node("a", terms=prior, term=2)
    sent = leader.elect()
    assert leader.term == 3
    leader.raw.propose(b"x")
    _ack_all(leader, sent + leader.drain())
    n = len(prior)
    want = [*((i + 1, t) for i, t in enumerate(prior)), (n + 1, 3), (n + 2, 3)]
    assert _idx_terms(leader.applied) == want
    assert leader.applied[n].type is EntryType.NO_OP
    assert leader.applied[-1].data == b"x"


# --- the follower ---------------------------------------------------------------------

_FOLLOWER_COMMIT_CASES = [
    ([b"x"], 1),
    ([b"x", b"y"], 2),
    ([b"y", b"x"], 2),
    ([b"x", b"y"], 1),
]


@pytest.mark.parametrize(("datas", "commit"), _FOLLOWER_COMMIT_CASES)
def test_follower_applies_committed_entries_in_log_order(datas: list[bytes], commit: int) -> None:
    """§5.3: "Once a follower learns that a log entry is committed, it applies the
    entry to its local state machine (in log order)." """
    node = new_node("a")
    ents = tuple(Entry(1, i + 1, data=d) for i, d in enumerate(datas))
    node.step(Message(A, src="b", dst="a", term=1, entries=ents, commit=commit))
    assert node.raft.log.committed == commit
    assert node.applied == list(ents[:commit])


_CHECK_CASES = [
    # (prev log_term, prev index) -> (reject, response index, reject_hint, hint log_term)
    ((1, 1), (False, 1, 0, 0)),  # matches a committed entry
    ((2, 2), (False, 2, 0, 0)),  # matches an uncommitted entry
    ((1, 2), (True, 2, 1, 1)),  # entry exists with another term
    ((3, 3), (True, 3, 2, 2)),  # no entry at that index
]


@pytest.mark.parametrize(("prev", "want"), _CHECK_CASES)
def test_follower_refuses_entries_without_matching_prev(
    prev: tuple[int, int], want: tuple[bool, int, int, int]
) -> None:
    """§5.3: "When sending an AppendEntries RPC, the leader includes the index and term
    of the entry in its log that immediately precedes the new entries.  If the follower
    does not find an entry in its log with the same index and term, then it refuses the
    new entries." """
    node = new_node("a", terms=[1, 2], term=2, commit=1)
    log_term, index = prev
    out = node.step(Message(A, src="b", dst="a", term=2, index=index, log_term=log_term))
    assert [(m.type, m.dst, m.term) for m in out] == [(AR, "b", 2)]
    m = out[0]
    reject, resp_index, hint, hint_term = want
    assert (m.reject, m.index) == (reject, resp_index)
    if reject:
        assert (m.reject_hint, m.log_term) == (hint, hint_term)
    assert node.log_terms() == [1, 2]


_APPEND_CASES = [
    # prev (index, term), new entries' terms from prev+1, want the whole log's terms
    ((2, 2), [3], [1, 2, 3]),
    ((1, 1), [3, 4], [1, 3, 4]),
    ((0, 0), [1], [1, 2]),
    ((0, 0), [3], [3]),
    ((1, 1), [2], [1, 2]),
]


@pytest.mark.parametrize(("prev", "new_terms", "want"), _APPEND_CASES)
def test_follower_deletes_conflicts_and_appends_new_entries(
    prev: tuple[int, int], new_terms: list[int], want: list[int]
) -> None:
    """Figure 2, AppendEntries receiver: "If an existing entry conflicts with a new one
    (same index but different terms), delete the existing entry and all that follow it
    (§5.3).  Append any new entries not already in the log." """
    node = new_node("a", terms=[1, 2], term=2)
    index, log_term = prev
    ents = tuple(entries_of_terms(new_terms, start=index + 1))
    out = node.step(
        Message(A, src="b", dst="a", term=4, index=index, log_term=log_term, entries=ents)
    )
    assert [(m.type, m.reject, m.index) for m in out] == [(AR, False, index + len(ents))]
    assert node.log_terms() == want
    # "it writes the new entry into stable storage" before acknowledging.
    assert node.durable_terms() == want


def test_follower_does_not_truncate_on_a_shorter_matching_append() -> None:
    """Figure 2: "If an existing entry conflicts with a new one ... delete the existing
    entry and all that follow it" — only on a conflict: a delayed APPEND whose entries
    all match must not cut entries that follow them."""
    node = new_node("a", terms=[1, 1, 1], term=1)
    out = node.step(
        Message(
            A,
            src="b",
            dst="a",
            term=1,
            index=1,
            log_term=1,
            entries=tuple(entries_of_terms([1], start=2)),
        )
    )
    assert node.log_terms() == [1, 1, 1]
    assert [(m.reject, m.index) for m in out] == [(False, 2)]


def test_follower_commit_is_bounded_by_its_last_new_entry() -> None:
    """Figure 2, AppendEntries receiver: "If leaderCommit > commitIndex, set commitIndex
    = min(leaderCommit, index of last new entry)." — entries after it are unverified."""
    node = new_node("a", terms=[1, 1, 1], term=1)
    node.step(Message(A, src="b", dst="a", term=2, index=1, log_term=1, commit=3))
    assert node.raft.log.committed == 1
    assert [e.index for e in node.applied] == [1]


def test_append_rpc_is_idempotent() -> None:
    """§5.5: "Raft RPCs are idempotent ... if a follower receives an AppendEntries
    request that includes log entries already present in its log, it ignores those
    entries in the new request." """
    node = new_node("a", terms=[1], term=1)
    m = Message(
        A,
        src="b",
        dst="a",
        term=1,
        index=1,
        log_term=1,
        entries=tuple(entries_of_terms([1, 1], start=2)),
        commit=1,
    )
    first = node.step(m)
    second = node.step(m)
    assert [(r.reject, r.index) for r in first] == [(False, 3)]
    assert [(r.reject, r.index) for r in second] == [(False, 3)]
    assert node.log_terms() == [1, 1, 1]
    assert node.durable_terms() == [1, 1, 1]
    assert [e.index for e in node.applied] == [1]


# --- consistency -------------------------------------------------------------------------


def test_leader_decrements_next_index_and_retries_after_rejection() -> None:
    """§5.3: "After a rejection, the leader decrements nextIndex and retries the
    AppendEntries RPC.  Eventually nextIndex will reach a point where the leader and
    follower logs match." """
    leader = new_node("a", terms=[1, 1, 1], term=1)
    first = next(m for m in leader.elect() if m.type is A and m.dst == "b")
    assert (first.index, first.log_term) == (3, 1)
    # b only has the first entry.
    out = leader.step(
        Message(
            AR, src="b", dst="a", term=2, index=first.index, reject=True, reject_hint=1, log_term=1
        )
    )
    retry = [m for m in out if m.type is A and m.dst == "b"]
    assert len(retry) == 1
    assert (retry[0].index, retry[0].log_term) == (1, 1)
    assert [e.index for e in retry[0].entries] == [2, 3, 4]


def test_leader_never_overwrites_its_own_log() -> None:
    """§5.3: "a leader never overwrites or deletes entries in its own log (the
    Leader Append-Only Property in Figure 3)." """
    leader = new_node("a", terms=[1, 1], term=1)
    leader.elect()
    before = leader.raft.log.all_entries()
    # A stale leader's APPEND with conflicting entries, and a rejection from a follower.
    leader.step(
        Message(
            A,
            src="b",
            dst="a",
            term=1,
            index=1,
            log_term=1,
            entries=tuple(entries_of_terms([1, 1, 1], start=2)),
            commit=3,
        )
    )
    leader.step(Message(AR, src="c", dst="a", term=2, index=3, reject=True, reject_hint=0))
    assert leader.raft.log.all_entries() == before
    assert leader.storage.all_entries() == before
    assert (leader.role, leader.term) == (Role.LEADER, 2)


def test_leader_retries_until_every_follower_stores_every_entry() -> None:
    """§5.3: "If followers crash or run slowly, or if network packets are lost, the
    leader retries AppendEntries RPCs indefinitely (even after it has responded to the
    client) until all followers eventually store all log entries." """
    net = Network.create()
    net.campaign("a")
    net.isolate("c")
    for i in range(5):
        net.propose("a", f"x{i}".encode())
    assert net["a"].raft.log.committed == 6  # committed with b alone
    assert net["c"].log_terms() == [1]
    net.heal()
    net.tick("a", 3)
    assert net["c"].storage.all_entries() == net["a"].storage.all_entries()
    assert data_entries(net["c"].applied) == [f"x{i}".encode() for i in range(5)]


def test_committed_entries_are_applied_in_the_same_order_everywhere() -> None:
    """§5.3: "Once a follower learns that a log entry is committed, it applies the entry
    to its local state machine (in log order)." — every state machine sees the same
    sequence (Figure 3, State Machine Safety)."""
    net = Network.create()
    net.campaign("a")
    datas = [f"x{i}".encode() for i in range(6)]
    for d in datas:
        net.propose("a", d)
    net.tick("a")
    for n in net.nodes.values():
        assert data_entries(n.applied) == datas
        assert [e.index for e in n.applied] == list(range(1, 8))


# --- Figure 7 -----------------------------------------------------------------------------

_FIG7_LEADER = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
_FIG7_FOLLOWERS = {
    "a": [1, 1, 1, 4, 4, 5, 5, 6, 6],
    "b": [1, 1, 1, 4],
    "c": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],
    "d": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],
    "e": [1, 1, 1, 4, 4, 4, 4],
    "f": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],
}


@pytest.mark.parametrize("case", sorted(_FIG7_FOLLOWERS))
def test_figure7_leader_of_term_8_repairs_follower(case: str) -> None:
    """§5.3, Figure 7: "When the leader at the top comes to power, it is possible that
    any of scenarios (a-f) could occur in follower logs ... In Raft, the leader handles
    inconsistencies by forcing the followers' logs to duplicate its own.  This means
    that conflicting entries in follower logs will be overwritten with entries from the
    leader's log." — and Figure 3, Log Matching: "if two logs contain an entry with the
    same index and term, then the logs are identical in all entries up through the given
    index." """
    follower_log = _FIG7_FOLLOWERS[case]
    # "l" is the leader of Figure 7, "f" the follower in scenario ``case`` and "x" a
    # third server with the leader's log, whose vote the leader needs in (c) and (d).
    ids = ("l", "f", "x")
    net = Network.create(
        ids,
        logs={"l": _FIG7_LEADER, "f": follower_log, "x": _FIG7_LEADER},
        terms={"l": 7, "f": max(follower_log), "x": 7},
    )
    net.campaign("l")
    leader = net["l"]
    assert (leader.role, leader.term) == (Role.LEADER, 8)
    net.propose("l", b"cmd")
    net.tick("l")  # a heartbeat carries the final commit index
    want = leader.storage.all_entries()
    assert [e.term for e in want] == [*_FIG7_LEADER, 8, 8]
    assert leader.raft.log.committed == 12
    for n in (net["f"], net["x"]):
        assert n.storage.all_entries() == want
        assert n.raft.log.committed == 12
        assert data_entries(n.applied)[-1] == b"cmd"
    # The leader's own log was only appended to.
    assert [e.term for e in want][: len(_FIG7_LEADER)] == _FIG7_LEADER


@pytest.mark.parametrize("broadcast_commit", [True, False])
def test_a_moved_commit_index_is_sent_at_once_or_rides_on_the_next_message(
    broadcast_commit: bool,
) -> None:
    """Config.broadcast_commit: etcd's leader sends every follower an append as soon as the
    commit index moves, even an empty one; with it off, the commit index waits for the next
    append or heartbeat (one message per follower per write instead of two)."""
    leader = new_node("a", ("a", "b", "c"), broadcast_commit=broadcast_commit)
    leader.elect_and_commit_noop()
    leader.raw.propose(b"x")
    sent = leader.drain()
    appends = [m for m in sent if m.type is A]
    assert sorted(m.dst for m in appends) == ["b", "c"]
    index = appends[0].index + 1
    after_ack = leader.step(accept(appends[0]))  # b acknowledges: a majority, x commits
    assert leader.raft.log.committed == index
    commit_only = [m for m in after_ack if m.type is A and not m.entries]
    if broadcast_commit:
        assert sorted(m.dst for m in commit_only) == ["b", "c"]
        assert all(m.commit == index for m in commit_only)
    else:
        assert commit_only == []
        beats = [m for m in leader.tick(leader.config.heartbeat_tick) if m.type is HB]
        # A heartbeat carries min(commit, match): b has x, c has not acknowledged it yet.
        assert {m.dst: m.commit for m in beats} == {"b": index, "c": index - 1}
