"""Sessions over the batch pipeline, against scripted fake servers: every row sent once, in
batches cut by rows, a full batch sent without waiting for flush(), flush() returning only
when every row has an outcome, and errors in row order."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from raftlet.client.errors import InvalidArgument, RowError, Timeout
from raftlet.client.request_tracker import RequestTracker
from raftlet.client.session import FlushMode, Session
from raftlet.client.write_batch import WriteResult
from raftlet.proto import tablet_pb2
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from tests.unit.client_fakes import SERVERS, FakeCluster, config_pb, make_rpc, ok, rows_in
from tests.waiting import wait_for


def _cluster() -> FakeCluster:
    cluster = FakeCluster()
    for s in cluster.servers.values():
        s.script("write", ok)
    return cluster


def _session(cluster: FakeCluster, mode: FlushMode, **kwargs: object) -> Session:
    return Session(
        make_rpc(cluster),
        RequestTracker(),
        ThreadPoolExecutor(4),
        flush_mode=mode,
        timeout_s=5.0,
        **kwargs,  # type: ignore[arg-type]
    )


def _keys_of(session: Session, tablet: str, n: int) -> list[int]:
    meta = session._rpc.meta
    return [k for k in range(20 * n) if meta.tablet_for("kv", {"key": k}) == tablet][:n]


def test_manual_flush_cuts_batches_and_returns_when_all_are_answered() -> None:
    cluster = _cluster()
    session = _session(cluster, FlushMode.MANUAL_FLUSH, max_batch_rows=100)
    for k in range(450):
        session.insert("kv", {"key": k, "value": "v"})
    session.flush()
    assert session.pending == 0
    sent = [r for _, r in cluster.writes()]
    assert all(rows_in(r) <= 100 for r in sent)
    assert sum(rows_in(r) for r in sent) == 450
    assert len({r.request_id.seq_no for r in sent}) == len(sent)
    assert session.errors() == []
    session.close()


def test_background_sends_a_full_batch_without_flush() -> None:
    cluster = _cluster()
    session = _session(cluster, FlushMode.AUTO_FLUSH_BACKGROUND, max_batch_rows=5)
    for k in _keys_of(session, "kv-p0", 5):
        session.insert("kv", {"key": k, "value": "v"})
    wait_for(lambda: len(cluster.writes()) == 1, what="the full batch sent")
    assert rows_in(cluster.writes()[0][1]) == 5
    session.close()


def test_errors_come_back_in_row_order_whatever_order_batches_finish() -> None:
    cluster = _cluster()

    def refuse_first_row(request: tablet_pb2.WriteRequest) -> tablet_pb2.WriteResponse:
        response = ok(request)
        response.row_errors.add(row_index=0, code=tablet_pb2.RowErrorPB.KEY_EXISTS, message="x")
        return response

    for s in cluster.servers.values():
        s.script("write", refuse_first_row)
    session = _session(
        cluster, FlushMode.AUTO_FLUSH_BACKGROUND, max_batch_rows=3, max_batches_in_flight=4
    )
    for k in range(30):
        session.insert("kv", {"key": k, "value": "v"})
    session.flush()
    errors = session.errors()
    indexes = [e.row_index for e in errors]
    assert indexes == sorted(indexes)
    assert all(isinstance(e, RowError) for e in errors)
    assert len(errors) == len(cluster.writes())  # one refused row per batch
    session.close()


def test_a_sync_write_returns_where_it_landed_and_buffered_ones_none() -> None:
    cluster = _cluster()
    session = _session(cluster, FlushMode.AUTO_FLUSH_SYNC)
    tablet = session._rpc.meta.tablet_for("kv", {"key": 1})
    assert session.insert("kv", {"key": 1, "value": "v"}) == WriteResult(7, 1, tablet)
    buffered = _session(cluster, FlushMode.MANUAL_FLUSH)
    assert buffered.insert("kv", {"key": 2, "value": "v"}) is None
    buffered.close()
    session.close()


def _stuck_cluster() -> tuple[FakeCluster, threading.Event]:
    """Servers whose writes are answered only once the event is set."""
    cluster = FakeCluster()
    release = threading.Event()

    def stuck(request: tablet_pb2.WriteRequest) -> tablet_pb2.WriteResponse:
        release.wait(30)
        return ok(request)

    for s in cluster.servers.values():
        s.script("write", stuck)
    return cluster, release


def test_a_row_refused_for_a_full_buffer_was_never_sent() -> None:
    cluster, release = _stuck_cluster()
    real_time = RealClock()
    session = Session(
        make_rpc(cluster, real_time),  # type: ignore[arg-type]
        RequestTracker(),
        ThreadPoolExecutor(4),
        flush_mode=FlushMode.AUTO_FLUSH_BACKGROUND,
        timeout_s=0.2,
        max_batch_rows=1,
        max_buffered_rows=2,
    )
    try:
        session.insert("kv", {"key": 1, "value": "v"})
        session.insert("kv", {"key": 2, "value": "v"})
        with pytest.raises(Timeout, match="session buffer full") as refused:
            session.insert("kv", {"key": 3, "value": "v"})
        assert refused.value.may_have_applied is False
    finally:
        release.set()
        session.close()
    assert sorted(rows_in(r) for _, r in cluster.writes()) == [1, 1]  # key 3 never went


def test_a_background_session_buffers_rows_up_to_a_byte_budget_too() -> None:
    """Counted by rows alone, a session of 1 MB rows buffered 4 GB before a call blocked."""
    cluster, release = _stuck_cluster()
    session = Session(
        make_rpc(cluster, RealClock()),  # type: ignore[arg-type]
        RequestTracker(),
        ThreadPoolExecutor(4),
        flush_mode=FlushMode.AUTO_FLUSH_BACKGROUND,
        timeout_s=0.2,
        max_batch_bytes=250_000,
        max_buffered_bytes=250_000,
    )
    big = "x" * 100_000
    try:
        session.insert("kv", {"key": 1, "value": big})
        session.insert("kv", {"key": 2, "value": big})
        with pytest.raises(Timeout, match=r"max_buffered_bytes=250000") as refused:
            session.insert("kv", {"key": 3, "value": big})  # a third would pass 250 KB
        assert refused.value.may_have_applied is False
        assert "2 rows of 200" in str(refused.value)
    finally:
        release.set()
        session.close()
    with pytest.raises(InvalidArgument, match="max_buffered_bytes"):
        Session(
            make_rpc(cluster),
            RequestTracker(),
            ThreadPoolExecutor(1),
            max_batch_bytes=1000,
            max_buffered_bytes=999,
        )


class RealClock:
    """``make_rpc``'s clock and sleep, the real ones: the buffer waits on a condition."""

    clock = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)


@pytest.mark.parametrize("mode", [FlushMode.MANUAL_FLUSH, FlushMode.AUTO_FLUSH_BACKGROUND])
def test_flush_waits_for_every_row_after_one_the_client_refused(mode: FlushMode) -> None:
    """A refused row takes an index but is never buffered; flush() waited for as many rows
    as were buffered, so it returned with the last one still out and its error lost."""
    cluster = FakeCluster()
    release = threading.Event()
    held = "kv-p1"

    def answer(request: tablet_pb2.WriteRequest) -> tablet_pb2.WriteResponse:
        response = ok(request)
        if request.tablet_id == held:
            release.wait(30)
            response.row_errors.add(
                row_index=0, code=tablet_pb2.RowErrorPB.KEY_EXISTS, message="exists"
            )
        return response

    for s in cluster.servers.values():
        s.script("write", *[answer] * 4)
    session = Session(
        make_rpc(cluster, RealClock()),  # type: ignore[arg-type]
        RequestTracker(),
        ThreadPoolExecutor(4),
        flush_mode=mode,
        timeout_s=10.0,
    )
    try:
        with pytest.raises(RowError):
            session.insert("kv", {"key": "not an integer", "value": "v"})
        (first,) = _keys_of(session, "kv-p0", 1)
        (last,) = _keys_of(session, held, 1)
        session.insert("kv", {"key": first, "value": "v"})
        session.insert("kv", {"key": last, "value": "v"})
        flushed = threading.Event()
        flusher = threading.Thread(target=lambda: (session.flush(), flushed.set()))
        flusher.start()
        wait_for(
            lambda: any(r.tablet_id == held for _, r in cluster.writes()), what="the held row out"
        )
        assert not flushed.wait(0.3), "flush() returned with a row still out"
        release.set()
        assert flushed.wait(10)
        assert session.pending == 0
        assert [(e.row_index, e.code) for e in session.errors()] == [(2, "KEY_EXISTS")]
    finally:
        release.set()
        session.close()


@pytest.mark.parametrize("port", ["0", "65536", "70000", "131071", "١٢٣"])
def test_a_seed_port_out_of_range_is_refused(port: str) -> None:
    """gRPC takes a port modulo 65536: 70000 quietly reached a server on port 4464."""
    from raftlet.client.client import parse_seeds
    from raftlet.client.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=r"port must be 1 to 65535|is not host:port"):
        parse_seeds(f"127.0.0.1:{port}")
    assert parse_seeds("127.0.0.1:65535, [::1]:1") == ["127.0.0.1:65535", "[::1]:1"]


@pytest.mark.parametrize(
    ("seeds", "said"),
    [
        (["http://127.0.0.1:7051"], "without a scheme"),
        ("grpc://h:1,h:2", "without a scheme"),
        ([7051], "a server address is a string 'host:port', got int 7051"),
        (7051, "server addresses are 'host:port' strings"),
        (b"127.0.0.1:7051", "server addresses are 'host:port' strings"),
    ],
)
def test_a_seed_that_is_no_host_port_is_refused_at_once(seeds: object, said: str) -> None:
    """An http:// seed passed the check, then gRPC retried its name for the whole timeout;
    an int was said to be no address at all (review r33b)."""
    from raftlet.client.client import parse_seeds
    from raftlet.client.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=re.escape(said)):
        parse_seeds(seeds)  # type: ignore[arg-type]


SKV_SCHEMA = Schema(
    [
        ColumnSchema("k", DataType.STRING, is_key=True),
        ColumnSchema("v", DataType.INT64, nullable=True),
    ]
)


def _with_a_string_keyed_table(session: Session) -> None:
    pb = config_pb()
    pb.tables.add(name="skv", schema=SKV_SCHEMA.to_pb(), num_partitions=1, replication_factor=3)
    pb.tablets.add(tablet_id="skv-p0", table_name="skv", partition=0, replica_uuids=list(SERVERS))
    session._rpc.meta.install(pb)


@pytest.mark.parametrize("packed_rows", [True, False])
@pytest.mark.parametrize("mode", list(FlushMode))
def test_a_key_over_the_limit_is_refused_at_once_in_either_row_form(
    mode: FlushMode, packed_rows: bool
) -> None:
    """With packed rows (the default) a 20,000-byte key was sent, and in the buffered modes
    its error only showed up later in errors(); per-cell rows were refused at once."""
    cluster = _cluster()
    session = _session(cluster, mode, packed_rows=packed_rows)
    _with_a_string_keyed_table(session)
    try:
        with pytest.raises(RowError) as refused:
            session.insert("skv", {"k": "x" * 20_000, "v": 1})
        assert refused.value.code == "INVALID_ROW"
        assert refused.value.message == "the key is 20000 bytes, over the 16384-byte limit"
        assert refused.value.row_index == 0
        session.insert("skv", {"k": "x" * 100, "v": 1})
        session.flush()
        assert session.errors() == []
        assert sum(rows_in(r, SKV_SCHEMA) for _, r in cluster.writes()) == 1
    finally:
        session.close()


@pytest.mark.parametrize("row", [None, [1, 2], "key", 5])
def test_a_row_that_is_not_a_mapping_is_an_invalid_argument(row: object) -> None:
    """dict(row) raised a bare TypeError ("'NoneType' object is not iterable")."""
    cluster = _cluster()
    session = _session(cluster, FlushMode.AUTO_FLUSH_SYNC)
    try:
        with pytest.raises(InvalidArgument, match=r"a row is a mapping of column name to value"):
            session.insert("kv", row)  # type: ignore[arg-type]
        # Refused before it took an operation index (as an unknown table is).
        with pytest.raises(RowError) as next_row:
            session.insert("kv", {"key": "not an integer"})
        assert next_row.value.row_index == 0
    finally:
        session.close()
