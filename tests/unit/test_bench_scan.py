"""The pure parts of ``bench/scan.py``: reading ``raftlet write``'s summary and VmRSS, and the
tables it prints. (``tests/integration/test_bench_scan.py`` runs the whole bench on a few
rows; the numbers themselves are for docs/benchmarks.md and never asserted.)"""

from __future__ import annotations

import json

import pytest

from tests.bench_scripts import load_bench

bench = load_bench("scan.py")


def test_the_load_summary_is_the_json_raftlet_write_prints() -> None:
    doc = {"rows": 1000, "elapsed_s": 0.5, "server_cpu_s": 0.25, "failed_rows": 0}
    assert bench.parse_load_summary(json.dumps(doc, indent=2)) == doc
    assert bench.parse_load_summary("a warning\n" + json.dumps(doc) + "\n") == doc
    for text in ("", "no json here", "[1, 2]"):
        with pytest.raises(ValueError, match="no JSON summary"):
            bench.parse_load_summary(text)


def test_vm_rss_comes_from_proc_status() -> None:
    status = "Name:\traftlet\nVmPeak:\t  999 kB\nVmRSS:\t   81764 kB\nThreads:\t12\n"
    assert bench.parse_vm_rss_kib(status) == 81764
    assert bench.parse_vm_rss_kib("Name:\tzombie\n") is None
    assert bench.rss_mib(2**22 + 7) is None  # no such process


def test_the_tables_show_rates_and_cpu_per_row() -> None:
    phases = [
        bench.Phase("load", 1_000_000, 16.0, 8.0, 10.0),
        bench.Phase("scan: packed", 1_000_000, 2.5, 1.0, None),
    ]
    lines = bench.phase_table(phases)
    assert lines[2] == "| load | 1,000,000 | 16.00 | 62,500 | 8.00 | 10.00 |"
    assert lines[3] == "| scan: packed | 1,000,000 | 2.50 | 400,000 | 1.00 | - |"
    rss = bench.rss_table(
        {"ts1": "leader"}, {"ts1": 11, "ts2": 12}, {"ts1": 80.4, "ts2": None}, {"ts1": 117.0}
    )
    assert rss[2:] == [
        "| ts1 (pid 11) | leader | 80 | 117 |",
        "| ts2 (pid 12) | ? | - | - |",
    ]


def test_an_unknown_row_form_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--forms", "packed,rows"])
    assert exit_info.value.code == 2
    assert "unknown form 'rows'" in capsys.readouterr().err
