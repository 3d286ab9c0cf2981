"""A call that runs out of time marks its server down only when the server has gone silent
(``MetaState.timed_out``): a caller's short deadline passing at a leader that answers other
calls must not send every thread of the process to followers and leader look-ups."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from raftlet.client.channels import ServerStub
from raftlet.client.errors import Timeout
from raftlet.client.meta_cache import SILENCE_S
from raftlet.client.rpc import RpcContext, call_tablet
from raftlet.proto import tablet_pb2
from tests.unit.client_fakes import FakeClock, FakeCluster, FakeRpcError, make_rpc, ok


def _timed_out() -> FakeRpcError:
    return FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


def _write(rpc: RpcContext, clock: FakeClock, timeout_s: float = 5.0) -> str:
    def call(stub: ServerStub, attempt_timeout: float, _attempt_no: int) -> object:
        return stub.write(tablet_pb2.WriteRequest(tablet_id="kv-p0"), attempt_timeout)

    _, server = call_tablet(
        rpc, "kv-p0", call, what="write", deadline=clock.now + timeout_s, timeout_s=timeout_s
    )
    return server


def _late(clock: FakeClock, seconds: float, also: Callable[[], None] = lambda: None) -> object:
    """A write answer that takes ``seconds`` and then times out (``also`` runs meanwhile)."""

    def answer(_request: object) -> object:
        clock.now += seconds
        also()
        raise _timed_out()

    return answer


@pytest.fixture
def setup() -> tuple[FakeCluster, RpcContext, FakeClock]:
    cluster = FakeCluster()
    clock = FakeClock()
    rpc = make_rpc(cluster, clock, attempt_timeout_s=0.2)
    rpc.meta.set_leader("kv-p0", "ts1")
    return cluster, rpc, clock


def test_a_timeout_at_a_leader_that_answered_others_meanwhile_keeps_it_the_leader(
    setup: tuple[FakeCluster, RpcContext, FakeClock],
) -> None:
    cluster, rpc, clock = setup
    # While this write waited, another thread's call to ts1 was answered.
    answered_meanwhile = _late(clock, 0.2, lambda: rpc.meta.mark_up("ts1"))
    cluster.servers["ts1"].script("write", answered_meanwhile, ok)

    assert _write(rpc, clock) == "ts1"

    assert [s for s, _ in cluster.writes()] == ["ts1", "ts1"]  # no follower was asked
    assert not rpc.meta.is_down("ts1")
    assert rpc.meta.leader("kv-p0") == "ts1"
    assert rpc.stats.snapshot().leader_refreshes == 0


def test_a_short_silence_is_slowness_and_a_long_one_marks_the_server_down(
    setup: tuple[FakeCluster, RpcContext, FakeClock],
) -> None:
    cluster, rpc, clock = setup
    # A leader that stopped answering: each attempt times out after 0.2 s, and nothing else
    # it was asked is answered. Once SILENCE_S has passed, the write goes to the others.
    cluster.servers["ts1"].script("write", _late(clock, 0.2))
    cluster.servers["ts2"].script("write", ok)
    start = clock.now

    assert _write(rpc, clock) == "ts2"

    to_ts1 = [s for s, _ in cluster.writes()].count("ts1")
    assert to_ts1 == 3  # 0.2 s, 0.4 s (slow, perhaps), 0.6 s plus backoffs: silent
    assert clock.now - start >= SILENCE_S
    assert rpc.meta.is_down("ts1")


def test_the_silence_is_counted_from_the_first_unanswered_call_and_an_answer_ends_it() -> None:
    cluster = FakeCluster()
    clock = FakeClock()
    meta = make_rpc(cluster, clock).meta
    t0 = clock.now
    meta.mark_up("ts1")
    clock.now += 0.01
    # Sent after the last answer, timed out, but not silent for long yet.
    assert meta.timed_out("ts1", sent_at=clock.now) is False
    first = clock.now
    clock.now += SILENCE_S / 2
    assert meta.timed_out("ts1", sent_at=clock.now - 0.01) is False
    # A call sent before the last answer says nothing new.
    assert meta.timed_out("ts1", sent_at=t0 - 1) is False
    clock.now = first + SILENCE_S
    assert meta.timed_out("ts1", sent_at=clock.now - 0.01) is True
    assert meta.is_down("ts1")
    # An answer ends the silence: the next timeout starts a new one.
    meta.mark_up("ts1")
    clock.now += 0.01
    assert meta.timed_out("ts1", sent_at=clock.now - 0.005) is False
    assert not meta.is_down("ts1")


def test_a_write_that_times_out_everywhere_is_still_a_timeout(
    setup: tuple[FakeCluster, RpcContext, FakeClock],
) -> None:
    cluster, rpc, clock = setup
    for server in cluster.servers.values():
        server.script("write", _late(clock, 0.2))
    with pytest.raises(Timeout) as info:
        _write(rpc, clock, timeout_s=3.0)
    assert info.value.may_have_applied is True
    assert {s for s, _ in cluster.writes()} == {"ts1", "ts2", "ts3"}
