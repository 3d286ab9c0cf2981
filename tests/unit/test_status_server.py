"""The HTTP status server on an ephemeral loopback port: pages, bad requests, stop."""

from __future__ import annotations

import gzip
import http.client
import json
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import raftlet
from raftlet.metrics import catalogue
from raftlet.metrics.registry import MetricRegistry
from raftlet.metrics.status_server import HttpError, PageRequest, PageResponse, StatusServer
from tests.ipv6 import needs_ipv6_loopback
from tests.waiting import wait_for

WAIT = 30.0  # generous: a loaded CI box must not turn a slow wait into a failure
HOST = "127.0.0.1"


def fetch(
    server: StatusServer,
    path: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(HOST, server.port, timeout=WAIT)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def raw_exchange(server: StatusServer, payload: bytes) -> bytes:
    """Send raw bytes (if any), then read until the server closes the connection.

    With an empty payload nothing is sent and the write side stays open, like a client that
    connects and waits. A reset by the server ends the read with what arrived before it.
    """
    with socket.create_connection((HOST, server.port), timeout=WAIT) as sock:
        chunks = []
        try:
            if payload:
                sock.sendall(payload)
                sock.shutdown(socket.SHUT_WR)
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            raise  # the server hung: a failure, not a reset
        except OSError:
            pass  # reset or pipe closed by the server
        return b"".join(chunks)


@pytest.fixture
def registry() -> MetricRegistry:
    registry = MetricRegistry()
    server = registry.entity("server", "ts-1")
    server.counter(catalogue.RPCS_QUEUE_OVERFLOW, service="tablet", method="Write").increment(5)
    tablet = registry.entity("tablet", "t-1", {"table": "orders"})
    tablet.gauge(catalogue.RAFT_TERM).set(3)
    tablet.histogram(catalogue.LOG_SYNC_LATENCY_US).observe(1500)
    return registry


@pytest.fixture
def server(registry: MetricRegistry) -> Iterator[StatusServer]:
    s = StatusServer(registry, HOST, 0)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def test_ephemeral_port_is_exposed(server: StatusServer) -> None:
    assert server.port > 0
    assert server.url("/healthz") == f"http://{HOST}:{server.port}/healthz"


def test_url_names_another_host_in_its_scheme(server: StatusServer) -> None:
    """A server bound to 0.0.0.0 is named by its advertised host; IPv6 gets its brackets."""
    assert server.url(host="ts1.example") == f"http://ts1.example:{server.port}/"
    assert server.url("/x", host="::1") == f"http://[::1]:{server.port}/x"
    assert server.url("/x", host="[::1]") == f"http://[::1]:{server.port}/x"


@needs_ipv6_loopback
def test_serves_on_an_ipv6_address_written_as_the_config_writes_it(
    registry: MetricRegistry,
) -> None:
    """http_addr = "[::1]:8051": the host comes with its brackets, which the socket API
    refuses ("Name or service not known"), and the URL must not double them."""
    with StatusServer(registry, "[::1]", 0) as server:
        assert server.url("/healthz") == f"http://[::1]:{server.port}/healthz"
        with urllib.request.urlopen(server.url("/healthz"), timeout=WAIT) as r:
            assert r.read() == b"OK"


def test_healthz(server: StatusServer) -> None:
    status, headers, body = fetch(server, "/healthz")
    assert (status, body) == (200, b"OK")
    assert headers["Content-Type"].startswith("text/plain")


def test_metrics_page_is_parseable_prometheus_text(server: StatusServer) -> None:
    status, headers, body = fetch(server, "/metrics")
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert int(headers["Content-Length"]) == len(body)
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    (overflow,) = fams["rpcs_queue_overflow"].samples
    assert overflow.name == "rpcs_queue_overflow_total"
    assert overflow.labels == {"server": "ts-1", "service": "tablet", "method": "Write"}
    assert overflow.value == 5
    (term,) = fams["raft_term"].samples
    assert term.labels == {"tablet": "t-1", "table": "orders"}
    assert term.value == 3
    counts = [s for s in fams["log_sync_latency_us"].samples if s.name.endswith("_count")]
    assert [s.value for s in counts] == [1]


def test_a_large_page_goes_gzipped_to_whoever_asks_for_it(registry: MetricRegistry) -> None:
    """Prometheus asks for gzip: a 64-tablet server's /metrics was 1 MB of text each
    scrape, sent as it was (review r34b)."""
    for t in range(40):
        registry.entity("tablet", f"kv-p{t}").histogram(catalogue.LOG_SYNC_LATENCY_US)
    s = StatusServer(registry, HOST, 0)
    s.start()
    try:
        _, plain_headers, plain = fetch(s, "/metrics")
        assert "Content-Encoding" not in plain_headers
        for accept in ("gzip", "deflate, gzip;q=0.5", "*", "identity, GZIP", "*;q=0, gzip"):
            status, headers, body = fetch(s, "/metrics", headers={"Accept-Encoding": accept})
            assert (status, headers["Content-Encoding"]) == (200, "gzip"), accept
            assert int(headers["Content-Length"]) == len(body) < len(plain) / 5
            # The same page, but for the process's CPU time, read anew.
            assert _without_cpu(gzip.decompress(body)) == _without_cpu(plain)
        for accept in ("gzip;q=0", "deflate", "identity", "*, gzip;q=0"):
            _, headers, body = fetch(s, "/metrics", headers={"Accept-Encoding": accept})
            assert "Content-Encoding" not in headers, accept
            assert body.startswith(b"# HELP"), accept
        # A small page goes as it is.
        _, headers, body = fetch(s, "/healthz", headers={"Accept-Encoding": "gzip"})
        assert ("Content-Encoding" not in headers, body) == (True, b"OK")
    finally:
        s.stop()


def _without_cpu(page: bytes) -> list[bytes]:
    """The page but for what changes from one read to the next: CPU time and memory."""
    moving = (b"process_cpu", b"process_resident", b"process_open_fds")
    return [line for line in page.splitlines() if not line.startswith(moving)]


def test_metrics_page_exposes_the_process_cpu_time(server: StatusServer) -> None:
    """process_cpu_seconds_total, labelled with the server entity, read at scrape time: it
    never decreases and grows with CPU burnt in the process."""

    def cpu() -> float:
        fams = {
            f.name: f for f in text_string_to_metric_families(fetch(server, "/metrics")[2].decode())
        }
        (sample,) = fams["process_cpu_seconds"].samples
        assert sample.name == "process_cpu_seconds_total"
        assert sample.labels == {"server": "ts-1"}
        return float(sample.value)

    first = cpu()
    assert first > 0
    wait_for(lambda: cpu() > first, WAIT, "the process's CPU time to grow")
    # And when the process started, which tells a restart (its counters start again).
    fams = {
        f.name: f for f in text_string_to_metric_families(fetch(server, "/metrics")[2].decode())
    }
    (started,) = fams["process_start_time_seconds"].samples
    assert started.labels == {"server": "ts-1"}
    assert time.time() - 3600 < started.value <= time.time()


def test_metrics_page_names_only_the_metrics_asked_for(server: StatusServer) -> None:
    """``name[]`` (repeatable, family or sample name, as Prometheus's federation asks)
    gives only those metrics: a reader of one figure does not pay for the whole page."""

    def names(path: str) -> set[str]:
        status, _, body = fetch(server, path)
        assert status == 200
        return {f.name for f in text_string_to_metric_families(body.decode())}

    everything = names("/metrics")
    assert {"rpcs_queue_overflow", "raft_term", "log_sync_latency_us"} < everything
    assert names("/metrics?name%5B%5D=process_cpu_seconds_total") == {"process_cpu_seconds"}
    asked = "name%5B%5D=raft_term&name%5B%5D=rpcs_queue_overflow_total"
    assert names(f"/metrics?{asked}") == {"raft_term", "rpcs_queue_overflow"}
    assert names("/metrics?name%5B%5D=log_sync_latency_us_count") == {"log_sync_latency_us"}
    assert names("/metrics?name%5B%5D=no_such_metric") == set()
    assert names("/metrics?other=1") == everything  # not a filter: everything


def test_server_cpu_reading_asks_for_the_cpu_figures_alone(server: StatusServer) -> None:
    from raftlet.cli import server_cpu
    from raftlet.cli.common import Credentials
    from raftlet.cluster import ServerConfig

    seen: list[str] = []
    original = server._metrics_page

    def spy(request: PageRequest) -> PageResponse:
        seen.append(",".join(request.query.get("name[]", [])))
        return original(request)

    server.register_page("/metrics", spy, replace=True)
    config = ServerConfig(
        id="ts-1", rpc_addr=f"{HOST}:1", http_addr=f"{HOST}:{server.port}", data_dir=Path("ts-1")
    )
    seconds = server_cpu.read_cpu_seconds([config], creds=Credentials())
    cpu = seconds["ts-1"]
    assert cpu is not None
    assert cpu.seconds > 0
    assert cpu.started is not None  # a restart is told by it
    assert seen == ["process_cpu_seconds_total,process_start_time_seconds"]


def test_process_collector_reads_its_clock_at_collect_time() -> None:
    from raftlet.metrics.process import ProcessCollector

    seconds = [1.5]
    collector = ProcessCollector(MetricRegistry(), cpu_seconds=lambda: seconds[0])
    family, started, resident, open_fds, max_fds = collector.collect()
    assert [(s.name, s.labels, s.value) for s in family.samples] == [
        ("process_cpu_seconds_total", {}, 1.5)
    ]
    assert [s.name for s in started.samples] == ["process_start_time_seconds"]
    seconds[0] = 2.25
    assert next(iter(collector.collect())).samples[0].value == 2.25
    # Memory and descriptors, as a standard process collector names them.
    assert 1 << 20 < resident.samples[0].value < 64 << 30
    with open(__file__) as one_more:
        assert one_more.fileno() >= 0
        (_, _, _, more, _) = collector.collect()
    assert 3 <= open_fds.samples[0].value < more.samples[0].value <= max_fds.samples[0].value


def test_head_sends_headers_only(server: StatusServer) -> None:
    status, headers, body = fetch(server, "/metrics", method="HEAD")
    assert status == 200
    assert body == b""
    assert int(headers["Content-Length"]) > 0


def test_metrics_json_page_and_filter(server: StatusServer) -> None:
    status, headers, body = fetch(server, "/metrics.json")
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    doc = json.loads(body)
    assert [(e["type"], e["id"]) for e in doc] == [("server", "ts-1"), ("tablet", "t-1")]
    status, _, body = fetch(server, "/metrics.json?metrics=raft_term")
    assert status == 200
    assert json.loads(body) == [
        {
            "type": "tablet",
            "id": "t-1",
            "attributes": {"table": "orders"},
            "metrics": [{"name": "raft_term", "value": 3}],
        }
    ]
    status, _, body = fetch(server, "/metrics.json?level=loud")
    assert status == 400
    assert b"level" in body


def test_metrics_json_has_the_process_figures_in_the_server_entity(server: StatusServer) -> None:
    """Uptime and CPU time for `raftlet metrics`, which reads /metrics.json only."""
    (entity,) = [e for e in json.loads(fetch(server, "/metrics.json")[2]) if e["type"] == "server"]
    figures = {m["name"]: m["value"] for m in entity["metrics"]}
    # When this process started: before now, and this year (a test run may pass an hour).
    assert time.time() - 366 * 86400 < figures["process_start_time_seconds"] <= time.time()
    assert figures["process_cpu_seconds"] > 0
    # Filtered as the registry's own metrics are.
    doc = json.loads(fetch(server, "/metrics.json?metrics=process_start")[2])
    assert [[m["name"] for m in e["metrics"]] for e in doc] == [["process_start_time_seconds"]]


def test_stacks_shows_every_thread_by_name(server: StatusServer) -> None:
    release = threading.Event()

    def parked_in_a_recognisable_function() -> None:
        release.wait(WAIT)

    t = threading.Thread(target=parked_in_a_recognisable_function, name="stack-probe")
    t.start()
    try:
        status, headers, body = fetch(server, "/stacks")
    finally:
        release.set()
        t.join(WAIT)
    text = body.decode()
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert f'Thread "stack-probe" ident={t.ident}' in text
    assert "parked_in_a_recognisable_function" in text
    assert 'Thread "MainThread"' in text
    assert f'Thread "status-server:{server.port}"' in text


def test_index_lists_pages(server: StatusServer) -> None:
    status, headers, body = fetch(server, "/")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    for page in ("/metrics", "/metrics.json", "/stacks", "/healthz"):
        assert f'href="{page}"'.encode() in body


def test_pages_name_the_server_its_version_and_uptime_in_utc(registry: MetricRegistry) -> None:
    with StatusServer(registry, HOST, 0, server_name="ts-7") as named:
        for path in ("/", "/stacks"):
            status, _, body = fetch(named, path)
            assert status == 200
            text = body.decode()
            assert f"ts-7 · raftlet {raftlet.__version__} · up " in text, text[:300]
            assert " UTC)" in text


def test_unknown_paths_are_404(server: StatusServer) -> None:
    for path in ("/nope", "/metrics/", "/healthz/x", "/../etc/passwd"):
        status, headers, body = fetch(server, path)
        assert status == 404, path
        assert body == b"404 Not Found\n"
        assert headers["Content-Type"].startswith("text/plain")


def test_methods_other_than_get_and_head_are_405(server: StatusServer) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "BREW"):
        status, headers, _ = fetch(server, "/metrics", method=method, body=b"x" * 100)
        assert status == 405, method
        assert headers["Allow"] == "GET, HEAD"


def test_request_line_over_the_limit_is_414(server: StatusServer) -> None:
    status, _, _ = fetch(server, "/metrics.json?metrics=" + "a" * 7000)
    assert status == 200  # long but under 8 KiB
    status, _, body = fetch(server, "/metrics.json?metrics=" + "a" * 9000)
    assert status == 414
    assert body.startswith(b"414")
    status, _, _ = fetch(server, "/" + "x" * 20000)
    assert status == 414


def test_handler_exception_is_500_and_server_keeps_serving(server: StatusServer) -> None:
    def boom(request: PageRequest) -> PageResponse:
        raise RuntimeError("secret internals")

    server.register_page("/boom", boom)
    for _ in range(3):
        status, _, body = fetch(server, "/boom")
        assert status == 500
        assert b"RuntimeError" in body
        assert b"secret" not in body
    assert fetch(server, "/healthz")[0] == 200


def test_handler_http_error_status(server: StatusServer) -> None:
    def teapot(request: PageRequest) -> PageResponse:
        raise HttpError(418, "short and\r\nstout")

    server.register_page("/teapot", teapot)
    status, _, body = fetch(server, "/teapot")
    assert status == 418
    assert body == b"418 short and stout\n"


def test_registered_page_sees_query(server: StatusServer) -> None:
    def tablets(request: PageRequest) -> PageResponse:
        return PageResponse.json({"format": request.param("format"), "all": request.query})

    server.register_page("/tablets.json", tablets)
    status, _, body = fetch(server, "/tablets.json?format=short&x=1&x=2")
    assert status == 200
    assert json.loads(body) == {"format": "short", "all": {"format": ["short"], "x": ["1", "2"]}}


def test_register_page_rules(server: StatusServer) -> None:
    def page(request: PageRequest) -> PageResponse:
        return PageResponse.text("one")

    with pytest.raises(ValueError, match="already registered"):
        server.register_page("/metrics", page)
    with pytest.raises(ValueError, match="must start with"):
        server.register_page("tablets", page)
    with pytest.raises(ValueError, match="no query"):
        server.register_page("/tablets?x=1", page)
    server.register_page("/healthz", page, replace=True)
    assert fetch(server, "/healthz")[2] == b"one"


ERROR_REPLY = re.compile(rb"^(HTTP/1\.0 )?[45]\d\d ")
JUNK = [
    b"\x00\xff\xfe\x80garbage\r\n\r\n",
    b"GET\r\n\r\n",
    b"GET / HTTP/9.9\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\n" + b"X-Header: y\r\n" * 200 + b"\r\n",
    b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"y" * 70000 + b"\r\n\r\n",
    b"half a request line with no end",
    b"\r\n\r\n\r\n",
    bytes(range(256)) * 40,
]


def test_garbage_requests_never_hurt_the_server(
    server: StatusServer, capfd: pytest.CaptureFixture[str]
) -> None:
    for payload in JUNK:
        reply = raw_exchange(server, payload)
        # An error status line, a bare error body (what a line the parser took for HTTP/0.9
        # gets), or a silent close; never a 2xx for junk, never a hang.
        assert reply == b"" or ERROR_REPLY.match(reply), (payload[:40], reply[:80])
        assert fetch(server, "/healthz")[0] == 200
    # A client that connects and leaves without a word.
    socket.create_connection((HOST, server.port), timeout=WAIT).close()
    assert fetch(server, "/healthz")[0] == 200
    # A header line without a colon: the standard library's parser is lenient and serves it.
    reply = raw_exchange(server, b"GET /healthz HTTP/1.1\r\nBroken header line\r\n\r\n")
    assert reply.startswith(b"HTTP/1.0 ")
    # A client that connects and vanishes mid-response.
    with socket.create_connection((HOST, server.port), timeout=WAIT) as sock:
        sock.sendall(b"GET /stacks HTTP/1.0\r\n\r\n")
    assert fetch(server, "/healthz")[0] == 200
    # No request logging and no tracebacks on stderr (they go to `logging` at debug).
    assert capfd.readouterr().err == ""


def test_http_09_style_request_line(server: StatusServer) -> None:
    # A two-word request line is HTTP/0.9: the body alone, no status line or headers.
    assert raw_exchange(server, b"GET /healthz\r\n") == b"OK"


def test_idle_connection_is_dropped_after_the_timeout(registry: MetricRegistry) -> None:
    with (
        StatusServer(registry, HOST, 0, request_timeout_s=0.2) as server,
        socket.create_connection((HOST, server.port), timeout=WAIT) as sock,
    ):
        assert sock.recv(1024) == b""  # closed by the server, well before WAIT


def test_requests_over_the_cap_get_503_while_healthz_still_answers(
    registry: MetricRegistry,
) -> None:
    entered = threading.Event()
    release = threading.Event()

    def blocking(request: PageRequest) -> PageResponse:
        entered.set()
        release.wait(WAIT)
        return PageResponse.text("done")

    with StatusServer(registry, HOST, 0, max_connections=1) as server:
        server.register_page("/block", blocking)
        with socket.create_connection((HOST, server.port), timeout=WAIT) as busy:
            busy.sendall(b"GET /block HTTP/1.0\r\n\r\n")
            assert entered.wait(WAIT)  # the only request thread is taken
            reply = raw_exchange(server, b"GET /metrics HTTP/1.0\r\n\r\n")
            assert reply.startswith(b"HTTP/1.0 503"), reply[:80]
            # /healthz is answered by the loop itself, not by a request thread.
            assert raw_exchange(server, b"GET /healthz HTTP/1.0\r\n\r\n").endswith(b"OK")
            release.set()
            answer = b""
            while chunk := busy.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.0 200")
            assert answer.endswith(b"done")
        # Once its thread has finished, the slot is free again.
        wait_for(
            lambda: raw_exchange(server, b"GET /metrics HTTP/1.0\r\n\r\n").startswith(
                b"HTTP/1.0 200"
            )
        )


def test_concurrent_requests(server: StatusServer) -> None:
    results: list[int] = []
    lock = threading.Lock()

    def get() -> None:
        for path in ("/metrics", "/metrics.json", "/stacks", "/healthz"):
            status = fetch(server, path)[0]
            with lock:
                results.append(status)

    threads = [threading.Thread(target=get) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert results == [200] * 24


def test_stop_releases_port_and_thread(registry: MetricRegistry) -> None:
    server = StatusServer(registry, HOST, 0)
    server.start()
    with pytest.raises(RuntimeError, match="already started"):
        server.start()
    port = server.port
    thread = server.thread
    assert thread is not None
    assert thread.is_alive()
    assert fetch(server, "/healthz")[0] == 200
    server.stop()
    assert not thread.is_alive()
    assert server.thread is None
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.port
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((HOST, port), timeout=WAIT).close()
    server.stop()  # idempotent
    # The listening socket is closed: the same port can be bound again.
    with StatusServer(registry, HOST, port) as again:
        assert again.port == port
        assert fetch(again, "/healthz")[0] == 200
    # And a stopped server can be started again (on a fresh ephemeral port).
    server.start()
    try:
        assert fetch(server, "/healthz")[0] == 200
    finally:
        server.stop()


def test_no_threads_left_behind(registry: MetricRegistry) -> None:
    before = set(threading.enumerate())
    with StatusServer(registry, HOST, 0) as server:
        for _ in range(5):
            assert fetch(server, "/metrics")[0] == 200
    # Per-request threads end after their response; the serving thread is joined by stop().
    wait_for(lambda: set(threading.enumerate()) <= before)
