"""A cluster of RaftConsensus drivers over real logs and an in-memory transport.

Used by the driver tests: real threads, timers, WAL and metadata; only the network is
in-process, so partitions are a ``cut`` away and no ports are needed.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from raftlet.consensus.core import Entry, EntryType, Role
from raftlet.consensus.log import LogOptions, LogStorage, PersistentState
from raftlet.consensus.raft_consensus import ConsensusOptions, RaftConsensus, TermCheckMode
from raftlet.consensus.ticker import ManualTicker
from raftlet.consensus.transport import InMemoryTransport
from tests.waiting import wait_for

FAST = ConsensusOptions(tick_interval_s=0.02, election_ticks=10, heartbeat_ticks=1)


@dataclass
class Replica:
    node_id: str
    directory: Path
    storage: LogStorage
    consensus: RaftConsensus
    applied: list[Entry] = field(default_factory=list)
    _queue: queue.SimpleQueue[Sequence[Entry] | None] = field(default_factory=queue.SimpleQueue)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        # The applier runs on its own thread: apply_committed is called under the
        # consensus lock, and on_applied takes it.
        self._thread = threading.Thread(target=self._apply_loop, name=f"apply-{self.node_id}")
        self._thread.start()
        self.consensus.start()

    def _apply_loop(self) -> None:
        while (entries := self._queue.get()) is not None:
            self.applied.extend(entries)
            self.consensus.on_applied(entries[-1].index)

    def data(self) -> list[bytes]:
        return [e.data for e in self.applied if e.type is EntryType.NORMAL]

    def stop(self) -> None:
        self.consensus.stop()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.storage.close()


class Cluster:
    def __init__(
        self,
        root: Path,
        ids: Sequence[str] = ("a", "b", "c"),
        mode: TermCheckMode = TermCheckMode.LOCKFREE,
        options: ConsensusOptions = FAST,
        ticker: ManualTicker | None = None,
        clock: Callable[[], float] = time.monotonic,
        transport: InMemoryTransport | None = None,
    ) -> None:
        self.root = root
        self.ids = tuple(ids)
        self.options = dataclasses.replace(options, term_check_mode=mode)
        self.clock = clock
        self.transport = transport or InMemoryTransport()
        # With a ManualTicker time passes only when the test says so (``wait_leader`` ticks
        # while it waits); without one every replica ticks on the wall clock.
        self.ticker = ticker
        self.replicas: dict[str, Replica] = {}
        # The senders each replica was told it heard from (``on_peer_heard``), in order.
        self.heard: dict[str, list[str]] = {node_id: [] for node_id in self.ids}
        # The destinations of what each replica said it sent (``on_peer_asked``), in order.
        self.asked: dict[str, list[str]] = {node_id: [] for node_id in self.ids}
        for node_id in self.ids:
            self.open(node_id)

    def open(self, node_id: str) -> Replica:
        directory = self.root / node_id
        storage = LogStorage.open(directory, LogOptions(segment_size_bytes=1 << 20))
        if storage.metadata.fresh:
            storage.save_metadata(PersistentState(voters=self.ids))
        holder: list[Replica] = []
        consensus = RaftConsensus(
            group_id="t1",
            node_id=node_id,
            storage=storage,
            transport=self.transport,
            apply_committed=lambda entries: holder[0]._queue.put(list(entries)),
            options=self.options,
            ticker=self.ticker,
            clock=self.clock,
            on_peer_heard=self.heard.setdefault(node_id, []).append,
            on_peer_asked=self.asked.setdefault(node_id, []).append,
        )
        replica = Replica(node_id, directory, storage, consensus)
        holder.append(replica)
        self.replicas[node_id] = replica
        self.transport.register(node_id, consensus.handle_request)
        replica.start()
        return replica

    def crash(self, node_id: str) -> None:
        self.transport.unregister(node_id)
        self.replicas.pop(node_id).stop()

    def leader(self, among: Sequence[str] | None = None) -> Replica | None:
        leaders = [
            r
            for r in self.replicas.values()
            if (among is None or r.node_id in among)
            and r.consensus.snapshot.role is Role.LEADER
            and r.consensus.snapshot.leader_ready
        ]
        return leaders[0] if len(leaders) == 1 else None

    def wait_for(
        self, predicate: Callable[[], bool], timeout: float = 30.0, what: str = ""
    ) -> None:
        """``tests.waiting.wait_for``, ticking the cluster's ManualTicker once per poll: time
        passes only while the test waits for something, as fast as it looks."""

        def ticked() -> bool:
            if self.ticker is not None:
                self.ticker.tick()
            return predicate()

        wait_for(ticked, timeout, what)

    def wait_leader(self, among: Sequence[str] | None = None, timeout: float = 10.0) -> Replica:
        self.wait_for(lambda: self.leader(among) is not None, timeout, "a single ready leader")
        leader = self.leader(among)
        assert leader is not None
        return leader

    def close(self) -> None:
        for node_id in list(self.replicas):
            self.crash(node_id)
        self.transport.close()
