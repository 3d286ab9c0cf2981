"""The scanner against scripted fake servers: it asks for packed pages by default and reads
them into the same rows as cells; a reply without a block (an older server) is read as
cells; a malformed page is a ``RemoteError`` naming the table, never a crash."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from raftlet.client.errors import InvalidArgument, MessageTooLarge, RemoteError, Timeout
from raftlet.client.scanner import ReadMode, RowFormat, Scanner, _dicts, _some
from raftlet.proto import tablet_pb2
from raftlet.schema.predicates import Predicate
from raftlet.schema.row_pages import encode_page
from raftlet.schema.rows import row_to_pb
from raftlet.schema.scan_bounds import MAX_PREDICATES, MAX_SCAN_LIMIT
from raftlet.schema.types import Value
from tests.unit.client_fakes import (
    KV_SCHEMA,
    FakeClock,
    FakeCluster,
    FakeRpcError,
    make_rpc,
    unavailable,
)

ROWS: list[tuple[Value, ...]] = [(1, "a"), (2, None), (3, "ünï"), (4, ""), (5, "x" * 300)]
COLUMNS = ["key", "value"]
Answer = Callable[[tablet_pb2.ScanRequest], tablet_pb2.ScanResponse]


def serve(rows: list[tuple[Value, ...]], page_rows: int = 2) -> Answer:
    """A server holding ``rows``: pages of ``page_rows``, in the form asked for."""

    def answer(request: tablet_pb2.ScanRequest) -> tablet_pb2.ScanResponse:
        start = int(request.resume_key or b"0")
        page = rows[start : start + page_rows]
        response = tablet_pb2.ScanResponse(columns=COLUMNS)
        if request.row_format == tablet_pb2.ROW_FORMAT_PACKED:
            packed = encode_page(
                [c.type for c in KV_SCHEMA.columns], [[r[j] for r in page] for j in range(2)]
            )
            response.row_block.SetInParent()
            response.row_block.rows = packed.rows
            response.row_block.indirect = packed.indirect
        else:
            response.rows.extend(row_to_pb(KV_SCHEMA, COLUMNS, r) for r in page)
        if start + page_rows < len(rows):
            response.has_more = True
            response.resume_key = str(start + page_rows).encode()
        return response

    return answer


def scanner(
    answer: Answer | tablet_pb2.ScanResponse, **kwargs: object
) -> tuple[Scanner, FakeCluster]:
    cluster = FakeCluster()
    for s in cluster.servers.values():
        s.script("scan", answer)
    rpc = make_rpc(cluster)
    kwargs.setdefault("read_mode", ReadMode.FOLLOWER_APPLIED)
    kwargs.setdefault("timeout_s", 5.0)
    return Scanner(rpc, rpc.meta.table("kv"), ["kv-p0"], **kwargs), cluster  # type: ignore[arg-type]


def requests(cluster: FakeCluster) -> list[tablet_pb2.ScanRequest]:
    return [r for s in cluster.servers.values() for r in s.requests.get("scan", [])]


def test_packed_and_cell_pages_give_the_same_rows() -> None:
    want = [dict(zip(COLUMNS, r, strict=True)) for r in ROWS]
    packed, cluster = scanner(serve(ROWS))
    assert list(packed) == want
    assert packed.pages == 3
    sent = requests(cluster)
    assert {r.row_format for r in sent} == {tablet_pb2.ROW_FORMAT_PACKED}  # the default
    assert {(r.batch_size_rows, r.batch_size_bytes) for r in sent} == {(0, 0)}  # the server's
    cells, cluster = scanner(serve(ROWS), row_format=RowFormat.CELLS, batch_size_bytes=4096)
    assert list(cells) == want
    sent = requests(cluster)
    assert {r.row_format for r in sent} == {tablet_pb2.ROW_FORMAT_CELLS}
    assert {r.batch_size_bytes for r in sent} == {4096}


def test_a_server_that_sends_cells_when_asked_for_packed_pages_is_understood() -> None:
    def old_server(request: tablet_pb2.ScanRequest) -> tablet_pb2.ScanResponse:
        as_cells = tablet_pb2.ScanRequest()
        as_cells.CopyFrom(request)
        as_cells.row_format = tablet_pb2.ROW_FORMAT_CELLS  # it does not know the field
        return serve(ROWS)(as_cells)

    s, _ = scanner(old_server)
    assert [tuple(r.values()) for r in s] == ROWS


def _packed(
    rows: bytes, indirect: bytes = b"", columns: list[str] = COLUMNS
) -> tablet_pb2.ScanResponse:
    response = tablet_pb2.ScanResponse(columns=columns)
    response.row_block.SetInParent()
    response.row_block.rows = rows
    response.row_block.indirect = indirect
    return response


def test_malformed_pages_are_remote_errors() -> None:
    good = encode_page([c.type for c in KV_SCHEMA.columns], [[1], ["abc"]])
    both = _packed(good.rows, good.indirect)
    both.rows.append(row_to_pb(KV_SCHEMA, COLUMNS, (1, "abc")))
    cases = [
        (_packed(good.rows[:-1], good.indirect), "whole number"),
        (_packed(good.rows, b"ab"), "points past"),
        (_packed(good.rows, good.indirect, ["key", "nope"]), "nope"),
        (_packed(good.rows, good.indirect, ["key"]), "whole number"),  # one column fewer
        (_packed(b"", b"", []), "no columns"),
        (both, "both cells and a packed block"),
    ]
    for response, reason in cases:
        s, _ = scanner(response)
        with pytest.raises(
            RemoteError, match=f"scan of 'kv': the server sent a malformed page: .*{reason}"
        ):
            list(s)


def test_page_bounds_are_checked_before_any_call() -> None:
    for kwargs in ({"batch_size_bytes": -1}, {"batch_size_rows": 2**32}):
        with pytest.raises(InvalidArgument, match="must be in"):
            scanner(serve(ROWS), **kwargs)


@pytest.mark.parametrize("ncols", [1, 2, 3, 4, 5])
def test_rows_are_the_dicts_of_their_columns_whatever_their_number(ncols: int) -> None:
    columns = [f"c{j}" for j in range(ncols)]
    values: list[list[Value]] = [[j * 10 + i for i in range(4)] for j in range(ncols)]
    want = [{c: values[j][i] for j, c in enumerate(columns)} for i in range(4)]
    assert _dicts(columns, values) == want
    assert all(list(row) == columns for row in _dicts(columns, values))  # in column order
    assert _dicts(columns, [[] for _ in columns]) == []


def test_min_index_goes_with_every_page_and_a_replica_behind_it_is_left_for_another() -> None:
    """Bounded staleness: a replica that has not applied ``min_index`` in time answers
    UNAVAILABLE, and the page comes from another replica."""
    calls: list[str] = []
    pages = serve(ROWS)

    def behind_once(request: tablet_pb2.ScanRequest) -> tablet_pb2.ScanResponse:
        calls.append("scan")
        if len(calls) == 1:
            raise unavailable()
        return pages(request)

    sc, cluster = scanner(behind_once, min_index=42)
    assert [r["key"] for r in sc] == [r[0] for r in ROWS]
    sent = requests(cluster)
    assert {r.min_applied_index for r in sent} == {42}
    assert len(sent) == 4  # the refused attempt and three pages
    with pytest.raises(InvalidArgument, match="min_index"):
        scanner(serve(ROWS), min_index=-1)


def test_min_index_is_a_bound_per_tablet() -> None:
    """A Raft index belongs to one tablet's log: a plain one on a scan of two tablets is
    refused before any call (the other tablet's log may never reach it, and its pages waited
    out every replica), and a mapping bounds only the tablets it names."""
    cluster = FakeCluster()
    for s in cluster.servers.values():
        s.script("scan", serve(ROWS))
    rpc = make_rpc(cluster)
    kv = rpc.meta.table("kv")
    both = ["kv-p0", "kv-p1"]

    def scan(min_index: object) -> Scanner:
        return Scanner(
            rpc,
            kv,
            both,
            timeout_s=5.0,
            read_mode=ReadMode.FOLLOWER_APPLIED,
            min_index=min_index,  # type: ignore[arg-type]
        )

    with pytest.raises(InvalidArgument, match="visits 2 tablets: give an index for each tablet"):
        scan(42)
    with pytest.raises(InvalidArgument, match="'kv-p9', not a tablet of table 'kv'"):
        scan({"kv-p9": 42})
    for bad in (2**63, -1, "42", True):
        with pytest.raises(InvalidArgument, match="must be a Raft index"):
            scan({"kv-p1": bad})
    assert len(list(scan({"kv-p1": 42}))) == 2 * len(ROWS)
    sent = {(r.tablet_id, r.min_applied_index) for r in requests(cluster)}
    assert sent == {("kv-p0", 0), ("kv-p1", 42)}
    assert len(list(scan(0))) == 2 * len(ROWS)  # no bound: any number of tablets


def test_a_refusal_names_a_few_of_many_tablets() -> None:
    """A table of 128 tablets made a 2.5 KB line of an unknown tablet's refusal."""
    assert _some([f"t-p{i}" for i in range(128)]) == "t-p0, t-p1, t-p2, t-p3, ... (124 more)"
    assert _some(["t-p0", "t-p1"]) == "t-p0, t-p1"


def test_arguments_no_scan_could_take_are_refused_by_name() -> None:
    """Each once failed in its own way: a timeout of 0 or less as a Timeout after "0
    attempts", a string projection as a missing column 'k', a string predicate as an
    AttributeError."""
    for timeout in (0, -1, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument, match="timeout_s must be positive seconds"):
            scanner(serve(ROWS), timeout_s=timeout)
    with pytest.raises(InvalidArgument, match="not one name: \\['key'\\]"):
        scanner(serve(ROWS), projection="key")
    with pytest.raises(InvalidArgument, match="predicates are Predicate objects"):
        scanner(serve(ROWS), predicates=["key > 1"])
    # Python's own errors before: a TypeError, one only once the scan was iterated.
    with pytest.raises(InvalidArgument, match="predicates is a list of Predicate objects"):
        scanner(serve(ROWS), predicates=Predicate.equals("key", 1))
    with pytest.raises(InvalidArgument, match="limit must be 0 to"):
        scanner(serve(ROWS), limit=1.5)
    with pytest.raises(InvalidArgument, match="5 is not a valid ReadMode"):
        scanner(serve(ROWS), read_mode=5)


def test_scan_bounds_are_checked_before_any_call() -> None:
    many = [Predicate.is_not_null("value")] * (MAX_PREDICATES + 1)
    values = [Predicate.in_list("key", range(10_000))] * 3
    cases: list[tuple[dict[str, object], str]] = [
        ({"limit": 2**63 - 1}, r"limit must be 0 to .* rows \(or None: no limit\), got 922"),
        ({"limit": MAX_SCAN_LIMIT + 1}, r"limit must be 0 to 9007199254740992 rows"),
        ({"limit": -1}, r"\(or None: no limit\), got -1"),
        ({"predicates": many}, f"{MAX_PREDICATES + 1} predicates: a scan takes at most"),
        ({"predicates": values}, "carry 30000 values"),
    ]
    for kwargs, words in cases:
        with pytest.raises(InvalidArgument, match=words):
            scanner(serve(ROWS), **kwargs)
    s, cluster = scanner(serve(ROWS), limit=MAX_SCAN_LIMIT)
    assert len(list(s)) == len(ROWS)
    assert requests(cluster)[0].limit == MAX_SCAN_LIMIT


def test_a_page_over_the_message_limit_fails_once_with_the_limit_named() -> None:
    too_big = FakeRpcError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "Stream removed (CLIENT: Received message larger than max (4194149 vs. 1048576))",
    )
    s, cluster = scanner(too_big)
    with pytest.raises(MessageTooLarge, match=r"response of 4194149 bytes .* 1048576 bytes"):
        list(s)
    assert len(requests(cluster)) == 1


def test_an_empty_resume_key_continues_the_tablet() -> None:
    # The page before ended at a row whose key encodes as nothing (an empty string key):
    # has_more with an empty, present resume key is "go on", sent back as it came.
    asked: list[bytes | None] = []

    def answer(request: tablet_pb2.ScanRequest) -> tablet_pb2.ScanResponse:
        asked.append(request.resume_key if request.HasField("resume_key") else None)
        response = tablet_pb2.ScanResponse(columns=COLUMNS)
        if len(asked) == 1:
            response.rows.append(row_to_pb(KV_SCHEMA, COLUMNS, (1, "first")))
            response.has_more = True
            response.resume_key = b""
        else:
            response.rows.append(row_to_pb(KV_SCHEMA, COLUMNS, (2, "second")))
        return response

    scan, _ = scanner(answer, row_format=RowFormat.CELLS)
    assert [r["value"] for r in scan] == ["first", "second"]
    assert asked == [None, b""]


def test_a_scan_that_times_out_says_it_applied_nothing() -> None:
    """A read applies nothing: its Timeout said ``may_have_applied`` after a DEADLINE_EXCEEDED,
    as a write's does."""
    cluster = FakeCluster()
    clock = FakeClock()

    def late(_request: object) -> tablet_pb2.ScanResponse:
        clock.now += 1.0
        raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    for s in cluster.servers.values():
        s.script("scan", late)
    rpc = make_rpc(cluster, clock)
    scan = Scanner(rpc, rpc.meta.table("kv"), ["kv-p0"], read_mode=ReadMode.FOLLOWER_APPLIED,
                   timeout_s=3.0)  # fmt: skip
    with pytest.raises(Timeout) as info:
        list(scan)
    assert info.value.may_have_applied is False


def test_current_server_names_the_server_of_the_rows_being_handed_out() -> None:
    """It was None while the rows of each tablet's last page were handed out (review r32c);
    a tablet's first page is no fail-over, whatever server the page before came from."""
    sc, cluster = scanner(serve(ROWS, page_rows=2))
    servers = set()
    for _ in sc:
        servers.add(sc.current_server)
    assert None not in servers
    assert len(servers) == 1
    assert servers <= set(cluster.servers)
    assert (sc.pages, sc.failovers) == (3, 0)
