"""``raftlet chaos``: start a throw-away cluster, run faults under load, check the history.

Everything is the ``chaos`` package's (``chaos.run``); this module only turns the command
line into ``ChaosOptions``, prints the report, and says with its exit status whether the run
passed (0), found a violation or could not finish (1). Arguments that would only fail after
the run -- a used work directory, a history file that cannot be written -- are usage errors
(2) before anything starts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from raftlet.cli.common import (
    CliError,
    UsageError,
    positive_float,
    print_out,
    timeout_seconds,
)

__all__ = ["add_parser", "run"]

_EPILOG = """\
examples:
  raftlet chaos --duration 60
  raftlet chaos --duration 900 --seed 7 --history chaos-history.jsonl
  raftlet chaos --faults pause,partition-leader --duration 120
  raftlet chaos --leader-read-mode lease --duration 120
  raftlet chaos --unsafe stale-reads --faults partition-leader,pause   # must FAIL

Faults: kill, pause, partition-leader, partition-halves, partition-bridge, slow-disk,
restart-all. Partitions use network namespaces when run as root (iproute2), otherwise
per-link TCP proxies between loopback servers. Every process is stopped at the end. Without
--work-dir the cluster's files go to a temporary directory, removed after a PASS and kept
after a FAIL (the report says where); a FAIL's report also lists the ids of lost inserts.
The history file starts with the run's wall-clock start and its fault log, and is saved also
when the run is interrupted (Ctrl-C, SIGTERM).
"""


def _server_count(text: str) -> int:
    from raftlet.chaos.options import MAX_SERVERS, MIN_SERVERS

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not MIN_SERVERS <= n <= MAX_SERVERS:
        raise argparse.ArgumentTypeError(f"must be {MIN_SERVERS} to {MAX_SERVERS}, got {n}")
    return n


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    from raftlet.chaos.nemesis import ALL_FAULTS
    from raftlet.chaos.options import (
        BACKENDS,
        LEADER_READ_MODES,
        MAX_SERVERS,
        MIN_SERVERS,
        UNSAFE_SWITCHES,
    )

    p = commands.add_parser(
        "chaos",
        help="run faults against a throw-away cluster under load and check linearizability",
        description=(
            "Start a cluster, run a register and insert workload while a nemesis kills, "
            "pauses, partitions and slows its servers on a seeded schedule, then heal it and "
            "check the history: linearizable registers, no lost acknowledged insert, equal "
            "replicas."
        ),
        epilog=_EPILOG,
        formatter_class=formatter,
        allow_abbrev=False,
    )
    p.add_argument(
        "--duration",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="seconds of faults (default: 60)",
    )
    p.add_argument("--seed", type=int, default=1, help="the fault schedule's seed (default: 1)")
    p.add_argument(
        "--faults",
        default=",".join(ALL_FAULTS),
        metavar="KIND[,KIND…]",
        help="fault kinds to draw from (default: all)",
    )
    p.add_argument(
        "--servers",
        type=_server_count,
        default=3,
        metavar="N",
        help=f"tablet servers, {MIN_SERVERS} to {MAX_SERVERS} (default: 3)",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="how to partition: network namespaces (root and iproute2), per-link TCP proxies, "
        "or auto (namespaces when they work; the default)",
    )
    p.add_argument(
        "--leader-read-mode",
        choices=LEADER_READ_MODES,
        default="read_index",
        help="how leaders serve linearizable reads (the servers' --leader_read_mode; default: "
        "read_index)",
    )
    p.add_argument(
        "--keys", type=int, default=12, help="registers the workload reads and writes (default: 12)"
    )
    p.add_argument(
        "--register-workers",
        type=int,
        default=6,
        metavar="N",
        help="threads reading and writing the registers (default: 6)",
    )
    p.add_argument(
        "--insert-workers",
        type=int,
        default=2,
        metavar="N",
        help="threads inserting unique rows on the threaded client (default: 2)",
    )
    p.add_argument(
        "--async-insert-workers",
        type=int,
        default=1,
        metavar="N",
        help="insert workers on the asyncio client (its writes take the plain-TCP write port; "
        "default: 1)",
    )
    p.add_argument(
        "--op-timeout",
        type=timeout_seconds,
        default=5.0,
        metavar="S",
        help="deadline of one operation (default: 5)",
    )
    p.add_argument(
        "--check-budget",
        type=timeout_seconds,
        default=60.0,
        metavar="S",
        help="checker time per key (default: 60)",
    )
    p.add_argument(
        "--history",
        type=Path,
        metavar="FILE",
        help="save the history here (JSON lines: the run's start and fault log, then every "
        "operation), also when interrupted; its directory must exist",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        metavar="DIR",
        help="keep the cluster's files here; a new or empty directory (default: a temporary "
        "one, removed after a PASS, kept after a FAIL)",
    )
    p.add_argument(
        "--unsafe",
        default="",
        metavar="SWITCH[,…]",
        help=f"negative control: break a guarantee on purpose ({', '.join(UNSAFE_SWITCHES)})",
    )
    p.add_argument(
        "--tserver-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="one more flag for every server, e.g. --tserver-flag=--log_gc_interval_s=0.5 "
        "(repeatable)",
    )
    p.add_argument("--quiet", action="store_true", help="only the report")


def _list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def run(args: argparse.Namespace) -> int:
    from raftlet.chaos.options import (
        UNSAFE_SWITCHES,
        ChaosOptions,
        WorkloadOptions,
        history_path_problem,
        work_dir_problem,
    )
    from raftlet.chaos.run import ChaosStartError, run_chaos
    from raftlet.cli.tserver_args import build_tserver_parser

    # Set by options of chaos's own, which its report and history name: given again as a
    # server flag it won (it comes last), and a run in lease mode was reported as ReadIndex.
    own = {"--leader_read_mode": "--leader-read-mode"}
    own |= {
        flag.split("=", 1)[0]: f"--unsafe {name}"
        for name, flags in UNSAFE_SWITCHES.items()
        for flag in flags
    }
    for flag in args.tserver_flag:
        name = flag.split("=", 1)[0]
        if name in own:
            raise UsageError(
                f"--tserver-flag={flag}: set it with {own[name]}, which the report and the "
                "history name"
            )
    if args.tserver_flag:
        # The server's own parser: a typo is a usage error now, not three failed starts.
        check = build_tserver_parser("raftlet chaos --tserver-flag")
        check.parse_args(["--config", "-", "--server_id", "-", *args.tserver_flag])

    try:
        options = ChaosOptions(
            duration_s=args.duration,
            seed=args.seed,
            faults=_list(args.faults),
            servers=args.servers,
            backend=args.backend,
            workload=WorkloadOptions(
                keys=args.keys,
                register_workers=args.register_workers,
                insert_workers=args.insert_workers,
                async_insert_workers=args.async_insert_workers,
                op_timeout_s=args.op_timeout,
                seed=args.seed,
            ),
            check_budget_s=args.check_budget,
            unsafe=_list(args.unsafe),
            leader_read_mode=args.leader_read_mode,
            tserver_flags=tuple(args.tserver_flag),
            work_dir=args.work_dir,
            history_path=args.history,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    # Before the cluster starts: found at the end they would cost the run or its history.
    if args.work_dir is not None and (why := work_dir_problem(args.work_dir)) is not None:
        raise UsageError(why)
    if args.history is not None and (why := history_path_problem(args.history)) is not None:
        raise UsageError(why)
    if not args.quiet:
        logging.basicConfig(level=logging.WARNING, format="%(message)s")

    # The run goes on to its verdict, and undoes its faults, whether or not anyone reads.
    def log(line: str) -> None:
        if not args.quiet:
            print_out(line, file=sys.stderr)

    def warn(line: str) -> None:
        print_out(f"raftlet chaos: {line}", file=sys.stderr)

    try:
        report = run_chaos(options, log, warn)
    except ChaosStartError as e:
        raise CliError(str(e)) from None
    print_out(report.format())
    return 0 if report.ok else 1
