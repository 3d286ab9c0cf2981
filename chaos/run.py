"""One chaos run, start to verdict: cluster, workload and nemesis, then heal and check.

``run_chaos`` starts a cluster (network namespaces as root, else loopback servers that dial
each other through per-link proxies), runs the workload with the nemesis for ``duration_s``,
stops both, makes the cluster whole (every server running and resumed, every link restored,
every injected latency removed), waits for a ready leader of every tablet, and then checks:

1. the register history is linearizable, key by key (``chaos.checker``);
2. every acknowledged insert is present, none reported failed is (``check_unique_inserts``);
3. every replica of every tablet holds the same rows at the same applied index.

The ``ChaosReport`` says all of it, with the fault log and counter-examples. ``unsafe`` names
server switches that break a guarantee on purpose (the negative controls): the run must then
be flagged.

A run that fails keeps what is needed to investigate it: the report lists the ids of the
inserts that went wrong; the history file (``history_path``) starts with the run's wall-clock
start and its fault log (``history_header``), and is saved also when the run is interrupted;
and without a ``work_dir`` the temporary directory with the servers' logs is kept and named,
not removed (it is removed after a PASS).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from raftlet.chaos.checker import (
    CheckResult,
    InsertVerdict,
    KeyVerdict,
    check_registers,
    check_unique_inserts,
)
from raftlet.chaos.cluster import ChaosCluster
from raftlet.chaos.history import History, Op, OpKind, Outcome
from raftlet.chaos.nemesis import FaultEvent, Nemesis, NemesisOptions
from raftlet.chaos.options import (
    CHAOS_TIMINGS,
    UNSAFE_SWITCHES,
    ChaosOptions,
    work_dir_problem,
)
from raftlet.chaos.workload import INSERTS, REGISTERS, Workload, chaos_tables
from raftlet.client import Client
from raftlet.client.errors import RaftletError
from raftlet.client.scanner import ReadMode
from raftlet.deploy.netns import netns_available

__all__ = [
    "ChaosReport",
    "ChaosStartError",
    "history_header",
    "open_cluster",
    "run_chaos",
]

logger = logging.getLogger(__name__)

# Ids of lost or misplaced inserts listed in the report (the history file has them all).
_IDS_SHOWN = 20
# Lines of a server's log quoted when it did not start: its own error is at the end.
_START_LOG_LINES = 3


class ChaosStartError(RuntimeError):
    """The run could not begin: its work directory is unusable, or the cluster did not start
    (the message quotes the end of the failing server's log)."""


@dataclass
class ChaosReport:
    backend: str
    seed: int
    duration_s: float
    ops: dict[str, dict[str, int]]  # kind -> outcome -> count
    faults: list[FaultEvent]
    terms_advanced: int
    verdicts: dict[int, KeyVerdict]
    inserts: InsertVerdict
    replicas: dict[str, tuple[bool, str]]  # tablet -> (equal, detail)
    unsafe: Sequence[str] = ()
    leader_read_mode: str = "read_index"
    tserver_flags: Sequence[str] = ()
    # lease_reads, read_index_reads, stalls: summed over the servers, since their last start.
    read_counters: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # the run itself could not finish
    history_note: str = ""  # where the history was saved, or why it could not be
    kept_dir: Path | None = None  # the temporary directory kept after a FAIL
    # kind -> why an operation was not ok (fail or info: the status code or cause) -> count
    not_ok: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def linearizable(self) -> bool | None:
        """False if any key is not; None if some key could not be decided in the budget."""
        results = {v.result for v in self.verdicts.values()}
        if CheckResult.NOT_LINEARIZABLE in results:
            return False
        return None if CheckResult.UNKNOWN in results else True

    @property
    def replicas_equal(self) -> bool:
        return all(ok for ok, _ in self.replicas.values())

    @property
    def ok(self) -> bool:
        return (
            self.linearizable is True
            and self.inserts.ok
            and self.replicas_equal
            and not self.problems
        )

    def format(self) -> str:
        lines = [
            f"chaos run: backend {self.backend}, seed {self.seed}, {self.duration_s:.0f} s, "
            f"leader reads by {self.leader_read_mode}"
            + (f", UNSAFE: {', '.join(self.unsafe)}" if self.unsafe else "")
            + (f", flags {' '.join(self.tserver_flags)}" if self.tserver_flags else ""),
            "",
            "operations     attempted      ok    fail    info",
        ]
        for kind, outcomes in sorted(self.ops.items()):
            total = sum(outcomes.values())
            lines.append(
                f"  {kind:<12}{total:>11}{outcomes.get('ok', 0):>8}"
                f"{outcomes.get('fail', 0):>8}{outcomes.get('info', 0):>8}"
            )
        # Most of them are refusals the workload expects (a read off-leader is
        # FAILED_PRECONDITION, one during an election UNAVAILABLE): say which, so a reader
        # need not open the history to tell them from trouble.
        for kind, causes in sorted(self.not_ok.items()):
            top = sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))
            shown = ", ".join(f"{c} {n}" for c, n in top[:5])
            more = f", {len(top) - 5} other causes" if len(top) > 5 else ""
            lines.append(f"    {kind} not ok, why: {shown}{more}")
        counts: dict[str, int] = {}
        for e in self.faults:
            counts[e.kind] = counts.get(e.kind, 0) + 1
        lines += ["", f"faults: {sum(counts.values())} "
                  + "(" + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())) + ")",
                  f"terms advanced (elections): {self.terms_advanced}"]  # fmt: skip
        if self.read_counters:
            lines.append(
                "leader reads since the servers' last start: "
                + ", ".join(f"{k} {v}" for k, v in sorted(self.read_counters.items()))
            )
        failed = [e for e in self.faults if e.error]
        lines += [f"  fault problem: {e.describe()}" for e in failed]
        lines += ["", "registers (linearizability, per key):"]
        for key, v in sorted(self.verdicts.items()):
            lines.append(
                f"  key {key:>3}: {v.result.value} ({v.ops_checked} ops, {v.elapsed_s:.2f} s)"
            )
        bad = [v for v in self.verdicts.values() if v.result is CheckResult.NOT_LINEARIZABLE]
        if bad:
            shortest = min(bad, key=lambda v: len(v.counterexample))
            lines += ["", f"shortest counter-example (key {shortest.key}):"]
            lines += ["  " + line for line in shortest.describe().splitlines()]
        ins = self.inserts
        lines += [
            "",
            f"inserts: {ins.ok_count} acknowledged, {ins.fail_count} failed, {ins.info_count} "
            f"indeterminate ({ins.info_present} of those applied)",
            f"  lost acknowledged: {len(ins.lost)}; failed but present: "
            f"{len(ins.failed_but_present)}; never written but present: {len(ins.phantom)}",
        ]
        # The ids, so that each can be looked up in the history and the servers' logs.
        lines += ["  " + line for line in ins.describe(limit=_IDS_SHOWN).splitlines()[1:]]
        lines += ["", "replicas:"]
        lines += [
            f"  {tablet}: {'equal' if ok else 'DIFFERENT'} ({detail})"
            for tablet, (ok, detail) in sorted(self.replicas.items())
        ]
        lines += [f"problem: {p}" for p in self.problems]
        if self.history_note:
            lines += ["", self.history_note]
        if self.kept_dir is not None:
            lines.append(f"the cluster's files and the servers' logs are kept in {self.kept_dir}")
        lin = {True: "linearizable", False: "NOT LINEARIZABLE", None: "unknown (budget)"}
        lines += [
            "",
            f"verdict: {'PASS' if self.ok else 'FAIL'} -- {lin[self.linearizable]}, "
            f"{len(ins.lost)} lost acknowledged writes, replicas "
            f"{'equal' if self.replicas_equal else 'DIFFERENT'}",
        ]
        return "\n".join(lines)


def open_cluster(options: ChaosOptions, root: Path) -> ChaosCluster:
    """A started cluster for ``options`` (``close`` it): network namespaces where this
    process may make them (``backend="auto"``), otherwise loopback servers and proxies."""
    backend = options.backend
    if backend == "auto":
        backend = "netns" if netns_available()[0] else "proxy"
    tables = chaos_tables(replication=3)
    flags = [f"--leader_read_mode={options.leader_read_mode}"]
    flags += [flag for name in options.unsafe for flag in UNSAFE_SWITCHES[name]]
    flags += list(options.tserver_flags)
    cluster: ChaosCluster
    if backend == "netns":
        from raftlet.chaos.netns_cluster import NetnsChaosCluster

        cluster = NetnsChaosCluster(
            root, n_servers=options.servers, tables=tables, raft=CHAOS_TIMINGS, flags=flags
        )
    else:
        from raftlet.chaos.proxy_cluster import ProxyChaosCluster

        cluster = ProxyChaosCluster(
            root, n_servers=options.servers, tables=tables, raft=CHAOS_TIMINGS, flags=flags
        )
    try:
        cluster.start_all()
    except BaseException:
        cluster.close()
        raise
    return cluster


def run_chaos(
    options: ChaosOptions,
    log: Callable[[str], None] = logger.info,
    warn: Callable[[str], None] = logger.warning,
) -> ChaosReport:
    """Run, heal, verify (see the module docstring). ``log`` gets the progress, ``warn`` what
    must be said even to a quiet caller when no report follows (where an interrupted run's
    history went, where a crashed run's files are).

    ``ChaosStartError`` if ``options.work_dir`` is not empty (a previous run's tablets would
    be reopened) or the cluster does not start."""
    if options.work_dir is None:
        root = Path(tempfile.mkdtemp(prefix="raftlet-chaos-"))
    else:
        root = options.work_dir
        why = work_dir_problem(root)
        if why is not None:
            raise ChaosStartError(why)
        root.mkdir(parents=True, exist_ok=True)
    keep = options.work_dir is not None
    try:
        try:
            cluster = open_cluster(options, root)
        except (RuntimeError, OSError) as e:
            keep = True
            raise ChaosStartError(_start_failure(e, root)) from e
        try:
            report = _run(cluster, options, log, warn)
        finally:
            cluster.close()
        if not report.ok and not keep:
            keep = True
            report.kept_dir = root
        return report
    except (ChaosStartError, KeyboardInterrupt):
        raise
    except BaseException:
        if not keep:
            keep = True
            warn(f"the cluster's files and the servers' logs are kept in {root}")
        raise
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def _start_failure(e: BaseException, root: Path) -> str:
    """One line: what did not start and the end of its log (the server's own error)."""
    first, _, rest = str(e).partition("\n")
    tail = [line.strip() for line in rest.splitlines() if line.strip()][-_START_LOG_LINES:]
    text = first.strip().rstrip(":") + (": " + " / ".join(tail) if tail else "")
    return f"the cluster did not start: {text} (its files and logs are in {root})"


def history_header(
    options: ChaosOptions,
    backend: str,
    started: datetime | None,
    t0_ns: int | None,
    faults: Sequence[FaultEvent],
    *,
    complete: bool,
) -> list[dict[str, Any]]:
    """The records that open a saved history: the run (its wall-clock start, which the fault
    times and ``start_monotonic_ns`` refer to, so that the operations' monotonic times can be
    read against the faults), then each fault as the report logs it."""
    run: dict[str, Any] = {
        "record": "run",
        "started": started.isoformat() if started is not None else None,
        "start_monotonic_ns": t0_ns,
        "complete": complete,
        "backend": backend,
        "seed": options.seed,
        "duration_s": options.duration_s,
        "servers": options.servers,
        "faults": list(options.faults),
        "leader_read_mode": options.leader_read_mode,
        "unsafe": list(options.unsafe),
        "tserver_flags": list(options.tserver_flags),
    }
    return [run] + [
        {
            "record": "fault",
            "describe": e.describe(),
            "kind": e.kind,
            "targets": list(e.targets),
            "start_s": e.start_s,
            "end_s": e.end_s,
            "detail": e.detail,
            "error": e.error,
        }
        for e in faults
    ]


def _save_history(history: History, path: Path, header: list[dict[str, Any]]) -> str:
    """What was saved where, or why it could not be (the end of a sentence)."""
    try:
        n = history.save(path, header)
    except OSError as e:
        return f"could not be saved to {path}: {e}"
    return f"{n} operations and {len(header) - 1} faults saved to {path}"


def _terms(cluster: ChaosCluster) -> dict[str, int]:
    terms: dict[str, int] = {}
    for tablets in cluster.probe.statuses().values():
        for t in (tablets or {}).values():
            terms[t.tablet_id] = max(terms.get(t.tablet_id, 0), t.term)
    return terms


def _run(
    c: ChaosCluster,
    options: ChaosOptions,
    log: Callable[[str], None],
    warn: Callable[[str], None],
) -> ChaosReport:
    problems: list[str] = []
    started: datetime | None = None
    t0_ns: int | None = None
    finished = False
    log(f"cluster up ({c.backend}, {options.servers} servers) in {c.config_path.parent}")
    _wait_leaders(c, options.settle_timeout_s)
    terms_before = _terms(c)
    history = History()
    client = Client([s.rpc_addr for s in c.config.servers], timeout_s=options.workload.op_timeout_s,
                    rpc_timeout_s=min(1.0, options.workload.op_timeout_s))  # fmt: skip
    workload: Workload | None = None
    nemesis: Nemesis | None = None
    try:
        workload = Workload(client, options.workload, history, c.probe)
        nemesis = Nemesis(
            c,
            NemesisOptions(
                faults=tuple(options.faults),
                seed=options.seed,
                hold_s=options.hold_s,
                quiet_s=options.quiet_s,
                # The tablets that hold the registers (a tablet may hold none of few keys).
                focus_tablets=sorted(
                    {client.tablet_for(REGISTERS, {"key": k}) for k in range(options.workload.keys)}
                ),
            ),
        )
        t0_ns = time.monotonic_ns()
        started = datetime.now(UTC)
        t0 = t0_ns / 1e9
        workload.start()
        nemesis.start(t0)
        log(f"workload and nemesis running for {options.duration_s:.0f} s")
        end = t0 + options.duration_s
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 10.0))
            log(f"  {time.monotonic() - t0:5.0f} s: {len(history.ops)} ops, "
                f"{len(nemesis.events)} faults")  # fmt: skip
        nemesis.stop()
        workload.stop()
        for e in nemesis.events:
            log("  " + e.describe())
        log("healing: every server up and resumed, every link restored")
        _make_whole(c, problems)
        if not _wait_leaders(c, options.settle_timeout_s):
            problems.append(
                f"some tablet had no ready leader {options.settle_timeout_s:.0f} s after healing"
            )
        _final_reads(workload, options, problems)
        present = _inserted_ids(client, options, problems)
        replicas = _compare_replicas(c, options.settle_timeout_s)
        for sid in c.server_ids():
            if any(not ok and sid in detail for ok, detail in replicas.values()):
                problems.append(f"{sid}'s replicas could not be compared; its log ends:\n"
                                f"{c.log_tail(sid, 15)}")  # fmt: skip
        terms_after = _terms(c)
        read_counters = c.probe.read_counters()
        finished = True
    finally:
        # Stopped before the client closes under them, also when interrupted (each worker
        # printed a ClientClosed traceback on Ctrl-C); stopping twice is harmless.
        if nemesis is not None:
            nemesis.stop()
        if workload is not None:
            workload.stop()
        client.close()
        if not finished and options.history_path is not None:
            # Ctrl-C, SIGTERM or a crash: what was recorded so far is still worth having.
            events = nemesis.events if nemesis is not None else []
            header = history_header(options, c.backend, started, t0_ns, events, complete=False)
            warn("the history so far: " + _save_history(history, options.history_path, header))
    ops = history.snapshot()
    history_note = ""
    if options.history_path is not None:
        header = history_header(options, c.backend, started, t0_ns, nemesis.events, complete=True)
        history_note = "history: " + _save_history(history, options.history_path, header)
    log(f"checking {len(ops)} operations")
    verdicts = check_registers(ops, options.check_budget_s)
    inserts = check_unique_inserts((op for op in ops if op.kind is OpKind.INSERT), present)
    return ChaosReport(
        backend=c.backend,
        seed=options.seed,
        duration_s=options.duration_s,
        ops=_op_counts(ops),
        not_ok=_not_ok_causes(ops),
        faults=nemesis.events,
        terms_advanced=sum(terms_after.get(t, 0) - n for t, n in terms_before.items()),
        verdicts=verdicts,
        inserts=inserts,
        replicas=replicas,
        unsafe=tuple(options.unsafe),
        leader_read_mode=options.leader_read_mode,
        tserver_flags=tuple(options.tserver_flags),
        read_counters=read_counters,
        problems=problems,
        history_note=history_note,
    )


def _op_counts(ops: Sequence[Op]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for op in ops:
        by_outcome = out.setdefault(op.kind.value, {})
        by_outcome[op.outcome.value] = by_outcome.get(op.outcome.value, 0) + 1
    return out


def _not_ok_causes(ops: Sequence[Op]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for op in ops:
        if op.outcome.value == "ok":
            continue
        by_cause = out.setdefault(op.kind.value, {})
        cause = _cause_of(op.error)
        by_cause[cause] = by_cause.get(cause, 0) + 1
    return out


def _cause_of(error: str) -> str:
    """An operation's error, as the workload records it ("ts2: FAILED_PRECONDITION",
    "NOT_LEADER: ...", a row error), cut to its status code or cause."""
    words = error.split(": ")
    if len(words) > 1 and words[0].startswith("ts") and " " not in words[0]:
        words = words[1:]  # the server it came from
    cause = words[0].strip() if words and words[0].strip() else "no error recorded"
    return cause if len(cause) <= 40 else cause[:37] + "..."


def _make_whole(cluster: ChaosCluster, problems: list[str]) -> None:
    cluster.heal_network()
    for sid in cluster.server_ids():
        try:
            if cluster.alive(sid):
                cluster.resume(sid)
            else:
                cluster.start(sid)
        except Exception as e:
            problems.append(f"could not restart {sid}: {e}\n{cluster.log_tail(sid)}")
    for sid in cluster.server_ids():
        with contextlib.suppress(Exception):
            cluster.set_flag(sid, "log_inject_latency_ms", "0")


def _wait_leaders(cluster: ChaosCluster, timeout_s: float) -> bool:
    tablets = {p.tablet_id for p in cluster.config.placements()}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if set(cluster.leaders()) >= tablets:
            return True
        time.sleep(0.2)
    return False


def _final_reads(workload: Workload, options: ChaosOptions, problems: list[str]) -> None:
    """One read of every register after healing: it pins down where each one ended."""
    process = -1  # not a worker's number
    for key in range(options.workload.keys):
        deadline = time.monotonic() + options.settle_timeout_s
        while workload.read(process, key) is not Outcome.OK:
            if time.monotonic() > deadline:
                problems.append(f"register {key} could not be read after healing")
                break


def _inserted_ids(client: Client, options: ChaosOptions, problems: list[str]) -> set[int]:
    deadline = time.monotonic() + options.settle_timeout_s
    while True:
        try:
            rows = client.scan(INSERTS, projection=["id"], read_mode=ReadMode.LEADER_LATEST)
            return {r["id"] for r in rows if isinstance(r["id"], int)}
        except RaftletError as e:
            if time.monotonic() > deadline:
                problems.append(f"the inserts table could not be read after healing: {e}")
                return set()


def _compare_replicas(cluster: ChaosCluster, timeout_s: float) -> dict[str, tuple[bool, str]]:
    """Each tablet's replicas, compared until they agree or ``timeout_s`` passes (after a
    heal a follower may still be catching up)."""
    out: dict[str, tuple[bool, str]] = {}
    deadline = time.monotonic() + timeout_s
    for p in cluster.config.placements():
        schema = cluster.config.table(p.table).schema
        while True:
            ok, detail = cluster.probe.compare_replicas(p.tablet_id, p.replicas, schema)
            if ok or time.monotonic() > deadline:
                out[p.tablet_id] = (ok, detail)
                break
            time.sleep(0.2)
    return out
