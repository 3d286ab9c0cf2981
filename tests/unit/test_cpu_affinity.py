"""``--cpu_affinity``: parsing, which CPUs a value means, binding every thread, and the
server refusing CPUs it may not use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftlet.tserver.cpu_affinity import check_cpu_affinity, parse_cpu_list, resolve_cpus
from raftlet.tserver.main import run
from tests.unit.thread_child import run_with_an_early_thread
from tests.unit.tserver_settings_helpers import parse, write_config

needs_affinity = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform"
)


def test_cpu_lists() -> None:
    assert parse_cpu_list("0") == {0}
    assert parse_cpu_list("0,2-3") == {0, 2, 3}
    assert parse_cpu_list(" 1 , 1-2 ") == {1, 2}
    for bad in ("", "x", "3-1", "-1", "1-", "0,,1"):
        with pytest.raises(ValueError, match="is not a CPU number or range"):
            parse_cpu_list(bad)


def test_flag_values() -> None:
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    for good in ("", "auto", str(allowed[0]), ",".join(str(c) for c in allowed)):
        check_cpu_affinity(good)
    for bad in ("AUTO ", "none", "1.5"):
        with pytest.raises(ValueError, match="is not a CPU number or range"):
            check_cpu_affinity(bad)


def test_auto_spreads_servers_round_robin_over_the_allowed_cpus() -> None:
    allowed = frozenset({5, 2})
    assert [resolve_cpus("auto", i, allowed) for i in range(4)] == [{2}, {5}, {2}, {5}]
    assert resolve_cpus("auto", 0, frozenset({3})) == {3}


def test_empty_leaves_placement_to_the_os_and_lists_must_be_allowed() -> None:
    assert resolve_cpus("", 0, frozenset({0, 1})) is None
    assert resolve_cpus("1", 0, frozenset({0, 1})) == {1}
    with pytest.raises(ValueError, match=r"CPU 7,9 is not one this process may run on \(0,1\)"):
        resolve_cpus("0,7,9", 0, frozenset({0, 1}))


@needs_affinity
def test_every_thread_of_the_process_is_bound() -> None:
    cpu = min(os.sched_getaffinity(0))
    out = run_with_an_early_thread(
        f"""
        from raftlet.tserver.cpu_affinity import apply_cpu_affinity
        print(sorted(apply_cpu_affinity("{cpu}", 0)))
        print(sorted(in_new_thread(lambda: os.sched_getaffinity(0))))
        print(sorted(os.sched_getaffinity(early.native_id)))
        """
    )
    assert out == [f"[{cpu}]"] * 3, out


@needs_affinity
def test_a_server_whose_cpus_went_away_since_its_flags_were_checked_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    before = os.sched_getaffinity(0)
    cpu = min(before)
    settings = parse(write_config(tmp_path), "--cpu_affinity", str(cpu))
    # The process's mask no longer holds that CPU (e.g. a cgroup changed meanwhile).
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {cpu + 1})
    assert run(settings) == 2  # a usage error (was 1, as if the machine had failed)
    err = capsys.readouterr().err
    assert f"raftlet tserver: error: --cpu_affinity {cpu}: CPU {cpu} is not one" in err
    monkeypatch.undo()
    assert os.sched_getaffinity(0) == before
