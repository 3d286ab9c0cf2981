"""Restart of a replica whose log holds many entries: how long until it can serve.

    .venv/bin/python bench/restart.py [--entries 1000000] [--lag 100000] [--dir /path]

Setup (not measured): in a temporary directory removed at the end, one replica directory as
a tablet server leaves it -- ``consensus-meta``, ``wal/``, ``store.sqlite`` -- built with the
server's own code.  The WAL is written through ``LogStorage`` (fsync off, to build it fast;
the bytes are the same) in batches of 256 entries, which the appender packs into ~64 KiB
records as it does under load.  It holds ``--entries`` entries in ``--terms`` terms, each
term opened by the NO_OP its leader appends; every other entry is what a client's one-row
write becomes: a ``WriteOperationPB`` with a request id (``--clients`` clients taking turns,
each with 4 writes in flight, so ``first_incomplete_seq_no`` trails ``seq_no`` by 3) and a
packed row block of one INSERT into the ``kv`` table (INT64 key, a 100-byte STRING), keys
as ``raftlet write`` makes them: ascending per client.

Cases, each a restart of that directory in a fresh process (so "RSS" is a restarted
server's, not the builder's), timed from constructing the ``TabletReplica`` the way
``tserver/server.py`` does -- ``open_replica`` (store, consensus metadata, every segment
verified and indexed, committed entries above the store's applied index replayed), then the
Raft driver -- through ``start()``:

- ``store lags L``: the store applied all but the last L committed entries, which replay
  applies (setup: the store is brought to N-L with the commit index saved at N-L);
- ``clean``: the store applied everything, so only the log is opened and indexed;
- ``empty store``: all N entries are replayed (a replica whose store was lost).

The log is in the page cache in every case (it was just written), as after a process
crash; a cold cache adds reading it (~190 MB for 1M entries) from disk.  The phase table
splits the time as ``OpenedReplica.seconds`` reports it; "raft" is the rest (the Raft
driver and ``start``).  The consensus metadata is read again on its own to show its share.
"CPU seconds" is the restarted process's CPU time over the same span: on a shared machine,
the part of "seconds to open" that is not waiting for a core.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import raftlet
from raftlet.consensus.core.types import Entry, EntryType, Message
from raftlet.consensus.log import ConsensusMetadata, LogOptions, LogStorage, PersistentState
from raftlet.consensus.ticker import ManualTicker
from raftlet.consensus.transport import ResponseCallback
from raftlet.deploy.local import KV_SCHEMA
from raftlet.proto import common_pb2, tablet_pb2
from raftlet.schema.row_packer import row_packer
from raftlet.schema.rows import OpType
from raftlet.tserver.bootstrap import STORE_FILE, open_replica
from raftlet.tserver.tablet_replica import TabletReplica

VOTERS = ("ts-1", "ts-2", "ts-3")
TABLET = "kv-p0"
IN_FLIGHT = 4  # writes a client has outstanding: first_incomplete_seq_no = seq_no - 3
APPEND_BATCH = 256  # entries per append_async call while building
VALUE_BYTES = 100


def build_log(directory: Path, entries: int, terms: int, clients: int) -> None:
    """Write the replica's WAL and consensus metadata (commit index = last entry)."""
    packer = row_packer(KV_SCHEMA)
    run = random.getrandbits(22)  # key = run << 40 | client << 32 | n, as `raftlet write`
    client_ids = [uuid.uuid4().hex for _ in range(clients)]
    seq = [0] * clients
    per_term = -(-entries // terms)
    errors: list[BaseException] = []

    def done(error: BaseException | None) -> None:
        if error is not None:
            errors.append(error)

    storage = LogStorage.open(directory, LogOptions(fsync=False))
    try:
        batch: list[Entry] = []
        term = 0
        for index in range(1, entries + 1):
            if (index - 1) // per_term + 1 != term:
                term = (index - 1) // per_term + 1
                batch.append(Entry(term, index, EntryType.NO_OP))
            else:
                c = index % clients
                seq[c] += 1
                value = f"{index:>{VALUE_BYTES}}"
                rows, indirect = packer.pack(
                    OpType.INSERT, {"key": run << 40 | c << 32 | seq[c], "value": value}
                )
                write = tablet_pb2.WriteOperationPB(
                    request_id=common_pb2.RequestIdPB(
                        client_id=client_ids[c],
                        seq_no=seq[c],
                        first_incomplete_seq_no=max(1, seq[c] - IN_FLIGHT + 1),
                    ),
                    row_block=tablet_pb2.RowBlockPB(rows=rows, indirect=indirect),
                )
                batch.append(Entry(term, index, EntryType.NORMAL, write.SerializeToString()))
            if len(batch) == APPEND_BATCH:
                storage.append_async(batch, done)
                batch = []
        storage.append(batch)  # returns once everything queued before it is written too
        if errors:
            raise errors[0]
        storage.save_metadata(
            PersistentState(
                current_term=term, voted_for=VOTERS[0], voters=VOTERS, commit_index=entries
            )
        )
    finally:
        storage.close()


def set_commit(directory: Path, commit: int) -> None:
    """Save ``commit`` as the replica's commit index (the rest of its metadata kept)."""
    metadata = ConsensusMetadata.load(directory)
    metadata.save(dataclasses.replace(metadata.state, commit_index=commit))


def remove_store(directory: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        (directory / f"{STORE_FILE}{suffix}").unlink(missing_ok=True)


class NoPeers:
    """A transport that reaches nobody: the restarted replica waits for a leader, which is
    not part of a restart's cost."""

    def send(self, message: Message, on_response: ResponseCallback) -> None:
        pass

    def close(self) -> None:
        pass


def restart(directory: Path) -> dict[str, Any]:
    """Open the replica as the server does (in this process) and report what it took."""
    start, cpu_start = time.perf_counter(), time.process_time()
    replica = TabletReplica(
        tablet_id=TABLET,
        table="kv",
        partition=0,
        num_partitions=1,
        server_id=VOTERS[0],
        voters=VOTERS,
        directory=directory,
        schema=KV_SCHEMA,
        transport=NoPeers(),
        ticker=ManualTicker(),
    )
    replica.start()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    status = _proc_status()
    opened = replica.opened
    entries, replayed, phases = opened.storage.last_index(), opened.replayed, opened.seconds
    replica.stop()
    t0 = time.perf_counter()
    ConsensusMetadata.load(directory)
    return {
        "seconds": seconds,
        "cpu": cpu,
        "entries": entries,
        "replayed": replayed,
        "phases": {**phases, "metadata": time.perf_counter() - t0},
        "rss": status["VmRSS"],
        "peak_rss": status["VmHWM"],
    }


def _proc_status() -> dict[str, int]:
    """Memory figures of this process in bytes, from /proc/self/status."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def restart_in_child(directory: Path) -> dict[str, Any]:
    """``restart`` in a fresh interpreter that imports this same raftlet."""
    root = str(Path(raftlet.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
    out = subprocess.run(
        [sys.executable, __file__, "--restart", str(directory)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def print_tables(cases: list[tuple[str, dict[str, Any]]]) -> None:
    print()
    print(
        "| case | entries in log | entries replayed | seconds to open | CPU seconds | RSS after "
        "| peak RSS |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in cases:
        print(
            f"| {name} | {r['entries']:,} | {r['replayed']:,} | {r['seconds']:.2f} | "
            f"{r['cpu']:.2f} | {_mib(r['rss'])} | {_mib(r['peak_rss'])} |"
        )
    print()
    print("| case | store open s | log open + index s | replay s | raft s | metadata alone s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in cases:
        p = r["phases"]
        rest = r["seconds"] - p["store"] - p["log"] - p["replay"]
        print(
            f"| {name} | {p['store']:.3f} | {p['log']:.2f} | {p['replay']:.2f} | "
            f"{rest:.3f} | {p['metadata']:.4f} |"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000, help="entries in the log")
    parser.add_argument(
        "--lag", type=int, default=100_000, help="entries the lagging store misses (0: skip)"
    )
    parser.add_argument("--terms", type=int, default=4, help="terms the log spans")
    parser.add_argument("--clients", type=int, default=8, help="clients whose writes it holds")
    parser.add_argument(
        "--no-full", dest="full", action="store_false", help="skip the empty-store case"
    )
    parser.add_argument("--dir", default=None, help="where the temporary replica goes")
    parser.add_argument("--restart", default=None, help=argparse.SUPPRESS)  # the child's job
    args = parser.parse_args(argv)
    if args.restart is not None:
        print(json.dumps(restart(Path(args.restart))))
        return
    if not 0 <= args.lag < args.entries or args.terms < 1 or args.clients < 1:
        parser.error("need 0 <= --lag < --entries, --terms >= 1, --clients >= 1")
    base = args.dir or tempfile.gettempdir()
    print(
        f"# bench/restart.py  {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}  "
        f"python {platform.python_version()}  {os.cpu_count()} cpus  dir={base}  "
        f"entries={args.entries:,}  terms={args.terms}  clients={args.clients}"
    )
    with tempfile.TemporaryDirectory(prefix="restartbench-", dir=base) as tmp:
        directory = Path(tmp) / TABLET
        t0 = time.perf_counter()
        build_log(directory, args.entries, args.terms, args.clients)
        wal = sorted((directory / "wal").glob("*.seg"))
        size = sum(p.stat().st_size for p in wal)
        print(
            f"# setup: log of {args.entries:,} entries in {len(wal)} segments, {_mib(size)}, "
            f"written in {time.perf_counter() - t0:.1f} s"
        )
        cases: list[tuple[str, dict[str, Any]]] = []
        if args.lag:
            t0 = time.perf_counter()
            set_commit(directory, args.entries - args.lag)
            open_replica(directory, KV_SCHEMA, VOTERS).close()  # replays up to N - lag
            set_commit(directory, args.entries)
            print(
                f"# setup: store brought to entry {args.entries - args.lag:,} in "
                f"{time.perf_counter() - t0:.1f} s"
            )
            cases.append((f"store lags {args.lag:,}", restart_in_child(directory)))
            cases.append(("clean", restart_in_child(directory)))
        if args.full:
            remove_store(directory)
            cases.append(("empty store", restart_in_child(directory)))
            if not args.lag:
                cases.append(("clean", restart_in_child(directory)))
    print_tables(cases)


if __name__ == "__main__":
    main()
