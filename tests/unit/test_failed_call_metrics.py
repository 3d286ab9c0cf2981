"""``rpcs_failed`` tells an answer of a leader change (NOT_LEADER, LEADER_NOT_READY) from an
error by its ``error`` label, and ``raftlet metrics`` shows the two on rows of their own
(review r26c: "calls answered with an error" read 113 / 0 / 32 while clients saw no errors
-- every one was a NOT_LEADER redirect after leadership moved, so an alert on the row fired
on every leader change; review r26v: LEADER_NOT_READY still did)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from raftlet.cli.metrics_cmd import key_metrics
from raftlet.consensus.core import (
    ConfigChangeRefused,
    NotLeaderError,
    ProposalDropped,
    TermMismatch,
)
from raftlet.consensus.raft_consensus import LeaderNotReady
from raftlet.metrics.export_json import generate_json
from raftlet.metrics.registry import MetricRegistry
from raftlet.tserver.errors import (
    InvalidRequest,
    LeadershipLost,
    ServiceUnavailable,
    StaleRequest,
    UnknownTablet,
)
from raftlet.tserver.rpc_dispatch import dispatch
from raftlet.tserver.service_pool import InboundCall, ServicePool, ServicePoolMetrics

WAIT = 30.0


class Aborted(Exception):
    pass


class FakeContext:
    """The two ServicerContext methods dispatch uses."""

    def time_remaining(self) -> float | None:
        return None

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> None:
        raise Aborted(code)


def _failing(exc: BaseException) -> Any:
    def run(call: InboundCall) -> None:
        raise exc

    return run


def _answer_all(
    service: str, method: str, errors: list[BaseException]
) -> tuple[MetricRegistry, ServicePoolMetrics]:
    """Answer one call of ``method`` with each of ``errors`` through a server's ``service``
    pool; its registry and the pool's metrics."""
    registry = MetricRegistry()
    metrics = ServicePoolMetrics(registry.entity("server", "ts1"), service)
    pool = ServicePool(service, num_threads=1, queue_length=8, metrics=metrics)

    async def main() -> None:
        for exc in errors:
            with pytest.raises(Aborted):
                await dispatch(pool, method, FakeContext(), _failing(exc))

    pool.start()
    try:
        asyncio.run(asyncio.wait_for(main(), WAIT))
    finally:
        assert pool.stop(timeout=WAIT)
    return registry, metrics


def test_not_leader_answers_are_counted_apart_from_errors_of_the_same_status() -> None:
    registry, metrics = _answer_all(
        "tablet",
        "Write",
        [
            NotLeaderError("ts3", 4),
            NotLeaderError("ts3", 4),
            TermMismatch(4, 5, "ts3"),  # a moved term: the same redirect to a client
            StaleRequest("seq 3 < first incomplete 5"),  # FAILED_PRECONDITION too
            InvalidRequest("no key column"),
        ],
    )
    assert metrics.failed_for("Write", "FAILED_PRECONDITION", "NOT_LEADER").value() == 3
    assert metrics.failed_for("Write", "FAILED_PRECONDITION", "STALE_REQUEST").value() == 1
    assert metrics.failed_for("Write", "INVALID_ARGUMENT", "INVALID_ARGUMENT").value() == 1

    # What `raftlet metrics` makes of the server's /metrics.json.
    shown = key_metrics(generate_json(registry))
    assert shown["redirects"] == 3
    assert shown["failed_calls"] == 2


def test_a_refused_membership_change_is_an_error_not_a_redirect() -> None:
    """FAILED_PRECONDITION is not only NOT_LEADER: the operator must see these."""
    registry, _ = _answer_all(
        "admin", "ChangeConfig", [ConfigChangeRefused("a change is in progress")]
    )
    shown = key_metrics(generate_json(registry))
    assert (shown["failed_calls"], shown["redirects"]) == (1, 0)


def _doc(*series: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "server", "id": "ts1", "attributes": {}, "metrics": list(series)}]


def _failed(value: int, **labels: str) -> dict[str, Any]:
    return {"name": "rpcs_failed", "labels": {"service": "tablet", **labels}, "value": value}


@pytest.mark.parametrize(
    ("series", "rows"),
    [
        # As review r26c saw them.
        (
            [
                _failed(113, method="Write", code="FAILED_PRECONDITION", error="NOT_LEADER"),
                _failed(7, method="WriteStream", code="FAILED_PRECONDITION", error="NOT_LEADER"),
                _failed(2, method="Write", code="RESOURCE_EXHAUSTED", error="SERVICE_QUEUE_FULL"),
                _failed(1, method="Scan", code="UNAVAILABLE", error=""),
            ],
            (3, 120),
        ),
        # As review r26v saw them.
        (
            [
                _failed(6, method="Write", code="UNAVAILABLE", error="LEADER_NOT_READY"),
                _failed(26, method="Write", code="FAILED_PRECONDITION", error="NOT_LEADER"),
                _failed(3, method="Write", code="NOT_FOUND", error="TABLET_NOT_FOUND"),
                _failed(1, method="Write", code="UNAVAILABLE", error="TABLET_NOT_RUNNING"),
            ],
            (4, 32),
        ),
        ([], (0, 0)),
    ],
)
def test_the_rows_as_the_reviews_saw_them(
    series: list[dict[str, Any]], rows: tuple[int, int]
) -> None:
    shown = key_metrics(_doc(*series))
    assert (shown["failed_calls"], shown["redirects"]) == rows


def test_a_server_that_does_not_label_its_answers_shows_no_redirect_count() -> None:
    """An older server: its failures all stay errors, and the redirect row says "-" (not
    known) rather than 0."""
    shown = key_metrics(_doc(_failed(113, method="Write", code="FAILED_PRECONDITION")))
    assert (shown["failed_calls"], shown["redirects"]) == (113, None)


def test_answers_of_a_leader_change_are_not_errors() -> None:
    """Review r26v: three rounds of leader-step-down during `raftlet write` took the error
    row from 4 to 30 while the writer saw none -- LEADER_NOT_READY (handing leadership over)
    and the core's own refusal of a write bound before the transfer began (no error label
    then) were counted as errors."""
    registry, metrics = _answer_all(
        "tablet",
        "Write",
        [
            LeaderNotReady("leader of term 4 is handing leadership over"),
            ProposalDropped("leadership is being transferred to ts3"),
            NotLeaderError("ts3", 5),
            # In flight when the leader stepped down: it was counted with "shutting down".
            LeadershipLost("tablet kv-p0: this replica stopped leading (term 5)"),
            # A stale location and a wrong tablet id get the same answer: still an error.
            UnknownTablet("kv-p9"),
            ServiceUnavailable("the tablet server is shutting down"),
        ],
    )
    assert metrics.failed_for("Write", "UNAVAILABLE", "LEADER_NOT_READY").value() == 2
    assert metrics.failed_for("Write", "UNAVAILABLE", "LEADERSHIP_LOST").value() == 1
    assert metrics.failed_for("Write", "UNAVAILABLE", "").value() == 1
    shown = key_metrics(generate_json(registry))
    assert (shown["failed_calls"], shown["redirects"]) == (2, 4)
