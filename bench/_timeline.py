"""Where a lone write's wall time goes: its critical path across the client and three servers.

The pure part of ``bench/pass_cpu.py --timeline`` (a helper, so ``make bench`` skips it).
Input: the client's span of every write, and each server's passes as ``(label, thread,
start_ns, end_ns, thread_cpu_s)``, all on ``CLOCK_MONOTONIC``, which every process on a
machine shares.  With one write in flight, the passes a server starts inside a write's span
belong to that write; the server that read a client frame leads it, and of its followers
the one whose durable answer went out first is the one the commit waited for.  Between
consecutive marks of that path (below) the time is split into segments that add up to the
write's latency exactly; what runs beside the path (the other follower, the leader's own
WAL turn) is reported, not summed.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The labels of bench/pass_cpu.py's PASSES and LINKS that mark the path.
CLIENT_FRAME = "frame from a client (writes)"
LEADER_FRAME = "frame from a leader (step an append)"
FOLLOWER_FRAME = "frame from a follower (answers)"
WAL_TURN = "WAL appender turn"
FDATASYNC = "  of which fdatasync"
CALLBACKS = "  of which callbacks (durable: step, answer)"
APPLY = "apply stage"
COMPLETING = "  of which completing requests"

Event = tuple[str, int, int, int, float]  # label, thread, start ns, end ns, thread CPU s

# Each segment ends at a mark; the first starts at the client's call.
SEGMENTS = [
    "client: call, encode, send; the leader's reader wakes",
    "leader: admit, prepare, replicate; the append reaches follower A",
    "follower A: decode and step the append",
    "follower A: hand-off to its WAL appender",
    "follower A: write and fdatasync",
    "follower A: step the durable append, answer",
    "the answer reaches the leader's reader",
    "leader: step the answers, commit, hand to the apply stage",
    "leader: apply the entry, answer the writer (before COMMIT)",
    "the answer reaches the client, which returns",
]


@dataclass(frozen=True)
class WritePath:
    """One write's marks (ns, relative to the client's call) and what ran beside them."""

    span: tuple[int, int]  # the client's call and return, ns
    leader: str
    follower: str  # A: the follower whose durable answer went out first
    segments: tuple[float, ...]  # microseconds, one per SEGMENTS entry; sum = latency
    latency_us: float
    leader_sync_end_us: float | None  # when the leader's own fdatasync ended
    answer_read_us: float  # when the leader started reading A's answer


def _first(events: Sequence[Event], label: str) -> Event | None:
    return next((e for e in events if e[0] == label), None)


def trace(span: tuple[int, int], by_server: Mapping[str, Sequence[Event]]) -> WritePath | None:
    """The write whose client span is ``span``, from the passes each server started in it
    (sorted by start); None when a mark is missing (a heartbeat-only window, a write
    retried, passes outside the recorded cap)."""
    t0, t1 = span
    inside = {s: [e for e in evs if t0 <= e[2] <= t1] for s, evs in by_server.items()}
    leaders = [s for s, evs in inside.items() if _first(evs, CLIENT_FRAME)]
    if len(leaders) != 1:
        return None
    leader = leaders[0]
    answered: list[tuple[int, str]] = []
    for s, evs in inside.items():
        cb = _first(evs, CALLBACKS) if s != leader else None
        if cb is not None and _first(evs, LEADER_FRAME) is not None:
            answered.append((cb[3], s))
    if not answered:
        return None
    follower = min(answered)[1]
    lev, fev = inside[leader], inside[follower]
    client_frame = _first(lev, CLIENT_FRAME)
    step = _first(fev, LEADER_FRAME)
    turn = _first(fev, WAL_TURN)
    sync = _first(fev, FDATASYNC)
    callbacks = _first(fev, CALLBACKS)
    assert client_frame is not None
    assert step is not None
    assert callbacks is not None
    if turn is None or sync is None:
        return None
    answer = next((e for e in lev if e[0] == FOLLOWER_FRAME and e[2] >= callbacks[3]), None)
    apply = _first(lev, APPLY)
    completing = _first(lev, COMPLETING)
    if answer is None or apply is None or completing is None:
        return None
    marks = [
        t0,
        client_frame[2],
        step[2],
        step[3],
        turn[2],
        sync[3],
        callbacks[3],
        answer[2],
        apply[2],
        completing[3],
        t1,
    ]
    if any(b < a for a, b in itertools.pairwise(marks)):
        return None  # passes of two writes interleaved: not a lone write's path
    segments = tuple((b - a) / 1e3 for a, b in itertools.pairwise(marks))
    own_sync = _first(lev, FDATASYNC)
    return WritePath(
        span,
        leader,
        follower,
        segments,
        (t1 - t0) / 1e3,
        (own_sync[3] - t0) / 1e3 if own_sync is not None else None,
        (answer[2] - t0) / 1e3,
    )


def trace_all(
    spans: Sequence[tuple[int, int]], by_server: Mapping[str, Sequence[Event]]
) -> list[WritePath]:
    """``trace`` for every span; ``by_server``: each server's events sorted by start."""
    starts = {s: [e[2] for e in evs] for s, evs in by_server.items()}
    paths = []
    for t0, t1 in spans:
        window = {
            s: evs[bisect.bisect_left(starts[s], t0) : bisect.bisect_right(starts[s], t1)]
            for s, evs in by_server.items()
        }
        path = trace((t0, t1), window)
        if path is not None:
            paths.append(path)
    return paths


def segment_rows(paths: Sequence[WritePath]) -> list[tuple[str, float, float, float]]:
    """Per segment: (name, mean µs, median µs, share of the mean latency)."""
    mean_latency = statistics.fmean(p.latency_us for p in paths)
    rows = []
    for i, name in enumerate(SEGMENTS):
        values = [p.segments[i] for p in paths]
        mean = statistics.fmean(values)
        rows.append((name, mean, statistics.median(values), mean / mean_latency))
    return rows


def pass_rows(
    paths: Sequence[WritePath], by_server: Mapping[str, Sequence[Event]]
) -> list[tuple[str, str, float, float, float, float]]:
    """The top-level passes of the traced writes by role (leader, follower A, follower B):
    (role, pass, median start µs after the call, median wall µs, median thread CPU µs,
    share of writes that had it); passes in fewer than a third of the writes are left out.
    ``by_server``: each server's events sorted by start."""
    starts = {s: [e[2] for e in evs] for s, evs in by_server.items()}
    cells: dict[tuple[str, str, int], list[tuple[float, float, float]]] = defaultdict(list)
    for path in paths:
        t0, t1 = path.span
        roles = {path.leader: "leader", path.follower: "follower A"}
        for server, events in by_server.items():
            role = roles.get(server, "follower B")
            seen: dict[str, int] = defaultdict(int)
            lo = bisect.bisect_left(starts[server], t0)
            hi = bisect.bisect_right(starts[server], t1)
            for label, _thread, start, end, cpu in events[lo:hi]:
                if label.startswith(" "):
                    continue
                k = seen[label]
                seen[label] += 1
                cells[(role, label, k)].append(((start - t0) / 1e3, (end - start) / 1e3, cpu * 1e6))
    rows = []
    for (role, label, k), values in cells.items():
        if len(values) * 3 < len(paths):
            continue
        rows.append(
            (
                role,
                label if k == 0 else f"{label} (#{k + 1})",
                statistics.median(v[0] for v in values),
                statistics.median(v[1] for v in values),
                statistics.median(v[2] for v in values),
                len(values) / len(paths),
            )
        )
    rows.sort(key=lambda r: r[2])
    return rows


def own_sync_after_answer(paths: Sequence[WritePath]) -> tuple[float, float]:
    """How often the leader's own fdatasync ended after it began reading follower A's
    answer (so that commit could wait for it), and the median of those waits in µs."""
    waits = [
        p.leader_sync_end_us - p.answer_read_us
        for p in paths
        if p.leader_sync_end_us is not None and p.leader_sync_end_us > p.answer_read_us
    ]
    return len(waits) / len(paths), statistics.median(waits) if waits else 0.0


def report(
    spans: Sequence[tuple[int, int]], by_server: Mapping[str, Sequence[Event]], skip: float = 0.2
) -> str:
    """The printed tables: the segments of the path, then the passes by role."""
    spans = list(spans)[int(len(spans) * skip) :]  # the first writes warm caches up
    by_server = {s: sorted(evs, key=lambda e: e[2]) for s, evs in by_server.items()}
    paths = trace_all(spans, by_server)
    if not paths:
        return "\nno write could be traced (was it one write in flight?)\n"
    latencies = [p.latency_us for p in paths]
    lines = [
        f"\nThe critical path of a lone write: {len(paths):,} of {len(spans):,} writes "
        f"traced, latency mean {statistics.fmean(latencies):,.0f} us, median "
        f"{statistics.median(latencies):,.0f} us (follower A: the one whose answer went "
        "first; the segments add up to each write's latency)",
        "| segment | mean us | median us | share of the mean |",
        "|---|---:|---:|---:|",
    ]
    for name, mean, median, share in segment_rows(paths):
        lines.append(f"| {name} | {mean:,.0f} | {median:,.0f} | {share:.0%} |")
    late, wait = own_sync_after_answer(paths)
    lines.append(
        f"\nThe leader's own fdatasync ended after it began reading A's answer in {late:.0%} "
        f"of the writes (median {wait:,.0f} us later): a commit waits for the leader's copy "
        "unless both followers answered."
    )
    lines += [
        "\nPasses of the traced writes by role (medians; wall minus CPU: waiting inside the "
        "pass for the GIL or a CPU, or in a system call)",
        "| role | pass | start us | wall us | CPU us | writes with it |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for role, name, start, wall, cpu, share in pass_rows(paths, by_server):
        lines.append(f"| {role} | {name} | {start:,.0f} | {wall:,.0f} | {cpu:,.0f} | {share:.0%} |")
    return "\n".join(lines) + "\n"
