"""Inputs that used to break scans, and request records that used to grow without bound,
against a real 3-server cluster (one for the module, one tablet).

- A tablet of 20 rows of 1 MiB is scanned without a limit, in pages bounded in bytes, in
  both row forms, through ``Client.scan`` and ``raftlet scan``; a client whose message limit
  is below one row gets one clear ``MessageTooLarge``, not a minute of overload retries.
- 2000 predicates, a limit of 2**63-1 and other malformed requests are INVALID_ARGUMENT.
- Thousands of client ids leave at most ``--result_tracker_max_clients`` remembered on any
  server (the eviction metric counts the rest), and a retry of a request whose client was
  evicted is still answered once, from the store's records, not applied again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftlet.client import Client, MessageTooLarge, RowFormat
from raftlet.client.channels import channel_options
from raftlet.proto import tablet_pb2
from raftlet.schema.predicates import Predicate
from raftlet.schema.rows import OpType, encode_row_op
from raftlet.schema.scan_bounds import MAX_PREDICATES
from raftlet.tserver.result_tracker import MAX_CLIENT_ID_BYTES
from tests.integration.tserver_cluster import (
    KV_SCHEMA,
    TserverCluster,
    kv_op,
    running_cluster,
    wait_for,
    write_request,
    write_with_retry,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TABLET = "kv-p0"
MAX_TRACKED = 50
BIG_ROWS = 20
MiB = 1 << 20
# The big rows' keys: far from the keys the exactly-once test writes.
BIG_BASE = 1_000_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TserverCluster]:
    with running_cluster(
        tmp_path_factory.mktemp("scan_guards"),
        partitions=1,
        flags=["--result_tracker_max_clients", str(MAX_TRACKED)],
    ) as c:
        c.wait_leaders()
        for i in range(BIG_ROWS):
            value = chr(ord("a") + i) * MiB
            write_with_retry(c, write_request(TABLET, [kv_op(BIG_BASE + i, value)], "big", i + 1))
        yield c


def addresses(cluster: TserverCluster) -> list[str]:
    return [s.rpc_addr for s in cluster.config.servers]


def _big(rows: dict[int, object]) -> None:
    assert sorted(rows) == [BIG_BASE + i for i in range(BIG_ROWS)]
    for i in range(BIG_ROWS):
        assert rows[BIG_BASE + i] == chr(ord("a") + i) * MiB


@pytest.mark.parametrize("row_format", [RowFormat.PACKED, RowFormat.CELLS])
def test_big_rows_are_scanned_without_a_limit_in_pages(
    cluster: TserverCluster, row_format: RowFormat
) -> None:
    big_only = [Predicate.range("key", lower=BIG_BASE)]
    with Client(addresses(cluster), timeout_s=30) as client:
        scan = client.scan("kv", predicates=big_only, row_format=row_format)
        _big({r["key"]: r["value"] for r in scan})  # type: ignore[misc]
        # The server's 1 MiB page budget: a row that reaches it ends its page.
        assert scan.pages >= BIG_ROWS
        # A page budget a request asks for is honoured too: 4 MiB is about 4 rows a page.
        scan = client.scan(
            "kv", predicates=big_only, row_format=row_format, batch_size_bytes=4 * MiB
        )
        _big({r["key"]: r["value"] for r in scan})  # type: ignore[misc]
        assert BIG_ROWS // 4 <= scan.pages < BIG_ROWS
        assert "RESOURCE_EXHAUSTED" not in client.stats.retries_by_cause


def test_the_cli_scans_big_rows_without_a_limit(cluster: TserverCluster) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTLET_CLUSTER", "RAFTLET_SERVERS")}
    proc = subprocess.run(
        [sys.executable, "-m", "raftlet", "scan", "kv", "--servers", ",".join(addresses(cluster)),
         "--where", f"key >= {BIG_BASE}", "--format", "json"],
        capture_output=True, text=True, timeout=120, cwd=REPO, env={**env, "NO_COLOR": "1"},
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    _big({r["key"]: r["value"] for r in rows})


@pytest.mark.parametrize("row_format", [RowFormat.PACKED, RowFormat.CELLS])
def test_a_row_near_the_message_limit_after_smaller_ones_is_scanned(
    cluster: TserverCluster, row_format: RowFormat
) -> None:
    # The last two 1 MiB rows, then one of 15 MiB: a page that ended with the row that
    # reaches its 3 MiB budget would carry 17 MiB, over what gRPC lets a response carry,
    # and every scan of the tablet failed on it until the row was deleted.
    huge_key, huge = BIG_BASE + BIG_ROWS, "z" * (15 * MiB)
    seq = 100 + int(row_format)
    write_with_retry(cluster, write_request(TABLET, [kv_op(huge_key, huge)], "huge", seq))
    try:
        with Client(addresses(cluster), timeout_s=30) as client:
            scan = client.scan(
                "kv",
                predicates=[Predicate.range("key", lower=huge_key - 2)],
                row_format=row_format,
                batch_size_bytes=3 * MiB,
            )
            rows = {r["key"]: r["value"] for r in scan}
        assert sorted(rows) == [huge_key - 2, huge_key - 1, huge_key]
        assert rows[huge_key] == huge
        assert scan.pages == 2  # the huge row begins a page of its own
    finally:
        gone = encode_row_op(KV_SCHEMA, OpType.DELETE, {"key": huge_key})
        write_with_retry(cluster, write_request(TABLET, [gone], "huge", seq + 10))


def test_a_row_over_the_clients_message_limit_is_one_clear_error(cluster: TserverCluster) -> None:
    small = channel_options(max_message_bytes=MiB // 2)
    with Client(addresses(cluster), timeout_s=30, channel_options=small) as client:
        scan = client.scan("kv", predicates=[Predicate.equals("key", BIG_BASE)])
        with pytest.raises(MessageTooLarge, match=f"over the gRPC message limit of {MiB // 2}"):
            list(scan)
        assert scan.pages == 0
        # Not taken for overload: no retry, no backoff (before, 74 retries to the deadline).
        retried = client.stats.retries_by_cause
        assert "RESOURCE_EXHAUSTED" not in retried
        assert "MESSAGE_TOO_LARGE" not in retried


ANY_REPLICA: dict[str, Any] = {
    "tablet_id": TABLET,
    "read_mode": tablet_pb2.READ_FOLLOWER_APPLIED,  # a follower looks at the projection too
}


def test_malformed_scans_are_invalid_argument(cluster: TserverCluster) -> None:
    leader = cluster.leader_of(TABLET)
    key = Predicate.range("key", 0, 10).to_pb(KV_SCHEMA)
    cases = [
        (tablet_pb2.ScanRequest(tablet_id=TABLET, predicates=[key] * 2000), "2000 predicates"),
        (tablet_pb2.ScanRequest(tablet_id=TABLET, limit=2**63 - 1), "limit 9223372036854775807"),
        (tablet_pb2.ScanRequest(tablet_id=TABLET, limit=2**64 - 1), "out of range"),
        (tablet_pb2.ScanRequest(tablet_id=TABLET, read_mode=9), "unknown read mode 9"),  # type: ignore[arg-type]
        (tablet_pb2.ScanRequest(tablet_id=TABLET, min_applied_index=2**64 - 1), "Raft index"),
        # Echoed in the error, a 20,000-character name once pushed the call's trailers past
        # what a client takes (RESOURCE_EXHAUSTED instead of the error): cut short now.
        (tablet_pb2.ScanRequest(projection=["c" * 20_000], **ANY_REPLICA), "cut: the"),
        (tablet_pb2.ScanRequest(projection=["é" * 20_000], **ANY_REPLICA), "cut: the"),
    ]
    for request, words in cases:
        for server in (leader, *[s for s in cluster.servers.values() if s is not leader]):
            with pytest.raises(grpc.RpcError) as info:
                server.tablet.Scan(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
            assert words in info.value.details()
    # At the bound it runs.
    page = leader.tablet.Scan(
        tablet_pb2.ScanRequest(tablet_id=TABLET, predicates=[key] * MAX_PREDICATES), timeout=10
    )
    assert not page.has_more
    for s in cluster.servers.values():
        assert s.alive


def test_thousands_of_clients_stay_bounded_and_retries_stay_exactly_once(
    cluster: TserverCluster,
) -> None:
    n = 2000
    first = None
    for i in range(n):
        result = write_with_retry(
            cluster, write_request(TABLET, [kv_op(i, f"v{i}")], f"client-{i}", 1)
        )
        first = first or result.response
        assert list(result.response.row_errors) == []
    servers = list(cluster.servers.values())

    def bounded() -> bool:
        return all(s.metric("result_tracker_clients") <= MAX_TRACKED for s in servers)

    wait_for(bounded, what="every replica's result tracker within its bound")
    # Every replica completes every write, so each evicted all but the last few clients.
    for s in servers:
        wait_for(
            lambda s=s: s.metric("result_tracker_evictions_total") >= n - MAX_TRACKED,
            what=f"{s.id} evicts",
        )
    # client-0 was evicted long ago. Sent again as a first attempt, it is not looked up
    # at admission: it is proposed, and the apply stage finds its record and answers with
    # the original outcome without applying it (a second INSERT would be KEY_EXISTS).
    again = write_with_retry(cluster, write_request(TABLET, [kv_op(0, "v0")], "client-0", 1))
    assert first is not None
    assert (again.response.op_index, again.response.op_term) == (first.op_index, first.op_term)
    assert list(again.response.row_errors) == []
    # client-1, evicted too, retried (attempt_no 1): answered at admission from the store's
    # record; client-1999, recent, from the tracker's memory. Both count as replays.
    for i in (1, n - 1):
        retry = write_request(TABLET, [kv_op(i, f"v{i}")], f"client-{i}", 1)
        retry.request_id.attempt_no = 1
        leader = cluster.leader_of(TABLET)
        replays = leader.metric("result_tracker_replays_total")
        try:
            response = leader.tablet.Write(retry, timeout=10)
        except grpc.RpcError as e:  # the leader moved meanwhile: the apply path answers
            moved = e.code()
            response = write_with_retry(cluster, retry).response
            assert moved == grpc.StatusCode.FAILED_PRECONDITION
        else:
            assert leader.metric("result_tracker_replays_total") == replays + 1
        assert list(response.row_errors) == []
    # Each key holds its value once, on every replica.
    expected: dict[int, object] = {i: f"v{i}" for i in range(n)}
    expected.update({BIG_BASE + i: chr(ord("a") + i) * MiB for i in range(BIG_ROWS)})
    cluster.wait_converged(TABLET, expected, timeout=60)
    for s in servers:
        (status,) = [t for t in s.tablets_json() if t["tablet_id"] == TABLET]
        assert status["tracked_clients"] <= MAX_TRACKED


def test_client_ids_that_are_reserved_or_too_long_are_refused(cluster: TserverCluster) -> None:
    """The replica names a write without a request id ``~anonymous-N``; a client id of that
    form was once taken as one of those, and its write acknowledged without being applied.
    Ids are bounded too: every replica keeps them in memory and in its request records."""
    leader = cluster.leader_of(TABLET)
    for client_id, words in (
        ("~anonymous-1", "reserved"),
        ("x" * (MAX_CLIENT_ID_BYTES + 1), f"longer than {MAX_CLIENT_ID_BYTES} bytes"),
    ):
        with pytest.raises(grpc.RpcError) as info:
            leader.tablet.Write(
                write_request(TABLET, [kv_op(3_000_000, "no")], client_id, 0), timeout=10
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert words in info.value.details()
    # At the bound it is taken.
    ok = write_with_retry(
        cluster,
        write_request(TABLET, [kv_op(3_000_001, "ok")], "y" * MAX_CLIENT_ID_BYTES, 0),
    )
    assert list(ok.response.row_errors) == []
