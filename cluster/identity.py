"""Who is calling: the identities and roles raftlet's certificates and tokens carry.

Shared by the certificate generator (``deploy.certs``, which writes them into certificates),
the tablet server (``tserver.security``, which reads them back from a verified peer
certificate or a token) and the client; pure string functions, standard library only, so
the client may import it.

Identities are URIs in a certificate's subjectAltName, because a SAN URI is what both the
TLS stack (grpc's auth context, ``ssl.getpeercert``) and the ``cryptography`` package expose
without parsing distinguished names, and a URI cannot be confused with a host name:

    raftlet://server/<server id>              a tablet server (peers dial with it)
    raftlet://client/<name>?role=<role>       a client with a role

Roles are ordered: ``reader`` < ``writer`` < ``admin``; a higher role may do everything a
lower one may. ``server`` is not on that scale: it is what a tablet server's certificate
proves, and the only identity the consensus service accepts.
"""

from __future__ import annotations

import enum
import re
import ssl
from dataclasses import dataclass
from typing import cast
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "CLIENT_URI_PREFIX",
    "EXPIRY_WARNING_DAYS",
    "SERVER_URI_PREFIX",
    "AccessRole",
    "Identity",
    "client_uri",
    "parse_identity_uri",
    "parse_role",
    "peer_cert_uris",
    "server_uri",
]

SERVER_URI_PREFIX = "raftlet://server/"
CLIENT_URI_PREFIX = "raftlet://client/"
# A server whose certificate (or its CA) expires sooner than this starts with a WARNING,
# and `raftlet cluster status` warns: time to renew before clients and peers refuse it.
EXPIRY_WARNING_DAYS = 30
# Ids and names become parts of URIs and file names: the cluster config's id alphabet.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class AccessRole(enum.IntEnum):
    """What a caller may do; compare with ``>=`` (``admin`` may read)."""

    READER = 1
    WRITER = 2
    ADMIN = 3
    # A tablet server: consensus, and (as a peer) nothing of the client roles.
    SERVER = 10

    @property
    def label(self) -> str:
        return self.name.lower()


def parse_role(text: str) -> AccessRole:
    """``reader``, ``writer`` or ``admin`` (``ValueError`` otherwise; ``server`` is only
    ever proved by a server certificate, never given to a client or a token)."""
    try:
        role = AccessRole[text.strip().upper()]
    except KeyError:
        role = None
    if role is None or role is AccessRole.SERVER:
        raise ValueError(f"unknown role {text!r}: expected reader, writer or admin")
    return role


def check_name(name: str, what: str) -> str:
    if not _NAME.match(name):
        raise ValueError(
            f"{what} {name!r}: 1-64 letters, digits, '_', '.' or '-', starting with a "
            "letter or digit"
        )
    return name


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller: ``name`` is a server id for ``AccessRole.SERVER``, else the
    client's name; ``via`` says how it was proved (``cert`` or ``token``)."""

    name: str
    role: AccessRole
    via: str = "cert"

    @property
    def is_server(self) -> bool:
        return self.role is AccessRole.SERVER

    def __str__(self) -> str:
        kind = "server" if self.is_server else f"{self.role.label}"
        return f"{kind} {self.name!r} ({self.via})"


def server_uri(server_id: str) -> str:
    return SERVER_URI_PREFIX + check_name(server_id, "server id")


def client_uri(name: str, role: AccessRole) -> str:
    if role is AccessRole.SERVER:
        raise ValueError("a client certificate cannot carry the server role")
    return f"{CLIENT_URI_PREFIX}{check_name(name, 'client name')}?role={role.label}"


def parse_identity_uri(uri: str) -> Identity | None:
    """The identity a SAN URI names, or None if it is not a raftlet identity (or is
    malformed: a certificate with a garbled identity proves nothing)."""
    try:
        if uri.startswith(SERVER_URI_PREFIX):
            name = uri[len(SERVER_URI_PREFIX) :]
            return Identity(check_name(name, "server id"), AccessRole.SERVER)
        if uri.startswith(CLIENT_URI_PREFIX):
            parts = urlsplit(uri)
            name = parts.path.lstrip("/")
            roles = parse_qs(parts.query).get("role", [])
            if len(roles) != 1:
                return None
            return Identity(check_name(name, "client name"), parse_role(roles[0]))
    except ValueError:
        return None
    return None


def peer_cert_uris(sock: object) -> tuple[str, ...]:
    """The URIs in the subjectAltName of the peer certificate ``sock`` verified (where
    identities are); none for a plain socket or a peer that sent no certificate."""
    if not isinstance(sock, ssl.SSLSocket):
        return ()
    cert = sock.getpeercert()
    if not cert:
        return ()
    sans = cast(tuple[tuple[str, str], ...], cert.get("subjectAltName", ()))
    return tuple(value for kind, value in sans if kind == "URI")
