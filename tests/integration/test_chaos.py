"""Chaos runs against real clusters: every fault kind under load, then the verdict.

The main run must come out clean: every register linearizable, no acknowledged insert lost,
every replica equal. The negative controls switch off one guarantee each on the servers
(``--unsafe_*``) and must be caught: stale leader reads by the linearizability checker, early
acknowledgements by the checker and the lost-write count. A checker that passed everything
would fail them.

Network namespaces are used when the test runs as root (as CI does), per-link proxies
otherwise; ``test_proxy_partitions_*`` runs the proxy backend either way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlet.chaos.checker import CheckResult
from raftlet.chaos.nemesis import ALL_FAULTS
from raftlet.chaos.options import ChaosOptions, WorkloadOptions
from raftlet.chaos.run import ChaosReport, run_chaos
from raftlet.consensus.log.segment import scan_segment

pytestmark = pytest.mark.integration
# A negative control passes only if the fault it allows bites; other tests' load beside it
# could keep it from biting in time.
ALONE = pytest.mark.alone

# Short holds and gaps: a CI-sized run sees every kind more than once.
FAST = {"hold_s": (0.8, 2.5), "quiet_s": (0.5, 1.5)}


def _run(tmp_path: Path, **kwargs: object) -> ChaosReport:
    lines: list[str] = []
    options = ChaosOptions(work_dir=tmp_path / "cluster", **{**FAST, **kwargs})  # type: ignore[arg-type]
    report = run_chaos(options, lines.append)
    print("\n".join(lines))
    print(report.format())
    return report


def test_every_fault_kind_leaves_a_linearizable_history_and_no_lost_write(
    tmp_path: Path,
) -> None:
    # Small WAL segments, frequent log GC and a retention cap of two segments: the log is
    # collected under the faults too, past servers that are down, which then come back
    # behind their leader's log and are caught up by tablet copies.
    report = _run(
        tmp_path,
        duration_s=50.0,
        seed=7,
        history_path=tmp_path / "history.jsonl",
        tserver_flags=(
            "--log_segment_size_bytes=16384",
            "--log_gc_interval_s=0.3",
            "--log_max_segments_retained=2",
            "--tablet_copy_repair_interval_s=2",
        ),
    )
    kinds = {e.kind for e in report.faults}
    assert kinds == set(ALL_FAULTS), f"missing fault kinds: {set(ALL_FAULTS) - kinds}"
    assert not report.problems
    assert report.linearizable is True, report.format()
    assert report.inserts.lost == []
    assert report.inserts.failed_but_present == []
    assert report.replicas_equal, report.replicas
    assert report.ok
    # The run did real work on both sides of the faults.
    assert report.ops["write"]["ok"] > 500
    assert report.ops["read"]["ok"] > 500
    assert report.terms_advanced >= 3
    assert (tmp_path / "history.jsonl").stat().st_size > 0
    # GC ran on every replica: no log starts at index 1 any more (a copied replica's log
    # starts at the copy's index, in a segment numbered 1 again).
    wals = sorted((tmp_path / "cluster").glob("ts*/*/wal"))
    assert len(wals) == 3 * 4
    for wal in wals:
        assert _first_index(wal) > 1, wal
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "cluster").glob("ts*.log"))
    print(f"tablet copies installed: {logs.count('installed a copy')}")


def _first_index(wal: Path) -> int:
    segments = sorted(wal.glob("wal-*.seg"))
    first = segments[0]
    scan = scan_segment(first.read_bytes(), str(first), is_last=len(segments) == 1)
    return scan.records[0].first_index


# A cut-off leader keeps leading under the control (no check-quorum), so every cut longer than
# the others' election leaves it a stale window of a second or more. One run of a few cuts
# has caught a stale read every time; a miss runs again with the next seed, and the control
# fails only if no run catches one.
NEGATIVE_CONTROL_SEEDS = (3, 31, 59)


@ALONE
def test_negative_control_stale_leader_reads_are_caught(tmp_path: Path) -> None:
    for seed in NEGATIVE_CONTROL_SEEDS:
        report = _stale_reads_run(tmp_path / f"seed-{seed}", seed)
        if report.linearizable is False:
            break
    assert report.linearizable is False, report.format()
    bad = [v for v in report.verdicts.values() if v.result is CheckResult.NOT_LINEARIZABLE]
    assert all(v.counterexample for v in bad)
    assert not report.ok


def _stale_reads_run(tmp_path: Path, seed: int) -> ChaosReport:
    # Cuts of 3-4 s: the others elect within about 2 s and acknowledge writes while the
    # cut-off leader still answers reads from its own state.
    return _run(
        tmp_path,
        duration_s=8.0,
        seed=seed,
        faults=("partition-leader",),
        unsafe=("stale-reads",),
        hold_s=(3.0, 4.0),
        quiet_s=(0.5, 1.0),
        # A read shows as stale only if a write to the same key was acknowledged elsewhere
        # before it began. So: few keys, many workers, every call sent straight to a random
        # server with a short deadline, so no worker sits out the cut waiting on the cut-off
        # leader.
        workload=WorkloadOptions(
            keys=4,
            register_workers=12,
            direct_read_fraction=1.0,
            direct_write_fraction=1.0,
            direct_timeout_s=0.25,
        ),
    )


@ALONE
def test_negative_control_acknowledging_before_a_majority_is_caught(tmp_path: Path) -> None:
    report = _run(
        tmp_path,
        duration_s=15.0,
        seed=4,
        faults=("kill", "partition-leader"),
        unsafe=("early-ack",),
        workload=WorkloadOptions(register_workers=4, insert_workers=2),
    )
    assert report.inserts.lost or report.linearizable is False, report.format()
    assert not report.ok


def test_proxy_partitions_leave_a_linearizable_history(tmp_path: Path) -> None:
    """The backend for users without root: loopback servers behind per-link proxies."""
    report = _run(
        tmp_path,
        duration_s=18.0,
        seed=5,
        backend="proxy",
        faults=("partition-leader", "partition-halves", "pause", "kill"),
    )
    assert report.backend == "proxy"
    assert {e.kind for e in report.faults} >= {"partition-leader", "partition-halves"}
    assert report.ok, report.format()


def test_lease_reads_stay_linearizable_when_the_leader_is_paused_or_cut_off(
    tmp_path: Path,
) -> None:
    """A paused leader must not wake up holding a lease: the stall ends it (its clock ran on
    while it slept, and the ticker sees it woke late)."""
    report = _run(
        tmp_path,
        duration_s=20.0,
        seed=9,
        faults=("pause", "partition-leader"),
        leader_read_mode="lease",
        hold_s=(1.5, 4.0),
        workload=WorkloadOptions(direct_read_fraction=0.5),
    )
    assert report.leader_read_mode == "lease"
    assert report.ok, report.format()
    # The lease was really used, and the pauses were noticed as stalls.
    assert report.read_counters["lease_reads"] > 100, report.read_counters
    assert report.read_counters["stalls"] >= 1, report.read_counters
