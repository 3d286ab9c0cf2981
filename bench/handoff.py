"""What one thread hand-off costs: two Python threads passing a token back and forth, each
waiting on a semaphore, once with the process free to run on every CPU and once bound to one.

Why ``--cpu_affinity`` exists (docs/ARCHITECTURE.md, "One CPU per server"): a write crosses
several threads of each server, and when the woken thread sleeps on another CPU the wake-up
costs an inter-processor interrupt -- on a VM, the idle vCPU's exit and entry as well.
Prints, per placement, microseconds of wall time and of CPU (user, system) per hand-off
(half a round trip), medians of the repetitions, each placement measured in its own
child process.

    python bench/handoff.py [--handoffs 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

_CHILD = "--child"


def _measure(round_trips: int) -> dict[str, float]:
    ping, pong = threading.Semaphore(0), threading.Semaphore(0)

    def peer() -> None:
        for _ in range(round_trips):
            ping.acquire()
            pong.release()

    t = threading.Thread(target=peer)
    t.start()
    before, t0 = os.times(), time.perf_counter()
    for _ in range(round_trips):
        ping.release()
        pong.acquire()
    wall, after = time.perf_counter() - t0, os.times()
    t.join()
    n = 2 * round_trips
    return {
        "wall_us": wall / n * 1e6,
        "user_us": (after.user - before.user) / n * 1e6,
        "sys_us": (after.system - before.system) / n * 1e6,
    }


def _child(cpus: str, round_trips: int) -> None:
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    print(json.dumps(_measure(round_trips)))


def _run(cpus: list[int], round_trips: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, _CHILD, ",".join(map(str, cpus)), str(round_trips)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    result: dict[str, float] = json.loads(out)
    return result


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == _CHILD:
        _child(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--handoffs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.handoffs < 2 or args.repeat < 1:
        parser.error("--handoffs must be at least 2 and --repeat at least 1")
    if not hasattr(os, "sched_getaffinity"):
        print("no CPU affinity on this platform: nothing to compare")
        return
    allowed = sorted(os.sched_getaffinity(0))
    placements = [("any CPU", allowed), (f"CPU {allowed[0]} only", allowed[:1])]
    if len(allowed) == 1:
        print("this process may run on one CPU only: both placements are the same")
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in placements}
    for _ in range(args.repeat):
        for name, cpus in placements:  # interleaved: a noisy moment hits both
            results[name].append(_run(cpus, args.handoffs // 2))
    print(
        f"# bench/handoff.py  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  "
        f"{len(allowed)} cpus  {args.handoffs} hand-offs  medians of {args.repeat}"
    )
    print("| placement | wall µs / hand-off | CPU µs / hand-off (user + sys) |")
    print("|---|---:|---:|")
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        cpu = med["user_us"] + med["sys_us"]
        print(
            f"| {name} | {med['wall_us']:.1f} | {cpu:.1f} "
            f"({med['user_us']:.1f} + {med['sys_us']:.1f}) |"
        )


if __name__ == "__main__":
    main()
