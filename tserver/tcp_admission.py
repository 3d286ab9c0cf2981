"""Who may use a plain-TCP port of a TLS server (``tserver.tcp_listener``): the TLS
handshake and the same identity rules as the gRPC port (``tserver.security``).

``TcpAdmission.admit(tls, name)`` runs on the new connection's own thread, never on the
acceptor's: the handshake waits on the peer, which may be slow or hostile, for at most
``handshake_timeout_s``. The server's context requires a client certificate signed by the
cluster's CA (TLS 1.2 or later), so a peer without one -- or a plaintext one -- fails the
handshake and is closed. Then the certificate's SAN URIs name the caller
(``Authenticator.identify``; no bearer token: a client with one stays on gRPC) and its role
must be ``role`` (``Authenticator.authorize``): the consensus port takes servers only, the
write port writers. A refusal is counted in ``rpc_auth_denials`` under ``what`` and closes
the connection before any frame is read.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
from dataclasses import dataclass

import grpc

from raftlet.cluster.identity import AccessRole, Identity, peer_cert_uris
from raftlet.tserver.security import Authenticator, AuthError, server_ssl_context

__all__ = ["TcpAdmission", "tcp_server_ssl_context"]

logger = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0


def tcp_server_ssl_context(cert: str, key: str, ca: str) -> ssl.SSLContext:
    """TLS for the tcp ports: our certificate; the caller's required and verified against
    ``ca``, as on the gRPC port."""
    return server_ssl_context(cert, key, ca, ssl.CERT_REQUIRED, "tcp port")


@dataclass(frozen=True)
class TcpAdmission:
    """TLS and the role a tcp port requires. ``what`` names the port in refusals (the
    ``rpc_auth_denials`` log line), as a gRPC method name would."""

    context: ssl.SSLContext
    auth: Authenticator
    role: AccessRole
    what: str
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S

    def wrap(self, conn: socket.socket) -> ssl.SSLSocket:
        """``conn`` as a TLS socket, not handshaken yet (no I/O: the acceptor may call it)."""
        conn.settimeout(self.handshake_timeout_s)
        return self.context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)

    def admit(self, tls: ssl.SSLSocket, name: str) -> Identity | None:
        """The connection's own thread: handshake, then who the caller is; None: refused,
        and ``tls`` closed."""
        try:
            tls.do_handshake()
        except (OSError, ValueError) as e:  # no certificate, plaintext, a timeout...
            reason = e.reason if isinstance(e, ssl.SSLError) else None
            if reason is not None and "CERTIFICATE" in reason:
                # A certificate refused (expired, another CA's, none): an operator's problem
                # to see -- it was logged at DEBUG only, and counted nowhere. Probes that
                # connect and leave stay quiet.
                refusal = AuthError(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "tls_handshake",
                    f"the TLS handshake failed: {reason}",
                )
                self.auth.denied(refusal, self.what, name)
            else:
                logger.debug("%s %s: TLS handshake failed: %s", self.what, name, e)
            tls.close()
            return None
        uris = list(peer_cert_uris(tls))
        try:
            identity = self.auth.identify(uris, None)
            self.auth.authorize(identity, self.role, self.what)
        except AuthError as e:
            self.auth.denied(e, self.what, ",".join(uris) or name)
            with contextlib.suppress(OSError):
                tls.close()
            return None
        return identity
