"""What one write + fdatasync costs on this disk, depending on how far apart syncs are.

    .venv/bin/python bench/fsync_spacing.py [--seconds 2] [--dir /path/on/the/disk]

One thread appends ``size`` bytes to a file and fdatasyncs it, over and over; between two
syncs it spins on the CPU for ``gap`` microseconds (the work a group-commit cycle does
between syncs: producers making the next entries, the appender encoding them and running
callbacks).  Rows are interleaved by repetition so drift on a shared machine hits every
row alike; each cell reports the distribution of the sync alone (write + fdatasync).

Why it matters for ``bench/wal.py``: fsync per entry issues its syncs nearly back to back,
while group commit spaces them by a whole cycle of Python work.  If the disk is slower to
sync after a pause, the two modes are not paying the same price per sync.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field


@dataclass
class Cell:
    size: int
    gap_us: int
    samples: list[float] = field(default_factory=list)

    def pct(self, q: float) -> float:
        s = sorted(self.samples)
        return s[min(len(s) - 1, int(q * len(s)))]

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples)

    def share_over(self, us: float) -> float:
        return sum(1 for x in self.samples if x > us) / len(self.samples)


def measure(directory: str, cell: Cell, seconds: float) -> None:
    fd, path = tempfile.mkstemp(prefix="fsync-spacing-", dir=directory)
    data = b"x" * cell.size
    gap = cell.gap_us / 1e6
    clock = time.perf_counter
    try:
        deadline = clock() + seconds
        while clock() < deadline:
            if gap:
                until = clock() + gap
                while clock() < until:  # CPU work, not a sleep: the VM stays busy
                    pass
            t0 = clock()
            os.write(fd, data)
            os.fdatasync(fd)
            cell.samples.append((clock() - t0) * 1e6)
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per cell and repetition")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--sizes", default="130,4160", help="bytes per write")
    parser.add_argument("--gaps", default="0,100,300,1000", help="CPU microseconds between syncs")
    parser.add_argument("--dir", default=None, help="where the temporary files go")
    args = parser.parse_args()
    base = args.dir or tempfile.gettempdir()
    cells = [
        Cell(int(size), int(gap)) for size in args.sizes.split(",") for gap in args.gaps.split(",")
    ]
    print(
        f"# bench/fsync_spacing.py  {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}  "
        f"python {platform.python_version()}  {os.cpu_count()} cpus  dir={base}  "
        f"{args.seconds:g} s x {args.repeat} per cell"
    )
    for _ in range(args.repeat):
        for cell in cells:
            measure(base, cell, args.seconds)
    print("| bytes | gap us |  syncs | mean us | p50 us | p90 us | p99 us | > 400 us |")
    print("|-------|--------|--------|---------|--------|--------|--------|----------|")
    for c in cells:
        print(
            f"| {c.size:>5} | {c.gap_us:>6} | {len(c.samples):>6} | {c.mean:>7.0f} | "
            f"{c.pct(0.5):>6.0f} | {c.pct(0.9):>6.0f} | {c.pct(0.99):>6.0f} | "
            f"{c.share_over(400) * 100:>7.1f}% |"
        )


if __name__ == "__main__":
    main()
