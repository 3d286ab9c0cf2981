"""``make test``: the whole suite, spread over the machine's cores.

The test files are packed into jobs of about ``JOB_SECONDS`` each (by the durations in
tests/durations.json; a file that takes longer is a job of its own), and the jobs run as
separate pytest processes, longest first, ``--jobs`` at a time (default: one a core, at
least two, at most four), each with a temporary directory of its own. An integration test
spends most of its time waiting on its servers: run one at a time, the integration tests
kept one core of two busy, and the fresh-clone CI took 26 minutes of its 25. Tests marked
``alone`` -- those whose verdict compares timings or needs a fault to bite on time -- run
after every job has ended, in one pytest run with the machine to themselves.

Bytecode is compiled first: with PYTHONDONTWRITEBYTECODE set (as on the CI machine), every
server and CLI process the tests start would otherwise compile the whole package again,
about 0.6 s of CPU each.

    python tools/run_tests.py [--jobs N] [--record-durations] [PYTEST_ARGS...]

Extra arguments go to every pytest run. ``--record-durations`` rewrites
tests/durations.json from this run's per-file times (after adding or much changing tests).
Exit status: 0 when every run passed, else the first failing run's.
"""

from __future__ import annotations

import argparse
import compileall
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / "tests" / "durations.json"
SUITES = ("tests/unit", "tests/sim", "tests/integration")
# Long enough that a pytest start-up (1-2 s) is small beside it, short enough to balance.
JOB_SECONDS = 40.0
NOT_ALONE = "not alone"
# pytest's exit status when a run selected no test: a job whose tests are all `alone`.
NO_TESTS = 5


@dataclasses.dataclass
class Job:
    files: list[str]
    expected_s: float

    def name(self) -> str:
        shown = ", ".join(Path(f).stem.removeprefix("test_") for f in self.files[:3])
        more = len(self.files) - 3
        return f"{Path(self.files[0]).parent}: {shown}" + (f" +{more}" if more > 0 else "")


def load_durations() -> dict[str, float]:
    try:
        loaded = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in loaded.items()}


def expected_seconds(files: list[str], durations: dict[str, float]) -> dict[str, float]:
    """Each file's recorded seconds; a file not recorded gets its folder's median."""
    known = [durations[f] for f in files if f in durations]
    guess = statistics.median(known) if known else JOB_SECONDS / 4
    return {f: durations.get(f, guess) for f in files}


def pack(seconds: dict[str, float]) -> list[Job]:
    """Files packed first-fit, longest first, into jobs of about ``JOB_SECONDS``."""
    jobs: list[Job] = []
    for f in sorted(seconds, key=lambda f: (-seconds[f], f)):
        fits = next((j for j in jobs if j.expected_s + seconds[f] <= JOB_SECONDS), None)
        if fits is None:
            jobs.append(Job([f], seconds[f]))
        else:
            fits.files.append(f)
            fits.expected_s += seconds[f]
    return jobs


def plan(durations: dict[str, float]) -> list[Job]:
    jobs: list[Job] = []
    for suite in SUITES:
        files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / suite).glob("test_*.py"))
        jobs += pack(expected_seconds(files, durations))
    return sorted(jobs, key=lambda j: -j.expected_s)


def compile_bytecode() -> None:
    # compileall does not follow raftlet/'s links into the folders, so each is named.
    for d in sorted(p for p in (ROOT / "raftlet").iterdir() if p.is_dir()):
        compileall.compile_dir(d.resolve(), quiet=1)
    compileall.compile_dir(ROOT / "raftlet", maxlevels=0, quiet=1)
    compileall.compile_dir(ROOT / "tests", quiet=1)


def pytest_argv(scratch: Path, tag: str, extra: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        f"--basetemp={scratch / f'tmp-{tag}'}", f"--junitxml={scratch / f'{tag}.xml'}",
        *extra,
    ]  # fmt: skip


def run_job(i: int, job: Job, scratch: Path, extra: list[str]) -> tuple[int, float, Path]:
    """One job's pytest run: its exit status, seconds and log."""
    started = time.monotonic()
    log = scratch / f"job{i}.log"
    argv = [*pytest_argv(scratch, f"job{i}", extra), "-m", NOT_ALONE, *job.files]
    with log.open("wb") as out:
        code = subprocess.call(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    return (0 if code == NO_TESTS else code), time.monotonic() - started, log


def run_jobs(jobs: list[Job], workers: int, scratch: Path, extra: list[str]) -> list[int]:
    """Runs ``jobs`` ``workers`` at a time, in their order; prints each one's output as it
    ends."""
    codes: list[int] = []
    with ThreadPoolExecutor(workers) as pool:
        running = {pool.submit(run_job, i, job, scratch, extra): job for i, job in enumerate(jobs)}
        for done, future in enumerate(as_completed(running), 1):
            code, took, log = future.result()
            codes.append(code)
            verdict = "passed" if code == 0 else f"FAILED (exit status {code})"
            print(f"== [{done}/{len(jobs)}] {running[future].name()}: {verdict} in {took:.0f} s")
            print(log.read_text(errors="replace"), end="", flush=True)
    return codes


def junit_cases(scratch: Path) -> list[ET.Element]:
    """Every test case of the runs' JUnit reports."""
    return [case for report in scratch.glob("*.xml") for case in ET.parse(report).iter("testcase")]


def file_seconds(cases: list[ET.Element]) -> dict[str, float]:
    """Per test file, the seconds its tests took (setup and teardown included)."""
    seconds: dict[str, float] = {}
    for case in cases:
        parts = case.get("classname", "").split(".")
        # classname is the module's dotted path, then any classes in it.
        while parts and not (ROOT / Path(*parts)).with_suffix(".py").is_file():
            parts.pop()
        if parts:
            f = str(Path(*parts).with_suffix(".py"))
            seconds[f] = seconds.get(f, 0.0) + float(case.get("time", 0.0))
    return seconds


def slowest_tests(cases: list[ET.Element], n: int = 15) -> list[tuple[float, str]]:
    timed = [
        (float(case.get("time", 0.0)), f"{case.get('classname')}::{case.get('name')}")
        for case in cases
    ]
    return sorted(timed, reverse=True)[:n]


def main(argv: list[str]) -> int:
    # add_help=False: any other argument is pytest's, and `--help` is answered here rather
    # than by every job's pytest (which ran the suite's jobs to print pytest's help).
    ap = argparse.ArgumentParser(
        prog="tools/run_tests.py",
        allow_abbrev=False,
        add_help=False,
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Any other argument goes to every pytest run (e.g. -x, -k EXPR).",
    )
    cores = os.cpu_count() or 2
    ap.add_argument("--jobs", type=int, default=max(2, min(4, cores)), help="runs at a time")
    ap.add_argument(
        "--record-durations",
        action="store_true",
        help="rewrite tests/durations.json from this run's times",
    )
    ap.add_argument("-h", "--help", action="help", help="show this help and exit")
    opts, extra = ap.parse_known_args(argv)
    started = time.monotonic()
    compile_bytecode()
    jobs = plan(load_durations())
    with tempfile.TemporaryDirectory(prefix="raftlet-tests-") as tmp:
        scratch = Path(tmp)
        print(f"{len(jobs)} jobs, {opts.jobs} at a time; then the tests marked alone", flush=True)
        codes = run_jobs(jobs, opts.jobs, scratch, extra)
        print("== the tests marked alone", flush=True)
        alone = [*pytest_argv(scratch, "alone", extra), "-m", "alone", "tests/integration"]
        code = subprocess.call(alone, cwd=ROOT)
        codes.append(0 if code == NO_TESTS else code)
        cases = junit_cases(scratch)
        print("== slowest tests")
        for seconds, test in slowest_tests(cases):
            print(f"{seconds:8.1f} s  {test}")
        if opts.record_durations:
            recorded = {**load_durations(), **file_seconds(cases)}
            rounded = {f: round(s, 1) for f, s in sorted(recorded.items()) if (ROOT / f).is_file()}
            DURATIONS.write_text(json.dumps(rounded, indent=1) + "\n")
            print(f"recorded {DURATIONS.relative_to(ROOT)}")
    failed = [c for c in codes if c != 0]
    print(f"== {len(codes)} runs, {len(failed)} failed, {time.monotonic() - started:.0f} s")
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
