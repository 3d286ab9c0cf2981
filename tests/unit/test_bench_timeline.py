"""The pure part of ``bench/pass_cpu.py --timeline`` (``bench/_timeline.py``): which server
led a write and which follower's answer it waited for, segments that add up to the latency,
and writes it cannot trace.  Synthetic passes; no cluster."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench_scripts import load_bench

US = 1_000  # ns


@pytest.fixture(scope="module")
def tl() -> ModuleType:
    return load_bench("_timeline.py")


def _write(tl: ModuleType, t0: int, slow: str = "ts3") -> dict[str, list[tuple]]:
    """One write's passes, starting at ``t0`` ns: ts1 leads; the follower that is not
    ``slow`` answers first."""
    fast = "ts2" if slow == "ts3" else "ts3"

    def ev(label: str, start_us: int, end_us: int) -> tuple:
        return (label, 1, t0 + start_us * US, t0 + end_us * US, (end_us - start_us) / 1e6)

    def follower(delay: int) -> list[tuple]:
        return [
            ev(tl.LEADER_FRAME, 300 + delay, 400 + delay),
            ev(tl.WAL_TURN, 420 + delay, 800 + delay),
            ev(tl.FDATASYNC, 450 + delay, 700 + delay),
            ev(tl.CALLBACKS, 710 + delay, 790 + delay),
        ]

    return {
        "ts1": [
            ev(tl.CLIENT_FRAME, 60, 400),
            ev("prepare stage", 100, 300),
            ev(tl.WAL_TURN, 350, 950),
            ev(tl.FDATASYNC, 380, 900),
            ev(tl.FOLLOWER_FRAME, 850, 880),
            ev(tl.FOLLOWER_FRAME, 1_000, 1_020),
            ev(tl.APPLY, 1_050, 1_300),
            ev(tl.COMPLETING, 1_150, 1_200),
        ],
        fast: follower(0),
        slow: follower(150),
    }


def test_a_lone_write_is_split_at_the_marks_of_its_path(tl: ModuleType) -> None:
    path = tl.trace((0, 1_400 * US), _write(tl, 0))
    assert path.leader == "ts1"
    assert path.follower == "ts2"
    assert path.segments == (60, 240, 100, 20, 280, 90, 60, 200, 150, 200)
    assert sum(path.segments) == path.latency_us == 1_400
    assert path.leader_sync_end_us == 900  # after the answer was read at 850
    assert path.answer_read_us == 850


def test_follower_a_is_the_one_whose_answer_went_first(tl: ModuleType) -> None:
    path = tl.trace((0, 1_400 * US), _write(tl, 0, slow="ts2"))
    assert path.follower == "ts3"


@pytest.mark.parametrize("missing", ["apply stage", "  of which fdatasync"])
def test_a_write_without_a_mark_is_not_traced(tl: ModuleType, missing: str) -> None:
    events = _write(tl, 0)
    events = {s: [e for e in evs if e[0] != missing] for s, evs in events.items()}
    assert tl.trace((0, 1_400 * US), events) is None


def test_passes_out_of_order_are_not_a_lone_write(tl: ModuleType) -> None:
    events = _write(tl, 0)
    # the apply stage started before the follower's answer was read: two writes overlapped
    events["ts1"] = [e if e[0] != tl.APPLY else (*e[:2], 500 * US, *e[3:]) for e in events["ts1"]]
    assert tl.trace((0, 1_400 * US), events) is None


def test_the_report_covers_every_write_it_can_trace(tl: ModuleType) -> None:
    spans, events = [], {"ts1": [], "ts2": [], "ts3": []}
    for k in range(10):
        t0 = k * 2_000 * US
        spans.append((t0, t0 + 1_400 * US))
        for server, evs in _write(tl, t0).items():
            events[server].extend(evs)
    spans.append((30_000 * US, 31_000 * US))  # a span with no passes in it
    paths = tl.trace_all(spans, events)
    assert len(paths) == 10
    rows = tl.segment_rows(paths)
    assert [r[0] for r in rows] == tl.SEGMENTS
    assert sum(r[1] for r in rows) == pytest.approx(1_400)
    assert sum(r[3] for r in rows) == pytest.approx(1.0)
    assert tl.own_sync_after_answer(paths) == (1.0, 50.0)
    roles = {(r[0], r[1]) for r in tl.pass_rows(paths, events)}
    assert ("leader", "prepare stage") in roles
    assert ("follower A", tl.LEADER_FRAME) in roles
    assert ("follower B", tl.LEADER_FRAME) in roles
    assert ("leader", f"{tl.FOLLOWER_FRAME} (#2)") in roles
    printed = tl.report(spans, events, skip=0)
    assert "10 of 11 writes traced" in printed
    assert "| follower A: write and fdatasync | 280 | 280 | 20% |" in printed
