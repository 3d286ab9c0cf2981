"""``raftlet cluster up | status | down | balance-leaders``: a local cluster's life, a
ksck-style check, and its leaders spread evenly."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raftlet.cli.common import (
    CliError,
    UsageError,
    add_target_arguments,
    config_file_of,
    console,
    non_negative_int,
    positive_int,
    print_out,
    resolve_target,
    timeout_seconds,
)
from raftlet.consensus.modes import TermCheckMode
from raftlet.metrics.human import human_bytes
from raftlet.schema.types import DataType
from raftlet.tserver.cpu_affinity import check_cpu_affinity

if TYPE_CHECKING:
    from raftlet.client.health import ClusterHealth

__all__ = ["add_parsers", "failed_replica_lines", "run"]

# What `ksck --checksum` gives each tablet at least: its replicas may first have to apply
# what is queued ahead of the checksum point.
CHECKSUM_WAIT_S = 10.0

_CLUSTER_EPILOG = """\
examples:
  raftlet cluster up --data-dir ./c1                     # 3 servers, table kv in 4 tablets
  raftlet cluster status --data-dir ./c1 --checksum      # leaders, lag, every replica's rows
  raftlet cluster replace-server ts2 --data-dir ./c1     # move ts2's replicas to the others
  raftlet cluster balance-leaders --data-dir ./c1
  raftlet cluster down --data-dir ./c1 --remove-data

Run `raftlet cluster ACTION --help` for an action's options and more examples.
"""

_UP_EPILOG = """\
examples:
  raftlet cluster up                          # 3 servers, table kv of 4 tablets, in a new temp dir
  raftlet cluster up --data-dir ./c1 --servers 5 --tablets 8
  raftlet cluster up --data-dir ./c1          # again after `down`: restarts it, data and flags kept
  raftlet cluster up --term-check-mode locked --log-inject-latency-ms 20 \\
      --tserver-flag=--write_rounds_in_flight=0   # KUDU-2727 setup
  raftlet cluster up --tserver-flag=--rpc_service_queue_length=1

The servers run in the background (they outlive this command); their logs are
<data dir>/<server id>.log. Stop them with `raftlet cluster down --data-dir DIR`.
"""

_STATUS_EPILOG = """\
examples:
  raftlet cluster status --data-dir ./c1
  raftlet cluster status --servers 127.0.0.1:7051 --format json
  raftlet cluster ksck --data-dir ./c1 --checksum

Verdicts: ERROR = a tablet has no ready leader or no majority of working replicas (writes
fail); WARN = a server down or overloaded, a replica missing or lagging more than --max-lag
entries, a leader not ready yet, a server (or this cluster.toml) on another cluster config
than most servers; OK otherwise. Exit status 0 only for OK. With --token and no
--tls-cert, every server is asked at its token port (token_rpc_addr).

--checksum (admin role) also compares every replica's rows: each tablet's leader places a
checksum point in its log and every replica checksums its rows when it applies that point,
so all checksum the same state while writes go on. A replica whose checksum differs from
the majority's, or that cannot read its rows, is named and the exit status is 1. A replica
reads its rows beside its writes, about a second per 30-60 MB of store file: a large tablet
needs a --timeout to match.
"""

_DOWN_EPILOG = """\
examples:
  raftlet cluster down --data-dir ./c1
  raftlet cluster down --data-dir ./c1 --timeout 5 --remove-data
  raftlet cluster down --data-dir ./c1 --server ts2   # one server; `cluster up` restarts it

Each server gets SIGTERM (graceful: RPCs drain, logs are synced); any still running after
--timeout seconds gets SIGKILL. Only processes that are this cluster's servers are signalled.
With --server, a server whose stop would leave a tablet without a majority of answering
voters (another one is down or paused) is not stopped, unless --force.
"""


def add_parsers(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    cluster = commands.add_parser(
        "cluster",
        help="start, check and stop a local multi-server cluster",
        description="Start, check and stop a cluster of raftlet servers on this machine.",
        formatter_class=formatter,
        epilog=_CLUSTER_EPILOG,
    )
    sub = cluster.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)

    up = sub.add_parser(
        "up",
        help="start a local cluster and wait until every tablet has a leader",
        description=(
            "Start a cluster of raftlet tablet servers on this machine, each its own "
            "process, and wait until every tablet has a ready leader. Writes cluster.toml "
            "(the config clients use) and cluster.json (the server PIDs) into the data dir."
        ),
        epilog=_UP_EPILOG,
        formatter_class=formatter,
    )
    up.add_argument(
        "--data-dir",
        metavar="DIR",
        help="where the cluster lives (default: a new temporary directory, printed)",
    )
    # None = "not given": restarting an existing cluster keeps its shape unless told.
    up.add_argument("--servers", type=positive_int, metavar="N", help="tablet servers (default 3)")
    up.add_argument(
        "--tablets",
        type=positive_int,
        metavar="N",
        help="hash partitions of the table kv, one tablet each (default 4)",
    )
    up.add_argument(
        "--term-check-mode",
        choices=[m.value for m in TermCheckMode],
        help="how writes check leadership: lockfree (default) or locked (the KUDU-2727 path)",
    )
    up.add_argument(
        "--log-inject-latency-ms",
        type=_non_negative_float,
        metavar="MS",
        help="sleep this long after every WAL fsync, to mimic a slow disk (default 0)",
    )
    up.add_argument(
        "--tls",
        action="store_true",
        help="mutual TLS and roles: make a CA, server certificates and an admin client "
        "certificate in DATA_DIR/tls/ and start the servers with them (kept on restart); "
        "client commands given --data-dir use them by themselves",
    )
    up.add_argument(
        "--base-port",
        type=positive_int,
        metavar="PORT",
        help="server i listens on PORT+i (RPC) and PORT+1000+i (status); default: free ports",
    )
    up.add_argument(
        "--cpu-affinity",
        default="auto",
        metavar="{auto,none,CPUS}",
        help="bind each server's threads to CPUs (its --cpu_affinity): auto (default) one "
        "CPU per server, round-robin over this machine's; none leaves placement to the OS; "
        "or a CPU list for every server, e.g. 0-1",
    )
    up.add_argument(
        "--tserver-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="pass a flag to every server, e.g. --tserver-flag=--rpc_service_queue_length=1 "
        "(repeatable; see `raftlet tserver --help`)",
    )
    up.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=60.0,
        metavar="S",
        help="seconds to wait for each server to start and for leaders (default 60)",
    )

    status = sub.add_parser(
        "status",
        aliases=["ksck"],
        help="ksck-style health: servers, leaders, lagging replicas (--checksum: rows)",
        description=(
            "Ask every server for its replicas and report: which servers are up, each "
            "tablet's leader, term and replicas, replicas that lag the leader, and one "
            "overall OK / WARN / ERROR line. `raftlet cluster ksck` is another name for "
            "this command."
        ),
        epilog=_STATUS_EPILOG,
        formatter_class=formatter,
    )
    add_target_arguments(status)
    status.add_argument(
        "--max-lag",
        type=non_negative_int,
        default=100,
        metavar="N",
        help="entries a replica may trail the leader's commit by before it is reported, not "
        "counting those on their way into its store (default 100: under a write load a few "
        "are normal)",
    )
    status.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=3.0,
        metavar="S",
        help="per-server RPC timeout (default 3)",
    )
    status.add_argument(
        "--checksum",
        action="store_true",
        help=(
            "also compare every replica's rows at one log index (needs the admin role); "
            f"each tablet waits up to max(--timeout, {CHECKSUM_WAIT_S:g}) s for its replicas "
            "to reach the point, all tablets at once"
        ),
    )
    status.add_argument("--format", choices=("table", "json"), default="table")

    from raftlet.cli import leader_balance, tablet_cmd

    tablet_cmd.add_replace_server_parser(sub, formatter)
    leader_balance.add_parser(sub, formatter)

    down = sub.add_parser(
        "down",
        help="stop a local cluster (SIGTERM, then SIGKILL after a timeout)",
        description="Stop every server of a cluster started by `raftlet cluster up`.",
        epilog=_DOWN_EPILOG,
        formatter_class=formatter,
    )
    group = down.add_mutually_exclusive_group(required=True)
    group.add_argument("--data-dir", metavar="DIR", help="the cluster's directory")
    group.add_argument("--cluster", metavar="FILE", help="the cluster's cluster.toml")
    down.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=30.0,
        metavar="S",
        help="seconds to wait after SIGTERM before SIGKILL (default 30)",
    )
    down.add_argument(
        "--remove-data",
        action="store_true",
        help="also delete the data directory (its logs, config and replicas)",
    )
    down.add_argument(
        "--server",
        metavar="ID",
        help="stop only this server (a rolling restart: new certificates, a new release), "
        "leaving the others running; `raftlet cluster up` starts it again, with the flags it "
        "had (new flags need a full down and up). Refused when a tablet would be left "
        "without a majority of answering voters",
    )
    down.add_argument(
        "--force",
        action="store_true",
        help="with --server: stop it even if a tablet is left without a majority",
    )


def majority_lost_without(health: Any, server: str) -> list[str]:
    """The tablets that still have a majority of answering voters, and would not without
    ``server``, as lines naming their voters and those that do not answer (review r30a: with
    ts3 frozen, `down --server ts2` left a tablet without a leader, "stopped gracefully")."""
    lost = []
    for t in health.tablets:
        voters = [r for r in t.replicas if r.role != "LEARNER"]
        # UNKNOWN: its server is up but busy (or refuses this check): it still votes.
        answering = [r.server for r in voters if r.state in ("OK", "LAGGING", "AHEAD", "UNKNOWN")]
        if server not in answering:
            continue  # stopping it changes nothing the tablet has now
        need = len(voters) // 2 + 1
        if len(answering) >= need > len(answering) - 1:  # one that has a majority loses it
            silent = ", ".join(r.server for r in voters if r.server not in answering)
            lost.append(
                f"{t.tablet_id}: voters {', '.join(r.server for r in voters)}; "
                f"{silent or 'none'} not answering"
            )
    return lost


def _refuse_if_majority_lost(cluster: Any, server: str) -> None:
    from raftlet.client.health import ProbeOptions

    lost = majority_lost_without(cluster.health(ProbeOptions(timeout_s=3.0)), server)
    if lost:
        raise CliError(
            f"stopping {server} would leave {len(lost)} tablet(s) without a majority of "
            f"answering voters, so without a leader: {'; '.join(lost)} -- start or resume "
            f"those first (`raftlet cluster status`), or pass --force to stop {server} anyway"
        )


def _non_negative_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not x >= 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return x


def run(args: argparse.Namespace) -> int:
    if args.cluster_command == "up":
        return _up(args)
    if args.cluster_command in ("status", "ksck"):
        return _status(args)
    if args.cluster_command == "balance-leaders":
        from raftlet.cli import leader_balance

        return leader_balance.run(args)
    if args.cluster_command == "replace-server":
        from raftlet.cli import tablet_cmd

        return tablet_cmd.run_replace_server(args)
    return _down(args)


# --- up ------------------------------------------------------------------------------------


def failed_replica_lines(health: ClusterHealth) -> list[str]:
    """One line for each replica that is FAILED, with its reason: a cluster restarted on a
    full disk came up "OK" by its leaders alone, its FAILED replicas unmentioned."""
    lines = []
    for t in health.tablets:
        for r in t.replicas:
            if r.state != "FAILED":
                continue
            prefix = f"replica on {r.server} is FAILED: "
            why = next((i[len(prefix) :] for i in t.issues if i.startswith(prefix)), "")
            lines.append(
                f"  FAILED    {t.tablet_id} on {r.server}: {why or 'see `raftlet cluster status`'}"
            )
    return lines


def _up(args: argparse.Namespace) -> int:
    from raftlet.deploy.local import LauncherError, LocalCluster

    if args.tserver_flag:
        owned = {"--config", "--server_id", "--server-id", "--data_dir", "--data-dir"}
        owned |= {"--rpc_addr", "--rpc-addr", "--http_addr", "--http-addr"}
        for flag in args.tserver_flag:
            if flag.split("=", 1)[0] in owned:
                raise UsageError(
                    f"--tserver-flag {flag}: the launcher sets {flag.split('=', 1)[0]} itself"
                )
        from raftlet.cli.tserver_args import build_tserver_parser

        # Checked here, with the server's own parser, so a typo is a usage error now
        # rather than three servers failing to start.
        check = build_tserver_parser("raftlet cluster up --tserver-flag")
        check.parse_args(["--config", "-", "--server_id", "-", *args.tserver_flag])
    if args.cpu_affinity != "none":
        try:
            check_cpu_affinity(args.cpu_affinity)
        except ValueError as e:
            raise UsageError(f"--cpu-affinity {args.cpu_affinity}: {e}") from None
    _check_server_settings(args)
    out = console()
    try:
        cluster = LocalCluster.create(
            args.data_dir,
            servers=args.servers,
            tablets=args.tablets,
            term_check_mode=args.term_check_mode,
            log_inject_latency_ms=args.log_inject_latency_ms,
            extra_flags=args.tserver_flag,
            base_port=args.base_port,
            tls=args.tls,
            cpu_affinity=_cpu_affinity(args),
            ready_timeout_s=args.timeout,
            leader_timeout_s=args.timeout,
            on_progress=lambda msg: out.print(f"  {msg}"),
        )
    except LauncherError as e:
        if e.details:
            out.print(e.details, markup=False)
        raise CliError(str(e)) from None
    health = cluster.health()
    config = cluster.config
    tables = ", ".join(
        f"{t.name} in {_count(t.partitions, 'tablet')} x {_count(t.replication_factor, 'replica')}"
        for t in config.tables
    )
    running = len(cluster.servers)
    of = f"{running} of " if running < len(config.servers) else ""
    count = of + _count(len(config.servers), "server")
    out.print(
        f"raftlet cluster [bold]{config.name}[/] is up: {count}, "
        + (f"table{'s' * (len(config.tables) > 1)} {tables}" if tables else "no tables"),
        highlight=False,
    )
    out.print(f"  data dir  {cluster.data_dir}", markup=False)
    out.print(f"  config    {cluster.config_path}", markup=False)
    for s in cluster.servers.values():
        out.print(
            f"  {s.id:<5} pid {s.pid:<8} rpc {s.rpc_addr:<21} status {s.status_url}",
            markup=False,
        )
    leaders = ", ".join(f"{t.tablet_id}={t.leader or 'none'}" for t in health.tablets)
    if leaders:
        out.print(f"  leaders   {leaders}", markup=False)
    for line in failed_replica_lines(health):
        out.print(line, style="red", markup=False, highlight=False)
    for t in (t for t in health.tablets if t.lost_majority):
        why = next(i for i in t.issues if i.startswith("lost a majority"))
        out.print(f"  ERROR     {t.tablet_id}: {why}", style="red", markup=False)
    d = cluster.data_dir
    out.print("next:", markup=False)
    first = config.tables[0].name if config.tables else None
    # The load generator makes keys of one INT64 or UNIXTIME_MICROS column only.
    loadable = next(
        (
            t.name
            for t in config.tables
            if [c.type for c in t.schema.key_columns]
            in ([DataType.INT64], [DataType.UNIXTIME_MICROS])
        ),
        None,
    )
    table = "" if loadable == "kv" else f" --table {loadable}"
    lost = [t for t in health.tablets if t.lost_majority]
    if lost:  # a write or scan of the table would wait out its timeout
        loadable = first = None
    for cmd in (
        *([f"raftlet write --data-dir {d}{table} --duration 10 --threads 8"] if loadable else []),
        *([f"raftlet scan {first} --data-dir {d} --limit 10"] if first else []),
        f"raftlet cluster status --data-dir {d}",
        f"raftlet cluster down --data-dir {d}",
    ):
        out.print(f"  {cmd}", markup=False)
    if lost:
        # The servers keep running: their other tablets serve, and status shows the reasons.
        whose = "its" if len(lost) == 1 else "their"
        others = "every other tablet" if len(lost) < len(health.tablets) else "no tablet"
        out.print(
            f"{_count(len(lost), 'tablet')} lost a majority of {whose} replicas and cannot "
            f"elect a leader; the servers keep running ({others} serves) -- `raftlet cluster "
            "status` says why, and `raftlet tablet export` reads a stopped server's replica",
            style="red",
            markup=False,
        )
        return 1
    return 0


def _check_server_settings(args: argparse.Namespace) -> None:
    """Resolve every server's settings as it would (``ServerSettings.from_args``) against the
    config it would get, before any starts: flags that are each valid but not together
    (``--heartbeat_ticks`` not below the config's election_ticks, a worker pool whose max is
    below its min) are a usage error naming them, not servers that exit 2 one by one and
    an `up` that fails after them. Where the config cannot be built yet (a bad --servers,
    an invalid cluster.toml), ``LocalCluster.create`` reports that instead."""
    from raftlet.cli.tserver_args import build_tserver_parser
    from raftlet.cluster import ClusterConfigError, load_cluster_config
    from raftlet.deploy.local import (
        CONFIG_FILE,
        LauncherError,
        launch_flags,
        local_tls_files,
        new_config,
    )
    from raftlet.tserver.flag_spec import FlagError
    from raftlet.tserver.settings import ServerSettings

    root = Path(args.data_dir).expanduser().absolute() if args.data_dir else None
    try:
        if root is not None and (root / CONFIG_FILE).exists():
            config = load_cluster_config(root / CONFIG_FILE)
        else:
            # Only the ports differ from what `create` writes, and no flag depends on them.
            config = new_config(
                root or Path("raftlet-check"),
                servers=3 if args.servers is None else args.servers,
                tablets=4 if args.tablets is None else args.tablets,
                base_port=7051 if args.base_port is None else args.base_port,
                token_ports=args.tls,
            )
    except (ClusterConfigError, LauncherError, OSError):
        return
    # The flags `create` gives every server, in its order (the last of a flag wins).
    flags: list[str] = []
    if args.tls or (root is not None and local_tls_files(root) is not None):
        # Only their presence is checked before a server reads them.
        flags += ["--tls_cert", "-", "--tls_key", "-", "--tls_ca", "-"]
        flags += ["--auth_tokens_file", "-"]
    flags += launch_flags(
        args.tserver_flag or (),
        cpu_affinity=_cpu_affinity(args),
        term_check_mode=args.term_check_mode,
        log_inject_latency_ms=args.log_inject_latency_ms,
    )
    parser = build_tserver_parser("raftlet cluster up --tserver-flag")
    for server in config.servers:
        parsed = parser.parse_args(["--config", "-", "--server_id", server.id, *flags])
        try:
            ServerSettings.from_args(parsed, config)
        except FlagError as e:
            raise UsageError(
                f"--tserver-flag: {e} ({server.id} would refuse to start with these flags)"
            ) from None


def _cpu_affinity(args: argparse.Namespace) -> str:
    """``--cpu-affinity`` as the launcher takes it (``""``: leave placement to the OS)."""
    return "" if args.cpu_affinity == "none" else str(args.cpu_affinity)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


# --- status --------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    from raftlet.client.health import ProbeOptions, check_cluster
    from raftlet.client.tls import uses_token_ports
    from raftlet.deploy.local import LauncherError, LocalCluster, NoClusterError

    target = resolve_target(args, timeout_s=args.timeout)
    options = ProbeOptions(
        timeout_s=args.timeout,
        max_lag=args.max_lag,
        credentials=target.creds.channel_credentials(),
        token_ports=uses_token_ports(target.creds.tls),
        disk_usage=True,
    )
    pids: dict[str, int] = {}
    processes: dict[str, bool] | None = None
    local = None
    if target.data_dir is not None and (target.data_dir / "cluster.json").exists():
        try:
            local = LocalCluster.load(target.data_dir)
        except NoClusterError:
            local = None
        except LauncherError as e:
            raise CliError(str(e)) from None
        if local is not None:
            pids = local.pids()
            processes = {sid: sid in pids for sid in local.servers}
    health = check_cluster(target.config, options, processes=processes)
    if local is not None and processes is not None:
        local.note_dropped(health, processes)
    checksums = _checksums(target, args.timeout, health) if args.checksum else []
    ok = health.ok and all(c.ok for c in checksums)
    if args.format == "json":
        doc = health.to_json()
        for s in doc["servers"]:
            s["pid"] = pids.get(s["id"])
        if args.checksum:
            leaders = {t.tablet_id: t.leader for t in health.tablets}
            doc["checksums"] = [
                {
                    **dataclasses.asdict(c),
                    "ok": c.ok,
                    "diverged": c.diverged,
                    "remedy": _divergence_remedy(c, leaders.get(c.tablet_id)),
                }
                for c in checksums
            ]
        print_out(json.dumps(doc, indent=2))
        return 0 if ok else 1
    where = str(target.config_path or ", ".join(target.seeds))
    _print_status(health, pids, where, target.creds.status_url, target.data_dir)
    if args.checksum:
        _print_checksums(checksums, {t.tablet_id: t.leader for t in health.tablets})
    return 0 if ok else 1


def _checksums(target: Any, timeout_s: float, health: Any) -> list[Any]:
    """Every tablet's replica checksums (``Client.checksum``), the tablets at once; a tablet
    the health check found without a leader is not asked (nothing could place its point),
    and one whose leader cannot place a point is reported with that error."""
    from concurrent.futures import ThreadPoolExecutor

    from raftlet.client import RaftletError
    from raftlet.client.checksum import TabletChecksum

    led = {t.tablet_id for t in health.tablets if t.leader is not None}
    wait_s = max(timeout_s, CHECKSUM_WAIT_S)

    def one(placement: Any) -> Any:
        tablet = placement.tablet_id
        if tablet not in led:
            return TabletChecksum(
                tablet, 0, (), not_checked="no ready leader (see above): not checked"
            )
        try:
            return client.checksum(tablet, timeout_s=wait_s, refresh=False)
        except RaftletError as e:
            return TabletChecksum(tablet, 0, (), not_checked=f"no checksum point: {e}")

    placements = list(target.config.placements())
    with (
        target.client(timeout_s=wait_s) as client,
        ThreadPoolExecutor(max(1, min(16, len(placements))), "ksck-checksum") as pool,
    ):
        if placements:
            # Where every tablet's replicas are now, learned once for all of them.
            client.leader_of(placements[0].tablet_id, refresh=True)
        return list(pool.map(one, placements))


def _print_checksums(checksums: list[Any], leaders: Mapping[str, str | None] | None = None) -> None:
    from rich.table import Table

    out = console()
    table = Table(title="Checksums", title_justify="left", box=None, pad_edge=False)
    for col in ("tablet", "status", "index", "rows", "checksum", "suspect replicas"):
        table.add_column(col)
    by_id = {c.tablet_id: c for c in checksums}
    for c in checksums:
        suspects = c.suspects()
        agreed = c.agreed
        rows = next((r.rows for r in c.replicas if r.checksum == agreed), 0) if agreed else "-"
        table.add_row(
            c.tablet_id,
            _checksum_status(c),
            str(c.index or "-"),
            str(rows),
            agreed[:16] if agreed else "-",
            c.not_checked or "; ".join(_suspect_text(r, agreed) for r in suspects) or "-",
        )
    out.print()
    out.print(table)
    bad = [c.tablet_id for c in checksums if c.diverged]
    unchecked = [c.tablet_id for c in checksums if not c.ok and not c.diverged]
    out.print()
    if bad:
        out.print(f"[red]CHECKSUM MISMATCH: {', '.join(bad)}[/]")
        for c in checksums:
            for line in _divergence_remedy(c, (leaders or {}).get(c.tablet_id)):
                out.print(line, markup=False)
    # A replica that gave no checksum (its server down, the replica FAILED) is not
    # evidence of different rows: said apart from a mismatch.
    none = [t for t in unchecked if not any(r.checksum for r in by_id[t].replicas)]
    some = [t for t in unchecked if t not in none]
    if some:
        out.print(
            f"[yellow]CHECKSUMS INCOMPLETE: {', '.join(some)} (a replica gave none; "
            "those that did agree)[/]"
        )
    if none:
        out.print(f"[yellow]CHECKSUMS MISSING: {', '.join(none)} (no replica gave one)[/]")
    if not bad and not unchecked:
        out.print(f"[green]CHECKSUMS OK: {len(checksums)} tablets, replicas equal[/]")


def _divergence_remedy(c: Any, leader: str | None) -> list[str]:
    """What to do about a tablet whose replicas gave different checksums: rebuild each
    replica that differs -- from the majority, or with none, from the leader, whose rows
    a new replica would be copied from -- by removing it and adding it again."""
    if not c.diverged:
        return []
    tid, agreed = c.tablet_id, c.agreed
    if agreed:
        basis = "differs from the majority of its replicas"
        differing = [r.server for r in c.replicas if r.checksum and r.checksum != agreed]
    else:
        theirs = next((r.checksum for r in c.replicas if r.server == leader), "")
        if not theirs:
            return [
                f"{tid}: no majority of its replicas agrees and its leader gave no checksum, "
                "so which replica differs cannot be told from them: run the check again"
            ]
        basis = f"differs from the leader's ({leader}; no majority agrees: check its rows)"
        differing = [r.server for r in c.replicas if r.checksum and r.checksum != theirs]
    return [
        f"{tid}: the replica on {sid} {basis}: `raftlet tablet remove-replica {tid} {sid} "
        f"--wait`, then `raftlet tablet add-replica {tid} {sid} --wait`, which fills it by a "
        "copy from the leader (one replica at a time)"
        for sid in differing
    ]


def _checksum_status(c: Any) -> str:
    if c.ok:
        return "[green]OK[/]"
    if c.diverged:
        return "[red]DIVERGED[/]"
    if any(r.checksum for r in c.replicas):
        return "[yellow]INCOMPLETE[/]"
    return "[yellow]MISSING[/]"


def _suspect_text(replica: Any, agreed: str | None) -> str:
    if replica.error:
        return f"{replica.server}: {replica.error}"
    what = "differs from the majority" if agreed else "no majority"
    return f"{replica.server}: {replica.checksum[:16]} ({replica.rows} rows, {what})"


_ROLE_SHORT = {
    "LEADER": "L",
    "FOLLOWER": "F",
    "LEARNER": "learner",
    "CANDIDATE": "candidate",
    "PRE_CANDIDATE": "pre-candidate",
}


def _stopped(pid: int | None) -> bool:
    from raftlet.deploy.local import pid_stopped

    return pid is not None and pid_stopped(pid)


def _print_status(
    health: Any,
    pids: dict[str, int],
    where: str,
    status_url: Callable[[str, str], str],
    data_dir: Path | None = None,
) -> None:
    from rich.table import Table

    out = console()
    style = {"OK": "green", "UP": "green", "WARN": "yellow", "BUSY": "yellow", "LAGGING": "yellow"}
    style |= {"ERROR": "red", "DOWN": "red", "MISSING": "red", "FAILED": "red", "UNKNOWN": "yellow"}
    style["COPYING"] = "yellow"
    style["DENIED"] = "red"

    def mark(word: str) -> str:
        return f"[{style.get(word, '')}]{word}[/]" if word in style else word

    out.print(f"Cluster [bold]{health.name}[/] ({where})", highlight=False)
    servers = Table(title="Servers", title_justify="left", box=None, pad_edge=False)
    columns = ("server", "state", "pid", "rpc address", "status page", "replicas", "disk")
    for col in (*columns, "release", "note"):
        servers.add_column(col)
    for s in health.servers:
        note = s.error
        if s.state == "DOWN" and s.process_alive is False:
            note = "process not running"
        elif s.state == "DOWN" and s.process_alive and _stopped(pids.get(s.id)):
            pid = pids[s.id]
            note = f"process stopped (SIGSTOP or a debugger: `kill -CONT {pid}` resumes it)"
        elif s.state == "DOWN" and s.process_alive:
            note = f"process running but not answering ({s.error})"
        elif s.config_differs:
            note = f"another cluster config: {', '.join(s.config_differs)} differ"
        if s.cert_expires_soon:
            cert = f"TLS certificate {'expired' if s.cert_expired else 'expires soon'}"
            note = f"{note}; {cert}" if note else cert
        servers.add_row(
            s.id,
            mark(s.state),
            str(pids.get(s.id, "-")),
            s.rpc_addr,
            status_url(s.http_addr, "/"),
            str(s.tablets) if s.state == "UP" else "-",
            "-" if s.disk_bytes is None else human_bytes(s.disk_bytes),
            s.release,
            note,
        )
    out.print(servers)
    releases = health.releases()
    if len(releases) > 1:
        # Not an issue: a rolling upgrade runs two releases side by side on purpose.
        said = "; ".join(f"{r} on {', '.join(ids)}" for r, ids in sorted(releases.items()))
        out.print(f"servers run {len(releases)} releases: {said}", markup=False)
    stopped = [s.id for s in health.servers if s.state == "DOWN" and s.process_alive is False]
    if stopped and data_dir is not None:
        out.print(
            f"`raftlet cluster up --data-dir {data_dir}` starts {', '.join(stopped)} again",
            markup=False,
        )
    out.print()
    tablets = Table(title="Tablets", title_justify="left", box=None, pad_edge=False)
    for col in ("tablet", "status", "leader", "term", "commit", "replicas (role applied lag)"):
        tablets.add_column(col)
    for t in health.tablets:
        reps = []
        for r in t.replicas:
            if r.state in ("UNKNOWN", "FAILED") or not r.present:  # no role nor index to show
                reps.append(f"{r.server} {mark(r.state)}")
                continue
            role = _ROLE_SHORT.get(r.role, r.role.lower())
            ahead = r.applying_index - r.applied_index
            applying = f" (+{ahead} applying)" if ahead > 0 else ""
            lag = "" if r.lag is None else f" lag {r.lag}"
            text = f"{r.server} {role} {r.applied_index}{applying}{lag}"
            color = {"LAGGING": "yellow", "AHEAD": "red"}.get(r.state)
            reps.append(f"[{color}]{text}[/]" if color else text)
        tablets.add_row(
            t.tablet_id,
            mark(t.severity.name),
            t.leader or "[red]none[/]",
            str(t.term),
            "-" if t.leader_commit is None else str(t.leader_commit),
            ", ".join(reps),
        )
    out.print(tablets)
    if health.issues:
        out.print()
        out.print("Issues:")
        for issue in health.issues:
            out.print(f"  - {issue}", markup=False)
    verdict = health.summary()
    out.print()
    out.print(f"[{style[health.severity.name]}]{verdict}[/]")


# --- down ----------------------------------------------------------------------------------


def _down(args: argparse.Namespace) -> int:
    from raftlet.deploy.local import (
        STATE_FILE,
        LauncherError,
        LocalCluster,
        NoClusterError,
        pid_alive,
    )

    path = config_file_of(args)
    assert path is not None  # the parser requires --data-dir or --cluster
    root = path.parent
    out = console()
    if args.server is not None and args.remove_data:
        raise UsageError("--server stops one server: --remove-data would delete the others' data")
    if args.remove_data and not root.exists():
        # Removed already: `down --remove-data` twice is not an error.
        out.print(f"no cluster in {root}: it is gone already; nothing to stop", markup=False)
        return 0
    try:
        cluster = LocalCluster.load(root)
    except NoClusterError:
        if not path.exists():
            raise CliError(
                f"no cluster in {root}: neither {root / STATE_FILE} nor {path} exists"
            ) from None
        # Already stopped: `down` is idempotent, so cleanup scripts can always run it.
        out.print(
            f"no cluster is running in {root} (no {STATE_FILE}: stopped already, or its "
            "servers were not started by `raftlet cluster up`); nothing to stop",
            markup=False,
        )
        cluster = None
    except LauncherError as e:
        raise CliError(str(e)) from None
    if args.force and args.server is None:
        raise UsageError("--force goes with --server (it stops one server whatever it costs)")
    if cluster is not None and args.server is not None:
        if args.server not in cluster.servers:  # a usage error, as elsewhere (review r33a)
            known = ", ".join(cluster.servers)
            raise UsageError(f"--server: no server {args.server!r} in {root} (servers: {known})")
        if not args.force:
            _refuse_if_majority_lost(cluster, args.server)
        try:
            (stop,) = cluster.down(timeout=args.timeout, only=args.server)
        except LauncherError as e:
            raise CliError(str(e)) from None
        out.print(f"  {stop.describe()}", markup=False)
        dropped = cluster.dropped()  # not in cluster.toml: `up` does not start them
        stopped = sorted(
            s
            for s, up in cluster.running().items()
            if not up and s != args.server and s not in dropped
        )
        if args.server in dropped:
            out.print(
                f"{args.server} is down; it is no longer in cluster.toml, so `raftlet cluster "
                "up` does not start it again",
                markup=False,
            )
            return 0
        if not stopped:
            out.print(
                f"{args.server} is down, the others run; `raftlet cluster up --data-dir "
                f"{root}` starts it again",
                markup=False,
            )
            return 0
        verb = "is" if len(stopped) == 1 else "are"
        out.print(
            f"{args.server} is down, and {', '.join(stopped)} {verb} not running either: "
            "a tablet with a majority of its replicas on these servers "
            f"has no leader until `raftlet cluster up --data-dir {root}` starts them again",
            markup=False,
        )
        return 0
    if cluster is None and args.server is not None:
        raise CliError(f"no cluster is running in {root}: no server to stop")
    if cluster is not None:
        try:
            stops = cluster.down(timeout=args.timeout)
        except LauncherError as e:
            raise CliError(str(e)) from None
        for stop in stops:
            out.print(f"  {stop.describe()}", markup=False)
        unsure = [s for s in stops if s.outcome == "not ours" and pid_alive(s.pid)]
        if unsure and args.remove_data:
            # Only the command line tells a reused PID from our server; were it wrong, the
            # server would go on running on a deleted directory.
            pids = ", ".join(f"{s.pid} (recorded for {s.id})" for s in unsure)
            raise CliError(
                f"--remove-data: kept {root}: pid {pids} still runs; its command line is "
                "not the server's as recorded, so it is likely another program -- check it, "
                "then remove the directory by hand"
            )
        out.print(
            f"cluster in {root} is down: {_count(len(stops), 'server')}, no process left",
            markup=False,
        )
    if args.remove_data:
        _remove_data(root)
        out.print(f"removed {root}", markup=False)
    return 0


def _remove_data(root: Path) -> None:
    from raftlet.cluster import ClusterConfigError, load_cluster_config
    from raftlet.deploy.local import (
        CONFIG_FILE,
        MADE_BY_UP_FILE,
        STATE_FILE,
        data_dir_in_use,
    )

    # Never under a running server: one started by hand holds its data directory's lock.
    try:
        servers = load_cluster_config(root / CONFIG_FILE).servers
    except (OSError, ClusterConfigError):
        servers = ()
    for server in servers:
        pid = data_dir_in_use(server.data_dir)
        if pid is not None:
            who = f"pid {pid}" if pid > 0 else "a process"
            raise CliError(
                f"--remove-data: kept {root}: {who} runs server {server.id} on "
                f"{server.data_dir} (started by hand?); stop it, then run this again"
            )
    # Only a directory `cluster up` made for its cluster: never `rm -rf` a typo, nor the
    # folder a hand-written cluster.toml (--cluster FILE) happens to sit in.
    if not (root / MADE_BY_UP_FILE).is_file():
        raise UsageError(
            f"--remove-data: {root} has no {MADE_BY_UP_FILE}, the mark of a directory "
            "`raftlet cluster up` made (one made by an older raftlet has none either); "
            "remove it yourself if you mean to"
        )
    # The cluster's own files go last: a failure (a server directory that is a mount
    # point, say) leaves a directory the next `down --remove-data` still knows, where
    # removing them first once left one no `cluster` command would take.
    kept = {CONFIG_FILE, STATE_FILE, MADE_BY_UP_FILE}
    failures: list[str] = []
    for child in sorted(root.iterdir()):
        if child.name not in kept:
            _remove_tree(child, failures)
    if failures:
        more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
        raise CliError(
            f"--remove-data: could not remove everything in {root}: "
            + "; ".join(failures[:3])
            + more
            + f"; the rest is removed, and {CONFIG_FILE} kept so this can run again"
        )
    shutil.rmtree(root)


def _remove_tree(path: Path, failures: list[str]) -> None:
    """Remove ``path`` (a file, or a directory and all in it), adding what could not be
    removed, and why, to ``failures``."""

    def failed(_func: object, where: str, exc: BaseException) -> None:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if isinstance(exc, OSError) and exc.errno == errno.EBUSY and os.path.ismount(where):
            why = "a mount point: unmount it, then remove it"
        failures.append(f"{where}: {why}")

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=lambda f, p, info: failed(f, p, info[1]))
        return
    try:
        path.unlink()
    except OSError as exc:
        failed(None, str(path), exc)
