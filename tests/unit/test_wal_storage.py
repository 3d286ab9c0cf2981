"""LogStorage is what a RawNode needs: restart a node from it and find term, vote and log."""

from __future__ import annotations

import threading
from pathlib import Path

from raftlet.consensus.core import (
    Config,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    RawNode,
    Role,
    Storage,
)
from raftlet.consensus.log import LogOptions, LogStorage, PersistentState

OPTIONS = LogOptions(segment_size_bytes=4096)


def drive(node: RawNode, storage: LogStorage) -> list[Entry]:
    """A synchronous driver: persist each Ready in order, acknowledge it, collect applied."""
    applied: list[Entry] = []
    while node.has_ready():
        rd = node.ready()
        if rd.hard_state is not None:
            storage.save_hard_state(rd.hard_state)
        if rd.entries:
            storage.append(rd.entries)
        applied.extend(rd.committed_entries)
        node.advance(rd)
    return applied


def test_fresh_storage_is_an_empty_log(tmp_path: Path) -> None:
    with LogStorage.open(tmp_path, OPTIONS) as storage:
        s: Storage = storage
        assert s.initial_state() == HardState()
        assert s.last_index() == 0
        assert s.term(0) == 0
        assert s.entries(1, 1) == []
        assert storage.metadata.fresh


def test_single_node_restarts_with_term_vote_and_log(tmp_path: Path) -> None:
    with LogStorage.open(tmp_path, OPTIONS) as storage:
        storage.save_metadata(PersistentState(voters=("a",)))
        node = RawNode(Config(id="a", voters=storage.voters(), seed=1), storage)
        node.campaign()
        drive(node, storage)
        assert node.soft_state().role is Role.LEADER
        for i in range(40):
            node.propose(b"cmd%d" % i)
            drive(node, storage)
        before = node.hard_state()
        log_before = storage.entries(1, storage.last_index() + 1)
    assert before.term >= 1
    assert before.vote == "a"
    assert log_before[0].type is EntryType.NO_OP
    assert [e.data for e in log_before[1:]] == [b"cmd%d" % i for i in range(40)]

    with LogStorage.open(tmp_path, OPTIONS) as storage:
        assert storage.voters() == ("a",)
        node = RawNode(Config(id="a", voters=storage.voters(), seed=1), storage)
        assert node.hard_state() == before
        assert node.status().last_index == len(log_before)
        assert node.raft.log.all_entries() == log_before
        # Committed entries are delivered again from the log (applied index 0 on restart).
        assert drive(node, storage) == log_before
        node.campaign()
        drive(node, storage)
        assert node.hard_state().term == before.term + 1
        node.propose(b"after restart")
        drive(node, storage)
        assert storage.entries(storage.last_index(), storage.last_index() + 1)[0].data == (
            b"after restart"
        )


def append(
    src: str, term: int, prev: tuple[int, int], entries: list[Entry], commit: int
) -> Message:
    return Message(
        type=MessageType.APPEND,
        src=src,
        dst="b",
        term=term,
        index=prev[0],
        log_term=prev[1],
        entries=tuple(entries),
        commit=commit,
    )


def test_follower_overwrite_survives_restart(tmp_path: Path) -> None:
    voters = ("a", "b", "c")
    with LogStorage.open(tmp_path, OPTIONS) as storage:
        node = RawNode(Config(id="b", voters=voters, seed=2), storage)
        node.step(append("a", 1, (0, 0), [Entry(1, i, data=b"a%d" % i) for i in (1, 2, 3)], 1))
        drive(node, storage)
        # a's lease on b runs out (no later leader can exist before that: Raft.step ignores
        # one), then a new leader in term 2 holds a different entry 2: b's 2 and 3 are replaced.
        for _ in range(node.raft.config.election_tick):
            node.tick()
        drive(node, storage)
        node.step(append("c", 2, (1, 1), [Entry(2, 2, data=b"c2")], 1))
        drive(node, storage)
        assert storage.last_index() == 2
    with LogStorage.open(tmp_path, OPTIONS) as storage:
        node = RawNode(Config(id="b", voters=voters, seed=2), storage)
        assert node.hard_state().term == 2
        assert [(e.term, e.index, e.data) for e in node.raft.log.all_entries()] == [
            (1, 1, b"a1"),
            (2, 2, b"c2"),
        ]


def test_pipelined_async_driver(tmp_path: Path) -> None:
    """Readies taken back to back, appended with append_async, acknowledged in callbacks'
    order: the way the threaded driver will feed the group-committing log."""
    with LogStorage.open(tmp_path, OPTIONS) as storage:
        storage.save_metadata(PersistentState(voters=("a",)))
        node = RawNode(Config(id="a", voters=("a",), seed=3), storage)
        node.campaign()
        drive(node, storage)
        lock = threading.Lock()
        durable: list[object] = []
        all_done = threading.Event()
        readies = []
        for i in range(30):
            node.propose(b"p%d" % i)
            readies.append(node.ready())
        for k, rd in enumerate(readies):
            if rd.hard_state is not None:
                storage.save_hard_state(rd.hard_state)

            def done(err: BaseException | None, rd: object = rd, last: bool = k == 29) -> None:
                assert err is None
                with lock:
                    durable.append(rd)
                if last:
                    all_done.set()

            storage.append_async(rd.entries, done)
        assert all_done.wait(30)
        assert durable == readies
        for rd in readies:
            node.on_persisted(rd)
        applied = drive(node, storage)
        assert [e.data for e in applied][-30:] == [b"p%d" % i for i in range(30)]
