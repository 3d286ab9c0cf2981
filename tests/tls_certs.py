"""Certificates ``raftlet certs create`` would not make, signed by a test's CA: for tests
of what a server or client does with them."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def issue(
    tls_dir: Path,
    cert_path: Path,
    key_path: Path,
    *,
    name: str,
    valid: tuple[datetime.timedelta, datetime.timedelta],
    sans: list[x509.GeneralName] | None = None,
) -> None:
    """A certificate for ``name``, signed by the CA in ``tls_dir``, valid from now plus
    ``valid[0]`` to now plus ``valid[1]``, with ``sans`` (none: no subjectAltName)."""
    ca_cert = x509.load_pem_x509_certificate((tls_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((tls_dir / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + valid[0])
        .not_valid_after(now + valid[1])
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), False)
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
