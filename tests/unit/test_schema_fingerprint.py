"""A schema's fingerprint, and who checks it: a row packed for one schema reads, under
another of the same width, as other values without an error -- a reviewer's INT64 column
stored a client's DOUBLE 1.5 as 4609434218613702656, and a replica made with another schema
than its group's stored every write so, in silence."""

from __future__ import annotations

import dataclasses
import logging

import grpc
import pytest
from hypothesis import given

from raftlet.cluster import TableConfig
from raftlet.consensus.core import Entry, EntryType
from raftlet.proto import tablet_pb2
from raftlet.schema.row_block import encode_row_block
from raftlet.schema.rows import OpType
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from raftlet.tserver.bootstrap import SchemaMismatchedEntry, to_apply_entries, to_apply_entry
from raftlet.tserver.errors import SchemaMismatch, check_schema
from raftlet.tserver.table_layout import LayoutMismatch, check_new_tables, peer_configs
from raftlet.tserver.tablet_replica import write_entry_payload
from tests.unit.client_fakes import FakeRpcError
from tests.unit.schema_strategies import schemas

INTS = Schema([ColumnSchema("id", DataType.INT64, is_key=True), ColumnSchema("v", DataType.INT64)])
DOUBLES = Schema(
    [ColumnSchema("id", DataType.INT64, is_key=True), ColumnSchema("v", DataType.DOUBLE)]
)


def test_the_fingerprint_is_fixed_across_versions() -> None:
    """Servers and clients of two versions compare it: its value may not drift."""
    kv = Schema(
        [
            ColumnSchema("key", DataType.INT64, is_key=True),
            ColumnSchema("value", DataType.STRING, nullable=True),
        ]
    )
    assert kv.fingerprint == 1565230325621340833


def test_what_decides_how_a_row_reads_changes_the_fingerprint() -> None:
    base = INTS.columns
    variants = [
        DOUBLES,
        Schema([base[0], dataclasses.replace(base[1], nullable=True)]),
        Schema([base[0], dataclasses.replace(base[1], name="w")]),
        Schema([*base, ColumnSchema("w", DataType.INT64, nullable=True)]),
        Schema([base[0], dataclasses.replace(base[1], is_key=True)]),
    ]
    prints = {INTS.fingerprint, *(s.fingerprint for s in variants)}
    assert len(prints) == 1 + len(variants)


@given(schemas())
def test_equal_schemas_have_one_nonzero_fingerprint(schema: Schema) -> None:
    again = Schema(list(schema.columns))
    assert again.fingerprint == schema.fingerprint != 0
    assert Schema.from_pb(schema.to_pb()).fingerprint == schema.fingerprint


def test_a_request_for_another_schema_is_refused_and_one_without_any_is_not() -> None:
    check_schema(INTS.fingerprint, "the write", "t", INTS)
    check_schema(0, "the write", "t", INTS)  # an older client: not checked
    with pytest.raises(SchemaMismatch) as e:
        check_schema(DOUBLES.fingerprint, "the write", "t", INTS)
    assert str(e.value).startswith(
        "the write was made for another schema of table 't' than this replica's "
        "(id INT64 KEY, v INT64 NOT NULL)"
    )


def _entry(index: int, schema: Schema, fingerprint: int) -> Entry:
    request = tablet_pb2.WriteRequest(tablet_id="t-p0", schema_fingerprint=fingerprint)
    request.row_block.rows, request.row_block.indirect = encode_row_block(
        schema, [(OpType.INSERT, {"id": index, "v": 1.5 if schema is DOUBLES else 7})]
    )
    return Entry(index=index, term=1, type=EntryType.NORMAL, data=write_entry_payload(request))


def test_a_log_entry_carries_the_fingerprint_its_leader_checked() -> None:
    payload = tablet_pb2.WriteOperationPB.FromString(_entry(3, INTS, INTS.fingerprint).data)
    assert payload.schema_fingerprint == INTS.fingerprint


def test_a_replica_of_another_schema_applies_no_entry_written_for_the_leaders() -> None:
    written = [_entry(5, DOUBLES, DOUBLES.fingerprint)]
    # Without the check the block decodes under INTS: 1.5's bits as an INT64.
    with pytest.raises(SchemaMismatchedEntry, match="entry 5 was written by a leader with "):
        to_apply_entries(written, INTS)
    with pytest.raises(SchemaMismatchedEntry):
        to_apply_entry(written[0], INTS)
    assert len(to_apply_entries(written, DOUBLES)) == 1
    # Entries from before the field carry none, and are applied as before.
    assert len(to_apply_entries([_entry(6, INTS, 0)], INTS)) == 1


def _config(schema: Schema, partitions: int = 2) -> tablet_pb2.GetClusterConfigResponse:
    config = tablet_pb2.GetClusterConfigResponse()
    config.tables.add(name="t", schema=schema.to_pb(), num_partitions=partitions)
    return config


def test_a_table_new_here_must_be_what_the_running_servers_have() -> None:
    table = TableConfig("t", INTS, partitions=2, replication_factor=3)
    check_new_tables([table], {})  # nobody answered: nothing to compare
    check_new_tables([table], {"ts1": _config(INTS), "ts2": tablet_pb2.GetClusterConfigResponse()})
    with pytest.raises(LayoutMismatch) as e:
        check_new_tables([table], {"ts1": _config(DOUBLES), "ts2": _config(INTS, partitions=3)})
    assert str(e.value) == (
        "table 't' is new to this server, and its config gives it schema (id INT64 KEY, "
        "v INT64 NOT NULL) in 2 partitions, but ts1 has schema (id INT64 KEY, v DOUBLE NOT "
        "NULL); ts2 has 3 partitions: the servers of a cluster must agree on a table "
        "(replicas read one another's rows by it); make this server's cluster.toml agree "
        "with theirs"
    )


class _Peer:
    def __init__(self, answer: tablet_pb2.GetClusterConfigResponse | grpc.StatusCode) -> None:
        self._answer = answer

    def get_cluster_config(self, timeout: float) -> tablet_pb2.GetClusterConfigResponse:
        if isinstance(self._answer, grpc.StatusCode):
            raise FakeRpcError(self._answer)
        return self._answer


def test_peers_of_an_older_release_are_left_out_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A peer that refuses the call (a release whose servers could not ask) or does not know
    it is not compared with, and the log says so; one down or busy is left out quietly."""
    peers = {
        "ts1": _Peer(_config(INTS)),
        "ts2": _Peer(grpc.StatusCode.PERMISSION_DENIED),
        "ts3": _Peer(grpc.StatusCode.UNIMPLEMENTED),
        "ts4": _Peer(grpc.StatusCode.UNAVAILABLE),
        "ts5": _Peer(grpc.StatusCode.DEADLINE_EXCEEDED),
    }
    with caplog.at_level(logging.WARNING, logger="raftlet.tserver.table_layout"):
        answers = peer_configs(peers, 2.0)
    assert list(answers) == ["ts1"]
    assert [r.getMessage() for r in caplog.records] == [
        "ts2 refused to show this server its cluster config (an older release?): the schemas "
        "of tables new to this server are not compared with ts2's",
        "ts3 does not know the cluster-config call (an older release?): the schemas of tables "
        "new to this server are not compared with ts3's",
    ]
