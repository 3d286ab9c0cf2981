"""``--sched_batch``: run a tablet server's threads under Linux's SCHED_BATCH policy.

Why: a write is handed from thread to thread several times (docs/ARCHITECTURE.md, "A write,
hand-off by hand-off"), and under the default policy the kernel lets a thread it wakes
preempt the thread that woke it when both share a CPU (as they always do under
``--cpu_affinity``).  In a Python server the woken thread then finds the GIL still held by
its waker, sleeps on it, and the waker is switched back in: two context switches, and CPU
spent, for nothing.  A SCHED_BATCH thread never preempts on wake-up: the waker runs on until
it blocks, which it does soon (it waits for its next input, releasing the GIL), and the
woken thread then starts with the GIL free.  Measured on the project's 2-vCPU VM:
docs/benchmarks.md, "SCHED_BATCH".

Otherwise SCHED_BATCH is ordinary time sharing (same nice, same share of CPU over time), and
any user may choose it for their own threads.  Applied once, at startup, to every thread of
the process; threads started later inherit it.  Where the platform has no SCHED_BATCH
(not Linux) the server says so in its log and runs with the default policy.
"""

from __future__ import annotations

import contextlib
import os

from raftlet.tserver.cpu_affinity import process_thread_ids

__all__ = ["apply_sched_batch", "sched_batch_supported"]


def sched_batch_supported() -> bool:
    return hasattr(os, "SCHED_BATCH") and hasattr(os, "sched_setscheduler")


def apply_sched_batch() -> int:
    """Put every thread of this process under SCHED_BATCH; how many threads were set.
    Raises OSError if the kernel refuses (it does not for an unprivileged process leaving
    the default policy) and RuntimeError where the platform has no such policy."""
    if not sched_batch_supported():
        raise RuntimeError("this platform has no SCHED_BATCH scheduling policy")
    param = os.sched_param(0)
    os.sched_setscheduler(0, os.SCHED_BATCH, param)  # Linux: 0 is the calling thread
    # Threads already started (by imports) keep their own policy: set them too.
    count = 0
    for tid in process_thread_ids():
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.sched_setscheduler(tid, os.SCHED_BATCH, param)
            count += 1
    return max(count, 1)  # without /proc: the calling thread alone
