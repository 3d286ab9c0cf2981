"""Transport security and roles on a real TLS cluster (``raftlet cluster up --tls``'s
launcher): who may connect, who may do what, and that Raft's sender is the certificate's.

One 3-server cluster (stream transport) for the module, with a tokens file; a small one on
the unary transport; a plaintext server on 0.0.0.0 for the refusal. Every process is
stopped by PID (``LocalCluster.down``, ``Popen.terminate``).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509

from raftlet.cli.main import main
from raftlet.client import Client, FlushMode, RaftletError, ReadMode, RemoteError, TlsOptions
from raftlet.client.aio import AsyncClient
from raftlet.client.channels import ChannelPool, channel_options
from raftlet.client.tls import channel_credentials
from raftlet.cluster.identity import AccessRole
from raftlet.deploy.certs import ClientSpec, create_certs
from raftlet.deploy.local import LocalCluster, free_ports, local_tokens
from raftlet.proto import (
    admin_pb2,
    admin_pb2_grpc,
    consensus_pb2,
    consensus_pb2_grpc,
    tablet_copy_pb2,
    tablet_copy_pb2_grpc,
    tablet_pb2,
    tablet_pb2_grpc,
)
from tests import waiting
from tests.integration.cli_run import raftlet
from tests.integration.test_grpc_log_level import GRPC_CORE_LINE
from tests.tls_certs import issue

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
WRITER_TOKEN = "writer-token-0123456789abcdef"
READER_TOKEN = "reader-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
# Options unlike the clients': no connection (or handshake failure) shared with them.
OPTS = channel_options(max_reconnect_backoff_ms=300)


class Env:
    def __init__(self, cluster: LocalCluster, certs: Path) -> None:
        self.cluster = cluster
        self.certs = certs
        self.tls_dir = cluster.data_dir / "tls"
        self.ca = self.tls_dir / "ca.crt"
        self.seeds = [s.rpc_addr for s in cluster.config.servers]
        self.token_seeds = [s.token_rpc_addr for s in cluster.config.servers]

    def tls(self, name: str, where: Path | None = None) -> TlsOptions:
        d = where or self.certs
        return TlsOptions(self.ca, d / f"client-{name}.crt", d / f"client-{name}.key")

    def server_tls(self, server_id: str) -> TlsOptions:
        d = self.tls_dir
        return TlsOptions(self.ca, d / f"server-{server_id}.crt", d / f"server-{server_id}.key")

    def channels(self, tls: TlsOptions | None, token: str | None = None) -> ChannelPool:
        return ChannelPool(OPTS, credentials=channel_credentials(tls, token))

    def client(self, name: str, token: str | None = None, **kw: object) -> Client:
        return Client(self.seeds, tls=self.tls(name), token=token, timeout_s=10, **kw)  # type: ignore[arg-type]

    def status(self, server: int, path: str, name: str | None, token: str | None = None) -> int:
        http_addr = self.cluster.config.servers[server].http_addr
        context = ssl.create_default_context(cafile=str(self.ca))
        if name is not None:
            d = self.tls_dir if name == "admin" else self.certs
            context.load_cert_chain(d / f"client-{name}.crt", d / f"client-{name}.key")
        request = urllib.request.Request(f"https://{http_addr}{path}")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )
        try:
            with opener.open(request, timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    def denials(self, reason: str) -> float:
        """rpc_auth_denials_total{reason} summed over the servers (read as admin)."""
        total = 0.0
        for s in self.cluster.config.servers:
            context = ssl.create_default_context(cafile=str(self.ca))
            context.load_cert_chain(
                self.tls_dir / "client-admin.crt", self.tls_dir / "client-admin.key"
            )
            opener = urllib.request.build_opener(
                urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
            )
            with opener.open(f"https://{s.http_addr}/metrics", timeout=10) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith("rpc_auth_denials_total{") and f'reason="{reason}"' in line:
                        total += float(line.split()[-1])
        return total


def _issue_without_identity(tls_dir: Path, out: Path) -> None:
    """A certificate the cluster's CA signed, but with no raftlet identity in it."""
    issue(
        tls_dir,
        out / "client-nobody.crt",
        out / "client-nobody.key",
        name="nobody",
        valid=(-datetime.timedelta(minutes=5), datetime.timedelta(days=1)),
        sans=[x509.DNSName("nobody.example")],
    )


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("tls-cluster")
    tokens = root / "tokens"
    tokens.write_text(
        f"# token role name\n{WRITER_TOKEN} writer app\n{READER_TOKEN} reader dash\n"
        f"{ADMIN_TOKEN} admin ops\n"
    )
    tokens.chmod(0o600)
    cluster = LocalCluster.create(
        root / "c",
        servers=3,
        tablets=2,
        tls=True,
        extra_flags=["--auth_tokens_file", str(tokens)],
        ready_timeout_s=60,
        leader_timeout_s=60,
    )
    try:
        certs = root / "clients"
        # Clients signed by the cluster's CA (certs create reuses it).
        create_certs(
            cluster.data_dir / "tls",
            clients=[
                ClientSpec("alice", AccessRole.WRITER),
                ClientSpec("bob", AccessRole.READER),
            ],
        )
        for name in ("alice", "bob"):
            certs.mkdir(exist_ok=True)
            for ext in ("crt", "key"):
                src = cluster.data_dir / "tls" / f"client-{name}.{ext}"
                (certs / src.name).write_bytes(src.read_bytes())
        _issue_without_identity(cluster.data_dir / "tls", certs)
        # A different CA altogether: its certificates mean nothing to this cluster.
        create_certs(root / "other-ca", clients=[ClientSpec("mallory", AccessRole.ADMIN)])
        yield Env(cluster, certs)
    finally:
        cluster.down(timeout=20)


def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    return info.value.code()  # type: ignore[no-any-return]


# --- connecting ----------------------------------------------------------------------------


def test_a_plaintext_client_cannot_reach_a_tls_server(env: Env) -> None:
    channels = ChannelPool(OPTS)
    try:
        assert _code(lambda: channels.stub(env.seeds[0]).get_cluster_config(3)) == (
            grpc.StatusCode.UNAVAILABLE
        )
    finally:
        channels.close()
    with pytest.raises(RaftletError):
        Client(env.seeds, timeout_s=2)


def test_a_certificate_of_another_ca_cannot_connect(env: Env) -> None:
    other = env.cluster.data_dir.parent / "other-ca"
    tls = TlsOptions(env.ca, other / "client-mallory.crt", other / "client-mallory.key")
    channels = env.channels(tls)
    try:
        assert _code(lambda: channels.stub(env.seeds[0]).get_cluster_config(3)) == (
            grpc.StatusCode.UNAVAILABLE
        )
    finally:
        channels.close()


@pytest.mark.parametrize("verbosity", [None, "INFO"])
def test_the_cli_says_a_failed_handshake_in_its_own_words(
    env: Env, verbosity: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that does not trust the server's certificate (its CA was replaced): gRPC's
    core logged the handshake's failure at INFO, in its own format, above raftlet's one-line
    error. A GRPC_VERBOSITY the user set still stands."""
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    other = env.cluster.data_dir.parent / "other-ca"
    extra = {} if verbosity is None else {"GRPC_VERBOSITY": verbosity}
    proc = raftlet(
        "scan", "kv", "--limit", "1", "--servers", env.seeds[0], "--timeout", "3",
        "--tls-ca", str(other / "ca.crt"),
        "--tls-cert", str(other / "client-mallory.crt"),
        "--tls-key", str(other / "client-mallory.key"),
        **extra,
    )  # fmt: skip
    assert proc.returncode == 1, proc
    core_lines = GRPC_CORE_LINE.findall(proc.stderr)
    if verbosity is None:
        assert core_lines == [], proc.stderr
        assert proc.stderr.startswith("raftlet scan: error:"), proc.stderr
    else:
        assert core_lines, proc.stderr


@pytest.mark.parametrize(
    "command",
    [
        ("tablet", "add-replica", "kv-p0", "ts1"),
        ("tablet", "remove-replica", "kv-p0", "ts1"),
        ("tablet", "move-replica", "kv-p0", "ts1", "ts2"),
    ],
)
def test_a_membership_command_that_cannot_verify_the_server_fails_at_once(
    env: Env, command: tuple[str, ...]
) -> None:
    """Review r26v: with another CA's --tls-ca, add-replica retried for 30 s ("timed out
    after 30 s (36 attempts ... CERTIFICATE_VERIFY_FAILED)") where scan, write and
    leader-step-down failed at once with a one-line error."""
    other = env.cluster.data_dir.parent / "other-ca"
    start = time.monotonic()
    proc = raftlet(
        *command, "--data-dir", str(env.cluster.data_dir), "--timeout", "30",
        "--tls-ca", str(other / "ca.crt"),
        "--tls-cert", str(other / "client-mallory.crt"),
        "--tls-key", str(other / "client-mallory.key"),
    )  # fmt: skip
    assert proc.returncode == 1, proc
    assert time.monotonic() - start < 15, proc
    assert proc.stderr.startswith(f"raftlet tablet {command[1]}: error:"), proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in proc.stderr
    assert "timed out" not in proc.stderr


def test_no_identity_or_a_wrong_token_is_unauthenticated(env: Env) -> None:
    before = env.denials("no_identity") + env.denials("invalid_token")
    for tls, token in (
        (env.tls("nobody"), None),
        (env.tls("bob"), "not-a-known-token-at-all"),
    ):
        channels = env.channels(tls, token)
        try:
            stub = channels.stub(env.seeds[0])
            assert _code(lambda s=stub: s.get_cluster_config(3)) == (
                grpc.StatusCode.UNAUTHENTICATED
            )
        finally:
            channels.close()
    assert env.denials("no_identity") + env.denials("invalid_token") >= before + 2
    # A client is told at once, not after retrying to its deadline (30 s of "invalid
    # bearer token" once); the command line says why too, not just the status code.
    with pytest.raises(RemoteError, match="bearer token"):
        Client(env.seeds, tls=env.tls("bob"), token="not-a-known-token-at-all", timeout_s=60)
    nobody = env.tls("nobody")
    proc = subprocess.run(
        [sys.executable, "-m", "raftlet", "scan", "kv", "--servers", env.seeds[0],
         "--tls-ca", str(nobody.ca), "--tls-cert", str(nobody.cert), "--tls-key", str(nobody.key)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "UNAUTHENTICATED: " in proc.stderr, proc.stderr


# --- roles ---------------------------------------------------------------------------------


def test_a_reader_scans_but_cannot_write(env: Env) -> None:
    with env.client("alice") as writer:
        session = writer.new_session(FlushMode.AUTO_FLUSH_SYNC)
        session.insert("kv", {"key": 1, "value": "one"})
        session.close()
    with env.client("bob") as reader:
        assert {r["key"] for r in reader.scan("kv")} >= {1}
        channels = env.channels(env.tls("bob"))
        try:
            leader = reader.servers()[reader.leader_of(reader.tablet_for("kv", {"key": 2}))]
            stub = tablet_pb2_grpc.TabletServiceStub(channels.channel(leader.rpc_addr))
            request = tablet_pb2.WriteRequest(tablet_id=reader.tablet_for("kv", {"key": 2}))
            assert _code(lambda: stub.Write(request, timeout=5)) == (
                grpc.StatusCode.PERMISSION_DENIED
            )
        finally:
            channels.close()
        session = reader.new_session(FlushMode.AUTO_FLUSH_SYNC, timeout_s=3)
        with pytest.raises(RaftletError):
            session.insert("kv", {"key": 2, "value": "two"})

    # Through the asyncio client's write stream: refused at once, saying why (every write
    # was once retried as UNAVAILABLE until its deadline).
    async def write_as_reader() -> None:
        async with AsyncClient.connect(env.seeds, tls=env.tls("bob"), timeout_s=60) as c:
            with pytest.raises(RemoteError, match="needs role writer"):
                await c.insert("kv", {"key": 3, "value": "three"})

    asyncio.run(asyncio.wait_for(write_as_reader(), 120))


def test_a_writer_cannot_step_down_a_leader_or_set_a_flag(env: Env) -> None:
    before = env.denials("role_too_low")
    with env.client("alice") as writer, pytest.raises(RaftletError, match="needs role admin"):
        writer.leader_step_down("kv-p0", timeout_s=3)
    channels = env.channels(env.tls("alice"))
    try:
        admin = admin_pb2_grpc.AdminServiceStub(channels.channel(env.seeds[0]))
        request = admin_pb2.SetFlagRequest(name="log_inject_latency_ms", value="5")
        assert _code(lambda: admin.SetFlag(request, timeout=5)) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        assert _code(lambda: admin.GetFlags(admin_pb2.GetFlagsRequest(), timeout=5)) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
    finally:
        channels.close()
    assert env.denials("role_too_low") >= before + 2


def test_tablet_copy_is_for_servers_each_speaking_for_itself(env: Env) -> None:
    """Only a server certificate may call TabletCopyService, and only for itself: an
    operator's admin certificate and a server claiming to be another are refused, while a
    server asking its leader for a copy of a tablet gets a session over mutual TLS."""
    begin = tablet_copy_pb2.BeginTabletCopySessionRequest
    servers = [s.id for s in env.cluster.config.servers]
    admin = env.channels(env.tls("admin", env.tls_dir))
    try:
        stub = tablet_copy_pb2_grpc.TabletCopyServiceStub(admin.channel(env.seeds[0]))
        request = begin(tablet_id="kv-p0", requester_uuid=servers[1])
        assert _code(lambda: stub.BeginTabletCopySession(request, timeout=5)) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        start = tablet_copy_pb2.StartTabletCopyRequest(
            tablet_id="kv-p0", source_uuid=servers[1], source_term=1
        )
        assert _code(lambda: stub.StartTabletCopy(start, timeout=5)) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
    finally:
        admin.close()
    opened = 0
    for me in servers:
        channels = env.channels(env.server_tls(me))
        try:
            for i, other in enumerate(servers):
                if other == me:
                    continue
                stub = tablet_copy_pb2_grpc.TabletCopyServiceStub(channels.channel(env.seeds[i]))
                impostor = next(s for s in servers if s not in (me, other))
                forged = begin(tablet_id="kv-p0", requester_uuid=impostor)
                with pytest.raises(grpc.RpcError) as refused:
                    stub.BeginTabletCopySession(forged, timeout=5)
                assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
                try:
                    session = stub.BeginTabletCopySession(
                        begin(tablet_id="kv-p0", requester_uuid=me), timeout=10
                    )
                except grpc.RpcError as e:
                    not_leader = e.code() is grpc.StatusCode.FAILED_PRECONDITION
                    if not not_leader:
                        raise
                    continue
                chunk = stub.FetchTabletCopyData(
                    tablet_copy_pb2.FetchTabletCopyDataRequest(
                        session_id=session.session_id, max_bytes=4096, requester_uuid=me
                    ),
                    timeout=10,
                )
                assert chunk.data.startswith(b"SQLite format 3")
                stub.EndTabletCopySession(
                    tablet_copy_pb2.EndTabletCopySessionRequest(
                        session_id=session.session_id, success=False, requester_uuid=me
                    ),
                    timeout=10,
                )
                opened += 1
        finally:
            channels.close()
    assert opened == 2  # the leader of kv-p0, asked by each of the other two


def test_tokens_name_the_caller(env: Env) -> None:
    # bob's certificate is a reader's; the writer token makes the call a writer's.
    with env.client("bob", token=WRITER_TOKEN) as c:
        session = c.new_session(FlushMode.AUTO_FLUSH_SYNC)
        session.insert("kv", {"key": 10, "value": "by token"})
        session.close()
    with env.client("alice", token=READER_TOKEN) as c:
        session = c.new_session(FlushMode.AUTO_FLUSH_SYNC, timeout_s=3)
        with pytest.raises(RaftletError):
            session.insert("kv", {"key": 11, "value": "x"})
        assert any(r["key"] == 10 for r in c.scan("kv"))


# --- the token port: a bearer token and no certificate ----------------------------------------


def test_a_token_alone_reads_and_writes_on_the_token_ports(env: Env) -> None:
    assert all(env.token_seeds)
    ca_only = TlsOptions(env.ca)
    with Client(env.token_seeds, tls=ca_only, token=WRITER_TOKEN, timeout_s=10) as c:
        # Every server is reached at its token port, leaders included.
        assert {s.rpc_addr for s in c.servers().values()} == set(env.token_seeds)
        session = c.new_session(FlushMode.AUTO_FLUSH_SYNC)
        for key in range(300, 310):
            session.insert("kv", {"key": key, "value": "token"})
        session.close()
    with Client(env.token_seeds, tls=ca_only, token=READER_TOKEN, timeout_s=10) as c:
        assert {r["key"] for r in c.scan("kv")} >= set(range(300, 310))
        session = c.new_session(FlushMode.AUTO_FLUSH_SYNC, timeout_s=3)
        with pytest.raises(RaftletError):
            session.insert("kv", {"key": 310, "value": "x"})
    with (
        Client(env.token_seeds, tls=ca_only, token=WRITER_TOKEN, timeout_s=10) as c,
        pytest.raises(RaftletError, match="needs role admin"),
    ):
        c.leader_step_down("kv-p0", timeout_s=3)


def test_cluster_status_with_a_token_alone_asks_the_token_ports(
    env: Env, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It dialed every server's RPC port, whose handshake wants a certificate: a healthy
    cluster was all DOWN ("Socket closed") while scans with the same token worked."""
    monkeypatch.setenv("RAFTLET_TOKEN", READER_TOKEN)
    config = str(env.cluster.config_path)
    seen: list[dict[str, Any]] = []

    def led() -> bool:  # an earlier test's step-down may still be electing
        argv = ["cluster", "status", "--cluster", config, "--tls-ca", str(env.ca)]
        main([*argv, "--format", "json"])
        seen[:] = [json.loads(capsys.readouterr().out)]
        return all(t["leader"] for t in seen[0]["tablets"])

    waiting.wait_for(led, 30, "every tablet led, as status with a token alone sees it")
    doc = seen[0]
    assert [(s["state"], s["rpc_addr"]) for s in doc["servers"]] == [
        ("UP", addr) for addr in env.token_seeds
    ], doc["issues"]
    # leader-step-down finds the leader with the same check.
    monkeypatch.setenv("RAFTLET_TOKEN", ADMIN_TOKEN)
    argv = ["leader-step-down", "kv-p0", "--cluster", config, "--tls-ca", str(env.ca)]
    assert main(argv) == 0, capsys.readouterr().err


def test_the_token_port_needs_a_token_and_the_rpc_port_a_certificate(env: Env) -> None:
    def refused() -> float:
        return env.denials("no_credentials") + env.denials("invalid_token")

    before = refused()
    for token in (None, "not-a-known-token-at-all"):
        channels = env.channels(TlsOptions(env.ca), token)
        try:
            stub = channels.stub(env.token_seeds[0])
            assert _code(lambda s=stub: s.get_cluster_config(3)) == (
                grpc.StatusCode.UNAUTHENTICATED
            )
        finally:
            channels.close()
    # A client certificate is not asked for on the token port, so it names nobody there.
    channels = env.channels(env.tls("alice"))
    try:
        stub = channels.stub(env.token_seeds[0])
        assert _code(lambda: stub.get_cluster_config(3)) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        channels.close()
    assert refused() >= before + 3
    # Without a certificate the RPC port's handshake fails, token or not.
    channels = env.channels(TlsOptions(env.ca), WRITER_TOKEN)
    try:
        stub = channels.stub(env.seeds[0])
        assert _code(lambda: stub.get_cluster_config(3)) == grpc.StatusCode.UNAVAILABLE
    finally:
        channels.close()


def test_an_admin_steps_down_a_leader(env: Env) -> None:
    with Client(env.seeds, tls=env.tls("admin", env.tls_dir), timeout_s=20) as admin:
        admin.leader_step_down("kv-p1")


def test_status_pages_need_a_role(env: Env) -> None:
    assert env.status(0, "/healthz", None) == 200
    assert env.status(0, "/metrics", None) == 401
    assert env.status(0, "/metrics", None, token="wrong-token-0123456789") == 401
    assert env.status(0, "/metrics", None, token=READER_TOKEN) == 200
    assert env.status(0, "/stacks", None, token=READER_TOKEN) == 403
    assert env.status(0, "/tablets.json", "bob") == 200
    assert env.status(0, "/stacks", "bob") == 403
    assert env.status(0, "/stacks", "admin") == 200


# --- consensus: servers only, and the sender is the certificate's ------------------------------


def _consensus_requests(tablet: str, claimed: str, dest: str) -> list[tuple[str, object]]:
    return [
        (
            "UpdateConsensus",
            consensus_pb2.UpdateConsensusRequest(
                tablet_id=tablet, caller_uuid=claimed, dest_uuid=dest, caller_term=10**6
            ),
        ),
        (
            "RequestVote",
            consensus_pb2.RequestVoteRequest(
                tablet_id=tablet, candidate_uuid=claimed, dest_uuid=dest, candidate_term=10**6
            ),
        ),
        (
            "TimeoutNow",
            consensus_pb2.TimeoutNowRequest(
                tablet_id=tablet, caller_uuid=claimed, dest_uuid=dest, caller_term=10**6
            ),
        ),
    ]


def _leader_and_follower(env: Env, tablet: str) -> tuple[str, str, str]:
    """(leader id, a follower id, the follower's address)."""
    health = env.cluster.health()
    (t,) = [t for t in health.tablets if t.tablet_id == tablet]
    assert t.leader is not None
    follower = next(s for s in env.cluster.config.servers if s.id != t.leader)
    return t.leader, follower.id, follower.rpc_addr


@pytest.mark.parametrize("caller", ["admin-client", "admin-token", "other-server"])
def test_forged_consensus_requests_are_refused_and_lose_nothing(env: Env, caller: str) -> None:
    tablet = "kv-p0"
    leader, follower, follower_addr = _leader_and_follower(env, tablet)
    token = None
    if caller == "admin-client":
        # A valid client certificate, even an admin's, is not a server's.
        tls = env.tls("admin", env.tls_dir)
        expected_reason = "role_too_low"
    elif caller == "admin-token":
        # The token port: no certificate there, so no caller is a server.
        tls, token = TlsOptions(env.ca), ADMIN_TOKEN
        follower_addr = env.cluster.config.server(follower).token_rpc_addr
        expected_reason = "role_too_low"
    else:
        # A real server's certificate, claiming to be the leader: refused as a forgery.
        third = next(s.id for s in env.cluster.config.servers if s.id not in (leader, follower))
        tls = env.server_tls(third)
        expected_reason = "sender_mismatch"
    before = env.denials(expected_reason)

    acked: list[int] = []
    stop = threading.Event()

    def write_load() -> None:
        with Client(env.seeds, tls=env.tls("alice"), timeout_s=20) as c:
            session = c.new_session(FlushMode.AUTO_FLUSH_SYNC)
            key = {"admin-client": 1_000_000, "admin-token": 3_000_000}.get(caller, 2_000_000)
            while not stop.is_set():
                session.insert("kv", {"key": key, "value": "v"})
                acked.append(key)
                key += 1
            session.close()

    writer = threading.Thread(target=write_load, name="acked-writes")
    writer.start()
    channels = env.channels(tls, token)
    try:
        waiting.wait_for(lambda: len(acked) >= 20, 30, "writes before the forgery")
        stub = consensus_pb2_grpc.ConsensusServiceStub(channels.channel(follower_addr))
        for _ in range(5):
            for method, request in _consensus_requests(tablet, leader, follower):
                code = _code(lambda m=method, r=request: getattr(stub, m)(r, timeout=5))
                assert code == grpc.StatusCode.PERMISSION_DENIED, (method, code)
        # The stream transport: the call is refused (a client), or its item is (a server).
        update = _consensus_requests(tablet, leader, follower)[0][1]
        assert isinstance(update, consensus_pb2.UpdateConsensusRequest)
        answered = threading.Event()

        def frames() -> Iterator[consensus_pb2.ConsensusFramePB]:
            item = consensus_pb2.ConsensusItemPB(seq=1, update=update)
            yield consensus_pb2.ConsensusFramePB(items=[item])
            answered.wait(10)  # keep our side open until the answer is in

        call = stub.Stream(frames(), timeout=10)
        refused: grpc.RpcError | None = None
        answer = None
        try:
            answer = next(call)
        except grpc.RpcError as e:
            refused = e
        finally:
            answered.set()
            call.cancel()
        if caller != "other-server":
            assert refused is not None
            assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
        else:
            assert answer is not None
            (item,) = answer.items
            assert item.HasField("failed")
            assert "certificate" in item.failed.message
        n = len(acked)
        waiting.wait_for(lambda: len(acked) >= n + 20, 30, "writes after the forgery")
    finally:
        stop.set()
        writer.join(timeout=60)
        channels.close()
    assert not writer.is_alive()
    assert env.denials(expected_reason) > before

    # No term was taken over and nothing acknowledged is lost; replicas agree.
    with Client(env.seeds, tls=env.tls("admin", env.tls_dir), timeout_s=20) as c:
        keys = set(acked)
        rows = {r["key"] for r in c.scan("kv")}
        assert keys <= rows

        def replicas_equal() -> bool:
            seen = []
            for replica in c.replicas(tablet):
                scan = c.scan_tablet(tablet, read_mode=ReadMode.FOLLOWER_APPLIED, replica=replica)
                seen.append(sorted(r["key"] for r in scan))
            return all(s == seen[0] for s in seen)

        waiting.wait_for(replicas_equal, 30, "replicas of kv-p0 equal")
        statuses = c.list_tablets()
        terms = {t.term for s in statuses.values() for t in s.tablets if t.tablet_id == tablet}
        assert max(terms) < 10**6


# --- the other transport, and plaintext refusals ---------------------------------------------


def test_the_unary_consensus_transport_works_over_tls(tmp_path: Path) -> None:
    cluster = LocalCluster.create(
        tmp_path / "u",
        servers=3,
        tablets=1,
        tls=True,
        extra_flags=["--consensus_transport", "unary"],
        ready_timeout_s=60,
        leader_timeout_s=60,
    )
    try:
        tls_dir = cluster.data_dir / "tls"
        tls = TlsOptions(
            tls_dir / "ca.crt", tls_dir / "client-admin.crt", tls_dir / "client-admin.key"
        )
        with Client([s.rpc_addr for s in cluster.config.servers], tls=tls, timeout_s=20) as c:
            session = c.new_session(FlushMode.AUTO_FLUSH_SYNC)
            for k in range(20):
                session.insert("kv", {"key": k, "value": str(k)})
            session.close()
            c.leader_step_down("kv-p0")
            session = c.new_session(FlushMode.AUTO_FLUSH_SYNC)
            session.insert("kv", {"key": 100, "value": "after"})
            session.close()
            assert len(list(c.scan("kv"))) == 21
        # `up --tls` also made a token per role and gave every server a token port.
        tokens = local_tokens(cluster.data_dir)
        assert sorted(tokens) == ["admin", "reader", "writer"]
        assert oct((tls_dir / "tokens").stat().st_mode & 0o777) == "0o600"
        config = cluster.data_dir / "cluster.toml"
        ca_only = TlsOptions(tls_dir / "ca.crt")
        with Client.from_config(config, tls=ca_only, token=tokens["writer"], timeout_s=20) as c:
            session = c.new_session(FlushMode.AUTO_FLUSH_SYNC)
            session.insert("kv", {"key": 200, "value": "by token"})
            session.close()
        # The CLI: a CA and a token, no certificate.
        scan = subprocess.run(
            [sys.executable, "-m", "raftlet", "scan", "kv", "--data-dir", str(cluster.data_dir),
             "--tls-ca", str(tls_dir / "ca.crt")],
            cwd=REPO, capture_output=True, text=True, timeout=60,
            env={**os.environ, "RAFTLET_TOKEN": tokens["reader"]},
        )  # fmt: skip
        assert scan.returncode == 0, scan.stderr
        assert "by token" in scan.stdout
    finally:
        cluster.down(timeout=20)


def _tserver(config: Path, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "raftlet", "tserver", "--config", str(config),
         "--server_id", "ts1", "--data_dir", str(config.parent / "d"), *flags],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_a_plaintext_server_on_a_public_address_refuses_to_start(tmp_path: Path) -> None:
    from raftlet.cluster import write_cluster_config
    from raftlet.deploy.local import new_config

    config = write_cluster_config(
        new_config(tmp_path, servers=1, tablets=1),
        tmp_path / "cluster.toml",
    )
    assert config.path is not None
    rpc, http = free_ports(2)
    proc = _tserver(config.path, "--rpc_addr", f"0.0.0.0:{rpc}")
    try:
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 2
    assert "not a loopback address and TLS is off" in err
    assert "--insecure" in err

    # With --insecure it starts (and is stopped by its PID).
    proc = _tserver(
        config.path, "--rpc_addr", f"0.0.0.0:{rpc}", "--http_addr", f"0.0.0.0:{http}", "--insecure"
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "ready" in line, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=30)  # reaps it and closes its pipes
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=10)
