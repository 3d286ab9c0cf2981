"""Transport security and access control of the tablet server.

**TLS.** With ``--tls_cert``, ``--tls_key`` and ``--tls_ca`` the gRPC port serves TLS and
*requires* a client certificate signed by the CA (mutual TLS), and the status server serves
HTTPS (client certificate optional there, see below). Mutual TLS on the gRPC port is not a
choice: grpcio's Python server credentials either require a client certificate or never
ask for one (``require_client_auth=False`` is OpenSSL's "don't request"), and a server must
see its peers' certificates to know who sends it Raft messages. So a client on the gRPC port
always holds a certificate from the cluster's CA; a bearer token (``authorization: Bearer
<token>``, tokens from ``--auth_tokens_file``) then names the caller and its role instead of
the certificate. For clients with a token and no certificate a server may open a second
port, ``--token_rpc_addr``: TLS that never asks for a client certificate, so nothing that
arrives there has a certificate identity -- every call needs a token, and Raft messages
(role ``server``, which no token has) are refused. The same servicers and interceptor serve
both ports; the port a call came in on needs no check of its own. On the status server
(Python's ``ssl``, which can ask for a certificate without requiring one) a token alone is
enough, so Prometheus or curl need no certificate.

**Identity** (``cluster.identity``): the ``raftlet://server/<id>`` or
``raftlet://client/<name>?role=<role>`` URI in the verified certificate's subjectAltName,
or a token's line. A certificate without such a URI, an unknown token, or none of either is
UNAUTHENTICATED; a known caller whose role is too low is PERMISSION_DENIED. Each refusal is
counted in ``rpc_auth_denials{reason}`` and logged with the method and who (never a token).

**Roles per method** (``required_role``): ``reader`` Scan, ListTablets, GetClusterConfig,
reflection; ``writer`` + Write, WriteStream; ``admin`` + LeaderStepDown, SetFlag, GetFlags,
GetConsensusStatus, GetConsensusState, ChecksumTablet, and the membership RPCs
CreateReplica, ChangeConfig, CheckConfigChange, DeleteReplica; ``server`` (a peer's server
certificate, and nothing else) UpdateConsensus, RequestVote, TimeoutNow and the consensus
Stream. A server certificate is good for consensus only, and ListTablets and
GetClusterConfig (a server new to a cluster asks its peers which groups run without it
before it makes replicas, and a server compares its config's tables with its peers'). Health
checking stays open (it says SERVING or not, nothing else), so orchestrators can probe.

**Raft's sender is the certificate's.** ``check_sender`` refuses a consensus request whose
claimed sender (``caller_uuid`` / ``candidate_uuid``) is not the server the certificate
names; with that equal, the consensus handler's check that the sender is a voter of the
tablet makes "a member of that tablet's configuration" a property of the certificate.

**The plain-TCP ports** (the consensus port, ``--consensus_tcp_port``, and the write port,
``--write_tcp_port``) follow the same rules without gRPC (``tserver.tcp_admission``): with
TLS each requires a client certificate from the CA, and right after the handshake -- before
any frame is read -- the caller is ``identify``-d from the certificate's SAN URIs (there
are no bearer tokens there: a client with a token stays on gRPC) and ``authorize``-d for
the port's role: ``server`` on the consensus port, ``writer`` on the write port. A refusal
closes the connection and is counted like a refused RPC. Every consensus request on the
tcp port then goes through ``check_sender`` (``sender_check``), as on the gRPC stream.

With TLS off the server has no interceptor at all: every RPC is open, as on a developer's
loopback cluster (the settings refuse plaintext on any other address without
``--insecure``).
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import inspect
import logging
import re
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from raftlet.cluster import is_loopback_addr
from raftlet.cluster.identity import AccessRole, Identity, parse_identity_uri, parse_role
from raftlet.metrics.catalogue import RPC_AUTH_DENIALS
from raftlet.metrics.registry import MetricEntity
from raftlet.metrics.status_server import HttpError, PageRequest
from raftlet.proto import consensus_pb2 as cpb
from raftlet.tserver.file_modes import warn_if_world_readable

__all__ = [
    "AuthInterceptor",
    "Authenticator",
    "SenderMismatch",
    "TokenTable",
    "caller_identity",
    "check_sender",
    "check_sender_id",
    "is_loopback_addr",
    "parse_tokens",
    "required_role",
    "sender_check",
    "server_credentials",
    "server_ssl_context",
    "status_ssl_context",
    "token_port_credentials",
]

logger = logging.getLogger(__name__)

# The identity of the RPC being served on this task (set by AuthInterceptor; grpc.aio runs
# the interceptor's wrapper and the servicer coroutine in the same task). None: auth is off.
_CALLER: contextvars.ContextVar[Identity | None] = contextvars.ContextVar(
    "raftlet_caller", default=None
)

_TABLET = "/raftlet.TabletService/"
_CONSENSUS = "/raftlet.ConsensusService/"
_ADMIN = "/raftlet.AdminService/"
_COPY = "/raftlet.TabletCopyService/"
_ROLES: dict[str, AccessRole | None] = {
    _TABLET + "Scan": AccessRole.READER,
    _TABLET + "ListTablets": AccessRole.READER,
    _TABLET + "GetClusterConfig": AccessRole.READER,
    _TABLET + "Write": AccessRole.WRITER,
    _TABLET + "WriteStream": AccessRole.WRITER,
    _TABLET + "WriteEndpoint": AccessRole.WRITER,
    _ADMIN + "LeaderStepDown": AccessRole.ADMIN,
    _ADMIN + "GetConsensusStatus": AccessRole.ADMIN,
    _ADMIN + "GetFlags": AccessRole.ADMIN,
    _ADMIN + "SetFlag": AccessRole.ADMIN,
    _ADMIN + "ChecksumTablet": AccessRole.ADMIN,
    # Membership changes: they move a tablet's data between servers.
    _ADMIN + "CreateReplica": AccessRole.ADMIN,
    _ADMIN + "ChangeConfig": AccessRole.ADMIN,
    _ADMIN + "CheckConfigChange": AccessRole.ADMIN,
    _ADMIN + "DeleteReplica": AccessRole.ADMIN,
    _CONSENSUS + "UpdateConsensus": AccessRole.SERVER,
    _CONSENSUS + "RequestVote": AccessRole.SERVER,
    _CONSENSUS + "TimeoutNow": AccessRole.SERVER,
    _CONSENSUS + "Stream": AccessRole.SERVER,
    _CONSENSUS + "PeerEndpoint": AccessRole.SERVER,
    _COPY + "StartTabletCopy": AccessRole.SERVER,
    _COPY + "BeginTabletCopySession": AccessRole.SERVER,
    _COPY + "FetchTabletCopyData": AccessRole.SERVER,
    _COPY + "EndTabletCopySession": AccessRole.SERVER,
    # Read-only, but it shows every replica's vote and log position: operators only.
    _CONSENSUS + "GetConsensusState": AccessRole.ADMIN,
    "/grpc.health.v1.Health/Check": None,
    "/grpc.health.v1.Health/Watch": None,
}
_REFLECTION_PREFIX = "/grpc.reflection."


def required_role(method: str) -> AccessRole | None:
    """The role ``method`` (a full gRPC method name) needs; None: open to anyone. A method
    not listed needs ``admin``, so a service added later is closed until someone decides."""
    if method in _ROLES:
        return _ROLES[method]
    if method.startswith(_REFLECTION_PREFIX):
        return AccessRole.READER
    return AccessRole.ADMIN


# What a server may call besides consensus: a server new to a cluster asks its peers which
# tables they host before it makes replicas of its own (``TabletServer._peer_listings``),
# and compares its tables' schemas with theirs (``TabletServer._peer_configs``: refused, the
# check saw no peer under TLS, and a server started on another schema made replicas).
_SERVERS_MAY_CALL = frozenset({_TABLET + "ListTablets", _TABLET + "GetClusterConfig"})


def permits(identity: Identity, required: AccessRole, method: str = "") -> bool:
    # Servers are not on the reader < writer < admin scale: a server certificate is good
    # for consensus (and listing tablets) and nothing else, and only a server certificate is.
    if identity.is_server and method in _SERVERS_MAY_CALL:
        return True
    if required is AccessRole.SERVER or identity.is_server:
        return identity.is_server and required is AccessRole.SERVER
    return identity.role >= required


def caller_identity() -> Identity | None:
    """Who makes the RPC being served (None when auth is off)."""
    return _CALLER.get()


# --- tokens ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Token:
    secret: bytes
    identity: Identity


class TokenTable:
    """Bearer tokens → identities. ``lookup`` compares the presented token with every known
    one by ``hmac.compare_digest``, without stopping at a match, so the time taken does not
    tell which token (or how much of one) was right."""

    def __init__(self, tokens: Iterable[tuple[str, Identity]] = ()) -> None:
        self._tokens = [_Token(t.encode(), ident) for t, ident in tokens]

    def __len__(self) -> int:
        return len(self._tokens)

    def lookup(self, presented: str) -> Identity | None:
        given = presented.encode()
        found: Identity | None = None
        for token in self._tokens:
            if hmac.compare_digest(token.secret, given) and found is None:
                found = token.identity
        return found


_MIN_TOKEN_LENGTH = 16


def parse_tokens(text: str, source: str = "tokens") -> TokenTable:
    """``token role name`` per line (``#`` comments and blank lines ignored). ``ValueError``
    naming ``source:line`` and what is wrong -- never the token itself, which would then be
    in a log. Tokens must be at least 16 characters and unique; roles reader, writer or
    admin (``server`` is never a token's: only a server certificate proves it)."""
    entries: list[tuple[str, Identity]] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        where = f"{source}:{lineno}"
        if len(fields) != 3:
            raise ValueError(f"{where}: expected 'token role name', got {len(fields)} fields")
        token, role_text, name = fields
        if len(token) < _MIN_TOKEN_LENGTH:
            raise ValueError(f"{where}: token is shorter than {_MIN_TOKEN_LENGTH} characters")
        if token in seen:
            raise ValueError(f"{where}: token repeats an earlier line's")
        try:
            role = parse_role(role_text)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        seen.add(token)
        entries.append((token, Identity(name, role, via="token")))
    return TokenTable(entries)


def load_tokens_file(path: str) -> TokenTable:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise OSError(f"--auth_tokens_file {path}: cannot read ({e.strerror})") from None
    warn_if_world_readable(path, path, "tokens in it are secrets")
    return parse_tokens(text, path)


def _bearer(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    """The token of an ``authorization: Bearer <token>`` header; "" if the header is there
    but not a bearer token (which is refused, not ignored)."""
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


# --- who is calling ---------------------------------------------------------------------------


# Every rpc_auth_denials reason: each series exists from the start, at 0, so an alert on
# its rate has a series to watch before the first refusal (review r32a).
DENIAL_REASONS = (
    "invalid_token",
    "no_credentials",
    "no_identity",
    "role_too_low",
    "sender_mismatch",
    "tls_handshake",
)


class AuthError(Exception):
    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        if reason not in DENIAL_REASONS:
            raise ValueError(f"{reason!r} is not one of DENIAL_REASONS")
        super().__init__(message)
        self.code = code
        self.reason = reason  # the rpc_auth_denials label
        self.message = message

    @classmethod
    def sender_mismatch(cls, message: str) -> AuthError:
        return cls(grpc.StatusCode.PERMISSION_DENIED, "sender_mismatch", message)


# ":43322" of "ipv4:127.0.0.1:43322", "127.0.0.1:4242", "[::1]:4242", and a tcp
# connection's number ("#67").
_PORTS = re.compile(r":\d+(?=$|[,#\s])|#\d+")


class Authenticator:
    """Resolves and authorizes callers; counts and logs refusals. Thread-safe."""

    def __init__(self, tokens: TokenTable | None, metrics: MetricEntity | None = None) -> None:
        self.tokens = tokens or TokenTable()
        # Every reason's series from the start, and no look-up per refusal (a flood is many).
        self._denials = (
            {reason: metrics.counter(RPC_AUTH_DENIALS, reason=reason) for reason in DENIAL_REASONS}
            if metrics is not None
            else {}
        )
        self._lock = threading.Lock()
        # Log a refusal at most once a second per (reason, who): a misconfigured client
        # retrying in a loop must not flood the log.
        self._last_logged: dict[tuple[str, str], float] = {}

    def identify(self, cert_uris: Sequence[str], bearer: str | None) -> Identity:
        """The caller from its verified certificate's SAN URIs and its bearer token (None:
        no header). A token, when sent, decides: a wrong one is refused, not ignored."""
        if bearer is not None:
            identity = self.tokens.lookup(bearer) if bearer else None
            if identity is None:
                raise AuthError(
                    grpc.StatusCode.UNAUTHENTICATED, "invalid_token", "invalid bearer token"
                )
            return identity
        found = [i for i in (parse_identity_uri(u) for u in cert_uris) if i is not None]
        if len(found) == 1:
            return found[0]
        if not cert_uris:
            raise AuthError(
                grpc.StatusCode.UNAUTHENTICATED,
                "no_credentials",
                "no client certificate or bearer token (a token port never asks for a "
                "certificate: send a token there, or a certificate to the server's rpc_addr)",
            )
        raise AuthError(
            grpc.StatusCode.UNAUTHENTICATED,
            "no_identity",
            "the client certificate names no raftlet identity (raftlet certs create makes them)",
        )

    def authorize(self, identity: Identity, required: AccessRole, what: str) -> None:
        if not permits(identity, required, what):
            raise AuthError(
                grpc.StatusCode.PERMISSION_DENIED,
                "role_too_low",
                f"{what} needs {_role_words(required)}; {identity} may not",
            )

    def denied(self, error: AuthError, what: str, who: str) -> None:
        """Count and (rate-limited) log a refusal. ``who`` must hold no secret."""
        counter = self._denials.get(error.reason)
        if counter is not None:
            counter.increment()
        now = time.monotonic()
        # Keyed by where the caller is, not its port: a client reconnecting in a loop makes a
        # new port each time, and a line each (review of r32a's fixes).
        key = (error.reason, _PORTS.sub("", who))
        with self._lock:
            if now - self._last_logged.get(key, -1e9) < 1.0:
                return
            self._last_logged[key] = now
            if len(self._last_logged) > 1024:
                self._last_logged.clear()
        logger.warning("refused %s from %s: %s", what, who, error.message)

    # --- the status server --------------------------------------------------------------

    def check_page(self, request: PageRequest) -> None:
        """The status server's guard: ``/healthz`` and ``/readyz`` are open (probes carry no
        credentials); ``/stacks`` needs admin; every other page reader. Raises ``HttpError``
        401 or 403."""
        if request.path in ("/healthz", "/readyz"):
            return
        required = AccessRole.ADMIN if request.path == "/stacks" else AccessRole.READER
        header = {k.lower(): v for k, v in request.headers.items()}.get("authorization")
        bearer = _bearer([("authorization", header)]) if header is not None else None
        what = f"GET {request.path}"
        try:
            identity = self.identify(request.peer_uris, bearer)
            self.authorize(identity, required, what)
        except AuthError as e:
            self.denied(e, what, _who_http(request, bearer))
            status = 401 if e.code == grpc.StatusCode.UNAUTHENTICATED else 403
            raise HttpError(status, e.message) from None


def _role_words(role: AccessRole) -> str:
    return "a server certificate" if role is AccessRole.SERVER else f"role {role.label}"


def _who_http(request: PageRequest, bearer: str | None) -> str:
    """Who asked, for a refusal's log line: its certificate's URIs, or that it sent a token
    (never the token), and its address."""
    who = ",".join(request.peer_uris) or ("a token caller" if bearer else "an anonymous client")
    return f"{who} at {request.peer}" if request.peer else who


def _cert_uris(context: grpc.aio.ServicerContext) -> list[str]:
    # grpc puts every SAN of the verified peer certificate (DNS names too) under
    # x509_subject_alternative_name; only the raftlet URIs matter, parsed by the caller.
    values = context.auth_context().get("x509_subject_alternative_name", [])
    return [v.decode(errors="replace") for v in values]


# Calls of the open methods (health checking) whose request is being read at once, and the
# largest such request decoded: one is read whole, up to --max_message_bytes (16 MiB), from
# anyone who can reach a port, for a request of a few bytes -- and one that the handler
# refused stayed in memory until the cyclic collector next ran (3.5 GB after 256 of them).
_OPEN_READS = 4
_OPEN_REQUEST_BYTES = 64 * 1024
# How long one of those reads may take: a caller that sent the call's headers and never its
# body held a place for good, and four such calls from anyone refused every health check.
_OPEN_READ_TIMEOUT_S = 2.0


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # untyped grpc
    """Authenticates and authorizes every RPC before its servicer runs, and publishes the
    caller for it (``caller_identity``). Refusals abort with UNAUTHENTICATED or
    PERMISSION_DENIED.

    Before the request is read, too: gRPC takes a unary request in whole (up to the
    message limit, 16 MiB) before the handler runs, and anyone who reaches the token port
    had 128 calls of 16 MiB refused only after the server held 2.7 GB for them (review
    r32a). So a unary-request handler is served as a request-streaming one, which reads
    its one message only once the caller is admitted; a refused call's body is never taken
    in beyond the transport's flow-control window. The open methods have no caller to
    admit: at most ``_OPEN_READS`` of their requests are read at once, the rest refused
    RESOURCE_EXHAUSTED, and one over ``_OPEN_REQUEST_BYTES`` is refused undecoded."""

    def __init__(self, auth: Authenticator) -> None:
        self._auth = auth
        self._open_reads = asyncio.Semaphore(_OPEN_READS)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        required = required_role(method)
        if required is None:
            return handler if handler.request_streaming else self._open(handler, method)
        auth = self._auth

        async def admit(context: grpc.aio.ServicerContext) -> None:
            uris = _cert_uris(context)
            try:
                identity = auth.identify(uris, _bearer(context.invocation_metadata()))
                auth.authorize(identity, required, method)
            except AuthError as e:
                auth.denied(e, method, ",".join(uris) or context.peer())
                await context.abort(e.code, e.message)
            else:
                _CALLER.set(identity)

        if not handler.request_streaming:
            return _read_after(admit, handler, method)

        async def admitted(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await admit(context)
            return request

        # grpc.experimental.wrap_server_method_handler, without the experimental import.
        if handler.response_streaming:
            return handler._replace(stream_stream=_after(admitted, handler.stream_stream))
        return handler._replace(stream_unary=_after(admitted, handler.stream_unary))

    def _open(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        reads = self._open_reads
        decode = handler.request_deserializer

        def bounded_decode(data: bytes) -> Any:
            # Refused undecoded: its bytes are let go at once.
            if len(data) > _OPEN_REQUEST_BYTES:
                return _TOO_LARGE
            return decode(data) if decode is not None else data

        async def admit(context: grpc.aio.ServicerContext) -> None:
            if reads.locked():
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{method}: {_OPEN_READS} such calls are being read; retry",
                )
            await reads.acquire()

        return _read_after(
            admit,
            handler._replace(request_deserializer=bounded_decode),
            method,
            done=reads.release,
            read_timeout_s=_OPEN_READ_TIMEOUT_S,
        )


Behaviour = Callable[..., Any]


def _after(
    prelude: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]], behaviour: Behaviour
) -> Behaviour:
    """``behaviour`` run with what ``await prelude(request, context)`` returns (which may
    abort the call): an async generator stays one, and a coroutine -- or a function --
    becomes a coroutine (a streaming answer written with context.write, as the health
    service's Watch does, is one)."""
    if inspect.isasyncgenfunction(behaviour):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async for item in behaviour(await prelude(request, context), context):
                yield item

        return stream

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        result = behaviour(await prelude(request, context), context)
        return await result if inspect.isawaitable(result) else result

    return call


def _read_after(
    admit: Callable[[grpc.aio.ServicerContext], Awaitable[None]],
    handler: grpc.RpcMethodHandler,
    method: str,
    done: Callable[[], None] | None = None,
    read_timeout_s: float | None = None,
) -> grpc.RpcMethodHandler:
    """``handler`` (unary request) as a request-streaming handler that awaits ``admit``,
    then reads the one request message and runs the unary behaviour with it. ``done``, when
    given, runs once the message is read (or the read failed) after ``admit`` succeeded; a
    read not done within ``read_timeout_s`` (when given) is DEADLINE_EXCEEDED."""

    async def one_request(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        await admit(context)
        try:
            reading = anext(requests, _NO_REQUEST)
            if read_timeout_s is None:  # an admitted caller's: no task of its own
                request = await reading
            else:
                request = await asyncio.wait_for(reading, read_timeout_s)
        except TimeoutError:
            request = _TIMED_OUT
        finally:
            if done is not None:
                done()
        if request is _TIMED_OUT:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{method}: the request did not arrive within {read_timeout_s:g} s",
            )
        if request is _TOO_LARGE:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{method}: a request of more than {_OPEN_REQUEST_BYTES} bytes",
            )
        if request is _NO_REQUEST:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: no request")
        return request

    if not handler.response_streaming:
        call = _after(one_request, handler.unary_unary)
        return handler._replace(request_streaming=True, unary_unary=None, stream_unary=call)
    stream = _after(one_request, handler.unary_stream)
    return handler._replace(request_streaming=True, unary_stream=None, stream_stream=stream)


_NO_REQUEST = object()
_TIMED_OUT = object()
_TOO_LARGE = object()  # an open method's request over _OPEN_REQUEST_BYTES


# --- consensus senders ------------------------------------------------------------------------


class SenderMismatch(ValueError):
    """A consensus request claims a sender other than its certificate's server."""


def claimed_sender(request: object) -> str:
    if isinstance(request, cpb.RequestVoteRequest):
        return request.candidate_uuid
    if isinstance(request, cpb.UpdateConsensusRequest | cpb.TimeoutNowRequest):
        return request.caller_uuid
    return ""


def check_sender(request: object, peer: Identity | None) -> None:
    """Refuse (``SenderMismatch``) a consensus request whose claimed sender is not the
    server its TLS certificate names. ``peer`` None: auth is off, nothing to check."""
    if peer is None:
        return
    check_sender_id(claimed_sender(request), peer, type(request).__name__)


def sender_check(
    auth: Authenticator | None, peer: Identity | None, what: str
) -> Callable[[object], None] | None:
    """With auth on, what refuses (``SenderMismatch``, counted and logged as ``what``) the
    consensus requests of a caller ``peer`` that claim another sender; None with auth off.
    The gRPC consensus calls and the tcp consensus port use the same."""
    if auth is None:
        return None

    def check(request: object) -> None:
        try:
            check_sender(request, peer)
        except SenderMismatch as e:
            auth.denied(AuthError.sender_mismatch(str(e)), what, str(peer))
            raise

    return check


def check_sender_id(claimed: str, peer: Identity | None, what: str = "the request") -> None:
    """Refuse (``SenderMismatch``) a request that claims to come from server ``claimed``
    unless ``peer`` -- the caller's verified identity -- is that server."""
    if peer is None:
        raise SenderMismatch(f"{what} claims to come from {claimed!r}, but the caller is unknown")
    if not peer.is_server or claimed != peer.name:
        raise SenderMismatch(
            f"{what} claims to come from {claimed!r}, but the caller's certificate is {peer}"
        )


# --- credentials ------------------------------------------------------------------------------


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise OSError(f"--{what} {path}: {e.strerror}") from None


def server_credentials(cert: str, key: str, ca: str) -> grpc.ServerCredentials:
    """TLS for the gRPC port: our certificate, and client certificates required and
    verified against ``ca`` (see the module docstring for why required)."""
    return grpc.ssl_server_credentials(
        [(_read(key, "tls_key"), _read(cert, "tls_cert"))],
        root_certificates=_read(ca, "tls_ca"),
        require_client_auth=True,
    )


def token_port_credentials(cert: str, key: str) -> grpc.ServerCredentials:
    """TLS for the token port: our certificate, no client certificate asked for -- so no
    caller there is a server, and every call needs a bearer token."""
    return grpc.ssl_server_credentials(
        [(_read(key, "tls_key"), _read(cert, "tls_cert"))], require_client_auth=False
    )


def status_ssl_context(cert: str, key: str, ca: str) -> ssl.SSLContext:
    """HTTPS for the status server: a client certificate is asked for and verified if sent
    (CERT_OPTIONAL), so a bearer token alone also works."""
    return server_ssl_context(cert, key, ca, ssl.CERT_OPTIONAL, "status server")


def server_ssl_context(
    cert: str, key: str, ca: str, verify_mode: ssl.VerifyMode, what: str
) -> ssl.SSLContext:
    """Python ``ssl`` for a server port: our certificate, TLS >= 1.2, callers' certificates
    verified against ``ca`` (asked for, or required, by ``verify_mode``)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
        context.load_verify_locations(ca)
    except (OSError, ssl.SSLError) as e:
        raise OSError(f"{what} TLS ({cert}, {key}, {ca}): {e}") from None
    context.verify_mode = verify_mode
    return context
