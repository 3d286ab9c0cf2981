"""A certificate authority and the certificates of a raftlet cluster (``raftlet certs create``).

Made with the ``cryptography`` package (no ``openssl`` subprocess), ECDSA P-256 keys. In
``--dir D``:

    ca.crt, ca.key                 the cluster's CA (reused if present, so clients can be
                                   added to an existing cluster later)
    server-<id>.crt / .key         one per tablet server: CN=<id>, subjectAltName = its host
                                   names and IPs + ``raftlet://server/<id>``; extendedKeyUsage
                                   serverAuth *and* clientAuth, because a server dials its
                                   peers with the same certificate (mutual TLS)
    client-<name>.crt / .key       one per client: CN=<name>, subjectAltName
                                   ``raftlet://client/<name>?role=<role>``; clientAuth only

The identity is in the SAN URI (``cluster.identity``), which is what the server reads back
from a verified peer. Private keys are created with mode 0600 (never world-readable, not
even for an instant: ``os.open`` with the mode, then written); certificates 0644. An
existing certificate is never overwritten silently: ``CertError`` unless ``overwrite``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from raftlet.cluster import bare_host
from raftlet.cluster.identity import AccessRole, check_name, client_uri, parse_role, server_uri
from raftlet.tserver.cert_check import is_ca, validity_fault

__all__ = [
    "CertError",
    "CertPaths",
    "ClientSpec",
    "CreatedCerts",
    "create_certs",
    "parse_client_spec",
]

DEFAULT_DAYS = 365
CA_CERT = "ca.crt"
CA_KEY = "ca.key"


class CertError(Exception):
    """A certificate cannot be made as asked (the message says why, for the CLI)."""


@dataclass(frozen=True)
class CertPaths:
    cert: Path
    key: Path


@dataclass(frozen=True)
class ClientSpec:
    name: str
    role: AccessRole


@dataclass
class CreatedCerts:
    ca: Path
    servers: dict[str, CertPaths] = field(default_factory=dict)
    clients: dict[str, CertPaths] = field(default_factory=dict)


def parse_client_spec(text: str) -> ClientSpec:
    """``NAME:ROLE`` (e.g. ``ops:admin``) → ``ClientSpec``; ``ValueError`` with the reason."""
    name, sep, role = text.partition(":")
    if not sep:
        raise ValueError(f"client {text!r} is not NAME:ROLE (e.g. app:writer)")
    return ClientSpec(check_name(name.strip(), "client name"), parse_role(role))


def server_cert_paths(directory: Path, server_id: str) -> CertPaths:
    return CertPaths(directory / f"server-{server_id}.crt", directory / f"server-{server_id}.key")


def client_cert_paths(directory: Path, name: str) -> CertPaths:
    return CertPaths(directory / f"client-{name}.crt", directory / f"client-{name}.key")


def create_certs(
    directory: Path,
    *,
    servers: Sequence[str] = (),
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    clients: Sequence[ClientSpec] = (),
    days: int = DEFAULT_DAYS,
    overwrite: bool = False,
) -> CreatedCerts:
    """Create (or reuse) the CA in ``directory`` and sign a certificate per server and
    client. ``hosts`` go in every server certificate's SAN; ``{server}`` in a host is
    replaced by the server's id (``{server}.raftlet.svc`` for per-pod names)."""
    if days < 1:
        raise CertError(f"--days must be at least 1, got {days}")
    for sid in servers:
        check_name(sid, "server id")
    if len(set(servers)) != len(servers):
        raise CertError(f"server ids repeat: {', '.join(servers)}")
    names = [c.name for c in clients]
    if len(set(names)) != len(names):
        raise CertError(f"client names repeat: {', '.join(names)}")
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _load_or_create_ca(directory, days)
    out = CreatedCerts(ca=directory / CA_CERT)
    for sid in servers:
        paths = server_cert_paths(directory, sid)
        _refuse_existing(paths, overwrite)
        host_names = [h.replace("{server}", sid) for h in hosts]
        sans = [*_host_sans(host_names), x509.UniformResourceIdentifier(server_uri(sid))]
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        _issue(paths, sid, sans, usages, ca_cert, ca_key, days)
        out.servers[sid] = paths
    for spec in clients:
        paths = client_cert_paths(directory, spec.name)
        _refuse_existing(paths, overwrite)
        sans = [x509.UniformResourceIdentifier(client_uri(spec.name, spec.role))]
        _issue(paths, spec.name, sans, [ExtendedKeyUsageOID.CLIENT_AUTH], ca_cert, ca_key, days)
        out.clients[spec.name] = paths
    return out


def _refuse_existing(paths: CertPaths, overwrite: bool) -> None:
    for path in (paths.cert, paths.key):
        if path.exists():
            if not overwrite:
                raise CertError(f"{path} exists (remove it, or pass --overwrite)")
            path.unlink()


def _host_sans(hosts: Iterable[str]) -> list[x509.GeneralName]:
    sans: list[x509.GeneralName] = []
    for host in hosts:
        host = bare_host(host.strip())  # an IPv6 address as cluster.toml writes it: [::1]
        if not host:
            continue
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    return sans


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _load_or_create_ca(
    directory: Path, days: int
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if cert_path.exists() or key_path.exists():
        if not (cert_path.exists() and key_path.exists()):
            raise CertError(f"{directory} holds only one of {CA_CERT} and {CA_KEY}")
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        except ValueError as e:
            raise CertError(f"{cert_path} holds no PEM certificate ({e})") from None
        try:
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (ValueError, TypeError) as e:
            raise CertError(f"{key_path} holds no unencrypted PEM key ({e})") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise CertError(f"{key_path} is not an EC key made by raftlet certs create")
        # What it signs must work: it signed certificates no server or client accepts.
        if key.public_key() != cert.public_key():
            raise CertError(f"{key_path} is not the key of {cert_path}")
        if not is_ca(cert):
            raise CertError(f"{cert_path} is no CA certificate (its basicConstraints say CA:FALSE)")
        fault = validity_fault(cert, _now())
        if fault is not None:
            then = (
                "make a new CA in another directory and move the cluster to it (README, TLS)"
                if fault.startswith("expired")
                else "servers refuse what it signs until then"
            )
            raise CertError(f"the CA {cert_path} {fault}: {then}")
        return cert, key
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raftlet cluster CA")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        # The CA outlives the certificates it signs, so they can be renewed under it.
        .not_valid_after(now + datetime.timedelta(days=days * 5))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return cert, key


def _issue(
    paths: CertPaths,
    common_name: str,
    sans: list[x509.GeneralName],
    usages: list[x509.ObjectIdentifier],
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    days: int,
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    end = now + datetime.timedelta(days=days)
    if end > ca_cert.not_valid_after_utc:
        # A certificate is good only as long as its CA: one made to outlive it said so
        # falsely (--days 3650 under a CA of 10 days).
        raise CertError(
            f"a certificate of {days} days would outlive its CA, which expires on "
            f"{ca_cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: ask for fewer --days, or make "
            "a new CA in another directory"
        )
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(paths.key, key)
    _write_cert(paths.cert, cert)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # Created 0600 (O_EXCL: never through an existing file or link an attacker placed).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
