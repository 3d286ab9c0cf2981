"""The status URL of ``raftlet tserver``'s ready line: the status server's own scheme (https
under TLS), and a host others can dial (never 0.0.0.0)."""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlet.cli.tserver_args import parse_tserver_args
from raftlet.cluster.identity import AccessRole
from raftlet.deploy.certs import ClientSpec, CreatedCerts, create_certs
from raftlet.metrics.registry import MetricRegistry
from raftlet.metrics.status_server import StatusServer
from raftlet.tserver.main import status_url
from raftlet.tserver.security import status_ssl_context
from raftlet.tserver.settings import ServerSettings
from tests.waiting import WAIT_S

CONFIG = """\
[cluster]
name = "ready"

[[servers]]
id = "ts1"
rpc_addr = "ts1.example:7051"
http_addr = "ts1.example:8051"

[[servers]]
id = "ts2"
rpc_addr = "ts2.example:7051"
http_addr = "ts2.example:8051"

[[tables]]
name = "kv"
partitions = 1
replication_factor = 2
columns = [{ name = "k", type = "INT64", key = true }]
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CreatedCerts:
    return create_certs(
        tmp_path_factory.mktemp("certs"),
        servers=["ts1"],
        clients=[ClientSpec("ops", AccessRole.ADMIN)],
        days=1,
    )


@pytest.fixture
def plain_status() -> Iterator[StatusServer]:
    # Where the server actually listens does not matter here: status_url reads only the
    # scheme and the bound port from it.
    with StatusServer(MetricRegistry(), "127.0.0.1", 0) as server:
        yield server


def settings(config: Path, *flags: str) -> ServerSettings:
    return parse_tserver_args(["--config", str(config), "--server_id", "ts1", *flags])


@pytest.mark.parametrize("bind", ["0.0.0.0", "[::]"])
def test_a_server_bound_to_every_interface_is_named_by_its_config_entry(
    config: Path, plain_status: StatusServer, bind: str
) -> None:
    s = settings(config, "--http_addr", f"{bind}:8051", "--insecure")
    assert status_url(s, plain_status) == f"http://ts1.example:{plain_status.port}/"


def test_a_server_bound_to_one_address_is_named_by_it(
    config: Path, plain_status: StatusServer
) -> None:
    # Not the config's name: a flag moved it, and the config's address may be another's.
    s = settings(config, "--http_addr", "127.0.0.1:8051", "--insecure")
    assert status_url(s, plain_status) == f"http://127.0.0.1:{plain_status.port}/"


def test_a_tls_server_prints_an_https_url_that_answers(config: Path, certs: CreatedCerts) -> None:
    """The status server speaks HTTPS under TLS: an http:// URL there gets no page."""
    server_paths = certs.servers["ts1"]
    tls = [
        *("--tls_cert", str(server_paths.cert), "--tls_key", str(server_paths.key)),
        *("--tls_ca", str(certs.ca)),
    ]
    s = settings(config, "--http_addr", "127.0.0.1:8051", *tls)
    context = status_ssl_context(str(server_paths.cert), str(server_paths.key), str(certs.ca))
    with StatusServer(MetricRegistry(), "127.0.0.1", 0, ssl_context=context) as status:
        url = status_url(s, status)
        assert url == f"https://127.0.0.1:{status.port}/"
        client = ssl.create_default_context(cafile=str(certs.ca))
        with urllib.request.urlopen(f"{url}healthz", timeout=WAIT_S, context=client) as r:
            assert r.read() == b"OK"
