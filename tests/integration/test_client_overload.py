"""The client against servers with a tablet service of one thread and a queue of one.

A burst of concurrent sessions overflows that queue: the servers refuse calls with
RESOURCE_EXHAUSTED "service queue full", the client backs off (jittered, exponential) and
retries with the same request id, and every write succeeds exactly once. The last test then
kills every server: operations raise ``Timeout`` within their deadline plus slack.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from raftlet.client import Client, FlushMode, Predicate, Timeout
from tests.integration.tserver_cluster import TserverCluster, running_cluster

pytestmark = pytest.mark.integration

SLACK_S = 0.75  # see test_client.py


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TserverCluster]:
    flags = ["--rpc_num_service_threads", "1", "--rpc_service_queue_length", "1"]
    with running_cluster(tmp_path_factory.mktemp("overload"), flags=flags) as c:
        c.wait_leaders()
        yield c


def addresses(cluster: TserverCluster) -> list[str]:
    return [s.rpc_addr for s in cluster.config.servers]


def test_queue_full_is_retried_with_backoff(cluster: TserverCluster) -> None:
    """Each session writes until the client has retried a refusal (at least ``min_rows``,
    at most ``max_rows``): a fixed 15 rows each once overflowed nothing on a fast moment of
    CI, and the test failed on what it had not provoked."""
    n_sessions, min_rows, max_rows = 12, 15, 300
    overflow_before = sum(s.metric("rpcs_queue_overflow_total") for s in cluster.servers.values())
    failures: list[BaseException] = []
    start = threading.Barrier(n_sessions)
    refused = threading.Event()
    written = [0] * n_sessions
    with Client(addresses(cluster), timeout_s=60.0) as client:

        def burst(w: int) -> None:
            try:
                with client.new_session(FlushMode.AUTO_FLUSH_SYNC) as session:
                    start.wait(30)
                    for i in range(max_rows):
                        session.insert("kv", {"key": w * 1000 + i, "value": f"w{w}"})
                        written[w] = i + 1
                        if i % 5 == 4 and client.stats.retries_by_cause.get("RESOURCE_EXHAUSTED"):
                            refused.set()
                        if i + 1 >= min_rows and refused.is_set():
                            return
            except BaseException as e:
                failures.append(e)

        threads = [threading.Thread(target=burst, args=(w,)) for w in range(n_sessions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not failures, failures[:3]
        stats = client.stats
        scanned = {
            r["key"]
            for r in client.scan("kv", predicates=[Predicate.range("key", lower=0, upper=10**6)])
        }
    assert scanned == {w * 1000 + i for w in range(n_sessions) for i in range(written[w])}
    assert stats.errors_by_cause == {}
    assert stats.retries_by_cause.get("RESOURCE_EXHAUSTED", 0) > 0, stats.retries_by_cause
    assert stats.rows_acked == sum(written)
    overflow = sum(s.metric("rpcs_queue_overflow_total") for s in cluster.servers.values())
    # Every refusal the client retried was counted by a server (ListTablets refusals too).
    assert overflow - overflow_before >= stats.retries_by_cause["RESOURCE_EXHAUSTED"]


def test_every_server_down_raises_timeout_in_bounded_time(cluster: TserverCluster) -> None:
    """Runs last in this module: it kills the whole cluster."""
    with Client(addresses(cluster), timeout_s=5.0) as client:
        # The client learns where the tablet is, unhurried: with one service thread a
        # server, a loaded machine may take more than the dead write's second for it.
        with client.new_session(timeout_s=30.0) as warm:
            warm.insert("kv", {"key": 5_000_000, "value": "alive"})
        session = client.new_session(timeout_s=1.0)
        for server in cluster.servers.values():
            server.kill()

        began = time.monotonic()
        with pytest.raises(Timeout) as info:
            session.insert("kv", {"key": 5_000_001, "value": "dead"})
        assert time.monotonic() - began < 1.0 + SLACK_S
        assert "timed out after 1 s" in str(info.value)
        assert "UNAVAILABLE" in str(info.value)

        background = client.new_session(FlushMode.AUTO_FLUSH_BACKGROUND, timeout_s=1.0)
        background.insert("kv", {"key": 5_000_002, "value": "dead"})
        began = time.monotonic()
        background.flush()
        assert time.monotonic() - began < 1.0 + SLACK_S
        (err,) = background.errors()
        assert isinstance(err, Timeout)
        assert err.row_index == 0

        began = time.monotonic()
        with pytest.raises(Timeout):
            list(client.scan("kv", timeout_s=1.0))
        assert time.monotonic() - began < 1.0 + SLACK_S
        assert client.stats.errors_by_cause == {"TIMEOUT": 2}
