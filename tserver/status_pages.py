"""What a tablet server shows about its tablets: the ``/tablets`` and ``/tablets.json``
status pages, each tablet's Raft gauges (term, role, commit and applied index) and disk
gauges (WAL and store bytes, ``tserver.disk_usage``) on ``/metrics``, and the server's
total of the latter.

Kept apart from the process (``tserver.server``: start, stop, the wiring) because these
are views of the replicas, not part of running them. Everything here reads what a replica
published or cached, never under its consensus lock: a replica stuck behind a slow disk
must not hang the page that would show it.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from raftlet.consensus.core.types import Role
from raftlet.metrics import catalogue as cat
from raftlet.metrics.human import human_bytes
from raftlet.metrics.registry import MetricEntity
from raftlet.metrics.status_server import PageRequest, PageResponse, StatusServer
from raftlet.tserver.disk_usage import (
    DiskUsage,
    directory_usage,
    files_bytes,
    store_bytes,
    tree_bytes,
)
from raftlet.tserver.failed_tablet import FailedTablet
from raftlet.tserver.readiness import not_ready
from raftlet.tserver.tablet_replica import TabletReplica

__all__ = [
    "register_disk_total_gauge",
    "register_tablet_gauges",
    "register_tablet_pages",
    "replica_disk_usage",
    "tablet_statuses",
    "tablets_table_html",
]

_HTML_COLUMNS = [
    "tablet_id",
    "table",
    "partition",
    "state",
    "role",
    "term",
    "leader",
    "leader_ready",
    "commit_index",
    "applied_index",
    "last_index",
    "log_bytes",
    "store_bytes",
    "last_election",
    "failure",
]

# What a non-leader's row shows under leader_ready. The field says "this replica is a ready
# leader", so it is False on every follower; next to the `leader` column a False there read
# as "the leader is not ready" while that leader was taking writes. /tablets.json keeps the
# bool: a program reads it by its name, not beside another column.
NOT_LEADER_CELL = "-"


def register_tablet_gauges(
    entity: MetricEntity, current: Callable[[], TabletReplica | FailedTablet | None]
) -> None:
    """Export the tablet's term, role, commit and applied index as gauges of ``entity``,
    read from ``current()`` -- the replica serving it now, which a tablet copy may replace,
    or the ``FailedTablet`` standing in for one (no Raft state: the gauges read 0, except
    ``tablet_failed``)."""
    roles = cat.RAFT_ROLE_VALUES

    def of(read: Callable[[TabletReplica], float]) -> Callable[[], float]:
        def value() -> float:
            replica = current()
            return read(replica) if isinstance(replica, TabletReplica) else 0.0

        return value

    def failed() -> float:
        replica = current()
        if isinstance(replica, TabletReplica):
            return 0.0 if replica.failure_reason() is None else 1.0
        return 1.0 if isinstance(replica, FailedTablet) else 0.0

    entity.function_gauge(cat.RAFT_TERM, of(lambda r: float(r.consensus.snapshot.term)))
    entity.function_gauge(
        cat.RAFT_ROLE, of(lambda r: float(roles[r.consensus.snapshot.role.value]))
    )
    entity.function_gauge(cat.RAFT_COMMIT_INDEX, of(lambda r: float(r.commit_index_cached())))
    entity.function_gauge(cat.RAFT_APPLIED_INDEX, of(lambda r: float(r.store.applied_index())))
    entity.function_gauge(cat.TABLET_FAILED, failed)
    entity.function_gauge(cat.RESULT_TRACKER_CLIENTS, of(lambda r: float(r.tracker.clients())))
    entity.function_gauge(
        cat.RESULT_TRACKER_MEMORY_BYTES, of(lambda r: float(r.tracker.memory_bytes()))
    )
    entity.function_gauge(cat.SCANS_HELD, of(lambda r: float(r.scans_held())))

    # A FAILED replica's files are on disk all the same (until a copy replaces them), so the
    # disk gauges read them from its directory where the Raft gauges read 0.
    def disk(
        running: Callable[[TabletReplica], int], failed: Callable[[DiskUsage], int]
    ) -> Callable[[], float]:
        def value() -> float:
            replica = current()
            if isinstance(replica, TabletReplica):
                return float(running(replica))
            if isinstance(replica, FailedTablet):
                return float(failed(directory_usage(replica.directory)))
            return 0.0

        return value

    entity.function_gauge(
        cat.TABLET_LOG_BYTES,
        disk(lambda r: files_bytes(r.consensus_log().segment_paths()), lambda u: u.log_bytes),
    )
    entity.function_gauge(
        cat.TABLET_LOG_SEGMENTS,
        disk(lambda r: len(r.consensus_log().segment_paths()), lambda u: u.log_segments),
    )
    entity.function_gauge(
        cat.TABLET_STORE_BYTES,
        disk(lambda r: store_bytes(r.store.path), lambda u: u.store_bytes),
    )


def replica_disk_usage(replica: TabletReplica | FailedTablet) -> DiskUsage:
    """What ``replica``'s WAL and store take on disk (one stat per file)."""
    if isinstance(replica, FailedTablet):
        return directory_usage(replica.directory)
    segments = replica.consensus_log().segment_paths()
    return DiskUsage(files_bytes(segments), len(segments), store_bytes(replica.store.path))


def register_disk_total_gauge(
    entity: MetricEntity,
    replicas: Mapping[str, TabletReplica],
    failed: Mapping[str, FailedTablet],
    copy_area: Path,
) -> None:
    """Export ``tablets_disk_bytes`` on the server's ``entity``: the WAL and store bytes of
    every replica in ``replicas`` and ``failed`` at the time of each scrape; and
    ``tablet_copy_disk_bytes``, what ``copy_area`` holds (copies on their way in or out)."""

    def total() -> float:
        hosted: list[TabletReplica | FailedTablet] = [*replicas.values(), *failed.values()]
        return float(sum(replica_disk_usage(r).total_bytes for r in hosted))

    entity.function_gauge(cat.TABLETS_DISK_BYTES, total)
    entity.function_gauge(cat.TABLET_COPY_DISK_BYTES, lambda: float(tree_bytes(copy_area)))


def tablet_statuses(
    replicas: Iterable[TabletReplica], failed: Iterable[FailedTablet] = ()
) -> list[dict[str, object]]:
    """Every replica's published status (see the module docstring: no consensus lock), then
    every tablet that failed to open, with what its files take on disk."""
    return [r.published_status() for r in replicas] + [_failed_status(f) for f in failed]


def _failed_status(tablet: FailedTablet) -> dict[str, object]:
    usage = directory_usage(tablet.directory)
    return {
        **tablet.status(),
        "log_bytes": usage.log_bytes,
        "log_segments": usage.log_segments,
        "store_bytes": usage.store_bytes,
    }


def tablets_table_html(statuses: Iterable[Mapping[str, object]]) -> str:
    """The ``/tablets`` table of ``statuses`` (``tablet_statuses``): log and store sizes in
    human units, and ``NOT_LEADER_CELL`` under leader_ready on every row that is not a
    leader's."""
    rows = []
    for status in statuses:
        st = dict(status)
        for column in ("log_bytes", "store_bytes"):
            size = st.get(column)
            st[column] = human_bytes(size) if isinstance(size, int) else ""
        if st.get("role") != Role.LEADER.value:
            st["leader_ready"] = NOT_LEADER_CELL
        cells = "".join(f"<td>{html.escape(str(st.get(c, '')))}</td>" for c in _HTML_COLUMNS)
        rows.append(f"<tr>{cells}</tr>")
    head = "".join(f"<th>{c}</th>" for c in _HTML_COLUMNS)
    return f"<table border=1><tr>{head}</tr>{''.join(rows)}</table>"


def register_tablet_pages(
    status: StatusServer,
    server_id: str,
    replicas: Mapping[str, TabletReplica],
    failed: Mapping[str, FailedTablet] | None = None,
    copying: Callable[[], Iterable[str]] = tuple,
    unsettled: Callable[[], Iterable[str]] = tuple,
) -> None:
    """Serve ``/tablets`` (HTML) and ``/tablets.json`` on ``status``, showing the replicas
    in ``replicas`` and the tablets in ``failed`` at the time of each request, and
    ``/readyz`` (``tserver.readiness``; ``copying()``: the tablets a copy is bringing here;
    ``unsettled()``: why the server's set of replicas is not settled yet, a line each):
    200 "ready", or 503 with a line per replica that is not."""
    failed = failed if failed is not None else {}

    def statuses() -> list[dict[str, object]]:
        return tablet_statuses(replicas.values(), failed.values())

    def tablets_json(request: PageRequest) -> PageResponse:
        return PageResponse.json({"server": server_id, "tablets": statuses()})

    def tablets_html(request: PageRequest) -> PageResponse:
        body = (
            tablets_table_html(statuses())
            + "<p><a href='/tablets.json'>JSON</a> · <a href='/metrics'>metrics</a></p>"
        )
        return status.html_page(f"Tablets on {server_id}", body)

    def readyz(request: PageRequest) -> PageResponse:
        judged = [r.ready_status() for r in replicas.values()]
        judged += [f.status() for f in failed.values()]
        reasons = [*unsettled(), *not_ready(server_id, judged, copying())]
        if not reasons:
            return PageResponse.text("ready\n")
        lines = "".join(f"{r}\n" for r in reasons)
        return PageResponse.text(f"not ready, {len(reasons)} reason(s):\n{lines}", status=503)

    status.register_page("/tablets", tablets_html)
    status.register_page("/tablets.json", tablets_json)
    status.register_page("/readyz", readyz)
