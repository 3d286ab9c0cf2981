"""Bad input against real servers: each gets its documented status
(``tserver.rpc_dispatch.status_for``), no server goes down, and no stored row changes.

One cluster (``--max_batch_rows 10``) serves the whole module; every test checks, at its
end, that all three servers still answer and every replica still holds exactly the rows
written by ``_seed`` -- and that the leader and term did not move unless the test moved it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftlet.proto import admin_pb2, consensus_pb2, tablet_pb2
from raftlet.proto.common_pb2 import ServerErrorPB
from raftlet.schema.row_block import encode_row_block
from raftlet.schema.rows import OpType
from tests.integration.tserver_cluster import (
    KV_SCHEMA,
    Server,
    TserverCluster,
    kv_op,
    running_cluster,
    server_error,
    wait_for,
    write_request,
)

pytestmark = pytest.mark.integration

TABLET = "kv-p0"
MAX_BATCH_ROWS = 10
Code = tablet_pb2.RowErrorPB.Code


class Seeded:
    def __init__(self, cluster: TserverCluster, rows: dict[int, str | None]) -> None:
        self.cluster = cluster
        self.rows = rows
        self.seq = 100

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    @property
    def leader(self) -> Server:
        return self.cluster.leader_of(TABLET)

    def follower(self) -> Server:
        leader = self.leader
        return next(s for s in self.cluster.servers.values() if s.id != leader.id)

    def check_intact(self) -> None:
        """Every server is up and answers; every replica holds exactly the seeded rows."""
        for s in self.cluster.servers.values():
            assert s.alive, f"{s.id} died:\n{s.log_tail()}"
            assert TABLET in s.list_tablets()
        self.cluster.wait_converged(TABLET, self.rows, timeout=20)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    root: Path = tmp_path_factory.mktemp("bad_input")
    with running_cluster(
        root, partitions=1, flags=["--max_batch_rows", str(MAX_BATCH_ROWS)]
    ) as cluster:
        leader = cluster.leader_of(TABLET)
        # A batch of exactly --max_batch_rows is accepted.
        rows: dict[int, str | None] = {k: f"v{k}" for k in range(1, MAX_BATCH_ROWS + 1)}
        resp = leader.tablet.Write(
            write_request(TABLET, [kv_op(k, v) for k, v in rows.items()], "seed", 1), timeout=10
        )
        assert list(resp.row_errors) == []
        # Kudu semantics: a bad row fails alone, the good rows of its batch are applied.
        bad = tablet_pb2.RowOperationPB(type=tablet_pb2.RowOperationPB.INSERT)
        bad.cells.add(column="nope").value.int_value = 1
        bad.cells.add(column="key").value.int_value = 99
        mixed = write_request(TABLET, [kv_op(11, "v11"), bad, kv_op(12, None)], "seed", 2)
        resp = leader.tablet.Write(mixed, timeout=10)
        assert [(e.row_index, e.code) for e in resp.row_errors] == [(1, Code.UNKNOWN_COLUMN)]
        assert resp.op_index > 0
        rows |= {11: "v11", 12: None}
        seeded = Seeded(cluster, rows)
        seeded.check_intact()
        yield seeded


def _rpc_error(call: object, *args: object, **kwargs: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    return info.value


def _op(
    op_type: int = tablet_pb2.RowOperationPB.INSERT, **cells: dict[str, object]
) -> tablet_pb2.RowOperationPB:
    """A row operation built by hand (``encode_row_op`` would refuse a bad row): each cell is
    column=dict(ValuePB member=value)."""
    pb = tablet_pb2.RowOperationPB(type=op_type)  # type: ignore[arg-type]
    for column, value in cells.items():
        cell = pb.cells.add(column=column)
        for member, v in value.items():
            setattr(cell.value, member, v)
    return pb


# --- the tablet service --------------------------------------------------------------------


def test_unknown_tablet_is_not_found(seeded: Seeded) -> None:
    for server in seeded.cluster.servers.values():  # leader and followers alike
        req = write_request("no-such-tablet", [kv_op(500, "x")], "bad", seeded.next_seq())
        err = _rpc_error(server.tablet.Write, req, timeout=10)
        assert err.code() == grpc.StatusCode.NOT_FOUND
        detail = server_error(err)
        assert detail is not None
        assert detail.code == ServerErrorPB.TABLET_NOT_FOUND
        assert "no-such-tablet" in err.details()

        scan = tablet_pb2.ScanRequest(tablet_id="no-such-tablet")
        err = _rpc_error(server.tablet.Scan, scan, timeout=10)
        assert err.code() == grpc.StatusCode.NOT_FOUND
    seeded.check_intact()


@pytest.mark.parametrize(
    ("name", "ops", "codes"),
    [
        (
            "wrong column type",
            [
                _op(key={"string_value": "not an int"}, value={"string_value": "x"}),
                _op(key={"int_value": 501}, value={"int_value": 7}),
            ],
            [Code.TYPE_MISMATCH, Code.TYPE_MISMATCH],
        ),
        (
            "missing key column",
            [_op(value={"string_value": "no key"}), _op(OpType.UPSERT, value={"null_value": True})],
            [Code.MISSING_KEY_COLUMN, Code.MISSING_KEY_COLUMN],
        ),
        (
            "unknown column",
            [_op(key={"int_value": 502}, colour={"string_value": "red"})],
            [Code.UNKNOWN_COLUMN],
        ),
        (
            "mixed bad rows",
            [
                _op(key={"int_value": 503}, value={"bool_value": True}),
                _op(value={"string_value": "x"}),
                _op(key={"int_value": 504}, extra={"int_value": 1}),
                _op(key={"null_value": True}, value={"string_value": "x"}),
                _op(tablet_pb2.RowOperationPB.OP_UNKNOWN, key={"int_value": 505}),
                # A key that exists already: decoded fine, fails when applied.
                _op(key={"int_value": 1}, value={"string_value": "overwrite?"}),
            ],
            [
                Code.TYPE_MISMATCH,
                Code.MISSING_KEY_COLUMN,
                Code.UNKNOWN_COLUMN,
                Code.NULL_NOT_ALLOWED,
                Code.INVALID_ROW,
                Code.KEY_EXISTS,
            ],
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_rows_get_per_row_errors(
    seeded: Seeded, name: str, ops: list[tablet_pb2.RowOperationPB], codes: list[int]
) -> None:
    req = write_request(TABLET, ops, "bad", seeded.next_seq())
    resp = seeded.leader.tablet.Write(req, timeout=10)  # status OK
    got = [(e.row_index, Code.Name(e.code)) for e in resp.row_errors]
    assert got == [(i, Code.Name(c)) for i, c in enumerate(codes)], name
    assert all(e.message for e in resp.row_errors)
    # The same request id again is answered the same way.
    again = seeded.leader.tablet.Write(req, timeout=10)
    assert list(again.row_errors) == list(resp.row_errors)
    seeded.check_intact()


@pytest.mark.parametrize("n_rows", [0, MAX_BATCH_ROWS + 1, 1000])
def test_empty_and_oversized_batches_are_invalid_argument(seeded: Seeded, n_rows: int) -> None:
    ops = [kv_op(10_000 + i, "big") for i in range(n_rows)]
    for server in (seeded.leader, seeded.follower()):  # checked before leadership
        req = write_request(TABLET, ops, "bad", seeded.next_seq())
        err = _rpc_error(server.tablet.Write, req, timeout=10)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        detail = server_error(err)
        assert detail is not None
        assert detail.code == ServerErrorPB.INVALID_ARGUMENT
        if n_rows:
            assert "max_batch_rows" in err.details()
    seeded.check_intact()


def _block(keys: list[int]) -> tuple[bytearray, bytes]:
    rows, side = encode_row_block(
        KV_SCHEMA, [(OpType.INSERT, {"key": k, "value": "v"}) for k in keys]
    )
    return bytearray(rows), side


def _torn(rows: bytearray, side: bytes) -> tuple[bytes, bytes]:
    return bytes(rows[:-1]), side


def _past_the_side_buffer(rows: bytearray, side: bytes) -> tuple[bytes, bytes]:
    return bytes(rows), side[:-1]


def _spare_bitmap_bit(rows: bytearray, side: bytes) -> tuple[bytes, bytes]:
    rows[1] |= 0x80  # isset bit of a column kv does not have
    return bytes(rows), side


def _null_but_not_given(rows: bytearray, side: bytes) -> tuple[bytes, bytes]:
    rows[1] &= ~0x02  # value not given ...
    rows[2] |= 0x02  # ... but NULL
    return bytes(rows), side


@pytest.mark.parametrize(
    "damage", [_torn, _past_the_side_buffer, _spare_bitmap_bit, _null_but_not_given]
)
def test_a_malformed_row_block_is_invalid_argument_and_stores_nothing(
    seeded: Seeded, damage: object
) -> None:
    rows, side = _block([20_000, 20_001])
    req = tablet_pb2.WriteRequest(tablet_id=TABLET)
    req.row_block.rows, req.row_block.indirect = damage(rows, side)  # type: ignore[operator]
    req.request_id.client_id = "bad-block"
    req.request_id.seq_no = seeded.next_seq()
    err = _rpc_error(seeded.leader.tablet.Write, req, timeout=10)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "row block" in err.details()
    seeded.check_intact()


JUNK = [
    b"\xff\xff\xff\xff",  # wire type 7 does not exist
    b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a length beyond the message
    b"\x12\x05\x0a\x03",  # a sub-message cut short
    bytes(range(256)) * 4,
    random.Random(5).randbytes(4096),
]


@pytest.mark.parametrize(
    "method",
    [
        "/raftlet.TabletService/Write",
        "/raftlet.TabletService/Scan",
        "/raftlet.ConsensusService/UpdateConsensus",
        "/raftlet.ConsensusService/RequestVote",
        "/raftlet.AdminService/LeaderStepDown",
    ],
)
def test_garbage_payload_is_an_error_not_a_crash(seeded: Seeded, method: str) -> None:
    codes: list[grpc.StatusCode] = []
    for server in seeded.cluster.servers.values():
        raw = server.channel.unary_unary(
            method, request_serializer=None, response_deserializer=None
        )
        for junk in JUNK:
            try:
                answer = raw(junk, timeout=10)
            except grpc.RpcError as e:
                codes.append(e.code())
                continue
            # Random bytes may happen to parse; then the request is nonsense, and a
            # success can only be an empty-handed answer that changed nothing.
            codes.append(grpc.StatusCode.OK)
            assert isinstance(answer, bytes)
    # Refused at once, not by timing out: bytes that do not decode are INVALID_ARGUMENT
    # (tserver/malformed.py); what parses by chance is judged by the handler
    # (INVALID_ARGUMENT, or NOT_FOUND for a tablet that does not exist).
    refused = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}
    assert set(codes) <= refused, codes
    seeded.check_intact()


# --- the consensus service ----------------------------------------------------------------


def _state(server: Server) -> consensus_pb2.ConsensusStatePB:
    req = consensus_pb2.GetConsensusStateRequest(tablet_id=TABLET)
    state: consensus_pb2.ConsensusStatePB = server.consensus.GetConsensusState(req, timeout=5).state
    return state


def _step_down_to_a_new_term(seeded: Seeded) -> Server:
    """Move leadership once so the current term is at least 2 (a past term exists)."""
    old = seeded.leader
    term = _state(old).current_term
    if term >= 2:
        return old
    old.admin.LeaderStepDown(admin_pb2.LeaderStepDownRequest(tablet_id=TABLET), timeout=10)
    new = seeded.cluster.new_leader_of(TABLET, old.id)
    wait_for(
        lambda: all(
            _state(s).leader_uuid == new.id and _state(s).current_term >= 2
            for s in seeded.cluster.servers.values()
        ),
        20,
        "every replica to follow the new leader",
    )
    return new


def _malicious_entry(term: int, index: int) -> consensus_pb2.EntryPB:
    """A log entry that would insert key 666 if it were ever applied."""
    op = tablet_pb2.WriteOperationPB(ops=[kv_op(666, "evil")])
    op.request_id.client_id = "evil"
    op.request_id.seq_no = 1
    return consensus_pb2.EntryPB(
        term=term, index=index, type=consensus_pb2.NORMAL, payload=op.SerializeToString()
    )


def test_update_consensus_from_a_past_term_is_answered_with_the_higher_term(
    seeded: Seeded,
) -> None:
    leader = _step_down_to_a_new_term(seeded)
    follower = seeded.follower()
    before = {s.id: _state(s) for s in seeded.cluster.servers.values()}
    term = before[leader.id].current_term
    assert term >= 2
    third = next(s for s in seeded.cluster.servers if s not in (leader.id, follower.id))

    requests = [
        # A heartbeat from a deposed leader.
        (follower, consensus_pb2.UpdateConsensusRequest(
            tablet_id=TABLET, caller_uuid=third, dest_uuid=follower.id,
            caller_term=term - 1, is_heartbeat=True, committed_index=1,
        )),
        # An append from a past term that, if accepted, would overwrite the whole log from
        # index 1 with an entry inserting a row.
        (follower, consensus_pb2.UpdateConsensusRequest(
            tablet_id=TABLET, caller_uuid=third, dest_uuid=follower.id,
            caller_term=term - 1, prev_log_index=0, prev_log_term=0,
            entries=[_malicious_entry(term - 1, 1)], committed_index=1,
        )),
        # The same sent to the leader, claiming to come from a follower.
        (leader, consensus_pb2.UpdateConsensusRequest(
            tablet_id=TABLET, caller_uuid=follower.id, dest_uuid=leader.id,
            caller_term=term - 1, prev_log_index=0, prev_log_term=0,
            entries=[_malicious_entry(term - 1, 1)], committed_index=1,
        )),
    ]  # fmt: skip
    for target, req in requests:
        resp = target.consensus.UpdateConsensus(req, timeout=10)
        assert resp.responder_uuid == target.id
        assert resp.responder_term == term > req.caller_term
        # Not accepted: the raftlet wire form says so with the higher term (the caller
        # steps down on it); `rejected` is kept for a failed log-matching check, and no
        # entry was taken, so nothing may be reported as matching.
        assert resp.last_log_index == 0 or resp.rejected

    after = {s.id: _state(s) for s in seeded.cluster.servers.values()}
    for sid, st in after.items():
        assert st.current_term == term, sid
        assert st.leader_uuid == leader.id, sid
        assert st.last_log_index >= before[sid].last_log_index, sid
    assert after[leader.id].role == consensus_pb2.LEADER
    # The log was not truncated: every entry written so far is still applied everywhere.
    seeded.check_intact()


@pytest.mark.parametrize("term_offset", [0, 5])
def test_update_consensus_from_a_non_member_is_invalid_argument(
    seeded: Seeded, term_offset: int
) -> None:
    """From a server that is not a voter -- even one claiming a newer term, which from a
    member would depose the leader -- the call is refused and changes nothing."""
    leader = seeded.leader
    before = _state(leader)
    for target in seeded.cluster.servers.values():
        term = _state(target).current_term + term_offset
        req = consensus_pb2.UpdateConsensusRequest(
            tablet_id=TABLET,
            caller_uuid="ts-intruder",
            dest_uuid=target.id,
            caller_term=term,
            prev_log_index=0,
            prev_log_term=0,
            entries=[_malicious_entry(term, 1)],
            committed_index=1,
        )
        err = _rpc_error(target.consensus.UpdateConsensus, req, timeout=10)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        detail = server_error(err)
        assert detail is not None
        assert detail.code == ServerErrorPB.INVALID_ARGUMENT
        assert "ts-intruder" in err.details()

        vote = consensus_pb2.RequestVoteRequest(
            tablet_id=TABLET,
            candidate_uuid="ts-intruder",
            dest_uuid=target.id,
            candidate_term=term + 1,
            last_log_index=1 << 40,
            last_log_term=term,
        )
        err = _rpc_error(target.consensus.RequestVote, vote, timeout=10)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = _state(leader)
    assert (after.current_term, after.role, after.leader_uuid) == (
        before.current_term,
        consensus_pb2.LEADER,
        leader.id,
    )
    seeded.check_intact()


def test_update_consensus_for_an_unknown_tablet_is_not_found(seeded: Seeded) -> None:
    target = seeded.follower()
    req = consensus_pb2.UpdateConsensusRequest(
        tablet_id="no-such-tablet",
        caller_uuid=seeded.leader.id,
        dest_uuid=target.id,
        caller_term=1,
        is_heartbeat=True,
    )
    err = _rpc_error(target.consensus.UpdateConsensus, req, timeout=10)
    assert err.code() == grpc.StatusCode.NOT_FOUND
    seeded.check_intact()


def test_update_consensus_addressed_to_another_server_says_wrong_server_uuid(
    seeded: Seeded,
) -> None:
    """A call that reached the wrong server (dest_uuid names another one) is refused with
    INVALID_ARGUMENT; its ServerErrorPB should say WRONG_SERVER_UUID, the code the proto
    defines for this case (consensus/rpc/codec.py raises WrongServerUuid for it)."""
    leader = seeded.leader
    target = seeded.follower()
    other = next(s for s in seeded.cluster.servers if s not in (leader.id, target.id))
    req = consensus_pb2.UpdateConsensusRequest(
        tablet_id=TABLET,
        caller_uuid=leader.id,
        dest_uuid=other,
        caller_term=_state(target).current_term,
        is_heartbeat=True,
    )
    err = _rpc_error(target.consensus.UpdateConsensus, req, timeout=10)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    seeded.check_intact()
    detail = server_error(err)
    assert detail is not None
    assert ServerErrorPB.Code.Name(detail.code) == "WRONG_SERVER_UUID", err.details()
