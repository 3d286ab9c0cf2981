"""A server's TLS files, checked before it serves (``--tls_cert``, ``--tls_key``,
``--tls_ca``).

gRPC and ``ssl`` only load the files: a server with an expired certificate, one not valid
yet, another server's, a client's, or one its CA did not sign started, said it was ready,
and then no peer or client could talk to it (or, with another server's certificate, its
peers refused its votes as forged, and its own log said nothing). Each of these is now an
error naming the file and what is wrong with it, and the server does not start; one that
expires within ``EXPIRY_WARNING_DAYS`` starts with a WARNING saying when.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import ssl
from collections.abc import Callable
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID

from raftlet.cluster.identity import CLIENT_URI_PREFIX, EXPIRY_WARNING_DAYS, SERVER_URI_PREFIX
from raftlet.tserver.file_modes import warn_if_world_readable

__all__ = [
    "EXPIRY_WARNING_DAYS",
    "ExpiryWatch",
    "FilesRefused",
    "check_server_tls",
    "is_ca",
    "validity_fault",
]

logger = logging.getLogger(__name__)

# A running server warns of its certificate's expiry once this close to it.
_LAST_DAY_S = 86400.0


def check_server_tls(
    cert: str,
    key: str,
    ca: str,
    server_id: str,
    now: datetime.datetime | None = None,
    host: str = "",
) -> datetime.datetime:
    """Raise ``OSError`` naming the flag, the file and the fault if the files cannot make
    ``server_id`` a working TLS server and peer -- ``host`` being the name or address
    clients and peers dial it by; log a WARNING if one expires soon. Returns when the first
    of the certificate and its CA expires (``tls_cert_expiry_seconds``)."""
    now = now or datetime.datetime.now(datetime.UTC)
    (own, *_) = _load(cert, "tls_cert")
    authorities = _load(ca, "tls_ca")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key)
    except ssl.SSLError as e:
        raise FilesRefused(
            f"--tls_key {key} is not the key of --tls_cert {cert} ({e.reason or e})"
        ) from None
    except OSError as e:
        raise OSError(f"--tls_key {key}: {e.strerror or e}") from None
    # The CA file may hold several (a bundle, while a cluster moves to a new CA): ours
    # must have signed it, and be valid.
    issuer = next((a for a in authorities if _issued(own, a)), None)
    if issuer is None:
        raise FilesRefused(
            f"--tls_cert {cert} was not signed by --tls_ca {ca}: peers and clients that "
            "trust that CA refuse it"
        )
    _check_dates(issuer, f"--tls_ca {ca}", now)
    _check_dates(own, f"--tls_cert {cert}", now)
    warn_if_world_readable(
        key,
        f"--tls_key {key}",
        "anyone who reads it can pose as this server; chmod o-rwx it",
    )
    uris = _san_uris(own)
    wanted = SERVER_URI_PREFIX + server_id
    if wanted not in uris:
        names = ", ".join(uris) or "no raftlet identity"
        what = (
            "a client certificate"
            if any(u.startswith(CLIENT_URI_PREFIX) for u in uris)
            else "not this server's"
        )
        raise FilesRefused(
            f"--tls_cert {cert} is {what} ({names}); server {server_id} needs one naming "
            f"{wanted} (`raftlet certs create --servers {server_id}`)"
        )
    if host and not _names_host(own, host):
        raise FilesRefused(
            f"--tls_cert {cert} does not name {host}, the host clients and peers dial "
            f"{server_id} by: their host name check refuses it (`raftlet certs create "
            f"--servers {server_id} --hosts {host}`)"
        )
    usages = _usages(own)
    missing = [
        label
        for oid, label in (
            (ExtendedKeyUsageOID.SERVER_AUTH, "serverAuth"),
            (ExtendedKeyUsageOID.CLIENT_AUTH, "clientAuth"),
        )
        if usages is not None and oid not in usages
    ]
    if missing:
        raise FilesRefused(
            f"--tls_cert {cert} may not be used for {' or '.join(missing)}: a server presents "
            "it to clients and, as a client, to its peers"
        )
    return min(own.not_valid_after_utc, issuer.not_valid_after_utc)


class FilesRefused(OSError):
    """TLS or token files that are there but cannot work as they are (another server's
    certificate, an expired one, a key of another certificate): the operator must change
    them, which no restart does -- the server exits 2, which supervisors do not restart on
    (a review's systemd unit restarted one five times, compose for ever). A file missing
    or unreadable stays a plain ``OSError`` (exit 1): a secret not mounted yet, say."""


class ExpiryWatch:
    """What a running server says of its certificate (or CA) as it nears and passes its
    expiry: a WARNING a day before, an ERROR once it has expired -- each once. The start-up
    check warns only as a server starts, and one that ran on past its certificate's expiry
    said nothing while every new connection to it failed (review r27a)."""

    def __init__(
        self,
        expires: datetime.datetime,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._expires = expires
        self._clock = clock
        self._said = ""

    def check(self) -> bool:
        """Log what is new; whether the certificate has expired."""
        left = (self._expires - self._clock()).total_seconds()
        stage = "expired" if left <= 0 else "soon" if left <= _LAST_DAY_S else ""
        if not stage or stage == self._said:
            return stage == "expired"
        self._said = stage
        at = f"{self._expires:%Y-%m-%d %H:%M} UTC"
        if stage == "expired":
            logger.error(
                "TLS certificate (or its CA) expired at %s: clients and peers that connect "
                "anew refuse this server, which hands over the tablets it leads; renew it "
                "and restart the server",
                at,
            )
            return True
        logger.warning(
            "TLS certificate (or its CA) expires at %s, in %.0f hours: renew it and "
            "restart the server before then",
            at,
            left / 3600,
        )
        return False


def _load(path: str, flag: str) -> list[x509.Certificate]:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise OSError(f"--{flag} {path}: {e.strerror}") from None
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise FilesRefused(f"--{flag} {path} holds no PEM certificate ({e})") from None


def _issued(cert: x509.Certificate, authority: x509.Certificate) -> bool:
    """Whether ``authority``, a CA, signed ``cert`` (a CA: TLS refuses an issuer that is
    not one, whatever it signed)."""
    if not is_ca(authority):
        return False
    try:
        cert.verify_directly_issued_by(authority)
    except (InvalidSignature, ValueError, TypeError):  # ValueError: another issuer's name
        return False
    return True


def is_ca(cert: x509.Certificate) -> bool:
    """Whether ``cert`` may sign others (its basicConstraints say CA:TRUE)."""
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def validity_fault(cert: x509.Certificate, now: datetime.datetime) -> str | None:
    """What is wrong with ``cert``'s dates at ``now`` ("is not valid before ...", "expired
    on ..."), or None."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now < start:
        return f"is not valid before {start:%Y-%m-%d %H:%M} UTC"
    if now > end:
        return f"expired on {end:%Y-%m-%d %H:%M} UTC"
    return None


def _check_dates(cert: x509.Certificate, what: str, now: datetime.datetime) -> None:
    fault = validity_fault(cert, now)
    if fault is not None:
        renew = ": renew it" if fault.startswith("expired") else ""
        raise FilesRefused(f"{what} {fault}{renew}")
    end = cert.not_valid_after_utc
    left = end - now
    if left < datetime.timedelta(days=EXPIRY_WARNING_DAYS):
        logger.warning(
            "%s expires on %s UTC, in %.1f days: renew it before then (a server whose "
            "certificate expired can reach no peer, and no client can reach it)",
            what,
            f"{end:%Y-%m-%d %H:%M}",
            left.total_seconds() / 86400,
        )


def _names_host(cert: x509.Certificate, host: str) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        names = [n.lower() for n in san.get_values_for_type(x509.DNSName)]
        wanted = host.lower().rstrip(".")
        return wanted in names or any(
            n.startswith("*.") and wanted.partition(".")[2] == n[2:] for n in names
        )
    return address in san.get_values_for_type(x509.IPAddress)


def _san_uris(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(u) for u in san.get_values_for_type(x509.UniformResourceIdentifier)]


def _usages(cert: x509.Certificate) -> list[x509.ObjectIdentifier] | None:
    try:
        return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return None  # no restriction
