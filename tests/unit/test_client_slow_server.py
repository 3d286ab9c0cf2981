"""A call that runs out of time says little about its server. A leader's call that does makes
the next attempt ask who leads (a look-up done once a majority has answered) instead of
marking the leader down; a server is marked down by timeouts only once it has been silent
for ``SILENCE_S`` (``MetaState.timed_out``). A caller's short deadline passing at a busy
leader had sent every thread of the process to followers and leader look-ups."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any

import grpc
import pytest

from raftlet.client.aio_meta import AsyncMetaCache
from raftlet.client.aio_rpc import AsyncRpcContext, call_tablet_async
from raftlet.client.channels import ServerStub
from raftlet.client.errors import Timeout
from raftlet.client.meta_cache import SILENCE_S, Answers
from raftlet.client.retry import Action, Cause, RpcFailure
from raftlet.client.rpc import RpcContext, call_tablet
from raftlet.client.stats import StatsRecorder
from raftlet.proto import consensus_pb2, tablet_pb2
from tests.unit.client_fakes import (
    FakeCall,
    FakeClock,
    FakeCluster,
    FakeRpcError,
    addr,
    config_pb,
    make_rpc,
    ok,
)

LEADER, FOLLOWER = consensus_pb2.LEADER, consensus_pb2.FOLLOWER


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


def _listing(uuid: str, term: int, leader: str) -> tablet_pb2.ListTabletsResponse:
    """``uuid``'s ListTablets answer: its replica of kv-p0, at ``term``, with ``leader``."""
    resp = tablet_pb2.ListTabletsResponse(server_uuid=uuid)
    role = LEADER if leader == uuid else FOLLOWER
    resp.tablets.add(
        tablet_id="kv-p0", role=role, term=term, leader_uuid=leader, voters=["ts1", "ts2", "ts3"]
    )
    return resp


def _pause_ts1_and_answer(
    cluster: FakeCluster,
    never: Future[Any],
    ts2: tablet_pb2.ListTabletsResponse,
    ts3: tablet_pb2.ListTabletsResponse,
) -> None:
    """ts1's ListTablets answer is ``never`` (paused); ts2 and ts3 answer at once."""

    def answered(response: tablet_pb2.ListTabletsResponse) -> Callable[[float], Future[Any]]:
        def list_tablets_future(_timeout: float) -> Future[Any]:
            done: Future[Any] = Future()
            done.set_result(response)
            return done

        return list_tablets_future

    servers = cluster.servers
    servers["ts1"].list_tablets_future = lambda _t: never  # type: ignore[method-assign]
    servers["ts2"].list_tablets_future = answered(ts2)  # type: ignore[method-assign]
    servers["ts3"].list_tablets_future = answered(ts3)  # type: ignore[method-assign]


@pytest.fixture
def setup() -> tuple[FakeCluster, RpcContext, FakeClock]:
    cluster = FakeCluster()
    clock = FakeClock()
    rpc = make_rpc(cluster, clock, attempt_timeout_s=0.2)
    rpc.meta.set_leader("kv-p0", "ts1")
    return cluster, rpc, clock


def test_a_timeout_at_a_busy_leader_goes_back_to_it_and_marks_nothing_down(
    setup: tuple[FakeCluster, RpcContext, FakeClock],
) -> None:
    cluster, rpc, clock = setup
    cluster.servers["ts1"].script("write", _late(clock, 0.2), _late(clock, 0.2), ok)
    cluster.servers["ts1"].leads = {"kv-p0"}

    assert _write(rpc, clock) == "ts1"

    assert [s for s, _ in cluster.writes()] == ["ts1"] * 3  # no follower was asked
    assert not rpc.meta.is_down("ts1")
    assert rpc.meta.leader("kv-p0") == "ts1"


def test_a_silent_leader_is_left_for_the_one_its_group_elects(
    setup: tuple[FakeCluster, RpcContext, FakeClock],
) -> None:
    cluster, rpc, clock = setup
    ts1, ts2 = cluster.servers["ts1"], cluster.servers["ts2"]

    def elected() -> None:  # while the write waited on ts1, the others elected ts2
        ts2.leads = {"kv-p0"}

    ts1.script("write", _late(clock, 0.2, elected))
    ts2.script("write", ok)

    assert _write(rpc, clock) == "ts2"
    # Timed out after 0.2 s and 0.4 s: busy, perhaps. After the third, silent for SILENCE_S
    # (0.5 s): the leader is in doubt, and the look-up finds the one the others elected.
    assert [s for s, _ in cluster.writes()] == ["ts1", "ts1", "ts1", "ts2"]
    assert rpc.meta.leader("kv-p0") == "ts2"
    assert not rpc.meta.leader_in_doubt("kv-p0")


def test_a_leader_in_doubt_is_looked_up_by_the_next_call_and_kept_if_it_still_leads(
    setup: tuple[FakeCluster, RpcContext, FakeClock],
) -> None:
    cluster, rpc, clock = setup
    ts1 = cluster.servers["ts1"]
    ts1.leads = {"kv-p0"}  # it still claims the tablet: it was only slow
    ts1.script("write", _late(clock, 0.6), ok)
    with pytest.raises(Timeout):
        _write(rpc, clock, timeout_s=0.6)
    assert rpc.meta.leader_in_doubt("kv-p0")
    refreshes = rpc.stats.snapshot().leader_refreshes

    assert _write(rpc, clock) == "ts1"  # another call: a look-up first, then ts1 again

    assert rpc.stats.snapshot().leader_refreshes == refreshes + 1
    assert not rpc.meta.leader_in_doubt("kv-p0")


def test_a_leader_silent_with_no_election_is_a_timeout_that_may_have_applied(
    setup: tuple[FakeCluster, RpcContext, FakeClock],
) -> None:
    cluster, rpc, clock = setup
    cluster.servers["ts1"].script("write", _late(clock, 0.2))
    with pytest.raises(Timeout) as info:
        _write(rpc, clock, timeout_s=2.0)
    assert info.value.may_have_applied is True
    assert "DEADLINE_EXCEEDED from ts1" in str(info.value)
    # Nobody else claims leadership: the followers would only have named ts1 again.
    assert {s for s, _ in cluster.writes()} == {"ts1"}


def test_a_leader_is_settled_by_a_majority_with_no_later_term() -> None:
    meta = make_rpc(FakeCluster()).meta
    claim, follower = _listing("ts2", 5, "ts2"), _listing("ts3", 5, "ts2")
    assert meta.leader_settled("kv-p0", {"ts2": claim, "ts3": follower})
    # The claimant alone is no majority: ts1 and ts3 may have elected another at term 6.
    assert not meta.leader_settled("kv-p0", {"ts2": claim})
    failed = RpcFailure(Cause.UNAVAILABLE, Action.NEXT_REPLICA, "UNAVAILABLE", "down")
    assert not meta.leader_settled("kv-p0", {"ts2": claim, "ts1": failed})
    # A majority answered, but one is at a later term than the claim: an election is on.
    newer = _listing("ts3", 6, "")
    assert not meta.leader_settled("kv-p0", {"ts2": claim, "ts3": newer})
    # No claim at all.
    assert not meta.leader_settled("kv-p0", {"ts3": follower, "ts1": _listing("ts1", 5, "ts2")})


def test_a_look_up_ends_once_settled_without_waiting_for_a_paused_server() -> None:
    cluster = FakeCluster()
    clock = FakeClock()
    rpc = make_rpc(cluster, clock)
    never: Future[Any] = Future()  # ts1 is paused: its answer never comes

    _pause_ts1_and_answer(cluster, never, _listing("ts2", 3, "ts2"), _listing("ts3", 3, "ts2"))

    rpc.meta.refresh_leaders(clock.now + 2.0, tablet_id="kv-p0")

    assert rpc.meta.leader("kv-p0") == "ts2"
    assert not never.done()
    assert not rpc.meta.is_down("ts1")  # not waited for, so not judged


class _PausedOrAnswering:
    """An asyncio stub whose ``ListTablets`` is answered with ``listing``, or never."""

    def __init__(self, listing: tablet_pb2.ListTabletsResponse | None) -> None:
        self.listing = listing

    async def list_tablets(self, timeout: float) -> tablet_pb2.ListTabletsResponse:
        if self.listing is None:
            await asyncio.Event().wait()  # paused: no answer, ever
        assert self.listing is not None
        return self.listing


def test_an_asyncio_look_up_ends_once_settled_without_waiting_for_a_paused_server() -> None:
    stubs = {
        "ts1": _PausedOrAnswering(None),
        "ts2": _PausedOrAnswering(_listing("ts2", 3, "ts2")),
        "ts3": _PausedOrAnswering(_listing("ts3", 3, "ts2")),
    }

    async def look_up() -> AsyncMetaCache:
        meta = AsyncMetaCache(["x:1"], _ByAddress(stubs), StatsRecorder())  # type: ignore[arg-type]
        meta.install(config_pb())
        async with asyncio.timeout(5):
            await meta.refresh_leaders(meta.now() + 30.0, tablet_id="kv-p0")
        return meta

    meta = asyncio.run(look_up())
    assert meta.leader("kv-p0") == "ts2"
    assert not meta.is_down("ts1")


class _ByAddress:
    def __init__(self, stubs: dict[str, _PausedOrAnswering]) -> None:
        self.stubs = {addr(uuid): stub for uuid, stub in stubs.items()}

    def stub(self, address: str) -> _PausedOrAnswering:
        return self.stubs[address]


def test_the_silence_is_counted_from_the_first_unanswered_call_and_an_answer_ends_it() -> None:
    meta = make_rpc(FakeCluster(), clock := FakeClock()).meta
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


def test_a_look_up_timing_out_marks_a_server_down_only_after_its_silence() -> None:
    meta = make_rpc(FakeCluster(), clock := FakeClock()).meta
    late = RpcFailure(Cause.DEADLINE_EXCEEDED, Action.NEXT_REPLICA, "DEADLINE_EXCEEDED", "late")
    answers: Answers = {"ts1": late}
    meta.learn_leaders(answers, sent_at=clock.now - 0.01)  # a look-up with 10 ms left
    assert not meta.is_down("ts1")
    meta.learn_leaders(answers, sent_at=clock.now - SILENCE_S)  # one that waited long
    assert meta.is_down("ts1")


def test_a_follower_read_leaves_a_paused_replica_with_time_for_another() -> None:
    cluster = FakeCluster()
    clock = FakeClock()
    rpc = make_rpc(cluster, clock)  # attempts capped at 10 s, more than the read's 5 s
    paused = cluster.servers["ts1"].address
    asked: list[tuple[str, float]] = []

    def read(stub: ServerStub, attempt_timeout: float, _attempt_no: int) -> object:
        asked.append((stub.address, attempt_timeout))
        if stub.address == paused:  # it answers nothing: the call takes all it was given
            clock.now += attempt_timeout
            raise _timed_out()
        return tablet_pb2.ScanResponse()

    start = clock.now
    _, server = call_tablet(
        rpc, "kv-p0", read, what="scan", deadline=start + 5.0, timeout_s=5.0,
        leader_only=False, prefer="ts1",
    )  # fmt: skip

    assert server != "ts1"
    assert asked[0] == (paused, pytest.approx(2.5))
    assert clock.now - start < 5.0


def test_a_call_answered_around_is_no_alibi_for_a_silence_after_it() -> None:
    # Another thread's call was answered just after this one went; then nothing, for the
    # whole of this call's 3 s: the server is silent (it had been taken for slow, and every
    # next call waited its 3 s on a paused leader too).
    meta = make_rpc(FakeCluster(), clock := FakeClock()).meta
    sent_at = clock.now
    clock.now += 0.001
    meta.mark_up("ts1")
    clock.now += 3.0
    assert meta.silent("ts1", sent_at) is True
    # A call that went after a long idle time and timed out at once is no silence.
    clock.now += 600
    meta.mark_up("ts2")
    clock.now += 600
    assert meta.silent("ts2", clock.now - 0.03) is False


def test_a_look_up_during_an_election_does_not_wait_out_a_paused_server() -> None:
    """ts1 (the old leader) is paused; ts2 and ts3 answer, neither leading yet. The look-up
    ends soon after (``STRAGGLER_S``), not when ts1's call would time out: one started during
    the election had held up the next, which would find the new leader."""
    cluster = FakeCluster()
    rpc = make_rpc(cluster, FakeClock())
    never: Future[Any] = Future()

    _pause_ts1_and_answer(cluster, never, _listing("ts2", 4, ""), _listing("ts3", 4, ""))
    rpc.meta.set_leader("kv-p0", "ts1")

    started = time.monotonic()
    answers = rpc.meta.list_tablets(
        2.0,
        partial(rpc.meta.leader_settled, "kv-p0"),
        partial(rpc.meta.leader_heard, "kv-p0"),
    )
    waited = time.monotonic() - started

    assert set(answers) == {"ts2", "ts3"}
    assert waited < 2.0  # ts1's call would have been waited for 2 s, and 5 s more
    assert rpc.meta.leader("kv-p0") == "ts1"  # nobody claims it: what is cached stays


def test_an_asyncio_look_up_during_an_election_does_not_wait_out_a_paused_server() -> None:
    stubs = {
        "ts1": _PausedOrAnswering(None),
        "ts2": _PausedOrAnswering(_listing("ts2", 4, "")),
        "ts3": _PausedOrAnswering(_listing("ts3", 4, "")),
    }

    async def look_up() -> Answers:
        meta = AsyncMetaCache(["x:1"], _ByAddress(stubs), StatsRecorder())  # type: ignore[arg-type]
        meta.install(config_pb())
        async with asyncio.timeout(1.5):  # ts1's call would end only with the loop
            return await meta.list_tablets(
                2.0,
                partial(meta.leader_settled, "kv-p0"),
                partial(meta.leader_heard, "kv-p0"),
            )

    assert set(asyncio.run(look_up())) == {"ts2", "ts3"}


def test_a_leader_in_doubt_that_misses_a_look_up_too_is_marked_down() -> None:
    meta = make_rpc(FakeCluster(), FakeClock()).meta
    followers: Answers = {"ts2": _listing("ts2", 4, ""), "ts3": _listing("ts3", 4, "")}
    meta.set_leader("kv-p0", "ts1")
    meta.unanswered_doubt("kv-p0", followers)
    assert not meta.is_down("ts1")  # not in doubt: a look-up it missed says nothing yet
    meta.doubt_leader("kv-p0", "ts1")
    meta.unanswered_doubt("kv-p0", {**followers, "ts1": _listing("ts1", 4, "ts1")})
    assert not meta.is_down("ts1")  # it answered: slow, not gone
    meta.unanswered_doubt("kv-p0", followers)
    assert meta.is_down("ts1")  # silent, and silent again: the others are asked


def _write_with_id(rpc: RpcContext, clock: FakeClock, timeout_s: float = 30.0) -> str:
    """A write as a session makes it: one request id, ``attempt_no`` counting up."""
    request = tablet_pb2.WriteRequest(tablet_id="kv-p0")
    request.request_id.client_id, request.request_id.seq_no = "c1", 7

    def call(stub: ServerStub, attempt_timeout: float, attempt_no: int) -> object:
        request.request_id.attempt_no = attempt_no
        return stub.write(request, attempt_timeout)

    _, server = call_tablet(
        rpc, "kv-p0", call, what="write", deadline=clock.now + timeout_s, timeout_s=timeout_s
    )
    return server


def test_a_write_in_flight_to_a_leader_that_went_silent_goes_to_the_one_elected() -> None:
    cluster = FakeCluster()
    clock = FakeClock()
    rpc = make_rpc(cluster, clock)  # attempts of 10 s
    rpc.meta.set_leader("kv-p0", "ts1")
    rpc.meta.mark_up("ts1")
    paused: list[FakeCall] = []

    def pause(_request: object) -> FakeCall:  # ts1 takes the write in, then is paused
        paused.append(FakeCall(clock, 10.0))
        _pause_ts1_and_answer(
            cluster, Future(), _listing("ts2", 2, "ts2"), _listing("ts3", 2, "ts2")
        )
        return paused[-1]

    cluster.servers["ts1"].script("write", pause)
    cluster.servers["ts2"].script("write", ok)
    start = clock.now

    assert _write_with_id(rpc, clock) == "ts2"

    # Cut short once ts1 had been silent for SILENCE_S and the look-up found ts2 leading, not
    # when its 10 s ran out.
    assert clock.now - start == pytest.approx(SILENCE_S)
    assert paused[0].cancelled()
    sent = cluster.writes()
    assert [s for s, _ in sent] == ["ts1", "ts2"]
    ids = [(r.request_id.client_id, r.request_id.seq_no) for _, r in sent]
    assert ids == [("c1", 7), ("c1", 7)]  # the same request: applied once wherever it lands
    assert rpc.stats.snapshot().leader_refreshes == 1
    assert rpc.meta.leader("kv-p0") == "ts2"


def test_a_write_in_flight_to_a_slow_leader_that_still_leads_waits_for_its_answer() -> None:
    cluster = FakeCluster()
    clock = FakeClock()
    rpc = make_rpc(cluster, clock)
    rpc.meta.set_leader("kv-p0", "ts1")
    ts1 = cluster.servers["ts1"]
    ts1.leads = {"kv-p0"}  # it answers look-ups as the leader: busy, not gone
    calls: list[FakeCall] = []
    look_ups: list[float] = []
    listed = ts1.list_tablets_future

    def list_tablets_future(timeout: float) -> Any:
        look_ups.append(clock.now)
        if len(look_ups) == 2:  # the write's answer comes after the second look-up
            calls[0].set_result(ok())
        return listed(timeout)

    def slow(_request: object) -> FakeCall:
        calls.append(FakeCall(clock, 10.0))
        return calls[-1]

    ts1.list_tablets_future = list_tablets_future  # type: ignore[method-assign]
    ts1.script("write", slow)
    start = clock.now

    assert _write_with_id(rpc, clock) == "ts1"

    assert not calls[0].cancelled()
    assert [s for s, _ in cluster.writes()] == ["ts1"]  # sent once, never elsewhere
    # A look-up after each SILENCE_S it said nothing; it answered them as the leader.
    assert look_ups == pytest.approx([start + SILENCE_S, start + 2 * SILENCE_S])
    assert rpc.meta.leader("kv-p0") == "ts1"
    assert not rpc.meta.is_down("ts1")


class _AsyncLeader:
    """An asyncio stub of kv-p0's replica on ``uuid``: ``ListTablets`` answered with
    ``listing`` (or never), writes answered ``ok`` -- or, while ``paused``, only once
    ``answer`` is set."""

    def __init__(
        self, uuid: str, listing: tablet_pb2.ListTabletsResponse | None, clock: FakeClock
    ) -> None:
        self.uuid = uuid
        self.listing = listing
        self.clock = clock
        self.written_at: list[float] = []
        self.paused = False
        self.answer = asyncio.Event()
        self.writes: list[tablet_pb2.WriteRequest] = []
        self.cancelled = 0
        self.looked_up_at: list[float] = []

    async def list_tablets(self, timeout: float) -> tablet_pb2.ListTabletsResponse:
        self.looked_up_at.append(self.clock.now)
        if self.listing is None:
            await asyncio.Event().wait()  # paused: no answer, ever
        assert self.listing is not None
        return self.listing

    async def write(
        self, request: tablet_pb2.WriteRequest, timeout: float
    ) -> tablet_pb2.WriteResponse:
        copy = tablet_pb2.WriteRequest()
        copy.CopyFrom(request)
        self.writes.append(copy)
        self.written_at.append(self.clock.now)
        if self.paused:
            try:
                await self.answer.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return ok()


class _AsyncWatchClock(FakeClock):
    """The fake clock of an asyncio call's watch: a pause advances it, and yields."""

    async def pause(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)

    async def backoff(self, seconds: float) -> None:
        self.sleep(seconds)
        await asyncio.sleep(0)


def _async_write(
    stubs: dict[str, _AsyncLeader], clock: _AsyncWatchClock
) -> tuple[str, StatsRecorder]:
    """A write of an asyncio client to kv-p0, ts1 its leader; the server that took it."""

    async def write() -> tuple[str, StatsRecorder]:
        stats = StatsRecorder()
        by_address: Any = _ByAddress(stubs)  # type: ignore[arg-type]
        meta = AsyncMetaCache(["x:1"], by_address, stats, clock=clock.clock)
        meta.install(config_pb())
        meta.set_leader("kv-p0", "ts1")
        meta.mark_up("ts1")
        ctx = AsyncRpcContext(
            meta, by_address, stats, clock=clock.clock, sleep=clock.backoff, pause=clock.pause
        )
        request = tablet_pb2.WriteRequest(tablet_id="kv-p0")
        request.request_id.client_id, request.request_id.seq_no = "c1", 7

        async def call(stub: Any, attempt_timeout: float, attempt_no: int) -> object:
            request.request_id.attempt_no = attempt_no
            return await stub.write(request, attempt_timeout)

        async with asyncio.timeout(5):  # a call left waiting would end only with the loop
            _, server = await call_tablet_async(
                ctx, "kv-p0", call, what="write", deadline=clock.now + 30.0, timeout_s=30.0
            )
        return server, stats

    return asyncio.run(write())


def test_an_asyncio_write_in_flight_to_a_leader_that_went_silent_goes_to_the_elected() -> None:
    clock = _AsyncWatchClock()
    ts1 = _AsyncLeader("ts1", None, clock)  # paused: neither the write nor a look-up answered
    ts1.paused = True
    ts2 = _AsyncLeader("ts2", _listing("ts2", 2, "ts2"), clock)
    stubs = {"ts1": ts1, "ts2": ts2, "ts3": _AsyncLeader("ts3", _listing("ts3", 2, "ts2"), clock)}
    start = clock.now

    server, stats = _async_write(stubs, clock)

    assert server == "ts2"
    # Cut short once ts1 had been silent for SILENCE_S and the look-up found ts2 leading.
    assert ts2.written_at == [pytest.approx(start + SILENCE_S)]
    assert ts1.cancelled == 1
    ids = [(w.request_id.client_id, w.request_id.seq_no) for w in ts1.writes + ts2.writes]
    assert ids == [("c1", 7), ("c1", 7)]
    assert stats.snapshot().leader_refreshes == 1


def test_an_asyncio_write_in_flight_to_a_slow_leader_that_still_leads_waits_for_it() -> None:
    clock = _AsyncWatchClock()
    ts1 = _AsyncLeader("ts1", _listing("ts1", 1, "ts1"), clock)  # look-ups: it leads
    ts1.paused = True
    stubs = {
        "ts1": ts1,
        "ts2": _AsyncLeader("ts2", _listing("ts2", 1, "ts1"), clock),
        "ts3": _AsyncLeader("ts3", _listing("ts3", 1, "ts1"), clock),
    }
    listed = ts1.list_tablets

    async def list_tablets(timeout: float) -> tablet_pb2.ListTabletsResponse:
        if ts1.looked_up_at:  # the write's answer comes after the second look-up
            ts1.answer.set()
        return await listed(timeout)

    ts1.list_tablets = list_tablets  # type: ignore[method-assign]
    start = clock.now

    server, _stats = _async_write(stubs, clock)

    assert server == "ts1"
    assert ts1.cancelled == 0
    assert len(ts1.writes) == 1  # sent once, never elsewhere
    assert not stubs["ts2"].writes
    assert not stubs["ts3"].writes
    # A look-up after each SILENCE_S it said nothing; it answered them as the leader.
    assert ts1.looked_up_at == pytest.approx([start + SILENCE_S, start + 2 * SILENCE_S])
