"""What every ``raftlet`` client command shares: finding the cluster, errors, output.

Finding the cluster: exactly one of ``--data-dir DIR`` (a local cluster's directory, as
``raftlet cluster up`` made it), ``--cluster FILE`` (any ``cluster.toml``) or ``--servers
host:port,…`` (seed RPC addresses; the config is fetched from the first that answers
``GetClusterConfig``). ``resolve_target`` turns them into a ``Target``.

Credentials, for a TLS cluster: ``--tls-ca``, ``--tls-cert``, ``--tls-key`` and ``--token``
(or ``$RAFTLET_TLS_CA``, ``$RAFTLET_TLS_CERT``, ``$RAFTLET_TLS_KEY``, ``$RAFTLET_TOKEN``); with
``--data-dir`` of a cluster started by ``raftlet cluster up --tls`` and none of those, the
directory's own CA and admin certificate (``<data dir>/tls/``, ``deploy.local``).
``Credentials`` carries them to the client, the cluster check and the status-page fetches.

Errors: a command raises ``CliError`` (exit 1: the operation failed) or ``UsageError``
(exit 2: the arguments are wrong, even if that is only known after asking the cluster, such
as an unknown column in ``--where``). ``cli.main`` prints either as one line,
``raftlet <command>: error: <message>``, and never a traceback for these.
"""

from __future__ import annotations

import argparse
import functools
import os
import ssl
import sys
import threading
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from raftlet.cluster import (
    ClusterConfig,
    ClusterConfigError,
    TableConfig,
    load_cluster_config,
    parse_host_port,
)
from raftlet.metrics.human import cut, human_bytes

if TYPE_CHECKING:
    from rich.console import Console

    from raftlet.client import Client
    from raftlet.client.tls import TlsOptions

__all__ = [
    "CliError",
    "Target",
    "UsageError",
    "add_target_arguments",
    "console",
    "cut",
    "err_console",
    "human_bytes",
    "human_count",
    "human_us",
    "output_gone",
    "print_out",
    "resolve_target",
    "stdout_gone",
]

CONFIG_FILE = "cluster.toml"


class CliError(Exception):
    """The operation failed: exit status 1, ``str()`` printed as one line."""

    exit_code = 1


class UsageError(CliError):
    """The arguments are wrong: exit status 2."""

    exit_code = 2


# --- finding the cluster -----------------------------------------------------------------


# Where a client command finds its cluster when no flag names one (as etcdctl reads its
# endpoints from the environment): a config file, or seed addresses.
ENV_CLUSTER = "RAFTLET_CLUSTER"
ENV_SERVERS = "RAFTLET_SERVERS"
ENV_TLS_CA = "RAFTLET_TLS_CA"
ENV_TLS_CERT = "RAFTLET_TLS_CERT"
ENV_TLS_KEY = "RAFTLET_TLS_KEY"
ENV_TOKEN = "RAFTLET_TOKEN"


@dataclass(frozen=True, slots=True)
class Credentials:
    """How a command proves itself to the cluster; all None: plaintext, no token."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    token: str | None = None

    @property
    def tls(self) -> TlsOptions | None:
        from raftlet.client.tls import TlsOptions

        return TlsOptions(self.ca, self.cert, self.key) if self.ca else None

    def client_kwargs(self) -> dict[str, Any]:
        """``tls=`` and ``token=`` for ``Client`` / ``AsyncClient``."""
        return {"tls": self.tls, "token": self.token}

    def channel_credentials(self) -> Any:
        from raftlet.client.tls import channel_credentials

        return channel_credentials(self.tls, self.token)

    def status_url(self, http_addr: str, path: str) -> str:
        return f"{'https' if self.ca else 'http'}://{http_addr}{path}"

    def http_opener(self) -> urllib.request.OpenerDirector:
        """An opener for the status pages: no proxy (the status servers are on this
        machine or the cluster's network, and an http_proxy in the environment would send
        these requests somewhere else); with TLS, the CA, the client certificate and the
        token."""
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if self.ca:
            context = ssl.create_default_context(cafile=self.ca)
            if self.cert and self.key:
                context.load_cert_chain(self.cert, self.key)
            handlers.append(urllib.request.HTTPSHandler(context=context))
        opener = urllib.request.build_opener(*handlers)
        if self.token:
            opener.addheaders = [("Authorization", f"Bearer {self.token}")]
        return opener


def credentials_from_args(args: argparse.Namespace, data_dir: Path | None) -> Credentials:
    """Flags, else the environment, else a ``cluster up --tls`` directory's own files."""

    given: dict[str, str] = {}  # attribute -> where it came from, for the errors

    def pick(flag: str, env: str) -> str | None:
        value = getattr(args, flag, None)
        source = "--" + flag.replace("_", "-")
        if not value:
            value, source = os.environ.get(env) or None, f"${env}"
        if not value:
            return None
        given[flag] = source
        if flag == "token":
            return value
        path = Path(value).expanduser()
        # Said here, by the name the user gave it: later it surfaced as "no server has a
        # token_rpc_addr" or a bare "[Errno 2] No such file or directory". (A pipe, as
        # from `<(…)`, is a file to read.)
        if not path.exists():
            raise UsageError(f"{source} {value}: no such file")
        if path.is_dir():
            raise UsageError(f"{source} {value}: is a directory, not a PEM file")
        return str(path)

    creds = Credentials(
        pick("tls_ca", ENV_TLS_CA),
        pick("tls_cert", ENV_TLS_CERT),
        pick("tls_key", ENV_TLS_KEY),
        pick("token", ENV_TOKEN),
    )
    if (creds.cert is None) != (creds.key is None):
        only = given.get("tls_cert") or given["tls_key"]
        raise UsageError(f"give --tls-cert and --tls-key together (got only {only})")
    if creds.ca is None and data_dir is not None:
        from raftlet.deploy.local import local_tls_files

        files = local_tls_files(data_dir)
        if files is not None:
            ca, cert, key = files
            if creds.cert is None and creds.token is None:
                return Credentials(str(ca), str(cert), str(key), None)
            # Who you are is yours to say; the directory only vouches for the cluster.
            creds = Credentials(str(ca), creds.cert, creds.key, creds.token)
    if (creds.cert or creds.token) and not creds.ca:
        who = given.get("tls_cert") or given["token"]
        raise UsageError(f"{who} needs --tls-ca or ${ENV_TLS_CA} (the cluster's CA)")
    return creds


def add_target_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--data-dir`` / ``--cluster`` / ``--servers``, mutually exclusive; none is needed
    when ``RAFTLET_CLUSTER`` or ``RAFTLET_SERVERS`` is set."""
    group = parser.add_argument_group(
        "which cluster (exactly one)",
        "A local cluster's directory, a cluster config file, or seed server addresses. "
        f"Without one, ${ENV_CLUSTER} (a config file) or ${ENV_SERVERS} (host:port,…) "
        "names the cluster.",
    )
    from_env = bool(os.environ.get(ENV_CLUSTER) or os.environ.get(ENV_SERVERS))
    ex = group.add_mutually_exclusive_group(required=required and not from_env)
    ex.add_argument(
        "--data-dir",
        metavar="DIR",
        help="the directory of a cluster started by `raftlet cluster up` (holds cluster.toml)",
    )
    ex.add_argument("--cluster", metavar="FILE", help="a cluster config file (cluster.toml)")
    ex.add_argument(
        "--servers",
        metavar="HOST:PORT,…",
        type=_seed_list,
        help="RPC addresses of one or more servers; the config is fetched from them",
    )
    tls = parser.add_argument_group(
        "credentials (a TLS cluster)",
        "A TLS cluster needs the CA and a client certificate (raftlet certs create "
        "--client NAME:ROLE); a bearer token, if given, names you instead. Defaults: "
        f"${ENV_TLS_CA}, ${ENV_TLS_CERT}, ${ENV_TLS_KEY}, ${ENV_TOKEN}; with --data-dir of "
        "a cluster made by `cluster up --tls`, its own CA, and its admin certificate "
        "unless you give a certificate or token of your own.",
    )
    tls.add_argument("--tls-ca", metavar="FILE", help="the cluster's CA certificate (PEM)")
    tls.add_argument("--tls-cert", metavar="FILE", help="your client certificate (PEM)")
    tls.add_argument("--tls-key", metavar="FILE", help="the key of --tls-cert (PEM)")
    tls.add_argument(
        "--token", metavar="TOKEN", help=f"a bearer token (prefer ${ENV_TOKEN}: argv is public)"
    )


def _seed_list(text: str) -> list[str]:
    seeds = [s.strip() for s in text.split(",") if s.strip()]
    if not seeds:
        raise argparse.ArgumentTypeError("give at least one host:port")
    for s in seeds:
        try:
            parse_host_port(s)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return seeds


@dataclass(frozen=True, slots=True)
class Target:
    """A resolved cluster: its config, and how it was named."""

    config: ClusterConfig
    config_path: Path | None  # None when fetched from --servers
    seeds: tuple[str, ...]  # --servers as given, else ()
    creds: Credentials = field(default_factory=Credentials)

    @property
    def data_dir(self) -> Path | None:
        """The directory a local cluster's state would be in (the config's directory)."""
        return self.config_path.parent if self.config_path is not None else None

    def table(self, name: str, option: str = "") -> TableConfig:
        """The table called ``name``, or a ``UsageError`` (prefixed ``option``) naming the
        tables there are."""
        try:
            return self.config.table(name)
        except LookupError:
            names = ", ".join(t.name for t in self.config.tables) or "none"
            raise UsageError(f"{option}no table {name!r} (tables: {names})") from None

    def check_tablet(self, tablet_id: str) -> None:
        """A ``UsageError`` naming the tablets there are, unless ``tablet_id`` is one."""
        try:
            self.config.placement(tablet_id)
        except LookupError:
            known = ", ".join(p.tablet_id for p in self.config.placements())
            raise UsageError(f"no tablet {tablet_id!r} (tablets: {known})") from None

    def check_server(self, server_id: str, option: str = "") -> None:
        """A ``UsageError`` (prefixed ``option``) naming the servers there are, unless
        ``server_id`` is one of the config's."""
        if server_id not in self.config.server_ids:
            known = ", ".join(self.config.server_ids)
            raise UsageError(f"{option}no server {server_id!r} (servers: {known})")

    def client_seeds(self) -> list[str]:
        """Where a client starts: ``--servers`` as given, else the config's servers (from
        the config read already: ``--cluster <(…)`` is a pipe, read once)."""
        from raftlet.client.client import seeds_of_config
        from raftlet.client.tls import uses_token_ports

        if self.config_path is None:
            return list(self.seeds)
        token_ports = uses_token_ports(self.creds.client_kwargs()["tls"])
        return seeds_of_config(self.config, token_ports=token_ports, where=str(self.config_path))

    def client(self, timeout_s: float = 30.0, **kwargs: Any) -> Client:
        """A client of this cluster (``kwargs`` go to ``Client``)."""
        from raftlet.client import Client, RaftletError

        kwargs = {**self.creds.client_kwargs(), **kwargs}
        try:
            return Client(self.client_seeds(), timeout_s=timeout_s, **kwargs)
        except RaftletError as e:
            raise CliError(f"cannot connect to the cluster: {e}") from None


def config_file_of(args: argparse.Namespace) -> Path | None:
    """The config file ``--data-dir``/``--cluster`` names (not read), or None.  With no
    target flag at all, ``$RAFTLET_CLUSTER`` (unless ``$RAFTLET_SERVERS`` is what is set)."""
    if getattr(args, "data_dir", None):
        return Path(os.path.abspath(Path(args.data_dir).expanduser())) / CONFIG_FILE
    if getattr(args, "cluster", None):
        return Path(os.path.abspath(Path(args.cluster).expanduser()))
    env = os.environ.get(ENV_CLUSTER)
    if env and not getattr(args, "servers", None):
        return Path(os.path.abspath(Path(env).expanduser()))
    return None


def resolve_target(args: argparse.Namespace, timeout_s: float = 5.0) -> Target:
    """Read or fetch the config of the cluster the arguments name (``CliError`` if none)."""
    path = config_file_of(args)
    creds = credentials_from_args(args, path.parent if path is not None else None)
    if path is not None:
        if not path.exists():
            where = (
                f"no cluster in {path.parent} ({CONFIG_FILE} not found; start one with "
                f"`raftlet cluster up --data-dir {path.parent}`)"
                if getattr(args, "data_dir", None)
                else f"cluster config {path} not found"
            )
            raise CliError(where)
        try:
            return Target(load_cluster_config(path), path, (), creds)
        except ClusterConfigError as e:
            raise CliError(str(e)) from None
    seeds = getattr(args, "servers", None)
    if not seeds and os.environ.get(ENV_SERVERS):
        try:
            seeds = _seed_list(os.environ[ENV_SERVERS])
        except argparse.ArgumentTypeError as e:
            raise UsageError(f"${ENV_SERVERS}: {e}") from None
    if not seeds:
        raise UsageError(
            "name the cluster with --data-dir DIR, --cluster FILE or --servers "
            f"(or set ${ENV_CLUSTER} or ${ENV_SERVERS})"
        )
    return Target(fetch_config(seeds, timeout_s, creds), None, tuple(seeds), creds)


def fetch_config(
    seeds: Sequence[str], timeout_s: float = 5.0, creds: Credentials | None = None
) -> ClusterConfig:
    """The cluster config from the first seed that answers ``GetClusterConfig``."""
    import grpc

    from raftlet.client.channels import ChannelPool
    from raftlet.client.retry import CREDENTIALS_REFUSED

    failures = []
    channels = ChannelPool(credentials=(creds or Credentials()).channel_credentials())
    try:
        for addr in seeds:
            try:
                resp = channels.stub(addr).get_cluster_config(timeout_s)
            except grpc.RpcError as e:
                # The details say why (an unknown role, a bad token, a refused handshake):
                # the code alone left the operator guessing.
                details = (e.details() or "").strip()
                failures.append(f"{addr}: {e.code().name}" + (f": {details}" if details else ""))
                if e.code() in CREDENTIALS_REFUSED:
                    break  # every server takes the same credentials
                continue
            try:
                return ClusterConfig.from_pb(resp, name=f"via {addr}")
            except ClusterConfigError as e:
                raise CliError(f"{addr} sent an invalid cluster config: {e}") from None
    finally:
        channels.close()
    raise CliError(
        f"no server gave the cluster config ({'; '.join(failures)})" + _closed_hint(failures, creds)
    )


def _closed_hint(failures: Sequence[str], creds: Credentials | None) -> str:
    """What to try when a server closed the connection at once: gRPC says only "Socket
    closed" for a plaintext client on a TLS port, and for a client without the certificate
    mutual TLS asks for."""
    if not any("Socket closed" in f for f in failures):
        return ""
    creds = creds or Credentials()
    if creds.tls is None:
        return "; a TLS cluster? give --tls-ca (and a client certificate or a token)"
    if creds.cert is None:
        return (
            "; the RPC ports ask for a client certificate (mutual TLS): give --tls-cert and "
            "--tls-key, or with a token dial the servers' token ports (token_rpc_addr)"
        )
    return ""


# --- output --------------------------------------------------------------------------------


@functools.cache
def _console_class(stop_when_unread: bool = False) -> type[Console]:
    from rich.console import Console  # imported when first printing: a faster start

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            # rich exits 1 when the reader goes away; that is no failure of ours. Quiet from
            # here on, and only a command that merely prints what it reads stops (main()
            # answers 0 for it): `cluster up | head -1` once stopped the servers it had
            # started, and `cluster status | head -1` answered 0 for an ERROR verdict.
            self.quiet = True
            output_gone(self.file)
            if stop_when_unread:
                raise BrokenPipeError

    return PipeConsole


def output_gone(stream: IO[str] | None = None) -> None:
    """The reader of ``stream`` (default stdout) went away: what is written to it from here
    on goes nowhere (its descriptor now /dev/null), since a later write or flush -- even the
    interpreter's at exit, which would make the exit status 120 -- would raise again."""
    stream = sys.stdout if stream is None else stream
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return  # no descriptor (a test's capture): the callers drop what they print instead
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def stdout_gone() -> None:
    """The reader of stdout went away (``output_gone``)."""
    output_gone(sys.stdout)


def print_out(text: str = "", *, file: IO[str] | None = None) -> None:
    """``print(text)`` to stdout (or ``file``) for a command that must finish whether or not
    its output is read: once the reader has gone, the text goes nowhere and the command
    carries on to its real exit status (a BrokenPipeError here once ended `cluster status
    --format json | head -1` with 0 whatever the verdict). Flushed at once, so a reader gone
    is noticed here rather than at exit."""
    stream = sys.stdout if file is None else file
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:
        output_gone(stream)


def console(*, stop_when_unread: bool = False, **kwargs: Any) -> Console:
    """A rich console on stdout. Not a terminal (a pipe, a file, a test): no colour, no
    cursor movement, and a fixed width so tables do not wrap at 80 columns.

    When the reader of stdout goes away (`| head -1`), the console goes quiet and the
    command carries on: one that changes something must not stop halfway, and a check must
    still answer its verdict's exit status. ``stop_when_unread`` is for a command whose whole
    job is to print what it reads (scan, metrics): it raises BrokenPipeError then, and
    ``cli.main`` ends the command with exit 0, the Unix `| head` convention."""
    tty = sys.stdout.isatty()
    return _console_class(stop_when_unread)(
        highlight=False,
        soft_wrap=False,
        width=None if tty else 160,
        no_color=not tty or "NO_COLOR" in os.environ,
        **kwargs,
    )


def err_console() -> Console:
    """A rich console on stderr; quiet once its reader has gone (``console``)."""
    return _console_class()(stderr=True, highlight=False)


def human_us(us: float | None) -> str:
    """A duration given in microseconds: ``850 µs``, ``12.3 ms``, ``4.56 s``."""
    if us is None:
        return "-"
    if us < 1000:
        return f"{us:.0f} µs"
    if us < 1_000_000:
        return f"{us / 1000:.1f} ms" if us < 100_000 else f"{us / 1000:.0f} ms"
    return f"{us / 1_000_000:.2f} s"


def human_count(n: float) -> str:
    """``950``, ``12.3k``, ``4.56M``: counts readable at a glance."""
    n = float(n)
    if abs(n) < 10_000:
        return f"{n:,.0f}" if n == int(n) or abs(n) >= 100 else f"{n:,.1f}"
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}" if abs(n) < 1000 * size else f"{n / size:,.0f}{unit}"
    return f"{n:,.0f}"


# --- argument types shared by the subcommands ----------------------------------------------


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        return kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None


def positive_int(text: str) -> int:
    n = int(_number(text, int))
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def non_negative_int(text: str) -> int:
    n = int(_number(text, int))
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {n}")
    return n


def positive_float(text: str) -> float:
    x = _number(text, float)
    if not 0 < x < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return x


def timeout_seconds(text: str) -> float:
    """A ``--timeout``-style flag: seconds, positive and at most a week (what the client
    library takes)."""
    from raftlet.client.arguments import MAX_TIMEOUT_S

    x = positive_float(text)
    if x > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_TIMEOUT_S:g} s (a week), got {text}"
        )
    return x


# How long an interrupted command waits for its client to close before it exits anyway.
_CLOSE_AFTER_INTERRUPT_S = 1.0


def close_client(client: Any) -> None:
    """Close ``client`` (call it from a ``finally``). While a Ctrl-C or SIGTERM unwinds, wait
    at most ``_CLOSE_AFTER_INTERRUPT_S``: gRPC's channel close can wait for good on a call the
    interrupt cut short, and `replace-server` then hung after "interrupted" until SIGKILL."""
    if not isinstance(sys.exc_info()[1], KeyboardInterrupt):
        client.close()
        return
    closer = threading.Thread(target=client.close, name="close-after-interrupt", daemon=True)
    closer.start()
    closer.join(_CLOSE_AFTER_INTERRUPT_S)
