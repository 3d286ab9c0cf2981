"""What a tablet server shows about its tablets: the ``/tablets`` and ``/tablets.json``
status pages, and each tablet's Raft gauges (term, role, commit and applied index) on
``/metrics``.

Kept apart from the process (``tserver.server``: start, stop, the wiring) because these
are views of the replicas, not part of running them. Everything here reads what a replica
published or cached, never under its consensus lock: a replica stuck behind a slow disk
must not hang the page that would show it.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping

from raftlet.consensus.core.types import Role
from raftlet.metrics import catalogue as cat
from raftlet.metrics.human import human_bytes
from raftlet.metrics.registry import MetricEntity
from raftlet.metrics.status_server import PageRequest, PageResponse, StatusServer
from raftlet.tserver.failed_tablet import FailedTablet
from raftlet.tserver.tablet_replica import TabletReplica

__all__ = [
    "register_tablet_gauges",
    "register_tablet_pages",
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


def tablet_statuses(
    replicas: Iterable[TabletReplica], failed: Iterable[FailedTablet] = ()
) -> list[dict[str, object]]:
    """Every replica's published status (see the module docstring: no consensus lock), then
    every tablet that failed to open."""
    return [r.published_status() for r in replicas] + [f.status() for f in failed]


def tablets_table_html(statuses: Iterable[Mapping[str, object]]) -> str:
    """The ``/tablets`` table of ``statuses`` (``tablet_statuses``): log size in human
    units, and ``NOT_LEADER_CELL`` under leader_ready on every row that is not a leader's."""
    rows = []
    for status in statuses:
        st = dict(status)
        size = st.get("log_bytes")
        st["log_bytes"] = human_bytes(size) if isinstance(size, int) else ""
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
) -> None:
    """Serve ``/tablets`` (HTML) and ``/tablets.json`` on ``status``, showing the replicas
    in ``replicas`` and the tablets in ``failed`` at the time of each request."""
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

    status.register_page("/tablets", tablets_html)
    status.register_page("/tablets.json", tablets_json)
