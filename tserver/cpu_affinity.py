"""``--cpu_affinity``: keep a tablet server's threads on one CPU (or a chosen few).

Why: a server's threads hand work to each other several times per write (docs/ARCHITECTURE.md,
"A write, hand-off by hand-off"), and only one of them runs Python at a time (the GIL), so
spreading them over CPUs buys little parallelism.  What it costs is measured on this
project's 2-vCPU test VM: a thread waking a thread that sleeps on another CPU costs ~35 µs
of CPU and as much latency (an inter-processor interrupt, and the idle vCPU's exit and
entry), against ~4 µs when both run on the same CPU (docs/benchmarks.md, "One CPU per
server").  So servers that share a machine each get their own CPU where there are enough,
and round-robin where there are not.

Values: ``""`` leaves placement to the OS (the default); ``auto`` picks one CPU of those
this process may run on, by the server's position among the config's servers (so servers
of one cluster started on one machine spread over its CPUs); a list such as ``0`` or
``2-3,6`` names the CPUs.  Applied once, at startup, to every thread of the process;
threads started later inherit it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

__all__ = [
    "AUTO",
    "MAX_CPU",
    "apply_cpu_affinity",
    "check_cpu_affinity",
    "parse_cpu_list",
    "process_thread_ids",
    "resolve_cpus",
]

AUTO = "auto"


# Linux's largest NR_CPUS: no machine has a CPU numbered past it, and a range such as
# 0-99999999999 would otherwise be built as a set of that many numbers.
MAX_CPU = 8191


def parse_cpu_list(text: str) -> frozenset[int]:
    """``"0,2-3"`` -> ``{0, 2, 3}``; raises ValueError naming what is wrong."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        lo_text, dash, hi_text = part.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if dash else lo
        except ValueError:
            raise ValueError(f"{part!r} is not a CPU number or range (e.g. 0, 2-3)") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"{part!r} is not a CPU number or range (e.g. 0, 2-3)")
        if hi > MAX_CPU:
            raise ValueError(f"{part!r}: CPU numbers go up to {MAX_CPU}")
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def check_cpu_affinity(value: object) -> None:
    """The flag's value: ``""``, ``auto`` or a list of CPUs this process may run on (so
    a CPU the machine lacks is a usage error where the flag is given, not a server that
    fails as it starts)."""
    if not isinstance(value, str):
        raise ValueError(f"expected '', {AUTO} or a CPU list such as 0,2-3, got {value!r}")
    if value in ("", AUTO):
        return
    cpus = parse_cpu_list(value)
    if hasattr(os, "sched_getaffinity"):
        resolve_cpus(value, 0, frozenset(os.sched_getaffinity(0)))
    elif cpus:  # pragma: no cover - Linux has sched_getaffinity
        raise ValueError("this platform cannot bind threads to CPUs; leave --cpu_affinity empty")


def _format(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def resolve_cpus(value: str, position: int, allowed: frozenset[int]) -> frozenset[int] | None:
    """The CPUs ``value`` means for the server at ``position`` (0-based) among the config's
    servers, given the CPUs this process may run on; None: leave placement to the OS.
    Raises ValueError for CPUs this process may not use."""
    if value == "":
        return None
    if not allowed:
        raise ValueError("this process may run on no CPU (empty affinity)")
    if value == AUTO:
        ordered = sorted(allowed)
        return frozenset({ordered[position % len(ordered)]})
    cpus = parse_cpu_list(value)
    missing = cpus - allowed
    if missing:
        raise ValueError(
            f"CPU {_format(missing)} is not one this process may run on ({_format(allowed)})"
        )
    return cpus


def apply_cpu_affinity(value: str, position: int) -> frozenset[int] | None:
    """Resolve ``value`` and bind every thread of this process to those CPUs; the CPUs, or
    None when placement is left to the OS.  Raises ValueError (bad CPUs, or a platform
    without CPU affinity) and OSError (the kernel refused)."""
    if value == "":
        return None
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError("this platform cannot bind threads to CPUs")
    cpus = resolve_cpus(value, position, frozenset(os.sched_getaffinity(0)))
    assert cpus is not None
    os.sched_setaffinity(0, cpus)
    # Threads already started (by imports) keep their own mask: bind them too.
    for tid in process_thread_ids():
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.sched_setaffinity(tid, cpus)
    return cpus


def process_thread_ids() -> list[int]:
    """The kernel ids of this process's threads now (empty where /proc cannot tell): a
    setting applied to the process reaches only threads started after it, and imports may
    already have started some."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []
