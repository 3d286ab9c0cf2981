"""The nemesis: faults on a running cluster, one at a time, on a schedule drawn from a seed.

Each fault starts, holds for a while, and is undone before the next one (a quiet gap between
them lets the cluster elect and catch up, so the workload sees both faulty and healthy
periods). The kinds:

- ``kill``: SIGKILL a server (a tablet's leader, or any server), restart it after the hold.
- ``pause``: SIGSTOP a server, SIGCONT after the hold -- a leader that wakes from a pause
  still believes it leads, which is what breaks reads that trust local state.
- ``partition-leader``: cut a tablet leader's links to every other server (both directions);
  clients still reach it, so a stale leader is exactly what they can talk to.
- ``partition-halves``: split the servers into two random groups.
- ``partition-bridge``: two groups that only one server (the bridge, drawn from the larger
  group) talks to both of.
- ``slow-disk``: add WAL latency on a server through the runtime flag
  ``log_inject_latency_ms``, removed after the hold.
- ``restart-all``: SIGKILL every server, then start them all.

Every fault is logged (``FaultEvent``: kind, targets, start and end relative to the run's
start) so a checker's counter-example can be read against what the nemesis was doing.
``Nemesis.heal`` undoes whatever is in progress: the run's verification needs a whole cluster.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the command line imports this module to parse its options: keep it light
    from raftlet.chaos.cluster import ChaosCluster

__all__ = [
    "ALL_FAULTS",
    "FaultEvent",
    "Nemesis",
    "NemesisOptions",
    "bridge_cuts",
    "check_faults",
    "draw_bridge",
    "draw_halves",
    "halves_cuts",
    "isolate_cuts",
]

logger = logging.getLogger(__name__)

ALL_FAULTS = (
    "kill",
    "pause",
    "partition-leader",
    "partition-halves",
    "partition-bridge",
    "slow-disk",
    "restart-all",
)

Link = tuple[str, str]


def check_faults(faults: Sequence[str]) -> None:
    """ValueError naming the kinds there are, if ``faults`` is empty or names another."""
    unknown = sorted(set(faults) - set(ALL_FAULTS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; choose from {', '.join(ALL_FAULTS)}")
    if not faults:
        raise ValueError("at least one fault kind is needed")


@dataclass(frozen=True)
class NemesisOptions:
    faults: Sequence[str] = ALL_FAULTS
    seed: int = 1
    # Each fault holds for a uniform time in this range (s), then a quiet gap follows.
    hold_s: tuple[float, float] = (1.0, 4.0)
    quiet_s: tuple[float, float] = (1.0, 3.0)
    slow_disk_ms: tuple[int, int] = (50, 400)
    # Targeted faults hit the leader of one of these tablets (any tablet's if empty): the
    # tablets whose histories are checked for linearizability.
    focus_tablets: Sequence[str] = ()

    def __post_init__(self) -> None:
        check_faults(self.faults)
        for name, (lo, hi) in (("hold_s", self.hold_s), ("quiet_s", self.quiet_s)):
            if not 0 <= lo <= hi:
                raise ValueError(f"{name} must be a range 0 <= low <= high, got {(lo, hi)}")


@dataclass
class FaultEvent:
    kind: str
    targets: list[str]
    start_s: float
    end_s: float | None = None
    detail: str = ""
    error: str = ""

    def describe(self) -> str:
        end = f"{self.end_s:7.2f}" if self.end_s is not None else "    ..."
        extra = f" ({self.detail})" if self.detail else ""
        failed = f" FAILED: {self.error}" if self.error else ""
        return f"[{self.start_s:7.2f} - {end}] {self.kind} {','.join(self.targets)}{extra}{failed}"


def isolate_cuts(target: str, servers: Sequence[str]) -> set[Link]:
    """Both directions between ``target`` and every other server."""
    return {link for s in servers if s != target for link in ((target, s), (s, target))}


def halves_cuts(groups: tuple[Sequence[str], Sequence[str]]) -> set[Link]:
    """Every link between the two groups, both directions."""
    a, b = groups
    return {link for x in a for y in b for link in ((x, y), (y, x))}


def bridge_cuts(bridge: str, a: Sequence[str], b: Sequence[str]) -> set[Link]:
    """Groups ``a`` and ``b`` cannot talk to each other; ``bridge`` talks to both."""
    return halves_cuts(([s for s in a if s != bridge], [s for s in b if s != bridge]))


def draw_halves(rng: random.Random, servers: Sequence[str]) -> tuple[list[str], list[str]]:
    """Two random groups, the second the larger if the count is odd."""
    shuffled = rng.sample(list(servers), len(servers))
    half = len(shuffled) // 2
    return shuffled[:half], shuffled[half:]


def draw_bridge(rng: random.Random, servers: Sequence[str]) -> tuple[list[str], list[str], str]:
    """Two random groups and a bridge, a member of the second (the larger) group.

    The bridge comes from the larger group because one drawn from a group of one would leave
    the other group nobody to be cut from (with 3 servers, one draw in three cut nothing)."""
    if len(servers) < 3:
        raise ValueError(f"a bridge partition needs at least 3 servers, got {len(servers)}")
    a, b = draw_halves(rng, servers)
    return a, b, rng.choice(b)


@dataclass
class _Undo:
    """How to end the fault in progress."""

    run: Callable[[], None]
    event: FaultEvent


@dataclass
class Nemesis:
    """Runs faults on ``cluster`` from its own thread until ``stop``."""

    cluster: ChaosCluster
    options: NemesisOptions = field(default_factory=NemesisOptions)
    events: list[FaultEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.options.seed)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the fault in progress vs heal from another thread
        self._undo: _Undo | None = None
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()

    # --- lifecycle -----------------------------------------------------------------------

    def start(self, t0: float | None = None) -> None:
        """Begin faulting; event times are relative to ``t0`` (monotonic), default now."""
        self._t0 = time.monotonic() if t0 is None else t0
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop scheduling faults and undo the one in progress."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
        self.heal()

    def heal(self) -> None:
        """Undo the fault in progress, if any (idempotent)."""
        with self._lock:
            undo, self._undo = self._undo, None
            if undo is not None:
                self._finish(undo)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.events:
            out[e.kind] = out.get(e.kind, 0) + 1
        return out

    # --- the schedule --------------------------------------------------------------------

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _run(self) -> None:
        opts = self.options
        bag: list[str] = []
        while not self._stop.wait(self._rng.uniform(*opts.quiet_s)):
            # Every kind once per round, in a random order: a short run still sees them all.
            if not bag:
                bag = self._rng.sample(list(opts.faults), len(opts.faults))
            kind = bag.pop()
            hold = self._rng.uniform(*opts.hold_s)
            with self._lock:
                if self._stop.is_set():
                    return
                self._undo = self._begin(kind)
            if self._stop.wait(hold):
                return  # stop() heals
            self.heal()

    def _begin(self, kind: str) -> _Undo | None:
        servers = self.cluster.server_ids()
        event = FaultEvent(kind, [], self._now())
        self.events.append(event)
        logger.info("nemesis: %s begins", kind)
        try:
            return self._start_fault(kind, servers, event)
        except Exception as exc:  # a fault that cannot start is logged, the run goes on
            event.error = repr(exc)
            event.end_s = self._now()
            logger.warning("nemesis: %s failed to start: %r", kind, exc)
            return None

    def _start_fault(self, kind: str, servers: list[str], event: FaultEvent) -> _Undo | None:
        c = self.cluster
        rng = self._rng
        if kind == "restart-all":
            event.targets = list(servers)
            for sid in servers:
                c.kill(sid)
            return _Undo(lambda: self._start_all(servers), event)
        if kind == "partition-bridge":
            a, b, bridge = draw_bridge(rng, servers)
            event.detail = f"{'+'.join(a)} | {'+'.join(b)} via {bridge}"
            event.targets = sorted(servers)
            return self._cut(bridge_cuts(bridge, [*a, bridge], b), event)
        if kind == "partition-halves":
            a, b = draw_halves(rng, servers)
            event.detail = f"{'+'.join(a)} | {'+'.join(b)}"
            event.targets = sorted(servers)
            return self._cut(halves_cuts((a, b)), event)
        target = self._pick_target(servers, prefer_leader=kind != "slow-disk" or rng.random() < 0.5)
        event.targets = [target]
        if kind == "kill":
            c.kill(target)
            return _Undo(lambda: c.start(target), event)
        if kind == "pause":
            c.pause(target)
            return _Undo(lambda: c.resume(target), event)
        if kind == "partition-leader":
            return self._cut(isolate_cuts(target, servers), event)
        if kind == "slow-disk":
            ms = rng.randint(*self.options.slow_disk_ms)
            event.detail = f"+{ms} ms per WAL write"
            c.set_flag(target, "log_inject_latency_ms", str(ms))
            return _Undo(lambda: c.set_flag(target, "log_inject_latency_ms", "0"), event)
        raise ValueError(f"unknown fault {kind!r}")

    def _pick_target(self, servers: list[str], *, prefer_leader: bool) -> str:
        if prefer_leader:
            try:
                focus = set(self.options.focus_tablets)
                leaders = sorted(
                    {
                        sid
                        for tablet, sid in self.cluster.leaders().items()
                        if not focus or tablet in focus
                    }
                )
            except Exception:  # no answer while the cluster is in trouble: any server
                leaders = []
            if leaders:
                return self._rng.choice(leaders)
        return self._rng.choice(servers)

    def _cut(self, links: set[Link], event: FaultEvent) -> _Undo:
        for src, dst in sorted(links):
            self.cluster.cut(src, dst)
        return _Undo(self.cluster.heal_network, event)

    def _start_all(self, servers: list[str]) -> None:
        for sid in servers:
            self.cluster.start(sid)

    def _finish(self, undo: _Undo) -> None:
        try:
            undo.run()
        except Exception as exc:
            undo.event.error = f"undo failed: {exc!r}"
            logger.warning("nemesis: undoing %s failed: %r", undo.event.kind, exc)
        undo.event.end_s = self._now()
        logger.info("nemesis: %s ends", undo.event.kind)
