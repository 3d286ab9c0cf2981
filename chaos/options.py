"""The options of a chaos run, in a module light enough for the command line to import.

(Parsing ``raftlet chaos``'s arguments must not load the client, gRPC or the launchers.)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from raftlet.chaos.nemesis import ALL_FAULTS, check_faults
from raftlet.cluster.model import RaftTimings

__all__ = [
    "BACKENDS",
    "CHAOS_TIMINGS",
    "LEADER_READ_MODES",
    "MAX_SERVERS",
    "MIN_SERVERS",
    "UNSAFE_SWITCHES",
    "ChaosOptions",
    "WorkloadOptions",
    "history_path_problem",
    "work_dir_problem",
]

BACKENDS = ("auto", "netns", "proxy")
# How the servers' leaders serve linearizable reads (the tserver's --leader_read_mode).
LEADER_READ_MODES = ("read_index", "lease")
# Negative controls: server flags that break a guarantee, so a run can show it is caught.
# Stale reads: a leader reads from its own state, and one cut off keeps believing it leads
# (no check-quorum), so its stale window is the whole cut less the others' election, not
# the few hundred ms between their first write and its own step-down.
UNSAFE_SWITCHES: dict[str, tuple[str, ...]] = {
    "stale-reads": (
        "--unsafe_leader_reads_without_quorum=true",
        "--unsafe_leader_keeps_lost_quorum=true",
    ),
    "early-ack": ("--unsafe_ack_before_commit=true",),
}
# A majority must survive any one fault. The tablets have 3 replicas whatever the count, so
# more servers only add idle processes, and the proxy backend holds n * (n - 1) link proxies
# open in this process (201 servers ran out of file descriptors).
MIN_SERVERS = 3
MAX_SERVERS = 9
# Elections within a second or two, as in the integration tests (the defaults are slower).
CHAOS_TIMINGS = RaftTimings(tick_interval_ms=50, election_ticks=10, heartbeat_ticks=2)


@dataclass(frozen=True)
class WorkloadOptions:
    keys: int = 12
    register_workers: int = 6
    insert_workers: int = 2
    # Insert workers on the asyncio client: its writes take the servers' tcp write port,
    # so faults reach that path too.
    async_insert_workers: int = 1
    read_fraction: float = 0.5
    # Of the reads, those sent straight to a random server (see chaos.workload).
    direct_read_fraction: float = 0.25
    # Of the writes, those sent straight to a random server, once, without the client's
    # retries: a client with another view of who leads, which a deposed leader's stale
    # answers must be measured against.
    direct_write_fraction: float = 0.25
    # Deadline of one direct read or write. Short, so that a worker whose call waits at a
    # paused or cut-off server soon tries again elsewhere: calls keep arriving at every server
    # while the others move on, which is when a stale answer shows.
    direct_timeout_s: float = 1.0
    # Bounds each operation, retries included: past it the operation is INFO (or FAIL).
    op_timeout_s: float = 5.0
    seed: int = 1

    def __post_init__(self) -> None:
        if self.keys < 1:
            raise ValueError(f"keys must be at least 1, got {self.keys}")
        workers = (self.register_workers, self.insert_workers, self.async_insert_workers)
        if min(workers) < 0:
            raise ValueError("worker counts cannot be negative")
        if sum(workers) == 0:
            raise ValueError("the workload needs at least one worker")
        for name in ("read_fraction", "direct_read_fraction", "direct_write_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("op_timeout_s", "direct_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True)
class ChaosOptions:
    duration_s: float = 60.0
    seed: int = 1
    faults: Sequence[str] = ALL_FAULTS
    servers: int = 3
    backend: str = "auto"
    workload: WorkloadOptions = field(default_factory=WorkloadOptions)
    hold_s: tuple[float, float] = (1.0, 4.0)
    quiet_s: tuple[float, float] = (1.0, 3.0)
    check_budget_s: float = 60.0  # per key
    unsafe: Sequence[str] = ()
    leader_read_mode: str = "read_index"
    # More tserver flags for every server (e.g. small WAL segments and frequent log GC).
    tserver_flags: Sequence[str] = ()
    work_dir: Path | None = None  # default: a temporary directory, removed afterwards
    history_path: Path | None = None
    settle_timeout_s: float = 90.0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        check_faults(self.faults)  # before any cluster is started for the run
        if self.leader_read_mode not in LEADER_READ_MODES:
            raise ValueError(
                f"leader_read_mode must be one of {', '.join(LEADER_READ_MODES)}, "
                f"got {self.leader_read_mode!r}"
            )
        unknown = sorted(set(self.unsafe) - set(UNSAFE_SWITCHES))
        if unknown:
            raise ValueError(f"unknown unsafe switches {unknown}; have {sorted(UNSAFE_SWITCHES)}")
        if "stale-reads" in self.unsafe and self.leader_read_mode == "lease":
            raise ValueError(
                "the stale-reads control turns check-quorum off, and a leader lease needs it: "
                "run it with leader_read_mode read_index"
            )
        if self.servers < MIN_SERVERS:
            raise ValueError(
                f"a chaos run needs at least {MIN_SERVERS} servers (a majority to survive "
                f"faults), got {self.servers}"
            )
        if self.servers > MAX_SERVERS:
            raise ValueError(
                f"a chaos run takes at most {MAX_SERVERS} servers (its tablets have 3 "
                f"replicas), got {self.servers}"
            )
        if self.duration_s <= 0:
            raise ValueError("duration must be positive")


def work_dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot hold a run's cluster, or None. A previous run's files would be
    reopened by the new servers: its tablets and their rows would look like this run's, and
    the checks would report writes nobody made in this run."""
    if not path.exists():
        return None
    if not path.is_dir():
        return f"--work-dir {path} is not a directory"
    if any(path.iterdir()):
        return (
            f"--work-dir {path} is not empty (a previous run's cluster? its servers would "
            "reopen that run's tablets): give a new or empty directory"
        )
    return None


def history_path_problem(path: Path) -> str | None:
    """Why the history cannot be saved to ``path``, or None: asked before the run, so that a
    typo does not cost the run's history at its end."""
    if path.is_dir():
        return f"--history {path} is a directory: give a file name"
    parent = path.parent
    if not parent.is_dir():
        why = "does not exist" if not parent.exists() else "is not a directory"
        return f"--history {path}: its directory {parent} {why}"
    writable = os.access(path, os.W_OK) if path.exists() else os.access(parent, os.W_OK)
    if not writable:
        return f"--history {path}: not writable"
    return None
