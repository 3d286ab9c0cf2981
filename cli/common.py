"""What every ``raftlet`` client command shares: finding the cluster, errors, output.

Finding the cluster: exactly one of ``--data-dir DIR`` (a local cluster's directory, as
``raftlet cluster up`` made it), ``--cluster FILE`` (any ``cluster.toml``) or ``--servers
host:port,…`` (seed RPC addresses; the config is fetched from the first that answers
``GetClusterConfig``). ``resolve_target`` turns them into a ``Target``.

Errors: a command raises ``CliError`` (exit 1: the operation failed) or ``UsageError``
(exit 2: the arguments are wrong, even if that is only known after asking the cluster, such
as an unknown column in ``--where``). ``cli.main`` prints either as one line,
``raftlet <command>: error: <message>``, and never a traceback for these.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raftlet.cluster import (
    ClusterConfig,
    ClusterConfigError,
    TableConfig,
    load_cluster_config,
    parse_host_port,
)
from raftlet.metrics.human import human_bytes

if TYPE_CHECKING:
    from rich.console import Console

    from raftlet.client import Client

__all__ = [
    "CliError",
    "Target",
    "UsageError",
    "add_target_arguments",
    "console",
    "err_console",
    "human_bytes",
    "human_count",
    "human_us",
    "resolve_target",
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

    def client(self, timeout_s: float = 30.0, **kwargs: Any) -> Client:
        """A client of this cluster (``kwargs`` go to ``Client``)."""
        from raftlet.client import Client, RaftletError

        try:
            if self.config_path is not None:
                return Client.from_config(str(self.config_path), timeout_s=timeout_s, **kwargs)
            return Client(list(self.seeds), timeout_s=timeout_s, **kwargs)
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
            return Target(load_cluster_config(path), path, ())
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
    return Target(fetch_config(seeds, timeout_s), None, tuple(seeds))


def fetch_config(seeds: Sequence[str], timeout_s: float = 5.0) -> ClusterConfig:
    """The cluster config from the first seed that answers ``GetClusterConfig``."""
    import grpc

    from raftlet.client.channels import ChannelPool

    failures = []
    channels = ChannelPool()
    try:
        for addr in seeds:
            try:
                resp = channels.stub(addr).get_cluster_config(timeout_s)
            except grpc.RpcError as e:
                failures.append(f"{addr}: {e.code().name}")
                continue
            try:
                return ClusterConfig.from_pb(resp, name=f"via {addr}")
            except ClusterConfigError as e:
                raise CliError(f"{addr} sent an invalid cluster config: {e}") from None
    finally:
        channels.close()
    raise CliError(f"no server answered ({'; '.join(failures)})")


# --- output --------------------------------------------------------------------------------


def console(**kwargs: Any) -> Console:
    """A rich console on stdout. Not a terminal (a pipe, a file, a test): no colour, no
    cursor movement, and a fixed width so tables do not wrap at 80 columns."""
    from rich.console import Console

    tty = sys.stdout.isatty()
    return Console(
        highlight=False,
        soft_wrap=False,
        width=None if tty else 160,
        no_color=not tty or "NO_COLOR" in os.environ,
        **kwargs,
    )


def err_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


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
