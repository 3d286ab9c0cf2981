"""Certificates (``deploy.certs``), identities (``cluster.identity``), tokens and the role
table (``tserver.security``), and the settings' refusal of plaintext beyond loopback."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from raftlet.cluster import load_cluster_config
from raftlet.cluster.identity import (
    AccessRole,
    Identity,
    client_uri,
    parse_identity_uri,
    parse_role,
    server_uri,
)
from raftlet.deploy.certs import CertError, ClientSpec, create_certs, parse_client_spec
from raftlet.proto import consensus_pb2 as cpb
from raftlet.tserver.flag_spec import FlagError
from raftlet.tserver.security import (
    Authenticator,
    AuthError,
    SenderMismatch,
    check_sender,
    is_loopback_addr,
    parse_tokens,
    permits,
    required_role,
)
from raftlet.tserver.server import TabletServer
from raftlet.tserver.servicers import TabletServicer
from raftlet.tserver.settings import ServerSettings
from tests.unit.tserver_settings_helpers import write_config


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _sans(cert: x509.Certificate) -> x509.SubjectAlternativeName:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


# --- certificates ----------------------------------------------------------------------------


def test_certs_carry_server_ids_hosts_and_client_roles(tmp_path: Path) -> None:
    made = create_certs(
        tmp_path,
        servers=["ts1", "ts2"],
        hosts=["127.0.0.1", "{server}.example", "localhost"],
        clients=[ClientSpec("app", AccessRole.WRITER), ClientSpec("ops", AccessRole.ADMIN)],
    )
    ca = _cert(made.ca)
    for sid in ("ts1", "ts2"):
        cert = _cert(made.servers[sid].cert)
        sans = _sans(cert)
        assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [server_uri(sid)]
        assert set(sans.get_values_for_type(x509.DNSName)) == {f"{sid}.example", "localhost"}
        assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        # Servers dial their peers with the same certificate: both usages.
        assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
        assert cert.issuer == ca.subject
        cert.verify_directly_issued_by(ca)
    for name, role in (("app", AccessRole.WRITER), ("ops", AccessRole.ADMIN)):
        cert = _cert(made.clients[name].cert)
        (uri,) = _sans(cert).get_values_for_type(x509.UniformResourceIdentifier)
        assert parse_identity_uri(uri) == Identity(name, role)
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        cert.verify_directly_issued_by(ca)


def test_an_ipv6_host_in_brackets_is_an_ip_address(tmp_path: Path) -> None:
    """cluster.toml writes [::1]:7051, and "[::1]" went into certificates as a DNS name."""
    made = create_certs(tmp_path, servers=["ts1"], hosts=["[::1]", "::2"])
    sans = _sans(_cert(made.servers["ts1"].cert))
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["::1", "::2"]
    assert sans.get_values_for_type(x509.DNSName) == []


def test_private_keys_are_0600_and_certs_are_never_overwritten_silently(tmp_path: Path) -> None:
    made = create_certs(tmp_path, servers=["ts1"], clients=[ClientSpec("a", AccessRole.READER)])
    for key in (tmp_path / "ca.key", made.servers["ts1"].key, made.clients["a"].key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    with pytest.raises(CertError, match="exists"):
        create_certs(tmp_path, servers=["ts1"])
    again = create_certs(tmp_path, servers=["ts1"], overwrite=True)
    assert stat.S_IMODE(again.servers["ts1"].key.stat().st_mode) == 0o600


def test_the_ca_is_reused_so_clients_can_be_added_later(tmp_path: Path) -> None:
    first = create_certs(tmp_path, servers=["ts1"])
    ca_before = (tmp_path / "ca.crt").read_bytes()
    later = create_certs(tmp_path, clients=[ClientSpec("late", AccessRole.READER)])
    assert (tmp_path / "ca.crt").read_bytes() == ca_before
    _cert(later.clients["late"].cert).verify_directly_issued_by(_cert(first.ca))


def test_client_specs_and_roles() -> None:
    assert parse_client_spec("app:writer") == ClientSpec("app", AccessRole.WRITER)
    for bad in ("app", "app:root", "app:server", "../x:reader", ":reader"):
        with pytest.raises(ValueError):  # noqa: PT011 - the message varies by what is wrong
            parse_client_spec(bad)
    assert parse_role(" Admin ") is AccessRole.ADMIN
    with pytest.raises(ValueError, match="cannot carry the server role"):
        client_uri("x", AccessRole.SERVER)


def test_identity_uris_parse_strictly() -> None:
    assert parse_identity_uri("raftlet://server/ts1") == Identity("ts1", AccessRole.SERVER)
    assert parse_identity_uri(client_uri("a", AccessRole.READER)) == Identity(
        "a", AccessRole.READER
    )
    for bad in (
        "raftlet://server/",
        "raftlet://server/../ts1",
        "raftlet://client/a",  # no role
        "raftlet://client/a?role=server",  # only a server certificate proves that
        "raftlet://client/a?role=reader&role=admin",
        "spiffe://server/ts1",
        "ts1.example",
    ):
        assert parse_identity_uri(bad) is None, bad


# --- tokens ----------------------------------------------------------------------------------


GOOD = "0123456789abcdef-writer"


def test_tokens_parse_and_compare() -> None:
    table = parse_tokens(
        f"# comment\n\n{GOOD} writer app  # trailing\nA" + "x" * 20 + " admin ops\n"
    )
    assert len(table) == 2
    assert table.lookup(GOOD) == Identity("app", AccessRole.WRITER, via="token")
    assert table.lookup("A" + "x" * 20) == Identity("ops", AccessRole.ADMIN, via="token")
    for wrong in ("", GOOD[:-1], GOOD + "x", GOOD.upper()):
        assert table.lookup(wrong) is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (f"{GOOD} writer", "expected 'token role name'"),
        ("short writer app", "shorter than 16"),
        (f"{GOOD} root app", "unknown role"),
        (f"{GOOD} server app", "unknown role"),
        (f"{GOOD} reader a\n{GOOD} admin b", "repeats"),
    ],
)
def test_bad_token_lines_are_refused_without_the_token(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as info:
        parse_tokens(text, "tokens.txt")
    assert "tokens.txt:" in str(info.value)
    assert GOOD not in str(info.value)
    assert "short" not in str(info.value).replace("shorter", "")


def test_a_token_decides_and_a_wrong_one_is_refused_not_ignored() -> None:
    auth = Authenticator(parse_tokens(f"{GOOD} writer app"))
    reader_cert = [client_uri("bob", AccessRole.READER), "dns-name.example"]
    assert auth.identify(reader_cert, None) == Identity("bob", AccessRole.READER)
    assert auth.identify(reader_cert, GOOD).role is AccessRole.WRITER
    for bearer, reason in ((GOOD + "x", "invalid_token"), ("", "invalid_token")):
        with pytest.raises(AuthError) as info:
            auth.identify(reader_cert, bearer)
        assert info.value.reason == reason
    with pytest.raises(AuthError) as info:
        auth.identify([], None)
    assert info.value.reason == "no_credentials"
    with pytest.raises(AuthError) as info:
        auth.identify(["dns-name.example"], None)
    assert info.value.reason == "no_identity"


# --- roles -----------------------------------------------------------------------------------


def test_the_role_table() -> None:
    reader, writer, admin = (Identity("c", r) for r in list(AccessRole)[:3])
    server = Identity("ts1", AccessRole.SERVER)
    cases = {
        "/raftlet.TabletService/Scan": {reader, writer, admin},
        "/raftlet.TabletService/ListTablets": {reader, writer, admin, server},
        # A server compares its config with its peers' before it makes replicas of a new
        # table: refused, the schema check saw no peer under TLS (review r27c).
        "/raftlet.TabletService/GetClusterConfig": {reader, writer, admin, server},
        "/raftlet.TabletService/Write": {writer, admin},
        "/raftlet.TabletService/WriteStream": {writer, admin},
        "/raftlet.TabletService/WriteEndpoint": {writer, admin},
        "/raftlet.AdminService/LeaderStepDown": {admin},
        "/raftlet.AdminService/SetFlag": {admin},
        "/raftlet.AdminService/GetFlags": {admin},
        "/raftlet.ConsensusService/UpdateConsensus": {server},
        "/raftlet.ConsensusService/RequestVote": {server},
        "/raftlet.ConsensusService/TimeoutNow": {server},
        "/raftlet.ConsensusService/Stream": {server},
        "/raftlet.ConsensusService/PeerEndpoint": {server},
        "/raftlet.NewService/Anything": {admin},  # closed until someone decides
    }
    for method, allowed in cases.items():
        required = required_role(method)
        assert required is not None
        for who in (reader, writer, admin, server):
            assert permits(who, required, method) == (who in allowed), (method, who)
    assert required_role("/grpc.health.v1.Health/Check") is None


def test_a_consensus_request_must_claim_its_certificates_server() -> None:
    ts1 = Identity("ts1", AccessRole.SERVER)
    check_sender(cpb.UpdateConsensusRequest(caller_uuid="ts1"), ts1)
    check_sender(cpb.RequestVoteRequest(candidate_uuid="ts1"), ts1)
    check_sender(cpb.UpdateConsensusRequest(caller_uuid="ts2"), None)  # auth off
    for request in (
        cpb.UpdateConsensusRequest(caller_uuid="ts2"),
        cpb.RequestVoteRequest(candidate_uuid="ts2"),
        cpb.TimeoutNowRequest(caller_uuid="ts2"),
    ):
        with pytest.raises(SenderMismatch):
            check_sender(request, ts1)
    with pytest.raises(SenderMismatch):
        check_sender(
            cpb.UpdateConsensusRequest(caller_uuid="ts1"), Identity("ts1", AccessRole.ADMIN)
        )


# --- settings ----------------------------------------------------------------------------------


def test_loopback_addresses() -> None:
    for addr in ("127.0.0.1:1", "127.8.0.1:1", "[::1]:1", "localhost:1"):
        assert is_loopback_addr(addr), addr
    for addr in ("0.0.0.0:1", "[::]:1", "10.0.0.1:1", "ts1:1", "example.com:1"):
        assert not is_loopback_addr(addr), addr


def test_plaintext_beyond_loopback_needs_insecure_and_tls_needs_all_three(tmp_path: Path) -> None:
    config = load_cluster_config(write_config(tmp_path))
    base = {"server_id": "ts1", "config": config, "data_dir": tmp_path / "d"}
    loop = {"rpc_addr": "127.0.0.1:7051", "http_addr": "127.0.0.1:8051"}
    ServerSettings(**base, **loop)  # type: ignore[arg-type]
    public = {"rpc_addr": "0.0.0.0:7051", "http_addr": "127.0.0.1:8051"}
    with pytest.raises(FlagError, match=r"not a loopback address and TLS is off.*--insecure"):
        ServerSettings(**base, **public)  # type: ignore[arg-type]
    ServerSettings(**base, **public, insecure=True)  # type: ignore[arg-type]
    tls = {"tls_cert": "c", "tls_key": "k", "tls_ca": "a"}
    ServerSettings(**base, **public, **tls)  # type: ignore[arg-type]
    with pytest.raises(FlagError, match="--tls_key: TLS needs"):
        ServerSettings(**base, **loop, tls_cert="c", tls_ca="a")  # type: ignore[arg-type]
    with pytest.raises(FlagError, match="bearer tokens need TLS"):
        ServerSettings(**base, **loop, auth_tokens_file="t")  # type: ignore[arg-type]
    with pytest.raises(FlagError, match=r"--token_rpc_addr: .* needs --tls_cert"):
        ServerSettings(**base, **loop, token_rpc_addr="127.0.0.1:9051")  # type: ignore[arg-type]
    with pytest.raises(FlagError, match=r"--token_rpc_addr: .*--auth_tokens_file"):
        ServerSettings(**base, **loop, **tls, token_rpc_addr="127.0.0.1:9051")  # type: ignore[arg-type]
    ServerSettings(**base, **loop, **tls, auth_tokens_file="t", token_rpc_addr="127.0.0.1:9051")  # type: ignore[arg-type]


def _tls_settings(tmp_path: Path, cert: str, key: str, ca: str) -> ServerSettings:
    return ServerSettings(
        server_id="ts1",
        config=load_cluster_config(write_config(tmp_path)),
        data_dir=tmp_path / "d",
        rpc_addr="127.0.0.1:7051",
        http_addr="127.0.0.1:8051",
        tls_cert=cert,
        tls_key=key,
        tls_ca=ca,
    )


def test_a_missing_tls_file_is_an_os_error_that_names_it(tmp_path: Path) -> None:
    # What `raftlet tserver` prints as one line and exit 1 (it had been a traceback).
    missing = str(tmp_path / "nowhere.pem")
    settings = _tls_settings(tmp_path, missing, missing, missing)
    with pytest.raises(OSError, match=rf"--tls_cert {missing}: No such file or directory"):
        TabletServer(settings)


def test_a_tls_server_says_how_long_its_certificate_has_left(tmp_path: Path) -> None:
    """Nothing said a certificate was about to expire until no peer or client could
    connect: the gauge is what an alert watches."""
    tls = tmp_path / "tls"
    create_certs(tls, servers=["ts1"], days=10)
    settings = _tls_settings(
        tmp_path, str(tls / "server-ts1.crt"), str(tls / "server-ts1.key"), str(tls / "ca.crt")
    )
    server = TabletServer(settings)
    (gauge,) = [
        m for m in server.entity.instances() if m.prototype.name == "tls_cert_expiry_seconds"
    ]
    assert 9.9 * 86400 < gauge.metric.value() <= 10 * 86400
    # ... and a status check hears the same from ListTablets.
    listed = TabletServicer(server)._list_tablets()
    assert 9.9 * 86400 < listed.tls_cert_expiry_seconds <= 10 * 86400


def test_a_refused_status_page_names_the_caller_by_its_token_and_address(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It said "from an anonymous client" of a caller with a valid token, and never where
    the request came from (review r32a)."""
    from raftlet.metrics.status_server import HttpError, PageRequest

    auth = Authenticator(parse_tokens(f"{GOOD} reader dash"))
    caplog.set_level(logging.WARNING, logger="raftlet.tserver.security")
    for bearer, who in ((GOOD, "a token caller"), (None, "an anonymous client")):
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        request = PageRequest("GET", "/stacks", {}, headers, peer="127.0.0.1:4242")
        with pytest.raises(HttpError):
            auth.check_page(request)
        assert f"from {who} at 127.0.0.1:4242" in caplog.records[-1].getMessage()
    assert GOOD not in caplog.text
    # Rate-limited by where the caller is, not by its port: a client reconnecting in a loop
    # comes from a new port each time.
    lines = len(caplog.records)
    for port in range(5000, 5010):
        with pytest.raises(HttpError):
            auth.check_page(PageRequest("GET", "/stacks", {}, {}, peer=f"127.0.0.1:{port}"))
    assert len(caplog.records) == lines


def test_the_probes_pages_are_open_and_the_others_need_a_reader() -> None:
    """Kubernetes' probes carry no credentials: /healthz and /readyz answer anyone."""
    from raftlet.metrics.status_server import HttpError, PageRequest

    auth = Authenticator(parse_tokens(f"{GOOD} reader dash"))
    for path in ("/healthz", "/readyz"):
        auth.check_page(PageRequest("GET", path, {}, {}, peer="127.0.0.1:1"))
    for path in ("/tablets", "/metrics"):
        with pytest.raises(HttpError):
            auth.check_page(PageRequest("GET", path, {}, {}, peer="127.0.0.1:1"))


def test_every_denial_reason_is_a_series_from_the_start() -> None:
    """An alert on the rate of rpc_auth_denials_total had no series to watch until the
    first refusal (review r32a)."""
    from raftlet.metrics.catalogue import RPC_AUTH_DENIALS
    from raftlet.metrics.export_json import generate_json
    from raftlet.metrics.registry import MetricRegistry
    from raftlet.tserver.security import DENIAL_REASONS

    registry = MetricRegistry()
    Authenticator(None, registry.entity("server", "ts1"))
    series = {
        m["labels"]["reason"]: m["value"]
        for e in generate_json(registry)
        for m in e["metrics"]
        if m["name"] == RPC_AUTH_DENIALS.name
    }
    assert series == dict.fromkeys(DENIAL_REASONS, 0)
    with pytest.raises(ValueError, match="not one of DENIAL_REASONS"):
        AuthError(grpc.StatusCode.UNAUTHENTICATED, "made_up", "no")
