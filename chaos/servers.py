"""Asking each server directly: its tablets' state, its flags, a replica's rows.

The workload goes through the client library, which hides which replica answered; the
nemesis and the verification need to address one server at a time (set a flag on *this*
server, read *this* replica's rows), so they use the raw services here.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Mapping, Sequence

import grpc

from raftlet.client.channels import ChannelPool, channel_options
from raftlet.cluster import ClusterConfig
from raftlet.proto import admin_pb2, admin_pb2_grpc, consensus_pb2, tablet_pb2, tablet_pb2_grpc
from raftlet.schema.predicates import Predicate
from raftlet.schema.rows import OpType, encode_row_op, row_from_pb
from raftlet.schema.schema import Schema
from raftlet.schema.types import Value

__all__ = ["ReplicaRows", "ServerProbe"]

ReplicaRows = tuple[int, list[tuple[Value, ...]]]  # (applied index, rows in key order)

# One status or flag call: a paused or cut-off server must not stall the nemesis.
_CALL_TIMEOUT_S = 2.0
_SCAN_TIMEOUT_S = 10.0
_READ_COUNTERS = ("lease_reads", "read_index_reads", "stalls")


class ServerProbe:
    """A channel and stubs per server of ``config``."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        # Low reconnect backoff: a restarted server must be seen again at once.
        self._channels = ChannelPool(channel_options(max_reconnect_backoff_ms=500))
        self._addr = {s.id: s.rpc_addr for s in config.servers}

    def close(self) -> None:
        self._channels.close()

    def _tablet_stub(self, sid: str) -> tablet_pb2_grpc.TabletServiceStub:
        return tablet_pb2_grpc.TabletServiceStub(self._channels.channel(self._addr[sid]))

    def _admin_stub(self, sid: str) -> admin_pb2_grpc.AdminServiceStub:
        return admin_pb2_grpc.AdminServiceStub(self._channels.channel(self._addr[sid]))

    def status(self, sid: str) -> dict[str, tablet_pb2.TabletStatusPB] | None:
        """``sid``'s view of each of its tablets, or None if it does not answer."""
        try:
            resp = self._tablet_stub(sid).ListTablets(
                tablet_pb2.ListTabletsRequest(), timeout=_CALL_TIMEOUT_S
            )
        except grpc.RpcError:
            return None
        return {t.tablet_id: t for t in resp.tablets}

    def statuses(self) -> dict[str, dict[str, tablet_pb2.TabletStatusPB] | None]:
        return {sid: self.status(sid) for sid in self._addr}

    def leaders(self) -> dict[str, str]:
        """Tablet -> the server that leads it with a ready leader, the highest term winning
        where a deposed leader has not noticed yet."""
        best: dict[str, tuple[int, str]] = {}
        for sid, tablets in self.statuses().items():
            for t in (tablets or {}).values():
                ready = t.role == consensus_pb2.LEADER and t.leader_ready
                if ready and (t.tablet_id not in best or t.term > best[t.tablet_id][0]):
                    best[t.tablet_id] = (t.term, sid)
        return {tablet: sid for tablet, (_, sid) in best.items()}

    def read_counters(self) -> dict[str, int]:
        """``lease_reads``, ``read_index_reads`` and ``stalls`` summed over every replica of
        every server that answers (from ``/tablets.json``: counts since each server's last
        start, as published up to a second ago)."""
        totals = dict.fromkeys(_READ_COUNTERS, 0)
        for s in self.config.servers:
            try:
                with urllib.request.urlopen(
                    f"http://{s.http_addr}/tablets.json", timeout=_CALL_TIMEOUT_S
                ) as resp:
                    tablets = json.load(resp)["tablets"]
            except (OSError, ValueError, KeyError):
                continue
            for t in tablets:
                for name in _READ_COUNTERS:
                    value = t.get(name)
                    totals[name] += value if isinstance(value, int) else 0
        return totals

    def set_flag(self, sid: str, name: str, value: str) -> None:
        self._admin_stub(sid).SetFlag(
            admin_pb2.SetFlagRequest(name=name, value=value), timeout=_CALL_TIMEOUT_S
        )

    def replica_rows(self, sid: str, tablet_id: str, schema: Schema) -> ReplicaRows:
        """Every row ``sid``'s replica of ``tablet_id`` has applied, read at one applied
        index (pages are re-read from the start if the replica applied more meanwhile)."""
        stub = self._tablet_stub(sid)
        columns = [c.name for c in schema.columns]
        for _ in range(20):
            rows: list[tuple[Value, ...]] = []
            resume: bytes | None = None  # None: from the start (b"" is a key)
            index: int | None = None
            while True:
                resp = stub.Scan(
                    tablet_pb2.ScanRequest(
                        tablet_id=tablet_id,
                        read_mode=tablet_pb2.READ_FOLLOWER_APPLIED,
                        resume_key=resume,
                        row_format=tablet_pb2.ROW_FORMAT_CELLS,
                    ),
                    timeout=_SCAN_TIMEOUT_S,
                )
                if index is not None and resp.applied_index != index:
                    break  # moved on mid-scan: start again at one index
                index = resp.applied_index
                rows += [row_from_pb(schema, columns, pb) for pb in resp.rows]
                if not (resp.has_more and resp.HasField("resume_key")):
                    return index, rows
                resume = resp.resume_key
            time.sleep(0.05)  # the replica is applying: give it a moment before re-reading
        raise RuntimeError(f"{sid}'s replica of {tablet_id} kept changing during the scan")

    def leader_read(
        self, sid: str, tablet_id: str, schema: Schema, key: Value, timeout_s: float
    ) -> Value:
        """The ``value`` of the row whose single key column equals ``key``, read with a
        leader-latest scan sent to ``sid`` itself (None if there is no such row) -- what a
        client whose cache still names ``sid`` as the leader would get. Raises
        ``grpc.RpcError`` when ``sid`` refuses (not the leader, no quorum...)."""
        key_column = next(c.name for c in schema.columns if c.is_key)
        resp = self._tablet_stub(sid).Scan(
            tablet_pb2.ScanRequest(
                tablet_id=tablet_id,
                predicates=[Predicate.equals(key_column, key).to_pb(schema)],
                projection=["value"],
                read_mode=tablet_pb2.READ_LEADER_LATEST,
                row_format=tablet_pb2.ROW_FORMAT_CELLS,
            ),
            timeout=timeout_s,
        )
        rows = [row_from_pb(schema, ["value"], pb) for pb in resp.rows]
        return rows[0][0] if rows else None

    def write_row(
        self,
        sid: str,
        tablet_id: str,
        schema: Schema,
        row: Mapping[str, object],
        request_id: tuple[str, int],
        timeout_s: float,
    ) -> tablet_pb2.WriteResponse:
        """One UPSERT of ``row`` sent to ``sid`` itself, once, with request id ``(client id,
        sequence number)`` -- what a client whose cache names ``sid`` as the leader would
        send. Raises ``grpc.RpcError`` when it fails."""
        client_id, seq_no = request_id
        request = tablet_pb2.WriteRequest(
            tablet_id=tablet_id, ops=[encode_row_op(schema, OpType.UPSERT, row)]
        )
        request.request_id.client_id = client_id
        request.request_id.seq_no = seq_no
        # Never retried: nothing below this one needs remembering.
        request.request_id.first_incomplete_seq_no = seq_no
        response: tablet_pb2.WriteResponse = self._tablet_stub(sid).Write(
            request, timeout=timeout_s
        )
        return response

    def compare_replicas(
        self, tablet_id: str, replicas: Sequence[str], schema: Schema
    ) -> tuple[bool, str]:
        """Whether every replica holds the same rows at the same applied index; if not, a
        one-line account of the difference."""
        seen: dict[str, ReplicaRows] = {}
        for sid in replicas:
            try:
                seen[sid] = self.replica_rows(sid, tablet_id, schema)
            except grpc.RpcError as e:
                return False, f"{sid} did not answer: {e.code().name}: {e.details()}"
        indexes = {sid: idx for sid, (idx, _) in seen.items()}
        if len(set(indexes.values())) > 1:
            return False, f"applied indexes differ: {indexes}"
        first_sid, (_, first_rows) = next(iter(seen.items()))
        for sid, (_, rows) in seen.items():
            if rows != first_rows:
                only_a = set(first_rows) - set(rows)
                only_b = set(rows) - set(first_rows)
                return False, (
                    f"{first_sid} and {sid} differ at index {indexes[sid]}: "
                    f"{len(only_a)} rows only on {first_sid}, {len(only_b)} only on {sid}"
                )
        return True, f"{len(first_rows)} rows at index {indexes[first_sid]}"
