"""Exactly-once writes across retries and failover, with real processes on loopback.

The same request id sent twice to the leader, twice at once, and again to the new leader
after the old one stepped down or was SIGKILLed is applied once, and every answer names
the same log entry -- with the rows in the per-cell form or as a packed row block.  The
request id travels in the replicated entry, so the new leader knows the outcome without
ever having seen the original call.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import grpc
import pytest

from raftlet.proto import admin_pb2, consensus_pb2, tablet_pb2
from raftlet.proto.common_pb2 import ServerErrorPB
from raftlet.schema.rows import OpType, encode_row_op
from tests.integration.tserver_cluster import (
    KV_SCHEMA,
    Server,
    kv_op,
    running_cluster,
    server_error,
    wait_for,
    write_request,
    write_with_retry,
)

pytestmark = pytest.mark.integration

TABLET = "kv-p0"


def _same_answer(a: tablet_pb2.WriteResponse, b: tablet_pb2.WriteResponse) -> None:
    assert (b.op_index, b.op_term) == (a.op_index, a.op_term)
    assert list(b.row_errors) == list(a.row_errors) == []


@pytest.mark.parametrize("form", ["cells", "block"])
@pytest.mark.parametrize("failover", ["step_down", "kill"])
def test_same_request_id_applied_once_across_retries_and_failover(
    tmp_path: Path, failover: str, form: str
) -> None:
    request_of = functools.partial(write_request, packed=form == "block")
    with running_cluster(tmp_path, partitions=1) as cluster:
        old = cluster.leader_of(TABLET)
        rows = {1: "one", 2: "two", 3: "three"}
        first = request_of(TABLET, [kv_op(k, v) for k, v in rows.items()], "eo", 1)

        # Sent twice to the leader: the second answer is the stored first one.
        a1 = old.tablet.Write(first, timeout=10)
        assert a1.op_index > 0
        a2 = old.tablet.Write(first, timeout=10)
        _same_answer(a1, a2)

        # Sent twice at once: the second attaches to the first while it is in flight (or
        # finds it completed); either way one entry answers both.
        second = request_of(TABLET, [kv_op(4, "four")], "eo", 2)
        futures = [old.tablet.Write.future(second, timeout=10) for _ in range(2)]
        b1, b2 = (f.result() for f in futures)
        _same_answer(b1, b2)
        assert b1.op_index != a1.op_index
        expected = rows | {4: "four"}
        cluster.wait_converged(TABLET, expected)

        if failover == "step_down":
            old.admin.LeaderStepDown(admin_pb2.LeaderStepDownRequest(tablet_id=TABLET), timeout=10)
        else:
            old.kill()
        new = cluster.new_leader_of(TABLET, old.id)
        replays_before = new.metric("result_tracker_replays_total", tablet=TABLET)

        # Retried at the new leader: answered with the entry the old leader wrote.
        a3 = new.tablet.Write(first, timeout=10)
        _same_answer(a1, a3)
        b3 = new.tablet.Write(second, timeout=10)
        _same_answer(b1, b3)
        assert new.metric("result_tracker_replays_total", tablet=TABLET) == replays_before + 2

        # The old leader, stepped down or restarted, refuses it as a follower...
        if failover == "kill":
            old.start()
        wait_for(
            lambda: old.list_tablets()[TABLET].leader_uuid == new.id,
            20,
            f"{old.id} to follow {new.id}",
        )
        with pytest.raises(grpc.RpcError) as info:
            old.tablet.Write(first, timeout=10)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        err = server_error(info.value)
        assert err is not None
        assert err.code == ServerErrorPB.NOT_LEADER
        assert err.leader_uuid == new.id

        # ...and a new request after them goes through once more, in the new term.
        third = request_of(TABLET, [kv_op(5, "five")], "eo", 3, first_incomplete_seq_no=3)
        c1 = new.tablet.Write(third, timeout=10)
        assert c1.op_term > a1.op_term
        assert list(c1.row_errors) == []
        expected[5] = "five"
        # The client said it no longer waits for requests below 3: a late retry of one of
        # them is refused as stale rather than applied or answered from a forgotten result.
        with pytest.raises(grpc.RpcError) as info:
            new.tablet.Write(first, timeout=10)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        stale = server_error(info.value)
        assert stale is not None
        assert stale.code == ServerErrorPB.STALE_REQUEST

        # Applied once: every replica holds each row once, with its value, and the new
        # leader's store inserted exactly as many rows as were written.
        cluster.wait_converged(TABLET, expected, timeout=30)
        # A restarted server's counters start from zero: after a kill, the new leader's only.
        # Waited for: a count moves once its store transaction commits, just after the rows
        # show.
        counted = cluster.servers.values() if failover == "step_down" else [new]
        for s in counted:

            def inserted_all(server: Server = s) -> bool:
                return server.metric("rows_inserted_total", tablet=TABLET) == len(expected)

            wait_for(inserted_all, 10, f"{s.id}'s rows_inserted_total to reach {len(expected)}")


def test_concurrent_retries_of_one_request_id_apply_once(tmp_path: Path) -> None:
    """Many copies of one request id, sent at once from several threads to every server
    while leadership is moved, produce one entry and one row."""
    with running_cluster(tmp_path, partitions=1) as cluster:
        leader = cluster.leader_of(TABLET)
        req = write_request(TABLET, [kv_op(10, "ten")], "storm", 1)
        answers: list[tablet_pb2.WriteResponse] = []
        errors: list[str] = []
        lock = threading.Lock()

        def hammer(server_id: str) -> None:
            stub = cluster.servers[server_id].tablet
            for _ in range(15):
                try:
                    resp = stub.Write(req, timeout=10)
                except grpc.RpcError as e:
                    if e.code() not in (
                        grpc.StatusCode.FAILED_PRECONDITION,
                        grpc.StatusCode.UNAVAILABLE,
                    ):
                        with lock:
                            errors.append(f"{server_id}: {e.code()} {e.details()}")
                    continue
                with lock:
                    answers.append(resp)

        threads = [
            threading.Thread(target=hammer, args=(sid,), name=f"storm-{sid}-{i}")
            for sid in cluster.servers
            for i in range(2)
        ]
        for t in threads:
            t.start()
        leader.admin.LeaderStepDown(admin_pb2.LeaderStepDownRequest(tablet_id=TABLET), timeout=10)
        for t in threads:
            t.join(60)
            assert not t.is_alive()
        assert not errors, errors
        new = cluster.new_leader_of(TABLET, leader.id)
        answers.append(new.tablet.Write(req, timeout=10))
        # One entry answers them all.  (Only op_index is compared here: whether op_term
        # agrees too is what the next test pins down, deterministically.)
        assert {a.op_index for a in answers} == {answers[0].op_index}
        assert all(list(a.row_errors) == [] for a in answers)
        cluster.wait_converged(TABLET, {10: "ten"})
        # Counted once its store transaction commits, which may be just after the rows show.
        wait_for(lambda: new.metric("rows_inserted_total", tablet=TABLET) == 1, 10, "the count")


def _state(server: Server) -> consensus_pb2.ConsensusStatePB:
    req = consensus_pb2.GetConsensusStateRequest(tablet_id=TABLET)
    state: consensus_pb2.ConsensusStatePB = server.consensus.GetConsensusState(req, timeout=5).state
    return state


def test_retry_at_new_leader_that_has_not_applied_the_original_gets_the_same_answer(
    tmp_path: Path,
) -> None:
    """A write committed in term 1 but not yet applied on the next leader is retried there.

    The new leader's tracker and store do not know the request yet, so it proposes it once
    more; the store recognises the repeat and applies nothing (exactly-once holds).  But
    every answer must still name the entry that carried the write -- the same (op_index,
    op_term) the client got the first time.  To make the new leader's apply lag reliably,
    two 10,000-row batches are committed just before the write."""
    with running_cluster(tmp_path, partitions=1) as cluster:
        old = cluster.leader_of(TABLET)
        bulk = [
            write_request(
                TABLET,
                [kv_op(1_000_000 * (b + 1) + i, "bulk") for i in range(10_000)],
                "bulk",
                b + 1,
            )
            for b in range(2)
        ]
        write = write_request(TABLET, [kv_op(-1, "minus one")], "eo", 1)
        base = _state(old).last_log_index
        bulk_futures = [old.tablet.Write.future(r, timeout=60) for r in bulk]
        wait_for(lambda: _state(old).last_log_index >= base + 2, 20, "the bulk proposed")
        original_future = old.tablet.Write.future(write, timeout=60)
        wait_for(
            lambda: all(_state(s).last_log_index >= base + 3 for s in cluster.servers.values()),
            20,
            "the write replicated everywhere",
        )
        # Committed on the old leader too, as the docstring has it: stepped down first, on a
        # loaded machine, before its own fsync of the write, it answered "stopped leading
        # before the write was committed" (CI once).
        wait_for(lambda: _state(old).commit_index >= base + 3, 20, "the write committed")
        old.admin.LeaderStepDown(admin_pb2.LeaderStepDownRequest(tablet_id=TABLET), timeout=10)
        # The client did not hear back in time and retries with the same request id.
        retry = write_with_retry(cluster, write, timeout=30, attempt_timeout=30)
        original = original_future.result()
        for f in bulk_futures:
            assert list(f.result().row_errors) == []
        new = cluster.leader_of(TABLET)
        wait_for(
            lambda: all(
                (st := _state(s)).applied_index == st.commit_index == st.last_log_index
                for s in cluster.servers.values()
            ),
            30,
            "every replica to apply everything",
        )
        # Counted once its store transaction commits, which may be just after it applied.
        wait_for(lambda: new.metric("rows_inserted_total", tablet=TABLET) == 20_001, 10, "count")
        again = new.tablet.Write(write, timeout=10)
        assert new.metric("rows_inserted_total", tablet=TABLET) == 20_001  # applied once
        assert list(original.row_errors) == list(retry.response.row_errors) == []
        answers = {
            "original (old leader)": (original.op_index, original.op_term),
            f"retry ({retry.server})": (retry.response.op_index, retry.response.op_term),
            f"again ({new.id})": (again.op_index, again.op_term),
        }
        states = {s.id: str(_state(s)).replace("\n", " ") for s in cluster.servers.values()}
        assert len(set(answers.values())) == 1, f"answers differ: {answers}; logs: {states}"


@pytest.mark.parametrize("attempt", [0, 1])
def test_a_late_copy_below_the_first_incomplete_request_is_stale_after_the_client_is_forgotten(
    tmp_path: Path, attempt: int
) -> None:
    """A tracker that forgot a client (one client is all it keeps here) cannot judge a late
    copy of a request the client had its answer to: the store's bound does. A retry is
    refused at admission; a first attempt, which skips the store, reaches the log and is
    applied as nothing -- either way STALE, the newer rows intact on every replica."""
    flags = ["--result_tracker_max_clients=1"]
    with running_cluster(tmp_path, partitions=1, flags=flags) as cluster:
        leader = cluster.leader_of(TABLET)
        first = write_request(TABLET, [kv_op(1, "first", OpType.UPSERT)], "late", 1)
        leader.tablet.Write(first, timeout=10)
        second = write_request(
            TABLET, [kv_op(1, "second", OpType.UPSERT)], "late", 2, first_incomplete_seq_no=2
        )
        leader.tablet.Write(second, timeout=10)
        gone = write_request(TABLET, [kv_op(2, None, OpType.INSERT)], "late", 3, 3)
        leader.tablet.Write(gone, timeout=10)
        leader.tablet.Write(
            write_request(
                TABLET, [encode_row_op(KV_SCHEMA, OpType.DELETE, {"key": 2})], "late", 4, 4
            ),
            timeout=10,
        )
        # Another client's write: the tracker forgets "late".
        leader.tablet.Write(write_request(TABLET, [kv_op(3, "x")], "other", 1), timeout=10)
        evicted = leader.metric("result_tracker_evictions_total", tablet=TABLET)
        assert evicted >= 1

        for late in (first, gone):
            late.request_id.attempt_no = attempt
            with pytest.raises(grpc.RpcError) as info:
                leader.tablet.Write(late, timeout=10)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            err = server_error(info.value)
            assert err is not None
            assert err.code == ServerErrorPB.STALE_REQUEST
            assert "below its first incomplete request 4" in err.message

        # Nothing of the late copies was applied: a later write converges with the rest.
        last = write_request(TABLET, [kv_op(4, "after")], "late", 5, 5)
        leader.tablet.Write(last, timeout=10)
        cluster.wait_converged(TABLET, {1: "second", 3: "x", 4: "after"})
