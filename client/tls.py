"""How a client (or a server dialing its peers) proves itself to a TLS cluster.

``TlsOptions(ca, cert, key)``: the cluster's CA certificate (to verify the servers) and a
client certificate with its key (``raftlet certs create --client NAME:ROLE`` makes them;
a tablet server dials its peers with its own server certificate). Each is a path or PEM
bytes. A TLS cluster's gRPC port requires a client certificate (mutual TLS: see
``tserver.security`` for why); a bearer ``token`` sent as well then names the caller and
its role instead of the certificate.

``channel_credentials(tls, token)`` is what ``channels.ChannelPool`` and
``aio_channels.AsyncChannelPool`` open their channels with: grpc's own TLS, nothing else
(the client needs no ``cryptography``). Tokens go as ``authorization: Bearer <token>``
call credentials, which grpc sends only over TLS.

``client_ssl_context(tls)`` is the same TLS for Python's ``ssl`` -- the plain-TCP paths (a
server's tcp write port; a tablet server's tcp connections to its peers): the server's
certificate verified against ``ca`` and its name against the host dialed, as grpc does.

``TlsOptions.from_env()`` reads ``RAFTLET_TLS_CA``, ``RAFTLET_TLS_CERT``,
``RAFTLET_TLS_KEY``; ``token_from_env()`` reads ``RAFTLET_TOKEN``.
"""

from __future__ import annotations

import datetime
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc

from raftlet.client.errors import InvalidArgument

__all__ = [
    "TlsOptions",
    "channel_credentials",
    "client_ssl_context",
    "token_from_env",
    "uses_token_ports",
]

PemSource = str | os.PathLike[str] | bytes


def _pem(source: PemSource | None, what: str) -> bytes | None:
    if source is None:
        return None
    if isinstance(source, bytes):
        return source
    try:
        return Path(source).read_bytes()
    except OSError as e:
        raise InvalidArgument(f"TLS {what} {os.fspath(source)}: {e.strerror}") from None


@dataclass(frozen=True)
class TlsOptions:
    """TLS towards the servers: ``ca`` verifies them; ``cert`` and ``key`` (both or
    neither) are this client's certificate. Paths or PEM bytes."""

    ca: PemSource
    cert: PemSource | None = None
    key: PemSource | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise InvalidArgument("TlsOptions: give both cert and key, or neither")

    @classmethod
    def from_env(cls) -> TlsOptions | None:
        """From ``RAFTLET_TLS_CA`` / ``_CERT`` / ``_KEY``; None when ``RAFTLET_TLS_CA`` is
        not set."""
        ca = os.environ.get("RAFTLET_TLS_CA")
        if not ca:
            return None
        return cls(
            ca,
            os.environ.get("RAFTLET_TLS_CERT") or None,
            os.environ.get("RAFTLET_TLS_KEY") or None,
        )

    def credentials(self) -> grpc.ChannelCredentials:
        if self.cert is not None and self.key is not None:
            _check_own(self.cert, self.key)
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.ca, "CA"),
            private_key=_pem(self.key, "key"),
            certificate_chain=_pem(self.cert, "certificate"),
        )


def _load_cert_chain(context: ssl.SSLContext, cert: PemSource, key: PemSource) -> None:
    if not isinstance(cert, bytes) and not isinstance(key, bytes):
        context.load_cert_chain(cert, key)
        return
    # ssl loads a certificate chain from files only: PEM bytes go through a private
    # directory (0700) that is gone once they are loaded.
    with tempfile.TemporaryDirectory(prefix="raftlet-tls-") as tmp:
        paths = []
        for name, source in (("cert.pem", cert), ("key.pem", key)):
            path = Path(tmp) / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(_pem(source, name) or b"")
            paths.append(path)
        context.load_cert_chain(paths[0], paths[1])


def _check_own(cert: PemSource, key: PemSource) -> None:
    """A client certificate and key that cannot work are an error now, naming them: grpc
    took them, every handshake failed, and the call said "Socket closed" after retrying for
    its whole timeout. Its dates are checked when ``cryptography`` is installed (the
    client library does not need it)."""
    what = "PEM bytes" if isinstance(cert, bytes) else os.fspath(cert)
    try:
        _load_cert_chain(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), cert, key)
    except ssl.SSLError as e:
        key_name = "PEM bytes" if isinstance(key, bytes) else os.fspath(key)
        raise InvalidArgument(
            f"TLS key {key_name} does not go with certificate {what} ({e.reason})"
        ) from None
    except OSError as e:
        raise InvalidArgument(f"TLS certificate or key: {e.strerror or e}") from None
    try:
        from cryptography import x509
    except ImportError:
        return
    try:
        parsed = x509.load_pem_x509_certificate(_pem(cert, "certificate") or b"")
    except ValueError:
        return  # ssl took it: whatever cryptography makes of it, grpc decides
    now = datetime.datetime.now(datetime.UTC)
    if now > parsed.not_valid_after_utc:
        raise InvalidArgument(
            f"TLS certificate {what} expired on {parsed.not_valid_after_utc:%Y-%m-%d %H:%M} "
            "UTC: the servers refuse it"
        )
    if now < parsed.not_valid_before_utc:
        raise InvalidArgument(
            f"TLS certificate {what} is not valid before "
            f"{parsed.not_valid_before_utc:%Y-%m-%d %H:%M} UTC: the servers refuse it"
        )


def client_ssl_context(tls: TlsOptions) -> ssl.SSLContext:
    """``tls`` for Python's ``ssl`` (TLS 1.2 or later): servers verified against its CA and
    by the host name or IP dialed; its certificate, if any, presented."""
    ca = _pem(tls.ca, "CA")
    assert ca is not None
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca.decode())
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if tls.cert is not None and tls.key is not None:
            _load_cert_chain(context, tls.cert, tls.key)
    except (ssl.SSLError, ValueError, OSError) as e:
        raise InvalidArgument(f"TLS: cannot load the CA, certificate or key: {e}") from None
    return context


def uses_token_ports(tls: object) -> bool:
    """Whether a client given ``tls`` (a constructor's keyword, None without TLS) dials the
    servers' token ports: TLS without a certificate of its own (a server's RPC port
    requires one; its token port asks for none)."""
    return isinstance(tls, TlsOptions) and tls.cert is None


def token_from_env() -> str | None:
    return os.environ.get("RAFTLET_TOKEN") or None


def channel_credentials(
    tls: TlsOptions | None, token: str | None = None
) -> grpc.ChannelCredentials | None:
    """The credentials channels are opened with; None: plaintext (a loopback development
    cluster). A token without TLS is refused: it would cross the network in clear."""
    if tls is None:
        if token:
            raise InvalidArgument("a bearer token needs TLS (give TlsOptions as well)")
        return None
    credentials = tls.credentials()
    if token:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token)
        )
    return credentials
