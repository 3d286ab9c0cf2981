"""The pure parts of ``bench/peers.py``: argument parsing, the statistics, the tables and the
hand-built etcd PutRequest.  Nothing here starts a server, etcd or PySyncObj, or touches the
network; the numbers the bench prints are for docs/benchmarks.md and never asserted."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench_scripts import load_bench

peers = load_bench("peers.py")


def test_defaults_measure_every_system_at_three_levels() -> None:
    args = peers.parse_args([])
    assert args.mode == "peers"
    assert args.inflight == [1, 16, 64]
    assert args.repeat >= 3
    assert args.value_bytes == 100
    assert args.systems.split(",") == ["raftlet-1", "raftlet-4", "etcd", "pysyncobj"]
    assert args.tablets == [1, 4, 16, 64]
    assert args.raftlet_client == "auto"


def test_flags_parse() -> None:
    args = peers.parse_args(
        ["--mode", "tablets", "--duration", "3", "--repeat", "5", "--inflight", "2,8"]
    )
    assert (args.mode, args.duration, args.repeat, args.inflight) == ("tablets", 3.0, 5, [2, 8])


@pytest.mark.parametrize(
    "argv",
    [
        ["--systems", "raftlet-1,zookeeper"],
        ["--repeat", "0"],
        ["--duration", "0"],
        ["--inflight", "1,x"],
        ["--inflight", "0"],
        ["--mode", "both"],
    ],
)
def test_bad_flags_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        peers.parse_args(argv)
    assert e.value.code == 2


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity")
def test_peer_members_get_one_cpu_each_round_robin() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    for i in range(3):
        out = subprocess.run(
            [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
            preexec_fn=peers.one_cpu(i),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        assert out == f"[{cpus[i % len(cpus)]}]"


def test_pinned_and_unpinned_systems(tmp_path: Path) -> None:
    args = peers.parse_args(["--systems", "raftlet-4-unpinned,etcd-unpinned,pysyncobj-unpinned"])
    names = args.systems.split(",")
    made = [peers.make_system(n, tmp_path, args) for n in names]
    assert [m.pinned for m in made] == [False, False, False]
    assert peers.make_system("raftlet-1", tmp_path, args).pinned
    assert [peers.make_system(n, tmp_path, args).pinned for n in ("etcd", "pysyncobj")] == [
        True,
        True,
    ]
    assert made[0].tablets == 4


def test_percentile_median_ratio() -> None:
    values = [float(v) for v in range(1, 101)]
    assert peers.percentile(values, 0.5) == 51.0
    assert peers.percentile(values, 0.99) == 100.0
    assert peers.percentile(list(reversed(values)), 0.0) == 1.0
    assert math.isnan(peers.percentile([], 0.5))
    assert peers.median([3.0, 1.0, 2.0]) == 2.0
    assert peers.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert peers.median([math.nan, 5.0, 7.0]) == 6.0
    assert math.isnan(peers.median([math.nan]))
    assert peers.ratio(300.0, 600.0) == 0.5
    assert math.isnan(peers.ratio(1.0, 0.0))
    assert math.isnan(peers.ratio(math.nan, 1.0))
    assert peers.fmt_ratio(0.5) == "0.50x"
    assert peers.fmt_ratio(math.nan) == "-"


def test_varint() -> None:
    assert peers.varint(0) == b"\x00"
    assert peers.varint(127) == b"\x7f"
    assert peers.varint(128) == b"\x80\x01"
    assert peers.varint(300) == b"\xac\x02"
    with pytest.raises(ValueError, match="negative"):
        peers.varint(-1)


def test_etcd_put_request_bytes() -> None:
    # PutRequest{key: "foo", value: "bar"}: tag 0x0a (field 1, length-delimited), length 3,
    # "foo", tag 0x12 (field 2, length-delimited), length 3, "bar".
    assert peers.encode_put_request(b"foo", b"bar") == bytes.fromhex("0a03666f6f1203626172")
    # A 200-byte value: its length is the two-byte varint c8 01.
    encoded = peers.encode_put_request(b"k1", b"v" * 200)
    assert encoded == bytes.fromhex("0a026b3112c801") + b"v" * 200


def test_etcd_put_request_matches_protobuf() -> None:
    # The same message described to the protobuf runtime (no etcd .proto files needed).
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="put_test.proto", package="t")
    msg = fdp.message_type.add(name="PutRequest")
    for number, name in ((1, "key"), (2, "value")):
        msg.field.add(
            name=name,
            number=number,
            type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
            label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("t.PutRequest"))
    for key, value in ((b"k123", b"x" * 100), (b"", b"y"), (b"z" * 300, b"w" * 20000)):
        assert peers.encode_put_request(key, value) == cls(key=key, value=value).SerializeToString()


def test_proc_parsing() -> None:
    # A command name with spaces and a ')' must not shift the fields.
    stat = "4242 (weird) name) S 1 4242 4242 0 -1 4194560 500 0 0 0 1234 567 0 0 20 0 9 0"
    assert peers.cpu_ticks_from_stat(stat) == 1234 + 567
    status = "Name:\tpython\nState:\tS (sleeping)\nThreads:\t17\nVmRSS:\t1 kB\n"
    assert peers.threads_from_status(status) == 17
    with pytest.raises(ValueError, match="Threads"):
        peers.threads_from_status("Name:\tx\n")


def cell(writes: int, latency: float, server_s: float, client_s: float) -> object:
    return peers.Cell(writes, 2.0, [latency] * writes, server_cpu_s=server_s, client_cpu_s=client_s)


def test_summary_takes_medians_over_repetitions() -> None:
    s = peers.summarize(
        [cell(100, 1.0, 0.1, 0.05), cell(300, 3.0, 0.3, 0.1), cell(200, 2.0, 0.4, 0.2)]
    )
    assert s.rate == 100.0  # writes/s medians 50, 150, 100
    assert s.p50 == 2.0
    assert s.p99 == 2.0
    assert s.server_ms == pytest.approx(1.0)  # 1.0, 1.0, 2.0 ms per write
    assert s.client_ms == pytest.approx(0.5)  # 0.5, 0.333, 1.0
    assert s.cells == 3
    # A writer inside the server: no client CPU.
    assert math.isnan(peers.summarize([peers.Cell(10, 1.0, [1.0] * 10)]).client_ms)


def rows_of(table: str) -> list[list[str]]:
    lines = table.splitlines()
    assert set(lines[1]) <= {"|", "-"}
    widths = {len(line) for line in lines}
    assert len(widths) == 1  # columns line up
    return [[c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]]


def test_tables() -> None:
    a = peers.summarize([cell(400, 5.0, 2.0, 0.1)])
    b = peers.summarize([cell(1600, 1.0, 0.4, 0.2)])
    results = {("raftlet 4 tablets", 64): a, ("etcd", 64): b}
    table = peers.peers_table(
        [("raftlet 4 tablets", "fsync"), ("etcd", "fsync"), ("missing", "-")], results, [64]
    )
    rows = rows_of(table)
    assert rows[0] == [
        "raftlet 4 tablets",
        "64",
        "200",
        "5.00",
        "5.00",
        "5.000",
        "0.250",
        "0",
        "fsync",
    ]
    assert rows[1][:3] == ["etcd", "64", "800"]
    assert len(rows) == 2
    ratios = rows_of(peers.ratios_table(results, [1, 64], ["raftlet 4 tablets"], ["etcd"]))
    assert ratios == [["64", "raftlet 4 tablets", "etcd", "0.25x", "5.00x", "5.00x", "20.00x"]]
    tablets = rows_of(
        peers.tablets_table([peers.TabletsRow(64, [10.0, 20.0, 30.0], [475, 470, 480], a, 64)])
    )
    assert tablets == [["64", "20.0 / 30.0", "475/470/480", "64", "200", "5.00", "5.00", "5.000"]]


def summary(rate: float, p50: float = 1.0, server_ms: float = 0.1) -> object:
    return peers.Summary(rate, p50, p50, server_ms, 0.0, 0, 1)


def test_issue_targets_are_judged_from_the_medians() -> None:
    results = {
        ("r1", 1): summary(100), ("r1", 16): summary(400), ("r1", 64): summary(500),
        ("r4", 1): summary(800, p50=1.2), ("r4", 16): summary(300),
        ("r4", 64): summary(6000, server_ms=0.5),
        ("etcd", 1): summary(700), ("etcd", 64): summary(5000),
        ("pso", 16): summary(4000), ("pso", 64): summary(4000),
    }  # fmt: skip
    lines = peers.peer_targets(results, one="r1", four="r4", etcd="etcd", pysyncobj="pso")
    assert [line.split(":")[0] for line in lines] == [
        "- met",  # 800 >= 700, 6000 >= 5000
        "- MISSED",  # 300 < 4000 at 16
        "- met",  # p50 1.2 ms
        "- MISSED",  # 0.5 ms per write
        "- MISSED",  # 300 < 400 at 16
    ]
    missing = peers.peer_targets(results, one="r1", four="r4", etcd=None, pysyncobj="pso")
    assert missing[0].startswith("- n/a")
    rows = [
        peers.TabletsRow(1, [1.0, 1.0, 1.0], [30, 30, 30], summary(500), 64),
        peers.TabletsRow(64, [4.0, 6.0, 4.0], [90, 90, 90], summary(600), 64),
    ]
    assert [line.split(":")[0] for line in peers.tablets_targets(rows)] == ["- MISSED", "- met"]
    assert peers.tablets_targets(rows[:1])[0].startswith("- n/a")
