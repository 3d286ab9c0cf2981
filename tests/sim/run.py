"""Run simulated schedules from the command line (``make sim SEEDS=...``).

    python -m tests.sim.run --seeds 2000                 # random schedules, seeds 0..1999
    python -m tests.sim.run --seeds 500 --start 10000    # another range
    python -m tests.sim.run --seed 1234 --scenario random --steps 300 --drop 0.1 ...
    python -m tests.sim.run --seeds 50 --scenario churn  # a named scenario
    python -m tests.sim.run --seeds 20 --scenario all    # every scenario, each seed

Prints one line per failing seed (with the command that replays it) and a
summary; exits 1 if any seed failed.  With a single ``--seed`` a failure prints
its whole message and traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback
from collections.abc import Callable, Sequence

from tests.sim.scenarios import SCENARIOS, RandomParams, Stats, replay_command, run_random

__all__ = ["main"]


def _random_fields() -> list[dataclasses.Field[object]]:
    return [f for f in dataclasses.fields(RandomParams) if f.name != "steps"]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m tests.sim.run",
        description="Deterministic Raft simulation: random fault schedules and named scenarios.",
    )
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    which.add_argument("--seed", type=int, help="run (replay) exactly this one seed")
    ap.add_argument("--start", type=int, default=0, help="first seed of --seeds")
    ap.add_argument(
        "--scenario",
        default="random",
        choices=["random", "all", *SCENARIOS],
        help="random fault schedules (default), a named scenario, or all of them",
    )
    ap.add_argument("--steps", type=int, default=200, help="ticks per random schedule")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per seed")
    fixed = ap.add_argument_group("random schedule parameters (default: drawn from each seed)")
    for f in _random_fields():
        kind = int if f.type in ("int", "bool") else float
        fixed.add_argument("--" + f.name.replace("_", "-"), type=kind, default=None)
    return ap


@dataclasses.dataclass(frozen=True, slots=True)
class _Job:
    name: str
    # For "random": the schedule's parameters given the seed.
    params: Callable[[int], RandomParams] | None = None

    def replay(self, seed: int) -> str:
        if self.params is None:
            return replay_command(self.name, seed)
        return replay_command(self.name, seed, *self.params(seed).cli_args())

    def run(self, seed: int) -> Stats:
        if self.params is None:
            return SCENARIOS[self.name](seed)
        return run_random(seed, self.params(seed))


def _random_job(args: argparse.Namespace) -> _Job:
    overrides = {
        f.name: bool(v) if f.type == "bool" else v
        for f in _random_fields()
        if (v := getattr(args, f.name)) is not None
    }

    def params(seed: int) -> RandomParams:
        return dataclasses.replace(RandomParams.from_seed(seed, args.steps), **overrides)

    return _Job("random", params)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    single = args.seed is not None
    seeds = [args.seed] if single else range(args.start, args.start + args.seeds)
    names = ["random", *SCENARIOS] if args.scenario == "all" else [args.scenario]
    jobs = [_random_job(args) if n == "random" else _Job(n) for n in names]

    total = Stats()
    runs = failures = 0
    t0 = time.monotonic()
    for seed in seeds:
        for job in jobs:
            runs += 1
            try:
                stats = job.run(seed)
            except Exception as e:  # an exception from the core is a failure to report too
                failures += 1
                _report(job, seed, e, single)
                continue
            _add(total, stats)
            if args.verbose:
                print(f"ok   {job.name} seed={seed}: {_summary(stats)}")
    elapsed = time.monotonic() - t0
    what = f"{len(seeds)} seeds"
    if len(jobs) > 1:
        what += f" x {len(jobs)} scenarios = {runs} runs"
    elif args.scenario != "random":
        what += f" of {args.scenario}"
    else:
        what += f" of random schedules, {args.steps} ticks each"
    print(f"sim: {what}: {failures} failed, {elapsed:.1f}s; {_summary(total)}")
    return 1 if failures else 0


def _report(job: _Job, seed: int, e: Exception, single: bool) -> None:
    message = str(e)
    if "replay:" not in message:
        # An exception raised inside the core carries no replay command; add it.
        message = f"{type(e).__name__}: {message}\n  replay: {job.replay(seed)}"
    if single:
        traceback.print_exc()
        print(f"FAIL {job.name} seed={seed}: {message}")
        return
    first, _, rest = message.partition("\n")
    replay = next((ln.strip() for ln in rest.splitlines() if "replay:" in ln), "")
    print(f"FAIL {job.name} seed={seed}: {first} | {replay}", flush=True)


def _add(total: Stats, s: Stats) -> None:
    for f in dataclasses.fields(Stats):
        if f.name != "extra":
            setattr(total, f.name, getattr(total, f.name) + getattr(s, f.name))


def _summary(s: Stats) -> str:
    return (
        f"{s.elections} elections, {s.commits} commits, {s.ticks} ticks, {s.messages} messages; "
        f"{s.faults()} faults injected ({s.crashes} crashes, {s.partitions} partitions, "
        f"{s.dropped} dropped, {s.duplicated} duplicated, {s.delayed} long-delayed; "
        f"{s.blocked} messages blocked by partitions); {s.checks} invariant checks"
    ) + (
        f"; {s.compactions} compactions, {s.copies} tablet copies ({s.installs} installed, "
        f"{s.refused} refused; {s.chunks} chunks, {s.chunks_lost} lost, "
        f"{s.chunks_duplicated} duplicated)"
        if s.copies
        else ""
    )


if __name__ == "__main__":
    sys.exit(main())
