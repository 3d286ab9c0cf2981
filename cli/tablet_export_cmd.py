"""``raftlet tablet export REPLICA_DIR``: the rows of one replica of a stopped server, read
offline (``tserver.replica_export``), as ``raftlet scan --format json`` prints them -- the
way to save what a tablet that lost a majority of its replicas for good still holds."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raftlet.cli.common import CliError, UsageError

__all__ = ["add_parser", "run"]

_EPILOG = """\
examples:
  raftlet cluster down --data-dir ./c1 --server ts1
  raftlet tablet export ./c1/ts1/kv-p0 > kv-p0.json
  raftlet row upsert kv --json kv-p0.json --data-dir ./c2     # into a new cluster

For a tablet that elects no leader because a majority of its replicas is lost for good: no
command that goes through a leader can read it, and a surviving replica's files are all that
is left. The server must be stopped (its data directory is locked while it runs); its files
are not changed -- a copy of the replica directory is opened as the server would open it (the
store and log checked, the committed entries the store had not applied replayed), under
--work-dir, and removed afterwards. The rows go to standard output, a summary to standard
error. The replica's log may hold entries after the last one it knew committed, which a
lost majority may have acknowledged or never seen; the summary says how many, and
--all-logged applies them too. A replica the server refuses to open (a damaged log, lost
consensus metadata) may still have a readable store: --store-only reads that file alone,
without what the log held beyond it. A tablet that has a leader is read with `raftlet scan`.
"""


def add_parser(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "export",
        help="print the rows of a stopped server's replica (a tablet that lost a majority)",
        description="Read one replica's rows offline from a stopped server's data directory.",
        epilog=_EPILOG,
        formatter_class=formatter,
    )
    p.add_argument(
        "replica_dir",
        metavar="REPLICA_DIR",
        help="the replica's directory: <server data dir>/<tablet id>, e.g. ./c1/ts1/kv-p0",
    )
    p.add_argument(
        "--all-logged",
        action="store_true",
        help="also apply the entries logged after the last one the replica knew committed",
    )
    p.add_argument(
        "--store-only",
        action="store_true",
        help="read the store file alone, not the log (a replica the server refuses to open)",
    )
    p.add_argument(
        "--work-dir",
        metavar="DIR",
        help="where the copy is made (default: the system's temporary directory)",
    )


def run(args: argparse.Namespace) -> int:
    from raftlet.cli.scan_cmd import print_json_rows
    from raftlet.tserver.replica_export import ExportError, exported_replica

    try:
        if args.store_only and args.all_logged:
            raise UsageError("--store-only reads no log: --all-logged has nothing to apply")
        with exported_replica(
            args.replica_dir,
            all_logged=args.all_logged,
            store_only=args.store_only,
            work_dir=args.work_dir,
        ) as replica:
            n = 0

            def counted() -> Any:
                nonlocal n
                for row in replica.rows:
                    n += 1
                    yield row

            print_json_rows(counted(), replica.schema.column_names, replica.schema)
    except ExportError as e:
        raise CliError(str(e)) from None
    beyond = replica.beyond_commit
    entries = f"{beyond} entr{'y' if beyond == 1 else 'ies'}"
    if args.all_logged:
        note = f"; {entries} of them logged after its last known commit" if beyond else ""
    elif beyond:
        note = (
            f"; {entries} logged after index {replica.commit_index} "
            f"{'is' if beyond == 1 else 'are'} not in it (whether committed is unknown: "
            "--all-logged applies them)"
        )
    else:
        note = ""
    if not replica.log_read:
        note = "; the log was not read: what was committed after it is not in it"
    print(
        f"{n} row{'s' * (n != 1)} of {replica.tablet_id} (table {replica.table}), applied "
        f"through index {replica.applied_index}{note}",
        file=sys.stderr,
    )
    return 0
