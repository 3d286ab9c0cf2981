"""The plain-TCP paths on a real TLS cluster (``raftlet cluster up --tls``'s launcher): peers'
consensus traffic and the asyncio client's writes go over the tcp ports with TLS, and those
ports admit callers by the same rules as the gRPC port -- a server's certificate on the
consensus port (each request's sender must be the certificate's), a writer's on the write
port, and no plaintext.

One 3-server cluster for the module; every process is stopped by PID (``LocalCluster.down``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftlet.client import Client, FlushMode, TlsOptions
from raftlet.client.aio import AsyncClient
from raftlet.client.tls import channel_credentials
from raftlet.cluster.identity import AccessRole
from raftlet.deploy.certs import ClientSpec, create_certs
from raftlet.deploy.local import LocalCluster
from raftlet.proto import common_pb2, consensus_pb2_grpc, tablet_pb2, tablet_pb2_grpc
from raftlet.proto import consensus_pb2 as pb
from tests import waiting
from tests.integration.raw_frames import closed_by_server, read_frame, send_frame

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TABLET = "kv-p0"


class Env:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.tls_dir = cluster.data_dir / "tls"
        self.ca = self.tls_dir / "ca.crt"
        self.seeds = [s.rpc_addr for s in cluster.config.servers]

    def tls(self, who: str) -> TlsOptions:
        """``who``: client-<name> or server-<id>, as ``raftlet certs create`` names them."""
        return TlsOptions(self.ca, self.tls_dir / f"{who}.crt", self.tls_dir / f"{who}.key")

    def ssl_context(self, who: str) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(self.tls_dir / f"{who}.crt", self.tls_dir / f"{who}.key")
        return context

    def metric(self, server_id: str, name: str, **labels: str) -> float:
        """A sample of /metrics (read over HTTPS as admin), summed over matching labels."""
        http_addr = self.cluster.config.server(server_id).http_addr
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}),
            urllib.request.HTTPSHandler(context=self.ssl_context("client-admin")),
        )
        with opener.open(f"https://{http_addr}/metrics", timeout=10) as r:
            text = r.read().decode()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total

    def total(self, name: str, **labels: str) -> float:
        return sum(self.metric(s.id, name, **labels) for s in self.cluster.config.servers)

    def leader(self) -> str:
        def find() -> str | None:
            (t,) = [t for t in self.cluster.health().tablets if t.tablet_id == TABLET]
            return t.leader

        waiting.wait_for(lambda: find() is not None, 30, "a leader of kv-p0")
        leader = find()
        assert leader is not None
        return leader

    def consensus_port(self, server_id: str) -> tuple[str, int]:
        """Where ``server_id`` takes consensus frames over tcp (asked as a server may)."""
        addr = self.cluster.config.server(server_id).rpc_addr
        other = next(s.id for s in self.cluster.config.servers if s.id != server_id)
        credentials = channel_credentials(self.tls(f"server-{other}"))
        with grpc.secure_channel(addr, credentials) as channel:
            answer = consensus_pb2_grpc.ConsensusServiceStub(channel).PeerEndpoint(
                pb.PeerEndpointRequest(), timeout=10
            )
        assert answer.port > 0
        return addr.rsplit(":", 1)[0], answer.port

    def write_port(self, server_id: str) -> tuple[str, int]:
        addr = self.cluster.config.server(server_id).rpc_addr
        credentials = channel_credentials(self.tls("client-alice"))
        with grpc.secure_channel(addr, credentials) as channel:
            answer = tablet_pb2_grpc.TabletServiceStub(channel).WriteEndpoint(
                tablet_pb2.WriteEndpointRequest(), timeout=10
            )
        assert answer.port > 0
        return addr.rsplit(":", 1)[0], answer.port


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root: Path = tmp_path_factory.mktemp("tcp-tls")
    cluster = LocalCluster.create(
        root / "c", servers=3, tablets=1, tls=True, ready_timeout_s=60, leader_timeout_s=60
    )
    try:
        # A writer and a reader, signed by the cluster's CA (certs create reuses it).
        create_certs(
            cluster.data_dir / "tls",
            clients=[ClientSpec("alice", AccessRole.WRITER), ClientSpec("bob", AccessRole.READER)],
        )
        yield Env(cluster)
    finally:
        cluster.down(timeout=20)


def _insert(env: Env, keys: range) -> None:
    with Client(env.seeds, tls=env.tls("client-alice"), timeout_s=20) as c:
        session = c.new_session(FlushMode.AUTO_FLUSH_SYNC)
        for k in keys:
            session.insert("kv", {"key": k, "value": f"v{k}"})
        session.close()


def _keys(env: Env, lo: int, hi: int) -> set[int]:
    with Client(env.seeds, tls=env.tls("client-admin"), timeout_s=20) as c:
        return {int(r["key"]) for r in c.scan("kv") if lo <= int(r["key"]) < hi}


def _dial(env: Env, where: tuple[str, int], who: str) -> ssl.SSLSocket:
    raw = socket.create_connection(where, timeout=10)
    return env.ssl_context(who).wrap_socket(raw, server_hostname=where[0])


def test_peers_replicate_over_tls_tcp(env: Env) -> None:
    leader = env.leader()
    waiting.wait_for(
        lambda: env.metric(leader, "consensus_tcp_connections", direction="out") == 2,
        60,
        "the leader on tcp to both peers",
    )
    _insert(env, range(50))
    assert _keys(env, 0, 50) == set(range(50))
    # Still on tcp after the writes: nothing broke the links.
    assert env.metric(leader, "consensus_tcp_connections", direction="out") == 2


def test_the_asyncio_client_writes_over_the_tls_write_port(env: Env) -> None:
    base = 10_000

    async def main() -> float:
        async with AsyncClient.connect(env.seeds, tls=env.tls("client-alice"), timeout_s=30.0) as c:
            await asyncio.gather(
                *(c.insert("kv", {"key": base + i, "value": f"a{i}"}) for i in range(32))
            )
            return await asyncio.to_thread(env.total, "write_tcp_connections")

    assert asyncio.run(asyncio.wait_for(main(), 120)) >= 1
    assert _keys(env, base, base + 32) == set(range(base, base + 32))


@pytest.mark.parametrize(
    ("port", "who"),
    [("consensus", "client-alice"), ("write", "client-bob")],
    ids=["a writer on the consensus port", "a reader on the write port"],
)
def test_a_certificate_below_the_ports_role_is_refused(env: Env, port: str, who: str) -> None:
    before = env.total("rpc_auth_denials_total", reason="role_too_low")
    leader = env.leader()
    where = env.consensus_port(leader) if port == "consensus" else env.write_port(leader)
    with contextlib.closing(_dial(env, where, who)) as sock:
        assert closed_by_server(sock)
    waiting.wait_for(
        lambda: env.total("rpc_auth_denials_total", reason="role_too_low") > before,
        30,
        "the refusal counted",
    )


def test_a_server_claiming_another_servers_id_is_refused(env: Env) -> None:
    leader = env.leader()
    follower, third = [s.id for s in env.cluster.config.servers if s.id != leader]
    before = env.total("rpc_auth_denials_total", reason="sender_mismatch")
    forged = pb.UpdateConsensusRequest(
        tablet_id=TABLET, caller_uuid=leader, dest_uuid=follower, caller_term=10**6
    )
    sock = _dial(env, env.consensus_port(follower), f"server-{third}")
    with contextlib.closing(sock):
        item = pb.ConsensusItemPB(seq=7, update=forged)
        send_frame(sock, pb.ConsensusFramePB(items=[item]).SerializeToString())
        (answer,) = pb.ConsensusFramePB.FromString(read_frame(sock)).items
    assert answer.seq == 7
    assert answer.HasField("failed")
    # README, Security: a forged sender is PERMISSION_DENIED (it was UNKNOWN here).
    assert answer.failed.code == common_pb2.ServerErrorPB.PERMISSION_DENIED
    assert "certificate" in answer.failed.message
    waiting.wait_for(
        lambda: env.total("rpc_auth_denials_total", reason="sender_mismatch") > before,
        30,
        "the forgery counted",
    )
    # The term was not taken over, and the cluster goes on writing.
    _insert(env, range(20_000, 20_010))
    with Client(env.seeds, tls=env.tls("client-admin"), timeout_s=20) as c:
        terms = {t.term for s in c.list_tablets().values() for t in s.tablets}
    assert max(terms) < 10**6


@pytest.mark.parametrize("port", ["consensus", "write"])
def test_plaintext_on_a_tls_tcp_port_is_closed(env: Env, port: str) -> None:
    leader = env.leader()
    where = env.consensus_port(leader) if port == "consensus" else env.write_port(leader)
    with socket.create_connection(where, timeout=10) as sock:
        # A frame as a plaintext peer would send it: not a TLS ClientHello.
        send_frame(sock, pb.ConsensusFramePB().SerializeToString() + b"x" * 64)
        assert closed_by_server(sock)
    # Nothing crashed: the peers are still on tcp, and writes go through.
    base = 30_000 if port == "consensus" else 31_000
    _insert(env, range(base, base + 10))
    assert _keys(env, base, base + 10) == set(range(base, base + 10))
    assert env.metric(leader, "consensus_tcp_connections", direction="out") == 2


def test_a_certificate_the_handshake_refuses_is_counted_and_a_bare_probe_is_not(
    env: Env, tmp_path: Path
) -> None:
    """A client of another CA was refused in the handshake, logged at DEBUG and counted
    nowhere: an operator could not see why it failed."""
    create_certs(tmp_path, clients=[ClientSpec("stranger", AccessRole.WRITER)])
    context = ssl.create_default_context(cafile=str(env.ca))
    context.load_cert_chain(tmp_path / "client-stranger.crt", tmp_path / "client-stranger.key")
    where = env.write_port(env.leader())
    before = env.total("rpc_auth_denials_total", reason="tls_handshake")
    with socket.create_connection(where, timeout=10) as probe:  # connects and leaves
        probe.close()
    raw = socket.create_connection(where, timeout=10)
    try:
        sock = context.wrap_socket(raw, server_hostname=where[0])
    except (ssl.SSLError, OSError):  # refused within the handshake
        raw.close()
    else:
        # Under TLS 1.3 the client's side of the handshake ends before the server judges
        # its certificate: the refusal is the connection closing after.
        with contextlib.closing(sock), contextlib.suppress(ssl.SSLError, OSError):
            closed_by_server(sock)
    waiting.wait_for(
        lambda: env.total("rpc_auth_denials_total", reason="tls_handshake") == before + 1,
        30,
        "the refused certificate counted, once",
    )
