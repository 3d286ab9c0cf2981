"""A tiny, deterministic harness for the Raft core's unit tests.

``Node`` is one ``RawNode`` over a ``MemoryStorage`` plus a synchronous driver:
``drain()`` takes every pending ``Ready``, makes its hard state and entries
durable in the storage, acknowledges it (``on_persisted``), applies the committed
entries (``on_applied``) and returns the messages it asked to send — the ones
that may go at once first, then the ones that had to wait for durability.

``Network`` wires several nodes together and delivers messages in FIFO order,
synchronously, until nothing is left in flight.  Links can be cut to model
partitions.  Nothing here uses threads, clocks or randomness beyond the nodes'
fixed ``Config.seed``, so every test is reproducible.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from raftlet.consensus.core import (
    NO_NODE,
    Config,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    Raft,
    RawNode,
    Ready,
    Role,
)

__all__ = [
    "IDS3",
    "IDS5",
    "Network",
    "Node",
    "accept",
    "conf_overrides",
    "entries_of_terms",
    "make_config",
    "make_storage",
    "new_node",
]

IDS3: tuple[str, ...] = ("a", "b", "c")
IDS5: tuple[str, ...] = ("a", "b", "c", "d", "e")

# What §5 tests assume unless they say otherwise: the bare algorithm of the
# paper, without the thesis' pre-vote and check-quorum extensions.
PAPER_DEFAULTS: dict[str, Any] = {
    "election_tick": 10,
    "heartbeat_tick": 1,
    "pre_vote": False,
    "check_quorum": False,
}


def entries_of_terms(terms: Sequence[int], start: int = 1) -> list[Entry]:
    """Entries with the given terms at consecutive indexes from ``start``."""
    return [
        Entry(term=t, index=start + i, data=f"e{start + i}t{t}".encode())
        for i, t in enumerate(terms)
    ]


def make_storage(
    terms: Sequence[int] = (), *, term: int = 0, vote: str = NO_NODE, commit: int = 0
) -> MemoryStorage:
    """A MemoryStorage holding a log of the given entry terms and a hard state.

    ``term`` defaults to the last entry's term (a node cannot hold an entry of a
    term later than its own).
    """
    storage = MemoryStorage()
    storage.append(entries_of_terms(terms))
    storage.set_hard_state(
        HardState(term=max(term, terms[-1] if terms else 0), vote=vote, commit=commit)
    )
    return storage


def make_config(node_id: str, voters: Sequence[str] = IDS3, **overrides: Any) -> Config:
    """A Config with the paper defaults and a fixed per-node seed."""
    kwargs: dict[str, Any] = dict(PAPER_DEFAULTS)
    kwargs["seed"] = 1000 + sum(ord(ch) for ch in node_id)
    kwargs.update(overrides)
    return Config(id=node_id, voters=tuple(voters), **kwargs)


def accept(m: Message) -> Message:
    """The follower's acknowledgement of an APPEND (or HEARTBEAT) ``m``."""
    if m.type is MessageType.APPEND:
        return Message(
            MessageType.APPEND_RESPONSE,
            src=m.dst,
            dst=m.src,
            term=m.term,
            index=m.index + len(m.entries),
        )
    if m.type is MessageType.HEARTBEAT:
        return Message(MessageType.HEARTBEAT_RESPONSE, src=m.dst, dst=m.src, term=m.term)
    raise AssertionError(f"cannot accept {m.type}")


@dataclass
class Node:
    """One RawNode with its durable storage and a synchronous driver."""

    raw: RawNode
    storage: MemoryStorage
    config: Config
    applied: list[Entry] = field(default_factory=list)
    readies: list[Ready] = field(default_factory=list)
    # The membership last persisted (``Ready.conf_state``), as a driver keeps it in its
    # consensus metadata; None until one was.
    conf: ConfState | None = None

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def raft(self) -> Raft:
        return self.raw.raft

    @property
    def role(self) -> Role:
        return self.raw.soft_state().role

    @property
    def term(self) -> int:
        return self.raw.hard_state().term

    def log_terms(self) -> list[int]:
        """Terms of every entry in the node's log (durable + unstable)."""
        return [e.term for e in self.raft.log.all_entries()]

    def durable_terms(self) -> list[int]:
        return [e.term for e in self.storage.all_entries()]

    def persist(self, rd: Ready) -> None:
        """Make ``rd``'s hard state and entries durable (but do not acknowledge)."""
        if rd.hard_state is not None:
            self.storage.set_hard_state(rd.hard_state)
        if rd.conf_state is not None:
            self.conf = rd.conf_state
        if rd.entries:
            self.storage.append(rd.entries)

    def apply(self, rd: Ready) -> None:
        if rd.committed_entries:
            self.applied.extend(rd.committed_entries)
            self.raw.on_applied(rd.committed_entries[-1].index)

    def drain(self) -> list[Message]:
        """Handle every pending Ready; return the messages to send, in order."""
        out: list[Message] = []
        for _ in range(1000):
            self.check_state_differs()
            if not self.raw.has_ready():
                return out
            rd = self.raw.ready()
            self.readies.append(rd)
            out.extend(rd.messages)
            self.persist(rd)
            self.raw.on_persisted(rd)
            out.extend(rd.persisted_messages)
            self.apply(rd)
        raise AssertionError(f"{self.id}: has_ready() stays True after 1000 readies")

    def check_state_differs(self) -> None:
        """``Raft.*_state_differs`` (how ``has_ready`` and ``ready`` avoid building the
        states) agree with building them: every core test checks it at every drain."""
        raw, raft = self.raw, self.raw.raft
        assert raft.hard_state_differs(raw._prev_hard) == (raft.hard_state() != raw._prev_hard)
        assert raft.soft_state_differs(raw._prev_soft) == (raft.soft_state() != raw._prev_soft)
        # May say "changed" for an equal state (an extra Ready), never the reverse.
        assert raft.conf_state_differs(raw._prev_conf) or raft.conf_state() == raw._prev_conf

    def step(self, m: Message) -> list[Message]:
        self.raw.step(m)
        return self.drain()

    def tick(self, n: int = 1) -> list[Message]:
        out: list[Message] = []
        for _ in range(n):
            self.raw.tick()
            out.extend(self.drain())
        return out

    def campaign(self) -> list[Message]:
        self.raw.campaign()
        return self.drain()

    def elect(self) -> list[Message]:
        """Campaign and grant every (pre-)vote request from the other voters.

        Returns the messages the node sent once it became leader.
        """
        pending = self.campaign()
        for _ in range(4):
            if self.role is Role.LEADER:
                break
            requests = [m for m in pending if m.type in (MessageType.VOTE, MessageType.PRE_VOTE)]
            pending = []
            for m in requests:
                kind = (
                    MessageType.VOTE_RESPONSE
                    if m.type is MessageType.VOTE
                    else MessageType.PRE_VOTE_RESPONSE
                )
                pending += self.step(Message(kind, src=m.dst, dst=m.src, term=m.term))
        assert self.role is Role.LEADER, f"{self.id} failed to become leader"
        return [m for m in pending if m.type is not MessageType.VOTE]

    def elect_and_commit_noop(self) -> list[Message]:
        """Become leader and have every follower acknowledge the leader's no-op."""
        sent = self.elect()
        out: list[Message] = []
        for m in sent:
            if m.type is MessageType.APPEND:
                out += self.step(accept(m))
        assert self.raw.soft_state().leader_ready, "no-op not committed"
        return out


def new_node(
    node_id: str = "a",
    voters: Sequence[str] = IDS3,
    *,
    terms: Sequence[int] = (),
    term: int = 0,
    vote: str = NO_NODE,
    commit: int = 0,
    **overrides: Any,
) -> Node:
    """A node over a fresh MemoryStorage with a log of the given entry terms."""
    storage = make_storage(terms, term=term, vote=vote, commit=commit)
    config = make_config(node_id, voters, **overrides)
    node = Node(RawNode(config, storage), storage, config)
    node.drain()
    return node


class Network:
    """Delivers messages between nodes synchronously, FIFO, until quiet."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self.nodes: dict[str, Node] = {n.id: n for n in nodes}
        self.queue: deque[Message] = deque()
        self.cut: set[tuple[str, str]] = set()
        self.down: set[str] = set()
        self.delivered: list[Message] = []
        self.dropped: list[Message] = []
        # Rewrites (or, returning None, drops) each message before delivery.
        self.transform: Callable[[Message], Message | None] | None = None

    @classmethod
    def create(
        cls,
        ids: Sequence[str] = IDS3,
        logs: dict[str, Sequence[int]] | None = None,
        terms: dict[str, int] | None = None,
        **overrides: Any,
    ) -> Network:
        logs = logs or {}
        terms = terms or {}
        return cls(
            new_node(i, ids, terms=logs.get(i, ()), term=terms.get(i, 0), **overrides) for i in ids
        )

    def __getitem__(self, node_id: str) -> Node:
        return self.nodes[node_id]

    # --- faults -----------------------------------------------------------------

    def isolate(self, node_id: str) -> None:
        for other in self.nodes:
            if other != node_id:
                self.cut.add((node_id, other))
                self.cut.add((other, node_id))

    def partition(self, *groups: Sequence[str]) -> None:
        for g in groups:
            for h in groups:
                if g is not h:
                    self.cut.update((x, y) for x in g for y in h)

    def drop(self, src: str, dst: str) -> None:
        self.cut.add((src, dst))

    def heal(self) -> None:
        self.cut.clear()

    def crash(self, node_id: str) -> None:
        """Lose everything not durable: the node is rebuilt from storage on restart."""
        self.down.add(node_id)

    def restart(self, node_id: str, **overrides: Any) -> Node:
        old = self.nodes[node_id]
        config = old.config
        if old.conf is not None:  # the membership it persisted, as a driver restores it
            config = replace(config, **conf_overrides(old.conf))
        config = replace(config, **overrides) if overrides else config
        node = Node(RawNode(config, old.storage), old.storage, config, conf=old.conf)
        self.nodes[node_id] = node
        self.down.discard(node_id)
        self.send(node.drain())
        return node

    # --- delivery ---------------------------------------------------------------

    def send(self, msgs: Iterable[Message]) -> None:
        self.queue.extend(msgs)

    def run(self, max_messages: int = 100_000) -> None:
        for _ in range(max_messages):
            if not self.queue:
                return
            m = self.queue.popleft()
            if (m.src, m.dst) in self.cut or m.dst in self.down or m.src in self.down:
                self.dropped.append(m)
                continue
            if self.transform is not None:
                rewritten = self.transform(m)
                if rewritten is None:
                    self.dropped.append(m)
                    continue
                m = rewritten
            self.delivered.append(m)
            self.send(self.nodes[m.dst].step(m))
        raise AssertionError("network did not quiesce")

    def deliver(self, msgs: Iterable[Message]) -> None:
        self.send(msgs)
        self.run()

    def campaign(self, node_id: str) -> None:
        self.deliver(self.nodes[node_id].campaign())

    def tick(self, node_id: str, n: int = 1) -> None:
        for _ in range(n):
            self.deliver(self.nodes[node_id].tick())

    def tick_all(self, n: int = 1) -> None:
        for _ in range(n):
            for node_id, node in self.nodes.items():
                if node_id not in self.down:
                    self.send(node.tick())
            self.run()

    def propose(self, node_id: str, data: bytes) -> Entry:
        node = self.nodes[node_id]
        entry = node.raw.propose(data)
        self.deliver(node.drain())
        return entry

    # --- observation --------------------------------------------------------------

    def leaders(self) -> list[str]:
        return [i for i, n in self.nodes.items() if i not in self.down and n.role is Role.LEADER]

    def leader(self) -> Node:
        leaders = self.leaders()
        assert len(leaders) == 1, f"expected one leader, got {leaders}"
        return self.nodes[leaders[0]]

    def sent(self, kind: MessageType, src: str | None = None, dst: str | None = None) -> int:
        """How many messages of ``kind`` were delivered (optionally src→dst)."""
        return sum(
            1
            for m in self.delivered
            if m.type is kind and (src is None or m.src == src) and (dst is None or m.dst == dst)
        )


def conf_overrides(conf: ConfState) -> dict[str, Any]:
    """The ``Config`` fields that restore a persisted membership."""
    return {
        "voters": conf.membership.voters,
        "learners": conf.membership.learners,
        "config_index": conf.index,
        "committed_config": (conf.committed_index, conf.committed),
    }


def data_entries(entries: Iterable[Entry]) -> list[bytes]:
    """The payloads of the NORMAL entries (what the state machine sees)."""
    return [e.data for e in entries if e.type is EntryType.NORMAL]
