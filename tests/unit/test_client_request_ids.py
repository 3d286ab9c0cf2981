"""Request-id bookkeeping and routing of writes, against scripted fake servers.

The exactly-once contract on the client side: one seq_no per write RPC, the same
(client_id, seq_no) on every retry wherever it goes, attempt_no counting the retries, and
first_incomplete_seq_no never passing a request still outstanding.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from raftlet.client.errors import (
    InvalidArgument,
    NotLeader,
    RemoteError,
    RowError,
    ServerTooBusy,
    TabletNotFound,
    Timeout,
)
from raftlet.client.request_tracker import RequestTracker
from raftlet.client.session import FlushMode, Session
from raftlet.proto import tablet_pb2
from tests.unit.client_fakes import (
    FakeClock,
    FakeCluster,
    FakeRpcError,
    leadership_lost,
    make_rpc,
    not_leader,
    ok,
    queue_full,
    rows_in,
    stream_refused,
    unavailable,
)


def test_seq_nos_increase_and_first_incomplete_is_the_lowest_outstanding() -> None:
    t = RequestTracker()
    assert t.first_incomplete_seq_no() == 1
    a, b, c = t.new_seq_no(), t.new_seq_no(), t.new_seq_no()
    assert (a, b, c) == (1, 2, 3)
    assert t.first_incomplete_seq_no() == 1
    t.complete(b)  # completing a later one does not move it
    assert t.first_incomplete_seq_no() == 1
    t.complete(a)
    assert t.first_incomplete_seq_no() == 3
    t.complete(c)
    assert t.first_incomplete_seq_no() == 4  # none outstanding: the next one
    assert t.new_seq_no() == 4
    assert t.outstanding() == 1


def test_first_incomplete_never_passes_an_outstanding_request_under_concurrency() -> None:
    t = RequestTracker("fixed-id")
    assert t.client_id == "fixed-id"
    violations: list[str] = []
    seen_firsts: list[int] = []

    def worker() -> None:
        for _ in range(500):
            seq = t.new_seq_no()
            first = t.first_incomplete_seq_no()
            if first > seq:
                violations.append(f"first {first} > outstanding {seq}")
            seen_firsts.append(first)
            t.complete(seq)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert violations == []
    assert t.outstanding() == 0
    assert t.first_incomplete_seq_no() == 2001


def test_client_ids_are_unique_per_tracker() -> None:
    assert RequestTracker().client_id != RequestTracker().client_id


def _session(
    cluster: FakeCluster, mode: FlushMode = FlushMode.AUTO_FLUSH_SYNC, timeout_s: float = 5.0
) -> tuple[Session, RequestTracker, FakeClock]:
    clock = FakeClock()
    rpc = make_rpc(cluster, clock)
    tracker = RequestTracker()
    session = Session(rpc, tracker, ThreadPoolExecutor(2), flush_mode=mode, timeout_s=timeout_s)
    return session, tracker, clock


def _cache_leader(session: Session, server: str) -> None:
    """The client takes ``server`` for the leader of both tablets, as after a look-up."""
    for tablet in ("kv-p0", "kv-p1"):
        session._rpc.meta.set_leader(tablet, server)


def test_a_retried_write_keeps_its_request_id_across_servers() -> None:
    """ts1 (cached leader) says NOT_LEADER → ts2; ts2 is full, then unreachable → ts3
    succeeds. One seq_no throughout; attempt_no 0, 1, 2, 3."""
    cluster = FakeCluster()
    cluster.servers["ts1"].script("write", not_leader("ts2"))
    cluster.servers["ts2"].script("write", queue_full(), unavailable())
    cluster.servers["ts3"].script("write", ok)
    session, tracker, _ = _session(cluster)
    _cache_leader(session, "ts1")

    session.insert("kv", {"key": 1, "value": "a"})

    sent = cluster.writes()
    order = {"ts1": 0, "ts2": 1, "ts3": 2}
    sent.sort(key=lambda x: (order[x[0]], x[1].request_id.attempt_no))
    assert [s for s, _ in sent] == ["ts1", "ts2", "ts2", "ts3"]
    ids = {(r.request_id.client_id, r.request_id.seq_no) for _, r in sent}
    assert ids == {(tracker.client_id, 1)}
    assert [r.request_id.attempt_no for _, r in sent] == [0, 1, 2, 3]
    assert all(r.request_id.first_incomplete_seq_no == 1 for _, r in sent)
    stats = session._rpc.stats.snapshot()
    assert stats.retries_by_cause == {"NOT_LEADER": 1, "RESOURCE_EXHAUSTED": 1, "UNAVAILABLE": 1}
    # The next write is a new request and goes straight to the leader that answered.
    session.insert("kv", {"key": 2, "value": "b"})
    last = cluster.servers["ts3"].requests["write"][-1]
    assert (last.request_id.seq_no, last.request_id.attempt_no) == (2, 0)
    assert last.request_id.first_incomplete_seq_no == 2
    assert tracker.outstanding() == 0


def test_a_write_whose_leader_stepped_down_goes_to_the_next_leader_with_its_request_id() -> None:
    """ts1 stepped down with the write in flight (LEADERSHIP_LOST, naming ts2): the retry
    goes to ts2 with the same request id, and ts1 is not marked down -- as a plain
    UNAVAILABLE it was, and the client's next calls avoided a healthy server."""
    cluster = FakeCluster()
    cluster.servers["ts1"].script("write", leadership_lost("ts2"))
    cluster.servers["ts2"].script("write", ok)
    session, tracker, _ = _session(cluster)
    _cache_leader(session, "ts1")

    session.insert("kv", {"key": 1, "value": "a"})

    sent = cluster.writes()
    assert [s for s, _ in sent] == ["ts1", "ts2"]
    assert {(r.request_id.seq_no, r.request_id.attempt_no) for _, r in sent} == {(1, 0), (1, 1)}
    assert session._rpc.stats.snapshot().retries_by_cause == {"LEADERSHIP_LOST": 1}
    assert not session._rpc.meta.is_down("ts1")
    assert tracker.outstanding() == 0


def test_manual_flush_sends_one_request_per_tablet_with_distinct_seq_nos() -> None:
    cluster = FakeCluster()
    for s in cluster.servers.values():
        s.script("write", ok)
    cluster.servers["ts2"].leads = {"kv-p0", "kv-p1"}
    session, tracker, _ = _session(cluster, FlushMode.MANUAL_FLUSH)
    for k in range(20):
        session.insert("kv", {"key": k, "value": None})
    assert cluster.writes() == []  # buffered only
    session.flush()
    sent = [r for _, r in cluster.writes()]
    assert sorted(r.tablet_id for r in sent) == ["kv-p0", "kv-p1"]
    assert sorted(r.request_id.seq_no for r in sent) == [1, 2]
    for r in sent:
        assert r.request_id.first_incomplete_seq_no <= r.request_id.seq_no
    assert sum(rows_in(r) for r in sent) == 20
    assert session.errors() == []
    assert tracker.outstanding() == 0


def test_row_errors_name_the_rows_position_in_the_session() -> None:
    cluster = FakeCluster()

    def key_exists_on_second_op(request: tablet_pb2.WriteRequest) -> tablet_pb2.WriteResponse:
        resp = tablet_pb2.WriteResponse(op_index=3, op_term=1)
        resp.row_errors.add(row_index=1, code=tablet_pb2.RowErrorPB.KEY_EXISTS, message="dup")
        return resp

    for s in cluster.servers.values():
        s.script("write", key_exists_on_second_op)
    cluster.servers["ts1"].leads = {"kv-p0", "kv-p1"}
    session, _, _ = _session(cluster, FlushMode.MANUAL_FLUSH)
    keys = [k for k in range(100) if session._rpc.meta.tablet_for("kv", {"key": k}) == "kv-p0"]
    for k in keys[:3]:
        session.insert("kv", {"key": k, "value": "x"})
    session.flush()
    (err,) = session.errors()
    assert isinstance(err, RowError)
    assert (err.row_index, err.code, err.message) == (1, "KEY_EXISTS", "dup")
    assert err.row == {"key": keys[1], "value": "x"}
    assert session.errors() == []  # errors() hands each error out once
    assert session.error_count == 1


def test_a_row_the_server_would_refuse_is_refused_before_sending() -> None:
    cluster = FakeCluster()
    session, tracker, _ = _session(cluster)
    with pytest.raises(RowError) as info:
        session.insert("kv", {"key": "not an int", "value": "x"})
    assert (info.value.row_index, info.value.code) == (0, "TYPE_MISMATCH")
    assert "refused by the client" in str(info.value)
    assert cluster.writes() == []
    assert tracker.first_incomplete_seq_no() == 1  # no seq_no spent


def test_busy_until_the_deadline_raises_server_too_busy_and_releases_the_seq_no() -> None:
    cluster = FakeCluster()
    for s in cluster.servers.values():
        s.script("write", queue_full())
    cluster.servers["ts1"].leads = {"kv-p0", "kv-p1"}
    session, tracker, clock = _session(cluster, timeout_s=2.0)
    start = clock.now
    with pytest.raises(ServerTooBusy) as info:
        session.insert("kv", {"key": 5, "value": "x"})
    assert clock.now <= start + 2.0
    assert info.value.row_index == 0
    sent = [r for _, r in cluster.writes()]
    assert len(sent) > 3
    assert {r.request_id.seq_no for r in sent} == {1}
    assert [r.request_id.attempt_no for r in sent] == list(range(len(sent)))
    assert {s for s, _ in cluster.writes()} == {"ts1"}  # backoff on the same server
    assert tracker.outstanding() == 0
    assert session._rpc.stats.snapshot().errors_by_cause == {"RESOURCE_EXHAUSTED": 1}


def test_a_refused_stream_is_retried_on_the_same_server_and_not_taken_for_it_down() -> None:
    """A connection at the server's stream cap (HTTP/2 REFUSED_STREAM) is no server failure:
    the leader gets the write again after a short backoff, and stays the one to ask."""
    cluster = FakeCluster()
    cluster.servers["ts1"].script("write", stream_refused(), stream_refused(), ok)
    session, _, clock = _session(cluster)
    _cache_leader(session, "ts1")
    start = clock.now

    session.insert("kv", {"key": 1, "value": "a"})

    assert [s for s, _ in cluster.writes()] == ["ts1", "ts1", "ts1"]
    assert clock.now - start < 0.05
    assert not session._rpc.meta.is_down("ts1")
    stats = session._rpc.stats.snapshot()
    assert stats.retries_by_cause == {"STREAM_REFUSED": 2}


def test_refused_streams_until_the_deadline_say_busy_and_not_applied() -> None:
    cluster = FakeCluster()
    for s in cluster.servers.values():
        s.script("write", stream_refused())
    cluster.servers["ts1"].leads = {"kv-p0", "kv-p1"}
    session, _, _ = _session(cluster, timeout_s=1.0)
    with pytest.raises(ServerTooBusy) as info:
        session.insert("kv", {"key": 5, "value": "x"})
    assert info.value.may_have_applied is False
    # Not RESOURCE_EXHAUSTED: no server queue or memory limit refused it.
    assert info.value.cause == "STREAM_REFUSED"
    assert {s for s, _ in cluster.writes()} == {"ts1"}


def test_tablet_not_found_on_every_replica_is_raised_not_retried_forever() -> None:
    cluster = FakeCluster()
    missing = FakeRpcError(grpc.StatusCode.NOT_FOUND, "tablet 'kv-p0' not found")
    for s in cluster.servers.values():
        s.script("write", missing)
    session, _, _ = _session(cluster)
    with pytest.raises(TabletNotFound):
        session.insert("kv", {"key": 0, "value": "x"})
    assert len(cluster.writes()) == 3


def _connection_lost() -> FakeRpcError:
    """A connection that broke after the call went out."""
    return FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed")


def _timed_out() -> FakeRpcError:
    return FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")


@pytest.mark.parametrize(
    ("first", "then", "error", "may_have_applied"),
    [
        # Refused every time, before any log: definitely not applied.
        (queue_full(), queue_full(), ServerTooBusy, False),
        (not_leader(), not_leader(), NotLeader, False),
        # An attempt whose fate is unknown makes the whole write indeterminate, even when the
        # last attempt was refused -- or failed for good.
        (_timed_out(), queue_full(), ServerTooBusy, True),
        (_connection_lost(), not_leader(), NotLeader, True),
        # Its leader stepped down with it in flight: the next leader may commit it.
        (leadership_lost(), not_leader(), NotLeader, True),
        # gRPC could not connect: the call never left the client.
        (unavailable(), unavailable(), Timeout, False),
        (unavailable(), _connection_lost(), Timeout, True),
        # Refused at the door: the caller's role, token or certificate.
        (
            FakeRpcError(grpc.StatusCode.PERMISSION_DENIED, "needs role writer"),
            None,
            RemoteError,
            False,
        ),
        (FakeRpcError(grpc.StatusCode.UNAUTHENTICATED, "bad token"), None, RemoteError, False),
        (_timed_out(), FakeRpcError(grpc.StatusCode.PERMISSION_DENIED, "no"), RemoteError, True),
        (
            _timed_out(),
            FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "bad", None),
            InvalidArgument,
            True,
        ),
        (
            queue_full(),
            FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "bad", None),
            InvalidArgument,
            False,
        ),
        (FakeRpcError(grpc.StatusCode.INTERNAL, "boom", None), None, RemoteError, True),
    ],
)
def test_an_error_says_whether_the_write_may_have_been_applied(
    first: Exception, then: Exception | None, error: type[Exception], may_have_applied: bool
) -> None:
    cluster = FakeCluster()
    for s in cluster.servers.values():
        s.script("write", first, *([then] if then is not None else []))
    cluster.servers["ts1"].leads = {"kv-p0", "kv-p1"}
    session, _, _ = _session(cluster, timeout_s=2.0)
    with pytest.raises(error) as info:  # type: ignore[call-overload]
        session.insert("kv", {"key": 5, "value": "x"})
    assert info.value.may_have_applied is may_have_applied
    # The text says it too, whatever ended the write.
    assert ("it may have been applied" in str(info.value)) is may_have_applied
    code = (then or first).code()  # type: ignore[attr-defined]
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        assert info.value.cause == code.name


def test_a_refused_row_was_not_applied() -> None:
    cluster = FakeCluster()
    session, _, _ = _session(cluster)
    with pytest.raises(RowError) as info:
        session.insert("kv", {"key": "not an int"})
    assert info.value.may_have_applied is False
