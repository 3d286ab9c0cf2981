"""A simulated network: every message gets a delivery time; faults are decided
by the cluster's one random generator, so a seed replays the same schedule.

Time is in integer milliseconds of simulated time (the cluster ticks every
``TICK_MS``).  Connectivity is a set of cut links, checked both when a message is
sent and when it is due: a partition that forms while a message is in flight
still stops it, as a real one would.

Raft messages and the driver's own traffic (tablet copy chunks, ``tablet_copy.py``) share
the network, so both meet the same loss, duplication, delays and partitions.
"""

from __future__ import annotations

import enum
import heapq
import random
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["NetConfig", "Network", "Packet"]


class Packet(Protocol):
    """What the network carries: a core ``Message`` or a driver's copy message."""

    @property
    def src(self) -> str: ...
    @property
    def dst(self) -> str: ...
    @property
    def type(self) -> enum.Enum: ...


@dataclass(frozen=True, slots=True)
class NetConfig:
    # Each message is lost with this probability.
    drop: float = 0.0
    # Each delivered message is delivered a second time with this probability.
    dup: float = 0.0
    # Ordinary one-way latency, uniform in [min_delay, max_delay] ms.
    min_delay: int = 1
    max_delay: int = 4
    # With this probability a message is held back up to ``long_delay_max`` ms
    # instead: this is what reorders messages by whole election timeouts.
    long_delay: float = 0.0
    long_delay_max: int = 200


def _link(a: str, b: str) -> frozenset[str]:
    return frozenset((a, b))


class Network:
    def __init__(self, ids: Sequence[str], rng: random.Random, config: NetConfig) -> None:
        self.ids = tuple(ids)
        self.rng = rng
        self.config = config
        self._cut: set[frozenset[str]] = set()
        # (deliver_at, seq, message); seq keeps equal-time order deterministic.
        self._queue: list[tuple[int, int, Packet]] = []
        self._seq = 0
        self.sent: Counter[str] = Counter()  # by message type
        # Injected faults: random loss, duplication, long delay, connectivity changes.
        self.dropped = 0
        self.duplicated = 0
        self.delayed = 0
        self.partitions = 0
        # Consequences: messages stopped by a cut link, or lost with a crashed node.
        self.blocked = 0
        self.lost_in_crash = 0
        # The same, by message type (how many copy chunks were lost, say).
        self.dropped_by: Counter[str] = Counter()
        self.duplicated_by: Counter[str] = Counter()
        self.blocked_by: Counter[str] = Counter()

    # --- connectivity ---------------------------------------------------------------

    def connected(self, a: str, b: str) -> bool:
        return a == b or _link(a, b) not in self._cut

    def partition(self, groups: Iterable[Collection[str]]) -> None:
        """Two nodes can talk only if some group holds both; a node may sit in
        several groups (see ``bridge``) and an unlisted node is alone."""
        member: dict[str, set[int]] = {n: set() for n in self.ids}
        for gi, group in enumerate(groups):
            for node in group:
                member[node].add(gi)
        self._cut = {
            _link(a, b)
            for i, a in enumerate(self.ids)
            for b in self.ids[i + 1 :]
            if not member[a] & member[b]
        }
        self.partitions += 1

    def isolate(self, node: str) -> None:
        """Cut ``node`` off from everyone; other links stay as they are."""
        self._cut |= {_link(node, other) for other in self.ids if other != node}
        self.partitions += 1

    def reconnect(self, node: str) -> None:
        """Restore every link of ``node``; other cuts stay."""
        self._cut = {link for link in self._cut if node not in link}

    def bridge(self, node: str, left: Collection[str], right: Collection[str]) -> None:
        """``left`` and ``right`` cannot talk to each other, but ``node`` (in
        neither) talks to both: the classic non-transitive partition."""
        self.partition([[*left, node], [*right, node]])

    def heal(self) -> None:
        self._cut = set()

    def cut_links(self) -> set[frozenset[str]]:
        return set(self._cut)

    # --- traffic -----------------------------------------------------------------------

    def send(self, msg: Packet, now: int) -> None:
        kind = msg.type.value
        self.sent[kind] += 1
        cfg = self.config
        if not self.connected(msg.src, msg.dst):
            self.blocked += 1
            self.blocked_by[kind] += 1
            return
        if cfg.drop and self.rng.random() < cfg.drop:
            self.dropped += 1
            self.dropped_by[kind] += 1
            return
        copies = 2 if cfg.dup and self.rng.random() < cfg.dup else 1
        self.duplicated += copies - 1
        self.duplicated_by[kind] += copies - 1
        for _ in range(copies):
            self._push(now + self._delay(), msg)

    def _delay(self) -> int:
        cfg = self.config
        if cfg.long_delay and self.rng.random() < cfg.long_delay:
            self.delayed += 1
            return self.rng.randint(cfg.max_delay, max(cfg.max_delay, cfg.long_delay_max))
        return self.rng.randint(cfg.min_delay, cfg.max_delay)

    def _push(self, at: int, msg: Packet) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, msg))

    def next_due(self) -> int | None:
        return self._queue[0][0] if self._queue else None

    def pop(self) -> tuple[int, Packet] | None:
        """The next message due, if it can still get through (else None: lost)."""
        at, _, msg = heapq.heappop(self._queue)
        if not self.connected(msg.src, msg.dst):
            self.blocked += 1
            self.blocked_by[msg.type.value] += 1
            return None
        return at, msg

    def drop_node(self, node: str) -> None:
        """Forget everything in flight to or from ``node`` (it crashed)."""
        kept = [item for item in self._queue if node not in (item[2].src, item[2].dst)]
        self.lost_in_crash += len(self._queue) - len(kept)
        heapq.heapify(kept)
        self._queue = kept

    def in_flight(self) -> int:
        return len(self._queue)
