"""Malformed scan requests: each is INVALID_ARGUMENT (``InvalidRequest``) with what is wrong,
never an internal error -- checked field by field, at the bounds, against the store (a scan
at every bound runs), and by fuzzing whole requests against a real replica."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlet.proto import tablet_pb2
from raftlet.schema.predicates import Predicate
from raftlet.schema.rows import OpType, encode_row_op
from raftlet.schema.scan_bounds import MAX_PREDICATE_VALUES, MAX_PREDICATES, MAX_SCAN_LIMIT
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from raftlet.tserver.errors import InvalidRequest
from raftlet.tserver.scan_request import MAX_INDEX, check_scan_request
from raftlet.tserver.store import ApplyEntry, TabletStore
from tests.unit.test_tablet_replica import Tablet, send, write

SCHEMA = Schema(
    [
        ColumnSchema("k", DataType.INT64, is_key=True),
        ColumnSchema("v", DataType.STRING, nullable=True),
    ]
)


def _range(column: str, lo: int, hi: int) -> tablet_pb2.PredicatePB:
    return Predicate.range(column, lo, hi).to_pb(SCHEMA)


def _in_list(n: int) -> tablet_pb2.PredicatePB:
    return Predicate.in_list("k", range(n)).to_pb(SCHEMA)


def _request(**fields: object) -> tablet_pb2.ScanRequest:
    return tablet_pb2.ScanRequest(tablet_id="t", **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (_request(limit=2**63 - 1), "limit 9223372036854775807 is out of range: 0 .* to"),
        (_request(limit=2**64 - 1), "out of range"),
        (_request(limit=MAX_SCAN_LIMIT + 1), "out of range"),
        (_request(predicates=[_range("k", 0, 9)] * 2000), "2000 predicates: .* at most 256"),
        (
            _request(predicates=[_range("k", 0, 9)] * (MAX_PREDICATES + 1)),
            f"{MAX_PREDICATES + 1} predicates",
        ),
        (
            _request(predicates=[_in_list(10_000), _in_list(10_000), _range("k", 0, 9)]),
            f"carry 20002 values: a scan takes at most {MAX_PREDICATE_VALUES}",
        ),
        (_request(read_mode=77), "unknown read mode 77 .*READ_LEADER_LATEST=0"),
        (_request(read_mode=-1), "unknown read mode -1"),
        (_request(row_format=9), "unknown row format 9 .*ROW_FORMAT_PACKED"),
        (_request(min_applied_index=MAX_INDEX + 1), "min_applied_index .* beyond any Raft index"),
    ],
)
def test_each_bad_field_is_named(request_: tablet_pb2.ScanRequest, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        check_scan_request(request_)


def test_requests_at_the_bounds_pass() -> None:
    check_scan_request(_request(limit=MAX_SCAN_LIMIT, min_applied_index=MAX_INDEX))
    check_scan_request(_request(predicates=[_range("k", 0, 9)] * MAX_PREDICATES))
    check_scan_request(_request(predicates=[_in_list(10_000), _in_list(9_998), _range("k", 0, 1)]))


def test_the_store_runs_a_scan_at_every_bound(tmp_path: Path) -> None:
    # The bounds are meant to keep SQLite's statement limits out of reach: a scan at them
    # must run, with a resume key and a limit adding to the statement.
    with TabletStore.open(tmp_path / "t.db", SCHEMA) as store:
        ops = [encode_row_op(SCHEMA, OpType.INSERT, {"k": k, "v": f"v{k}"}) for k in range(10)]
        store.apply_batch([ApplyEntry(1, 1, ops)])
        ranges = [_range("k", 0, 9), _range("v", "", "zz")] * (MAX_PREDICATES // 2)
        first = store.scan(None, ranges, limit=3)
        assert [r[0] for r in first.rows] == [0, 1, 2]
        rest = store.scan(None, ranges, limit=MAX_SCAN_LIMIT, resume_key=first.resume_key)
        assert [r[0] for r in rest.rows] == list(range(3, 9))
        values = [_in_list(10_000), _in_list(MAX_PREDICATE_VALUES - 10_000)]
        assert len(store.scan(None, values, limit=MAX_SCAN_LIMIT).rows) == 10


@pytest.fixture
def tablet(tmp_path: Path) -> Iterator[Tablet]:
    t = Tablet(tmp_path)
    yield t
    t.close()


_values = st.one_of(
    st.builds(tablet_pb2.ValuePB),
    st.builds(tablet_pb2.ValuePB, int_value=st.integers(-(2**63), 2**63 - 1)),
    st.builds(tablet_pb2.ValuePB, string_value=st.text(max_size=4)),
    st.builds(tablet_pb2.ValuePB, double_value=st.floats()),
    st.builds(tablet_pb2.ValuePB, binary_value=st.binary(max_size=4)),
    st.builds(tablet_pb2.ValuePB, null_value=st.just(True)),
)


@st.composite
def _predicates(draw: st.DrawFn) -> tablet_pb2.PredicatePB:
    p = tablet_pb2.PredicatePB(column=draw(st.sampled_from(["k", "v", "nope", ""])))
    kind = draw(st.sampled_from(["equals", "range", "in_list", "is_null", "is_not_null", "-"]))
    if kind == "equals":
        p.equals.CopyFrom(draw(_values))
    elif kind == "range":
        p.range.SetInParent()
        if draw(st.booleans()):
            p.range.lower.CopyFrom(draw(_values))
        if draw(st.booleans()):
            p.range.upper.CopyFrom(draw(_values))
        p.range.lower_inclusive = draw(st.booleans())
    elif kind == "in_list":
        p.in_list.SetInParent()
        p.in_list.values.extend(draw(st.lists(_values, max_size=4)))
    elif kind == "is_null":
        p.is_null = draw(st.booleans())
    elif kind == "is_not_null":
        p.is_not_null = draw(st.booleans())
    return p


@st.composite
def _scan_requests(draw: st.DrawFn) -> tablet_pb2.ScanRequest:
    predicates = draw(
        st.one_of(
            st.lists(_predicates(), max_size=4),
            st.integers(MAX_PREDICATES - 1, MAX_PREDICATES + 2).map(
                lambda n: [tablet_pb2.PredicatePB(column="k", is_not_null=True)] * n
            ),
        )
    )
    return tablet_pb2.ScanRequest(
        tablet_id="kv-p0",
        projection=draw(st.lists(st.sampled_from(["k", "v", "nope", ""]), max_size=3)),
        predicates=predicates,
        limit=draw(
            st.one_of(
                st.integers(0, 5),
                st.sampled_from([MAX_SCAN_LIMIT, MAX_SCAN_LIMIT + 1, 2**63 - 1, 2**64 - 1]),
            )
        ),
        resume_key=draw(st.none() | st.binary(max_size=10)),  # None: unset
        read_mode=draw(st.integers(-2, 3)),  # type: ignore[arg-type]
        batch_size_rows=draw(st.sampled_from([0, 1, 2, 2**32 - 1])),
        row_format=draw(st.integers(-2, 3)),  # type: ignore[arg-type]
        batch_size_bytes=draw(st.sampled_from([0, 1, 2**32 - 1])),
        # A reachable index is served at once (one past it would wait the read wait out).
        min_applied_index=draw(st.sampled_from([0, 1, MAX_INDEX + 1, 2**64 - 1])),
    )


def test_no_scan_request_is_an_internal_error(tablet: Tablet) -> None:
    leader = tablet.leader()
    send(leader, write([1, 2, 3], "c1", 1)).result()
    answered = refused = 0

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_scan_requests())
    def scan(request: tablet_pb2.ScanRequest) -> None:
        nonlocal answered, refused
        try:
            page = leader.scan(request)
        except InvalidRequest as e:
            words = str(e)
            refused += 1
            assert words
        else:
            assert len(page.rows) <= 3
            answered += 1

    scan()
    assert answered
    assert refused
