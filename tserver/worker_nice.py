"""``--worker_nice``: the write pipeline's threads give way to the server's front door.

Why: on a server whose CPU is saturated, a write RPC waits in the service queue until a
service thread gets the CPU, and that thread competes with the stages that finish earlier
writes -- prepare, the WAL appenders' framing and CRCs, the apply stage's SQLite inserts --
which are most of the CPU.  The kernel has no way to know that one of them is urgent: the
service thread, once woken, waits its turn behind a stage that has just started a 50 KiB
decode.  With the pipeline's threads (the replica worker pool and the WAL appenders) a few
nice levels lower in priority than the rest, a woken service thread, tcp reader, event loop
or ticker runs first, and the pipeline takes the CPU it leaves, which under saturation is
still nearly all of it.  Measured on the project's 2-vCPU VM (docs/benchmarks.md, "The
pipeline below the front door"): the KUDU-2727 scenario's lock-free p99 incoming queue time
fell from ~2.0 to ~0.8 ms, and writes/s did not change beyond the noise.

Nice only orders the threads that share a scheduling group.  With Linux's autogroups (one
group per session) or a cgroup per service (systemd, containers), that is the server's own
threads and its session's, so other work on the host sees the same server as before.  Where
a server shares its group with unrelated CPU-bound processes, those would now win over its
pipeline: set ``--worker_nice 0`` there.

A thread's nice level is per thread on Linux (``setpriority(PRIO_PROCESS, tid)``), raising
it needs no privilege, and lowering it back does: each pipeline thread sets its own once,
when it starts, to the server's nice level plus the flag.  Threads the pipeline itself
starts inherit its level -- the thread that dials a peer when a replica first sends to it,
and that connection's reader and writer, which carry the pipeline's own traffic.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable

__all__ = ["MAX_NICE", "nicer_thread_start", "thread_nice", "worker_nice_supported"]

logger = logging.getLogger(__name__)

MAX_NICE = 19  # Linux's lowest priority


def worker_nice_supported() -> bool:
    """Whether a thread's nice level can be set apart from its process's (Linux)."""
    return sys.platform.startswith("linux") and hasattr(os, "setpriority")


def thread_nice(tid: int | None = None) -> int:
    """The nice level of thread ``tid`` (a native id; default the calling thread)."""
    return os.getpriority(os.PRIO_PROCESS, tid if tid is not None else threading.get_native_id())


def nicer_thread_start(by: int) -> Callable[[], None] | None:
    """A hook for a pool's threads to call as they start: it sets the calling thread's nice
    level to ``by`` above that of the thread calling this function now (the server's main
    thread), at most ``MAX_NICE``.  None when there is nothing to do (``by`` is 0, or the
    platform cannot set a thread's level apart).  A refusal by the kernel is logged once;
    the thread then runs at the level it has."""
    if by < 0:
        raise ValueError(f"a pipeline thread's nice level can only go up, got {by}")
    if by == 0 or not worker_nice_supported():
        return None
    level = min(MAX_NICE, thread_nice() + by)
    refused: list[OSError] = []

    def start() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), level)
        except OSError as e:
            if not refused:
                refused.append(e)
                logger.warning("--worker_nice: the kernel refused nice %d (%s)", level, e)

    return start
