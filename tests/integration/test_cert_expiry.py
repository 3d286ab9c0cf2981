"""A server whose TLS certificate expires while it runs hands over the tablets it leads.

Review r27v: ts1's certificate expired under a running cluster; no new client could connect
to ts1, but its peers, over the connections they had, kept it leader of its tablets, so
every write to them waited out its whole timeout (a 200-row `raftlet write` took 520 s) and
`raftlet leader-step-down` could not reach it either. Here ts1 restarts with a certificate
that expires seconds later, is made leader, and once the certificate has expired a new
client writes to that tablet through the leader ts1 handed it to.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from raftlet.client import Client, FlushMode, RaftletError, TlsOptions
from raftlet.cluster.identity import server_uri
from raftlet.deploy.local import LocalCluster
from tests.tls_certs import issue
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

TABLET = "kv-p0"
# Long enough for ts1 to restart and take the leadership before it expires (a server
# refuses to start on an expired certificate), short enough for a test.
VALID_S = 15.0
# Each look is a health check of every server, and each of ts1's, once expired, a failed
# handshake grpc logs: a few a second, not hundreds.
POLL_S = 0.2


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster.create(
        tmp_path / "c", servers=3, tablets=1, tls=True, ready_timeout_s=60, leader_timeout_s=60
    )
    try:
        yield c
    finally:
        c.down(timeout=20)


def _admin(cluster: LocalCluster) -> Client:
    tls = cluster.data_dir / "tls"
    seeds = [s.rpc_addr for s in cluster.config.servers]
    files = TlsOptions(tls / "ca.crt", tls / "client-admin.crt", tls / "client-admin.key")
    return Client(seeds, tls=files, timeout_s=20)


def _leader(cluster: LocalCluster) -> str | None:
    tablets = {t.tablet_id: t for t in cluster.health().tablets}
    return tablets[TABLET].leader


def test_a_leader_whose_certificate_expires_hands_its_tablets_over(cluster: LocalCluster) -> None:
    tls = cluster.data_dir / "tls"

    def short_certificate() -> None:
        sans: list[x509.GeneralName] = [
            x509.UniformResourceIdentifier(server_uri("ts1")),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.DNSName("localhost"),
        ]
        valid = (-datetime.timedelta(minutes=1), datetime.timedelta(seconds=VALID_S))
        issue(
            tls, tls / "server-ts1.crt", tls / "server-ts1.key", name="ts1", valid=valid, sans=sans
        )

    started = time.monotonic()
    cluster.restart_server("ts1", before_start=short_certificate)
    with _admin(cluster) as admin:
        asked = [-1.0]

        def ts1_leads() -> bool:
            # Asked again if a transfer was abandoned, or refused while the leader has not
            # heard from ts1 yet (its peers may not reach it yet): one short try each time.
            leader = _leader(cluster)
            if leader not in (None, "ts1") and time.monotonic() - asked[0] > 2.0:
                asked[0] = time.monotonic()
                with contextlib.suppress(RaftletError):
                    admin.leader_step_down(TABLET, "ts1", timeout_s=2.0)
            return leader == "ts1"

        wait_for(ts1_leads, timeout=VALID_S, what="ts1 leading", poll_s=POLL_S)
    assert time.monotonic() - started < VALID_S, "ts1 led only after its certificate expired"
    # Expired, ts1 refuses every new handshake (the check's too: it shows DOWN); its peers
    # name the leader it handed the tablet to.
    wait_for(
        lambda: _leader(cluster) not in (None, "ts1"),
        timeout=VALID_S + 20,
        what="a leader other than ts1 once its certificate expired",
        poll_s=POLL_S,
    )
    with _admin(cluster) as fresh:
        session = fresh.new_session(FlushMode.AUTO_FLUSH_SYNC)
        session.insert("kv", {"key": 1, "value": "after the expiry"})
        session.close()
        assert [r["value"] for r in fresh.scan("kv")] == ["after the expiry"]
    log = (cluster.data_dir / "ts1.log").read_text()
    assert "TLS certificate (or its CA) expired at" in log
    assert "handed leadership of 1 tablet(s) over (this server's TLS certificate expired)" in log
