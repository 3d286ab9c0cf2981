"""What a pass costs against how long ago its server last ran the same pass.

The pure part of ``bench/pass_cpu.py --gaps`` (a helper, so ``make bench`` skips it).  Input:
each server's passes as ``(label, thread, start_ns, end_ns, thread_cpu_s)``, the same events
``--timeline`` records.  A pass's *gap* is the time from the latest end of an earlier pass
with its label on that server (any thread) to its own start.  On the machine this project
is measured on, the same code costs 2.5-4x as much once a few milliseconds have passed
since it last ran (``bench/cold_code.py``); this says, for a running cluster, how many of
each pass ran that cold and what they cost, so that "the code was cold" can be told apart
from "the pass itself costs this much".  Nested passes (labels starting with spaces) are
part of their outer pass and left out.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Mapping, Sequence

Event = tuple[str, int, int, int, float]  # label, thread, start ns, end ns, thread CPU s

# Upper bounds of the gap buckets, ms; the last bucket is everything at or past the last.
GAP_BOUNDS_MS = (0.2, 1.0, 2.0, 4.0)


def bucket_labels() -> list[str]:
    lows = ("0", *(f"{b:g}" for b in GAP_BOUNDS_MS))
    labels = [f"{lo}-{hi:g} ms" for lo, hi in zip(lows, GAP_BOUNDS_MS, strict=False)]
    return [*labels, f">= {GAP_BOUNDS_MS[-1]:g} ms"]


def cpu_by_gap(events: Sequence[Event]) -> dict[str, list[list[float]]]:
    """Per top-level pass label, the thread CPU (us) of its calls in each gap bucket.  A
    label's first call has no gap and is not counted."""
    out: dict[str, list[list[float]]] = {}
    last_end: dict[str, int] = {}
    for label, _thread, start, end, cpu in sorted(events, key=lambda e: e[2]):
        if label.startswith(" "):
            continue
        previous = last_end.get(label)
        if previous is None:
            last_end[label] = end
            continue
        slot = bisect.bisect_right(GAP_BOUNDS_MS, (start - previous) / 1e6)
        out.setdefault(label, [[] for _ in range(len(GAP_BOUNDS_MS) + 1)])[slot].append(cpu * 1e6)
        last_end[label] = max(end, previous)
    return out


def report(events_by_server: Mapping[str, Sequence[Event]]) -> str:
    """One table per server: per pass and gap bucket, the calls' median CPU and count."""
    lines = [
        "",
        "Each pass's thread CPU against the time since its server last ran the same pass "
        "(median us a call, and the calls):",
    ]
    heads = bucket_labels()
    for server, events in sorted(events_by_server.items()):
        lines += ["", server, "| pass | " + " | ".join(heads) + " |"]
        lines.append("|---|" + "---:|" * len(heads))
        for label, cells in sorted(cpu_by_gap(events).items()):
            shown = [f"{statistics.median(c):.0f} ({len(c):,})" if c else "-" for c in cells]
            lines.append(f"| {label} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"
