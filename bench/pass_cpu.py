"""Where a write's server CPU goes, pass by pass: thread CPU time of each stage, per server.

    .venv/bin/python bench/pass_cpu.py [--tablets 1] [--in-flight 16] [--seconds 8]
        [--tree DIR] [--dir DIR] [--profile DIR] [--timeline] [--gaps]

Starts a 3-server cluster (``raftlet cluster up``, from source tree DIR, default this
checkout), restarts each server under this script (``--serve``), which wraps the entry
point of every pass a write takes -- a stage of the replica worker pool, a WAL appender
turn, a service call, a frame read off a tcp link -- so that it adds the thread CPU time
(``time.thread_time``) it ran for to a per-server table.  Then it places the leaders
(tablet i on server i mod 3), writes for a while at the given depth with ``raftlet write
--in-flight``, and prints per server: each pass's calls and thread CPU per acknowledged
write and per call, and how much of the process's CPU the passes account for.

``--timeline`` (with ``--in-flight 1``): the servers also note every pass's wall-clock start
and end, the writer notes each write's call and return, and the lone write's critical path
is printed -- client, leader, the follower whose answer went first, leader, client -- in
segments that add up to its latency, with the passes of each role (``bench/_timeline.py``).

``--gaps`` (any depth): the servers note every pass the same way, and per server and pass
the calls and their median CPU are printed against the time since that server last ran the
same pass (``bench/_gaps.py``): whether a pass costs what it does because its code had not
run for a while, or whatever the gap.

Thread CPU, not wall time: a pass that waits for the GIL or for its CPU is not charged
for the wait, so the tables add up to the CPU the servers burnt (the rest, "elsewhere",
is threads no wrapper covers: gRPC's, the ticker, the event loop).  Nested rows (indented)
are part of the row above them.  Each wrapped call costs two clock reads (~1 us), which
the figures include.  The profile behind docs/benchmarks.md, "Where a round goes".
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import os
import pstats
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (label, module, attribute path): the passes, outermost first; a label starting with
# spaces is part of the pass above it.
PASSES = [
    ("service call (client writes admitted)", "tserver.service_pool", "ServicePool._handle"),
    ("prepare stage", "tserver.tablet_replica", "TabletReplica._prepare_batch"),
    ("  of which decoding and checking rows", "tserver.tablet_replica", "TabletReplica._encode"),
    ("  of which replicate", "consensus.raft_consensus", "RaftConsensus.replicate"),
    ("    of which sending", "consensus.raft_consensus", "RaftConsensus._send_unlocked"),
    ("    of which the WAL's queue", "consensus.log.log", "Log.append_async"),
    ("raft worker (answers, ticks)", "consensus.raft_consensus", "RaftConsensus._handle_inputs"),
    ("WAL appender turn", "consensus.log.log", "Log._take_turn"),
    ("  of which write", "consensus.log.log", "Log._write_group"),
    ("  of which fdatasync", "consensus.log.log", "Log._sync_group"),
    ("  of which callbacks (durable: step, answer)", "consensus.log.log", "Log._complete"),
    ("apply stage", "tserver.tablet_replica", "TabletReplica._apply_held"),
    ("  of which store transaction", "tserver.store.tablet_store", "TabletStore.apply_batch"),
    ("  of which tracker and answers", "tserver.result_tracker", "ResultTracker.complete"),
    ("  of which on_applied", "consensus.raft_consensus", "RaftConsensus.on_applied"),
    ("  of which own entries for the store", "tserver.tablet_replica", "to_apply_entry"),
    ("  of which decoding entries", "tserver.tablet_replica", "to_apply_entries"),
    ("  of which completing requests", "tserver.tablet_replica", "TabletReplica._complete_applied"),
    ("  of which log GC check", "tserver.log_gc", "LogGc.maybe_collect"),
]  # fmt: skip
# FrameLink callbacks, by the link's name: what a server reads off each kind of tcp link.
LINKS = [
    ("consensus from", "frame from a leader (step an append)"),
    ("to ", "frame from a follower (answers)"),
    ("write from", "frame from a client (writes)"),
]


# Passes a server notes for --timeline and --gaps at most (~40 a write at one in flight).
_MAX_EVENTS = 1_000_000

# --timeline's writer: ``raftlet write`` with every AsyncClient.insert's call and return
# noted (CLOCK_MONOTONIC ns) and written as JSON to argv[1] when it exits.
_TIMED_WRITER = """
import atexit, json, runpy, sys, time
from raftlet.client import aio
out, spans, insert = sys.argv[1], [], aio.AsyncClient.insert
async def timed(self, table, row):
    began = time.monotonic_ns()
    result = await insert(self, table, row)
    spans.append((began, time.monotonic_ns()))
    return result
aio.AsyncClient.insert = timed
atexit.register(lambda: open(out, "w").write(json.dumps(spans)))
sys.argv = ["raftlet", *sys.argv[2:]]
runpy.run_module("raftlet", run_name="__main__", alter_sys=True)
"""


# --- in the server ---------------------------------------------------------------------------


def _serve(argv: list[str]) -> None:
    out = Path(os.environ["PASS_CPU_OUT"])
    table: dict[str, list[float]] = {}
    counting = threading.Event()
    clock = time.thread_time

    profile_dir = os.environ.get("PASS_CPU_PROFILE")
    # --timeline: every timed call's (label, thread, wall start, wall end, thread CPU).
    events: list[tuple[str, int, int, int, float]] | None = (
        [] if os.environ.get("PASS_CPU_EVENTS") else None
    )
    wall = time.monotonic_ns
    # (label, thread id) -> that thread's profile of that pass; one profiler per thread at a
    # time (cProfile's hook is per thread), so a pass nested in another is the outer's.
    profiles: dict[tuple[str, int], cProfile.Profile] = {}
    local = threading.local()

    def timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        cell = table.setdefault(label, [0, 0.0])

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            if not counting.is_set():
                return fn(*args, **kwargs)
            prof = None
            if profile_dir and not getattr(local, "profiling", False):
                key = (label, threading.get_ident())
                prof = profiles.get(key)
                if prof is None:  # this thread's first call of this pass
                    prof = profiles[key] = cProfile.Profile(clock)
                local.profiling = True
                prof.enable()
            start = clock()
            began = wall() if events is not None else 0
            try:
                return fn(*args, **kwargs)
            finally:
                cpu = clock() - start
                cell[0] += 1  # under the GIL: no update is lost between threads
                cell[1] += cpu
                if events is not None and len(events) < _MAX_EVENTS:
                    events.append((label, threading.get_ident(), began, wall(), cpu))
                if prof is not None:
                    prof.disable()
                    local.profiling = False

        return run

    import importlib

    for label, module, path in PASSES:
        owner: Any = importlib.import_module(f"raftlet.{module}")
        *cls_name, attr = path.split(".")  # a method, or a function the module imported
        if cls_name:
            owner = getattr(owner, cls_name[0])
        setattr(owner, attr, timed(label, getattr(owner, attr)))
    from raftlet.consensus.rpc import frame_link

    original = frame_link.FrameLink.__init__

    def init(self: Any, sock: Any, name: str, on_frame: Any, *args: Any, **kwargs: Any) -> None:
        label = next((lab for prefix, lab in LINKS if name.startswith(prefix)), "frame (other)")
        original(self, sock, name, timed(label, on_frame), *args, **kwargs)

    frame_link.FrameLink.__init__ = init  # type: ignore[method-assign]

    def dump(*_: object) -> None:
        out.write_text(json.dumps(table))
        if events is not None:
            Path(os.environ["PASS_CPU_EVENTS"]).write_text(json.dumps(events))
        by_label: dict[str, pstats.Stats] = {}
        for (label, _thread), prof in list(profiles.items()):
            prof.create_stats()
            if label in by_label:
                by_label[label].add(prof)
            else:
                by_label[label] = pstats.Stats(prof)
        for n, (label, stats) in enumerate(sorted(by_label.items())):
            stats.dump_stats(Path(profile_dir or ".") / f"{out.stem}.{n}.prof")
            (Path(profile_dir or ".") / f"{out.stem}.{n}.label").write_text(label)
        os._exit(0)

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, lambda *_: counting.set())
    sys.argv = ["raftlet", *argv]
    import runpy

    runpy.run_module("raftlet", run_name="__main__", alter_sys=True)


# --- the driver ------------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """The process's (user, system) CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _wait_gone(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def _print_tables(
    tables: dict[str, dict[str, list[float]]],
    cpu: dict[str, tuple[float, float]],
    leads: dict[str, list[str]],
    writes: int,
) -> None:
    labels = [label for label, _, _ in PASSES]
    after_raft = labels.index("raft worker (answers, ticks)") + 1
    order = labels[:after_raft] + [lab for _, lab in LINKS]
    order += [*labels[after_raft:], "frame (other)"]
    for server, table in tables.items():
        role = f"leads {', '.join(leads[server])}" if leads.get(server) else "follows"
        user, system = cpu[server]
        total = user + system
        print(
            f"\n{server} ({role}): process CPU {total / writes * 1e6:,.1f} us/write "
            f"(user {user / writes * 1e6:,.1f}, kernel {system / writes * 1e6:,.1f})"
        )
        print("| pass | calls/write | us/write | us/call |")
        print("|---|---:|---:|---:|")
        top = 0.0
        for label in order:
            calls, seconds = table.get(label, (0, 0.0))
            if not calls:
                continue
            if not label.startswith(" "):
                top += seconds
            name = label.replace("  ", "&nbsp;&nbsp;", 1) if label.startswith(" ") else label
            per_write, per_call = seconds / writes * 1e6, seconds / calls * 1e6
            print(f"| {name} | {calls / writes:.3f} | {per_write:.1f} | {per_call:.1f} |")
        print(f"| elsewhere (threads not wrapped) | | {(total - top) / writes * 1e6:.1f} | |")


def _print_profiles(where: Path, writes: int, top: int = 12) -> None:
    """Per server and pass, then over all of them, the functions with the most thread CPU
    of their own."""
    overall: dict[str, list[float]] = {}
    for label_file in sorted(where.glob("*.label")):
        stats: Any = pstats.Stats(str(label_file.with_suffix(".prof")))
        rows = {}
        for (file, line, name), (_cc, nc, tt, _ct, _callers) in stats.stats.items():
            key = f"{name} ({Path(file).parent.name}/{Path(file).name}:{line})" if line else name
            rows[key] = [nc, tt]
            cell = overall.setdefault(key, [0, 0.0])
            cell[0] += nc
            cell[1] += tt
        server = label_file.name.split(".")[0]
        _print_functions(f"{server}, {label_file.read_text().strip()}", rows, writes, top)
    _print_functions("every server, every pass", overall, writes, 2 * top)


def _print_functions(title: str, rows: dict[str, list[float]], writes: int, top: int) -> None:
    total = sum(tt for _nc, tt in rows.values())
    print(f"\n{title}: {total / writes * 1e6:,.1f} us/write")
    print("| function | own us/write | share | calls/write |")
    print("|---|---:|---:|---:|")
    for key, (nc, tt) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"| {key} | {tt / writes * 1e6:.1f} | {tt / total:.0%} | {nc / writes:.2f} |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        _serve(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tablets", type=int, default=1)
    ap.add_argument("--in-flight", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--dir", default=None, help="where the cluster lives (default: a temp dir)")
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="also cProfile each pass (thread CPU clock) into DIR and print its top "
        "functions; the profiler's own cost inflates every figure, so read its shares only",
    )
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="also print the critical path of a lone write (needs --in-flight 1)",
    )
    ap.add_argument(
        "--gaps",
        action="store_true",
        help="also print each pass's CPU against the time since its server last ran it",
    )
    args = ap.parse_args()
    if args.timeline and args.in_flight != 1:
        ap.error("--timeline traces a lone write: use it with --in-flight 1")
    note_events = args.timeline or args.gaps
    tree = args.tree.resolve()

    from _drivers import (
        cluster_servers,
        place_leaders,
        python_in,
        raftlet_cli,
        run_in_scratch_dir,
    )

    def run(root: Path) -> None:
        data = root / "cluster"
        raftlet_cli(tree, "cluster", "up", "--data-dir", str(data), "--tablets", str(args.tablets))
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            env = dict(os.environ, PYTHONPATH=str(tree))
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                env["PASS_CPU_PROFILE"] = str(args.profile.resolve())
            for srv in cluster_servers(data):
                os.kill(srv["pid"], signal.SIGTERM)
                _wait_gone(srv["pid"], 30)
                # The same command line: python -m raftlet tserver ...
                argv = srv["argv"][srv["argv"].index("raftlet") + 1 :]
                server_env = dict(env, PASS_CPU_OUT=str(root / f"{srv['id']}.json"))
                if note_events:
                    server_env["PASS_CPU_EVENTS"] = str(root / f"{srv['id']}.events.json")
                procs[srv["id"]] = subprocess.Popen(
                    [sys.executable, __file__, "--serve", *argv],
                    cwd=tree,
                    env=server_env,
                    stdout=subprocess.DEVNULL,
                    stderr=open(root / f"{srv['id']}.log", "wb"),  # noqa: SIM115
                    start_new_session=True,
                )
            deadline = time.monotonic() + 60
            while True:  # the restarted servers answer once their tablets are open
                try:
                    raftlet_cli(tree, "cluster", "status", "--data-dir", str(data))
                    break
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            leaders = place_leaders(tree, data)
            print(f"servers: pids {' '.join(str(p.pid) for p in procs.values())}", flush=True)
            leads: dict[str, list[str]] = {}
            for tablet, server in sorted(leaders.items()):
                leads.setdefault(server, []).append(tablet)
            write = ["write", "--data-dir", str(data), "--no-progress"]
            raftlet_cli(tree, *write, "--in-flight", str(args.in_flight), "--duration", "2")
            before = {sid: _cpu_seconds(p.pid) for sid, p in procs.items()}
            for p in procs.values():
                p.send_signal(signal.SIGUSR2)
            measured = [*write, "--in-flight", str(args.in_flight), "--duration", str(args.seconds)]
            if args.timeline:
                done = python_in(
                    tree, "-c", _TIMED_WRITER, str(root / "client.json"), *measured, timeout=300
                )
                if done.returncode != 0:
                    raise RuntimeError(f"the timed writer failed:\n{done.stderr[-2000:]}")
                out = done.stdout
            else:
                out = raftlet_cli(tree, *measured)
            after = {sid: _cpu_seconds(p.pid) for sid, p in procs.items()}
            cpu = {
                sid: (after[sid][0] - before[sid][0], after[sid][1] - before[sid][1])
                for sid in procs
            }
            for p in procs.values():
                p.send_signal(signal.SIGUSR1)
            for p in procs.values():
                p.wait(timeout=30)
            tables = {sid: json.loads((root / f"{sid}.json").read_text()) for sid in procs}
            if note_events:
                events = {
                    sid: [tuple(e) for e in json.loads((root / f"{sid}.events.json").read_text())]
                    for sid in procs
                }
            if args.timeline:
                from _timeline import report

                spans = [tuple(s) for s in json.loads((root / "client.json").read_text())]
                timeline = report(spans, events)
            if args.gaps:
                from _gaps import report as gaps_report

                gaps = gaps_report(events)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.terminate()
                    p.wait(timeout=30)
        line = next(ln for ln in out.splitlines() if ln.startswith("write RPCs"))
        writes = int(line.split()[2].replace(",", ""))
        print(
            f"# bench/pass_cpu.py  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  "
            f"{args.tablets} tablet(s), {args.in_flight} in flight, {args.seconds:g} s: {line}"
        )
        _print_tables(tables, cpu, leads, writes)
        if args.timeline:
            print(timeline, end="")
        if args.gaps:
            print(gaps, end="")
        if args.profile:
            _print_profiles(args.profile, writes)

    run_in_scratch_dir("pass-cpu-", args.dir, run)


if __name__ == "__main__":
    main()
