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
    for good in ("", "auto", "0", "0-1,4"):
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
def test_a_server_refuses_cpus_it_may_not_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = os.sched_getaffinity(0)
    missing = max(before) + 1
    settings = parse(write_config(tmp_path), "--cpu_affinity", str(missing))
    assert run(settings) == 1
    err = capsys.readouterr().err
    assert f"raftlet tserver: error: --cpu_affinity {missing}: CPU {missing} is not one" in err
    assert os.sched_getaffinity(0) == before
