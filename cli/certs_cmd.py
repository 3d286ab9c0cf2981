"""``raftlet certs create``: a cluster's CA and its servers' and clients' certificates.

The certificates themselves (SANs, key usages, file names and modes) are
``deploy.certs``'s; this is its command line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from raftlet.cli.common import CliError, UsageError, console

__all__ = ["add_parser", "run"]

_EPILOG = """\
examples:
  raftlet certs create --dir ./certs --servers ts1,ts2,ts3 --client ops:admin --client app:writer
  raftlet certs create --dir ./certs --servers ts1,ts2,ts3 --hosts '{server}.raftlet.svc,127.0.0.1'
  raftlet certs create --dir ./certs --client dashboards:reader   # later: reuses ./certs/ca.crt

Files in DIR: ca.crt/ca.key (made once, reused), server-<id>.crt/.key, client-<name>.crt/.key;
keys are mode 0600. Start each server with --tls_cert DIR/server-<id>.crt --tls_key
DIR/server-<id>.key --tls_ca DIR/ca.crt; give clients --tls-ca DIR/ca.crt --tls-cert
DIR/client-<name>.crt --tls-key DIR/client-<name>.key. Keep ca.key off the servers.
Roles: reader (scan, cluster config), writer (+ write), admin (+ leader step-down, flags,
consensus status, checksums, replica moves: tablet add/remove/move-replica and cluster
replace-server, /stacks).
"""


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _server_ids(text: str) -> list[str]:
    from raftlet.cluster.identity import check_name

    ids = _csv(text)
    try:
        for sid in ids:
            check_name(sid, "server id")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"server ids repeat: {', '.join(ids)}")
    return ids


# About a century: longer overflows the certificate's dates, and no CA lives that long.
_MAX_DAYS = 36_500


def _days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of days, got {text!r}") from None
    if not 1 <= days <= _MAX_DAYS:
        raise argparse.ArgumentTypeError(f"must be 1 to {_MAX_DAYS}, got {days}")
    return days


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    certs = commands.add_parser(
        "certs",
        help="make a CA and TLS certificates for servers and clients",
        description="Make the TLS certificates of a raftlet cluster.",
        formatter_class=formatter,
        epilog=_EPILOG.split("\n\n", 1)[0] + "\n\nRun `raftlet certs create --help` for more.",
    )
    sub = certs.add_subparsers(dest="certs_command", metavar="ACTION", required=True)
    create = sub.add_parser(
        "create",
        help="create (or reuse) a CA and sign server and client certificates",
        description=(
            "Create a CA in --dir (or reuse the one there) and sign a certificate for each "
            "server (its id and --hosts in the subjectAltName, usable as server and as "
            "client, for mutual TLS between servers) and each client (its name and role)."
        ),
        epilog=_EPILOG,
        formatter_class=formatter,
        allow_abbrev=False,
    )
    create.add_argument("--dir", required=True, metavar="DIR", help="where the files go")
    create.add_argument(
        "--servers",
        type=_server_ids,
        default=[],
        metavar="ID,…",
        help="server ids, as in cluster.toml (e.g. ts1,ts2,ts3)",
    )
    create.add_argument(
        "--hosts",
        type=_csv,
        default=["127.0.0.1", "localhost"],
        metavar="HOST,…",
        help="names and IPs clients and peers dial the servers by; {server} is replaced by "
        "each server's id (default 127.0.0.1,localhost)",
    )
    create.add_argument(
        "--client",
        action="append",
        default=[],
        metavar="NAME:ROLE",
        help="a client certificate; ROLE is reader, writer or admin (repeatable)",
    )
    create.add_argument(
        "--days",
        type=_days,
        default=365,
        metavar="N",
        help="validity in days (default 365); a CA made now lasts five times that, and no "
        "certificate may outlive the CA that signs it",
    )
    create.add_argument(
        "--overwrite", action="store_true", help="replace existing certificates of those names"
    )


def run(args: argparse.Namespace) -> int:
    from raftlet.deploy.certs import CertError, create_certs, parse_client_spec

    try:
        clients = [parse_client_spec(c) for c in args.client]
    except ValueError as e:
        raise UsageError(f"--client: {e}") from None
    if not args.servers and not clients:
        raise UsageError("nothing to make: give --servers and/or --client")
    names = [c.name for c in clients]
    if len(set(names)) != len(names):  # a usage error, as repeated server ids are
        raise UsageError(f"--client: client names repeat: {', '.join(names)}")
    try:
        made = create_certs(
            Path(args.dir),
            servers=args.servers,
            hosts=args.hosts,
            clients=clients,
            days=args.days,
            overwrite=args.overwrite,
        )
    except (CertError, ValueError) as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"{e.filename or args.dir}: {e.strerror}") from None
    out = console()
    out.print(f"CA      {made.ca}", markup=False)
    for sid, paths in made.servers.items():
        out.print(f"server  {sid:<12} {paths.cert}  {paths.key}", markup=False)
    for name, paths in made.clients.items():
        out.print(f"client  {name:<12} {paths.cert}  {paths.key}", markup=False)
    return 0
