"""The client library against a real 3-server cluster (one cluster for the whole module).

Each test writes its own key range (``BASE_*``) and reads back only that range, so tests do
not see each other's rows. Tests that kill a server restart it afterwards (the ``healed``
fixture) and wait for every tablet to have a leader again.

The tests may import ``tserver`` (to compare the client's routing with the server's own
placement); the client itself never does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlet.client import (
    Client,
    FlushMode,
    InvalidArgument,
    Predicate,
    ReadMode,
    RowError,
    RowFormat,
    Timeout,
)
from raftlet.proto import admin_pb2, tablet_pb2
from tests.integration.tserver_cluster import (
    TserverCluster,
    free_ports,
    running_cluster,
    wait_for,
)

pytestmark = pytest.mark.integration

PARTITIONS = 3
# Bound on how late a Timeout may come: the deadline plus scheduling noise on 2 shared cores
# (a bound the client must keep, not a performance claim).
SLACK_S = 0.75


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TserverCluster]:
    with running_cluster(tmp_path_factory.mktemp("client"), partitions=PARTITIONS) as c:
        c.wait_leaders()
        yield c


@pytest.fixture
def healed(cluster: TserverCluster) -> Iterator[TserverCluster]:
    """The cluster, with every server running again after the test."""
    yield cluster
    for server in cluster.servers.values():
        if not server.alive:
            server.start()
    cluster.wait_leaders()


def addresses(cluster: TserverCluster) -> list[str]:
    return [s.rpc_addr for s in cluster.config.servers]


@pytest.fixture
def client(cluster: TserverCluster) -> Iterator[Client]:
    with Client(addresses(cluster), timeout_s=30.0) as c:
        yield c


def key_range(lo: int, hi: int) -> Predicate:
    return Predicate.range("key", lower=lo, upper=hi)


def scan_range(client: Client, lo: int, hi: int, **kwargs: Any) -> dict[int, Any]:
    """{key: value} of keys in [lo, hi), failing on a key returned twice."""
    out: dict[int, Any] = {}
    for row in client.scan("kv", predicates=[key_range(lo, hi)], **kwargs):
        key = row["key"]
        assert isinstance(key, int)
        assert key not in out, f"key {key} scanned twice"
        out[key] = row["value"]
    return out


def keys_of_tablet(client: Client, tablet_id: str, start: int, n: int) -> list[int]:
    keys: list[int] = []
    k = start
    while len(keys) < n:
        if client.tablet_for("kv", {"key": k}) == tablet_id:
            keys.append(k)
        k += 1
    return keys


# --- flush modes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "base", "n"),
    [
        (FlushMode.AUTO_FLUSH_SYNC, 100_000, 30),
        (FlushMode.AUTO_FLUSH_BACKGROUND, 110_000, 400),
        (FlushMode.MANUAL_FLUSH, 120_000, 400),
    ],
)
def test_every_flush_mode_round_trips(client: Client, mode: FlushMode, base: int, n: int) -> None:
    """Inserts, then updates, upserts and deletes some, in one session; a scan shows exactly
    the resulting rows."""
    expected: dict[int, str | None] = {base + i: f"v{i}" for i in range(n)}
    with client.new_session(mode, max_batch_rows=64, flush_interval_s=0.02) as session:
        for k, v in expected.items():
            session.insert("kv", {"key": k, "value": v})
        session.flush()
        for k in list(expected)[::3]:
            session.update("kv", {"key": k, "value": "updated"})
            expected[k] = "updated"
        for k in list(expected)[1::5]:
            session.delete("kv", {"key": k})
            del expected[k]
        session.upsert("kv", {"key": base + n, "value": None})
        expected[base + n] = None
    assert session.errors() == []
    assert scan_range(client, base, base + n + 1, batch_size_rows=37) == expected
    stats = client.stats
    assert stats.errors_by_cause == {}
    assert stats.rows_acked >= len(expected)


# --- routing -----------------------------------------------------------------------------------


def test_routing_equals_server_placement(client: Client, cluster: TserverCluster) -> None:
    """For many keys, the client's tablet is the tablet whose leader actually stores the row
    (read from each leader's replica), and the tablets' replicas are the server config's
    placement."""
    base, n = 200_000, 300
    with client.new_session(FlushMode.MANUAL_FLUSH) as session:
        for k in range(base, base + n):
            session.insert("kv", {"key": k, "value": "r"})
    assert session.errors() == []

    placement = {p.tablet_id: p.replicas for p in cluster.config.placements()}
    assert {t: client.replicas(t) for t in client.tablets("kv")} == placement

    stored_in: dict[int, str] = {}
    for tablet_id in client.tablets("kv"):
        leader = cluster.leader_of(tablet_id)
        # A leader read: it waits for what was acknowledged, whose store transaction may
        # commit just after its answer.
        for key in leader.scan_rows(tablet_id, read_mode=tablet_pb2.READ_LEADER_LATEST):
            if base <= key < base + n:
                assert key not in stored_in, f"key {key} in {stored_in[key]} and {tablet_id}"
                stored_in[key] = tablet_id
    assert len(stored_in) == n
    for k in range(base, base + n):
        routed = client.tablet_for("kv", {"key": k})
        assert routed == stored_in[k] == cluster.tablet_for_key(k), k
    # Every tablet got some of the keys: the check above is not vacuous.
    assert set(stored_in.values()) == set(placement)


# --- errors ------------------------------------------------------------------------------------


def test_row_error_carries_the_row_index(client: Client) -> None:
    base = 300_000
    with client.new_session(FlushMode.MANUAL_FLUSH) as session:
        session.insert("kv", {"key": base + 7, "value": "first"})
        session.flush()
        assert session.errors() == []
        # Operations 1..10 of this session; operation 8 re-inserts key base+7.
        for i in range(10):
            session.insert("kv", {"key": base + i, "value": f"again{i}"})
        session.flush()
        (err,) = session.errors()
    assert isinstance(err, RowError)
    assert (err.row_index, err.code) == (8, "KEY_EXISTS")
    assert err.row == {"key": base + 7, "value": "again7"}
    assert err.tablet_id == client.tablet_for("kv", {"key": base + 7})
    assert str(err).startswith(f"row 8 of table 'kv' on tablet {err.tablet_id}: KEY_EXISTS")
    # The other rows of the batch were applied, the refused one kept its first value.
    rows = scan_range(client, base, base + 10)
    assert rows == {base + i: ("first" if i == 7 else f"again{i}") for i in range(10)}

    # AUTO_FLUSH_SYNC raises it; a row the client can refuse by itself never leaves.
    with client.new_session() as session:
        session.insert("kv", {"key": base + 100, "value": "x"})
        with pytest.raises(RowError) as info:
            session.insert("kv", {"key": base + 100, "value": "y"})
        assert (info.value.row_index, info.value.code) == (1, "KEY_EXISTS")
        with pytest.raises(RowError) as info:
            session.insert("kv", {"key": base + 101, "nope": 1})
        assert (info.value.row_index, info.value.code) == (2, "UNKNOWN_COLUMN")
    with pytest.raises(InvalidArgument, match="unknown table 'nope'"):
        client.new_session().insert("nope", {"key": 1})
    assert client.stats.errors_by_cause == {"KEY_EXISTS": 2, "UNKNOWN_COLUMN": 1}


# --- leadership changes ------------------------------------------------------------------------


def test_not_leader_after_step_down_is_retried_transparently(
    client: Client, healed: TserverCluster
) -> None:
    cluster = healed
    base = 400_000
    tablet = client.tablet_for("kv", {"key": base})
    k1, k2, k3 = keys_of_tablet(client, tablet, base, 3)
    with client.new_session() as session:
        session.insert("kv", {"key": k1, "value": "before"})
        old = client.leader_of(tablet)
        assert old is not None
        # Step down behind the client's back (raw admin RPC), so its cached leader is stale.
        target = next(r for r in client.replicas(tablet) if r != old)
        cluster.servers[old].admin.LeaderStepDown(
            admin_pb2.LeaderStepDownRequest(tablet_id=tablet, new_leader_uuid=target),
            timeout=10,
        )
        new = cluster.new_leader_of(tablet, old)
        before = client.stats.retries_by_cause.get("NOT_LEADER", 0)
        session.insert("kv", {"key": k2, "value": "after"})  # no exception: retried
        assert client.stats.retries_by_cause.get("NOT_LEADER", 0) > before
        assert client.leader_of(tablet) == new.id  # learned from the hint (or a lookup)

        # The client's own step-down: the next write finds whoever leads next.
        stepped = client.leader_step_down(tablet)
        assert stepped == new.id
        cluster.new_leader_of(tablet, new.id)
        session.insert("kv", {"key": k3, "value": "again"})
    assert scan_range(client, base, k3 + 1) == {k1: "before", k2: "after", k3: "again"}


def test_failover_during_background_flush_loses_and_duplicates_nothing(
    client: Client, healed: TserverCluster
) -> None:
    """A background session streams unique keys while the leader of a tablet is SIGKILLed.
    Every key written is there once; no write met KEY_EXISTS (which a retry applied twice
    would cause) and none failed."""
    cluster = healed
    base = 500_000
    tablet = client.tablet_for("kv", {"key": base})
    victim = cluster.leader_of(tablet)
    written: list[int] = []
    stop = threading.Event()
    failure: list[BaseException] = []
    session = client.new_session(
        FlushMode.AUTO_FLUSH_BACKGROUND, timeout_s=60.0, max_batch_rows=50, flush_interval_s=0.02
    )

    def stream() -> None:
        try:
            i = 0
            while not stop.is_set():
                session.insert("kv", {"key": base + i, "value": f"s{i}"})
                written.append(base + i)
                i += 1
        except BaseException as e:
            failure.append(e)

    writer = threading.Thread(target=stream, name="bg-writer")
    writer.start()
    try:
        wait_for(lambda: client.stats.rows_acked >= 300 or bool(failure), 30, "300 rows acked")
        victim.kill()
        new = cluster.new_leader_of(tablet, victim.id)
        # Keep streaming until the new leader of the victim's tablet has taken writes.
        acked = client.stats.rows_acked
        wait_for(lambda: client.stats.rows_acked >= acked + 300 or bool(failure), 30, "more rows")
        wait_for(lambda: client.leader_of(tablet) == new.id or bool(failure), 30, "leader learned")
    finally:
        stop.set()
        writer.join(30)
    assert not failure, failure
    session.close()
    errors = session.errors()
    assert errors == [], errors[:5]
    rows = scan_range(client, base, base + len(written))
    assert sorted(rows) == written  # none lost; scan_range fails on a duplicate
    assert all(rows[k] == f"s{k - base}" for k in written)
    stats = client.stats
    assert stats.errors_by_cause == {}
    retried = stats.retries_by_cause
    assert retried.get("UNAVAILABLE", 0) + retried.get("NOT_LEADER", 0) > 0, retried


def test_a_sync_write_says_where_it_is_in_the_log(client: Client) -> None:
    base = 950_000
    tablet = client.tablet_for("kv", {"key": base})
    keys = keys_of_tablet(client, tablet, base, 2)
    with client.new_session() as session:
        first = session.insert("kv", {"key": keys[0], "value": "a"})
        second = session.insert("kv", {"key": keys[1], "value": "b"})
    assert first is not None
    assert second is not None
    assert second.op_index > first.op_index > 0
    assert second.op_term >= first.op_term >= 1


def test_a_scan_that_fixes_the_key_visits_only_its_tablets(client: Client) -> None:
    base = 900_000
    with client.new_session(FlushMode.MANUAL_FLUSH) as session:
        for k in range(base, base + 30):
            session.insert("kv", {"key": k, "value": str(k)})
    point = client.scan("kv", predicates=[Predicate.equals("key", base + 7)])
    assert list(point) == [{"key": base + 7, "value": str(base + 7)}]
    assert point.pages == 1  # one tablet asked, not all of them
    keys = [base + 1, base + 2, base + 29]
    few = client.scan("kv", predicates=[Predicate.in_list("key", keys)])
    assert sorted(r["key"] for r in few) == keys
    assert few.pages == len({client.tablet_for("kv", {"key": k}) for k in keys})
    every = client.scan("kv", predicates=[Predicate.range("key", base, base + 30)])
    assert len(list(every)) == 30
    assert every.pages >= PARTITIONS  # no key fixed: every tablet


def test_scan_pages_and_fails_over(client: Client, healed: TserverCluster) -> None:
    """A leader-latest scan with small pages; the server it reads from is killed mid-scan;
    the scan continues on the new leader from its resume key: every row once."""
    cluster = healed
    base = 600_000
    tablet = client.tablet_for("kv", {"key": base})
    keys = keys_of_tablet(client, tablet, base, 120)
    with client.new_session(FlushMode.MANUAL_FLUSH) as session:
        for k in keys:
            session.insert("kv", {"key": k, "value": str(k)})
    assert session.errors() == []

    scanner = client.scan_tablet(
        tablet, predicates=[key_range(base, keys[-1] + 1)], batch_size_rows=20
    )
    seen = [next(scanner) for _ in range(30)]  # two pages in
    assert scanner.pages == 2
    reading = scanner.current_server
    assert reading is not None
    cluster.servers[reading].kill()
    seen.extend(scanner)
    got = [r["key"] for r in seen]
    assert got == keys  # all, in key order, none twice
    assert scanner.failovers >= 1
    assert scanner.current_server not in (None, reading)  # the last page, from another
    assert scanner.pages >= len(keys) // 20
    # Follower reads work too, and a limit bounds the whole scan.
    follower_rows = list(
        client.scan(
            "kv",
            predicates=[key_range(base, keys[-1] + 1)],
            read_mode=ReadMode.FOLLOWER_APPLIED,
            limit=50,
            batch_size_rows=7,
        )
    )
    assert len(follower_rows) == 50


def test_packed_and_cell_scans_return_the_same_rows(client: Client) -> None:
    """Through every tablet, with NULLs, empty, non-ASCII and long values, small pages cut
    by bytes or rows, a projection and a limit: the same rows in both forms."""
    base = 650_000
    values = [None, "", "plain", "ünïcødé ✓", "\U0001f600" * 50, "x" * 5000]
    expected = {base + i: values[i % len(values)] for i in range(300)}
    with client.new_session(FlushMode.MANUAL_FLUSH) as session:
        for k, v in expected.items():
            session.insert("kv", {"key": k, "value": v})
    assert session.errors() == []
    pages: dict[RowFormat, int] = {}
    whole: dict[RowFormat, list[dict[str, Any]]] = {}
    for fmt in RowFormat:
        for kwargs in ({}, {"batch_size_bytes": 2000}, {"batch_size_rows": 7}):
            scanner = client.scan(
                "kv", predicates=[key_range(base, base + 300)], row_format=fmt, **kwargs
            )
            rows = list(scanner)
            assert {r["key"]: r["value"] for r in rows} == expected, (fmt, kwargs)
            assert len(rows) == len(expected)
            if kwargs.get("batch_size_bytes"):
                pages[fmt] = scanner.pages
            whole.setdefault(fmt, rows)
    assert whole[RowFormat.PACKED] == whole[RowFormat.CELLS]  # in the same order, too
    assert pages[RowFormat.PACKED] > PARTITIONS  # the byte budget cut pages
    assert pages[RowFormat.CELLS] > PARTITIONS
    projected = {
        fmt: list(
            client.scan(
                "kv",
                projection=["value", "key"],
                predicates=[key_range(base, base + 300), Predicate.is_not_null("value")],
                limit=100,
                row_format=fmt,
            )
        )
        for fmt in RowFormat
    }
    assert projected[RowFormat.PACKED] == projected[RowFormat.CELLS]
    assert len(projected[RowFormat.PACKED]) == 100
    assert [list(r) for r in projected[RowFormat.PACKED]] == [["value", "key"]] * 100


# --- channels ----------------------------------------------------------------------------------


def test_one_channel_per_server(cluster: TserverCluster) -> None:
    """Many sessions, modes, scans and admin calls later, one channel per server."""
    base = 700_000
    with Client.from_config(cluster.path) as client:
        assert sorted(client.seeds) == sorted(addresses(cluster))
        sessions = [client.new_session(mode) for mode in FlushMode for _ in range(3)]
        for i, session in enumerate(sessions):
            for j in range(20):
                session.insert("kv", {"key": base + 100 * i + j, "value": "c"})
        for session in sessions:
            session.close()
            assert session.errors() == []
        assert len(scan_range(client, base, base + 10_000)) == 20 * len(sessions)
        for tablet in client.tablets("kv"):
            assert client.leader_of(tablet, refresh=True) is not None
            list(client.scan_tablet(tablet, read_mode=ReadMode.FOLLOWER_APPLIED, limit=5))
        assert len(client.list_tablets()) == 3
        stats = client.stats
        assert stats.channels_created == len(cluster.servers) == 3
        assert stats.writes_acked >= len(sessions)


# --- timeouts ----------------------------------------------------------------------------------


def test_timeout_is_raised_in_bounded_time(client: Client, cluster: TserverCluster) -> None:
    """Every server makes each log sync take 0.5 s, so no write can be acknowledged within a
    0.2 s deadline: Timeout, within the deadline plus slack."""
    old = {}
    for sid, server in cluster.servers.items():
        resp = server.admin.SetFlag(
            admin_pb2.SetFlagRequest(name="log_inject_latency_ms", value="500"), timeout=10
        )
        old[sid] = resp.old_value
    try:
        session = client.new_session(timeout_s=0.2)
        start = time.monotonic()
        with pytest.raises(Timeout) as info:
            session.insert("kv", {"key": 800_000, "value": "slow"})
        elapsed = time.monotonic() - start
    finally:
        for sid, server in cluster.servers.items():
            server.admin.SetFlag(
                admin_pb2.SetFlagRequest(name="log_inject_latency_ms", value=old[sid]),
                timeout=10,
            )
    assert elapsed < 0.2 + SLACK_S, elapsed
    assert "timed out after 0.2 s" in str(info.value)
    # It reached the logs: the caller is told it may be there.
    assert info.value.may_have_applied is True
    assert str(info.value).endswith("; its outcome is unknown: it may have been applied")
    assert info.value.row_index == 0


def test_no_server_answers_construction_times_out() -> None:
    (port,) = free_ports(1)
    start = time.monotonic()
    with pytest.raises(Timeout, match="fetching the cluster config"):
        Client([f"127.0.0.1:{port}"], timeout_s=0.5)
    assert time.monotonic() - start < 0.5 + SLACK_S


def test_bad_addresses_are_invalid_arguments(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="not host:port"):
        Client(["localhost"])
    with pytest.raises(InvalidArgument, match="no server address"):
        Client([])
    bad = tmp_path / "c.toml"
    bad.write_text("[cluster]\nname = 'x'\n")
    # Read by raftlet.cluster, as the servers read it: its message, naming the file.
    with pytest.raises(InvalidArgument, match=r"c\.toml: servers: missing \(expected an array"):
        Client.from_config(bad)
