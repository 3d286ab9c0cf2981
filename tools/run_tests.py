"""``make test``: the whole suite, the CPU-bound part two at a time.

The unit tests and the simulation are CPU-bound and independent of each other: they run
as two pytest processes at once (the test files dealt into two halves of about equal
size), one a core, each with a temporary directory of its own. The integration tests,
which start servers and time them, run after, alone. In one pytest run, one core idled
through the unit tests' five minutes, and the fresh-clone CI took 26.7 minutes of its 25 at
a slow hour.

    python tools/run_tests.py [PYTEST_ARGS...]    # extra arguments go to every run

Exit status: 0 when every run passed, else the first failing run's.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def halves(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """``files`` dealt into two lists of about equal total size, largest first."""
    a: list[Path] = []
    b: list[Path] = []
    size_a = size_b = 0
    for f in sorted(files, key=lambda p: (-p.stat().st_size, p.name)):
        if size_a <= size_b:
            a.append(f)
            size_a += f.stat().st_size
        else:
            b.append(f)
            size_b += f.stat().st_size
    return sorted(a), sorted(b)


def main(extra: list[str]) -> int:
    cpu_bound = sorted((ROOT / "tests" / "unit").glob("test_*.py"))
    cpu_bound += sorted((ROOT / "tests" / "sim").glob("test_*.py"))
    with tempfile.TemporaryDirectory(prefix="raftlet-tests-") as scratch:
        runs = []
        for i, half in enumerate(halves(cpu_bound)):
            log = Path(scratch) / f"half{i}.log"
            argv = [
                sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                f"--basetemp={Path(scratch) / f'tmp{i}'}", *extra,
                *[str(f.relative_to(ROOT)) for f in half],
            ]  # fmt: skip
            with log.open("wb") as out:
                runs.append((log, subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=out)))
        codes = []
        for log, proc in runs:
            codes.append(proc.wait())
            print(log.read_text(errors="replace"), end="", flush=True)
    integration = [sys.executable, "-m", "pytest", "-q", "--durations=15", *extra]
    codes.append(subprocess.call([*integration, "tests/integration"], cwd=ROOT))
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
