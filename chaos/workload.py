"""The chaos workload: registers read and written concurrently, and unique inserts.

Two tables, created by the run's cluster config:

- ``registers (key INT64, value INT64 NULL)``: ``keys`` registers. Register workers pick a
  key at random and either write it (an UPSERT of a value no other write uses, so a read
  names the write it saw) or read it: a linearizable leader read of that one key through the
  client (which prunes it to its tablet), or -- a ``direct_read_fraction`` of reads -- the
  same read sent straight to a server picked at random, as a client whose cache still names
  a deposed leader would send it. A server that is not the leader must refuse it. Likewise a
  ``direct_write_fraction`` of the writes go straight to a random server, once, without the
  client's retries: clients with other views of who leads, whose acknowledged writes a
  deposed leader's answers are then measured against.
- ``inserts (id INT64, process INT64)``: insert workers INSERT ids no one else uses; after
  the run every acknowledged id must be there and none reported failed may be.

Every operation goes through the public client library, but for direct reads and writes to
one chosen server (``ServerProbe``'s stubs), and is recorded in a ``History`` with
its outcome: OK; FAIL when the client says it cannot have been applied
(``may_have_applied`` False); INFO when nobody knows (a deadline, a lost connection). After
an INFO a worker continues as a new *process*: its old operation may still take effect at any
time, and the checker must treat that process as still busy with it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import threading
import uuid
from collections.abc import Callable
from functools import partial

import grpc

from raftlet.chaos.history import History, OpKind, Outcome
from raftlet.chaos.options import WorkloadOptions
from raftlet.chaos.servers import ServerProbe
from raftlet.client import Client
from raftlet.client.aio import AsyncClient
from raftlet.client.errors import RaftletError
from raftlet.client.retry import classify, refused_before_log
from raftlet.client.scanner import ReadMode
from raftlet.client.write_batch import code_name
from raftlet.cluster import TableConfig
from raftlet.proto import tablet_pb2
from raftlet.schema.predicates import Predicate
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType

__all__ = ["INSERTS", "REGISTERS", "Workload", "chaos_tables"]

logger = logging.getLogger(__name__)

REGISTERS = "registers"
INSERTS = "inserts"

REGISTERS_SCHEMA = Schema(
    [
        ColumnSchema("key", DataType.INT64, is_key=True),
        ColumnSchema("value", DataType.INT64, nullable=True),
    ]
)
INSERTS_SCHEMA = Schema(
    [
        ColumnSchema("id", DataType.INT64, is_key=True),
        ColumnSchema("process", DataType.INT64),
    ]
)


def chaos_tables(replication: int, partitions: int = 2) -> tuple[TableConfig, TableConfig]:
    """The two tables of a chaos run, each split so that faults hit several tablets."""
    return (
        TableConfig(REGISTERS, REGISTERS_SCHEMA, partitions, replication),
        TableConfig(INSERTS, INSERTS_SCHEMA, partitions, replication),
    )


class Workload:
    """Worker threads running operations against ``client`` until ``stop``."""

    def __init__(
        self,
        client: Client,
        options: WorkloadOptions,
        history: History,
        probe: ServerProbe | None = None,
    ) -> None:
        """``probe`` (the servers, one by one) is needed for direct reads and writes."""
        self.client = client
        self.probe = probe
        self._servers = [s.id for s in probe.config.servers] if probe is not None else []
        # Direct writes carry request ids of their own (one client, one sequence).
        self._direct_client_id = f"chaos-direct-{uuid.uuid4().hex[:12]}"
        self._direct_seq = itertools.count(1)
        self.options = options
        self.history = history
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._processes = itertools.count()
        self._values = itertools.count(1)
        self._ids = itertools.count(1)
        self._next_lock = threading.Lock()

    def _next(self, counter: itertools.count[int]) -> int:
        with self._next_lock:
            return next(counter)

    def start(self) -> None:
        opts = self.options
        for i in range(opts.register_workers):
            rng = random.Random(opts.seed * 1_000 + i)
            self._spawn(f"chaos-register-{i}", lambda rng=rng: self._registers(rng))
        for i in range(opts.insert_workers):
            self._spawn(f"chaos-insert-{i}", self._inserts)
        for i in range(opts.async_insert_workers):
            self._spawn(f"chaos-aio-insert-{i}", lambda: asyncio.run(self._async_inserts()))

    def _spawn(self, name: str, target: object) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)  # type: ignore[arg-type]
        self._threads.append(t)
        t.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Ask every worker to finish its operation in progress, and wait for them."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout_s)

    # --- operations ------------------------------------------------------------------------

    def read(self, process: int, key: int, rng: random.Random | None = None) -> Outcome:
        """One linearizable read of register ``key``, recorded; sent straight to a random
        server instead of through the client when ``rng`` draws a direct read."""
        direct = self.options.direct_read_fraction
        if rng is not None and self.probe is not None and rng.random() < direct:
            return self._direct_read(process, key, rng.choice(self._servers))
        started = self.history.call()
        try:
            rows = list(
                self.client.scan(
                    REGISTERS,
                    predicates=[Predicate.equals("key", key)],
                    read_mode=ReadMode.LEADER_LATEST,
                    timeout_s=self.options.op_timeout_s,
                )
            )
        except RaftletError as e:
            # A read changes nothing: whatever happened, it carries no information.
            error = f"{e.cause}: {e}"  # the cause first, as every other record has it
            self.history.done(started, process, OpKind.READ, key, None, Outcome.FAIL, error)
            return Outcome.FAIL
        value = rows[0]["value"] if rows else None
        self.history.done(started, process, OpKind.READ, key, value, Outcome.OK)
        return Outcome.OK

    def _direct_read(self, process: int, key: int, sid: str) -> Outcome:
        assert self.probe is not None
        tablet = self.client.tablet_for(REGISTERS, {"key": key})
        started = self.history.call()
        try:
            value = self.probe.leader_read(
                sid, tablet, REGISTERS_SCHEMA, key, self.options.direct_timeout_s
            )
        except grpc.RpcError as e:
            error = f"{sid}: {e.code().name}"
            self.history.done(started, process, OpKind.READ, key, None, Outcome.FAIL, error)
            return Outcome.FAIL
        self.history.done(started, process, OpKind.READ, key, value, Outcome.OK)
        return Outcome.OK

    def _direct_write(self, process: int, key: int, value: int, rng: random.Random) -> int:
        """One UPSERT sent straight to a random server, once; the process to go on with."""
        assert self.probe is not None
        sid = rng.choice(self._servers)
        tablet = self.client.tablet_for(REGISTERS, {"key": key})
        request_id = (self._direct_client_id, self._next(self._direct_seq))
        started = self.history.call()
        try:
            response = self.probe.write_row(
                sid, tablet, REGISTERS_SCHEMA, {"key": key, "value": value}, request_id,
                self.options.direct_timeout_s,
            )  # fmt: skip
            # An UPSERT of a valid row has no row error to give: any would be a refusal.
            outcome = Outcome.FAIL if response.row_errors else Outcome.OK
            error = _row_error(response.row_errors[0]) if response.row_errors else ""
        except grpc.RpcError as e:
            failure = classify(e, sid)
            outcome = Outcome.FAIL if refused_before_log(failure) else Outcome.INFO
            error = f"{sid}: {failure.cause}"
        self.history.done(started, process, OpKind.WRITE, key, value, outcome, error)
        return self._next(self._processes) if outcome is Outcome.INFO else process

    def _registers(self, rng: random.Random) -> None:
        opts = self.options
        process = self._next(self._processes)
        session = self.client.new_session(timeout_s=opts.op_timeout_s)
        try:
            while not self._stop.is_set():
                key = rng.randrange(opts.keys)
                if rng.random() < opts.read_fraction:
                    self.read(process, key, rng)
                    continue
                value = self._next(self._values)
                if rng.random() < opts.direct_write_fraction and self.probe is not None:
                    process = self._direct_write(process, key, value, rng)
                    continue
                row = {"key": key, "value": value}
                process = self._write(
                    process, OpKind.WRITE, key, value, partial(session.upsert, REGISTERS, row)
                )
        finally:
            session.close()

    def _inserts(self) -> None:
        process = self._next(self._processes)
        session = self.client.new_session(timeout_s=self.options.op_timeout_s)
        try:
            while not self._stop.is_set():
                row_id = self._next(self._ids)
                row = {"id": row_id, "process": process}
                process = self._write(
                    process, OpKind.INSERT, row_id, process, partial(session.insert, INSERTS, row)
                )
        finally:
            session.close()

    async def _async_inserts(self) -> None:
        """Inserts as ``_inserts`` makes them, one at a time, through the asyncio client."""
        process = self._next(self._processes)
        client = AsyncClient(self.client.seeds, timeout_s=self.options.op_timeout_s)
        while True:  # the cluster config, from any server that answers
            try:
                await client.load()
                break
            except RaftletError:
                if self._stop.is_set():
                    await client.close()
                    return
        try:
            while not self._stop.is_set():
                row_id = self._next(self._ids)
                started = self.history.call()
                try:
                    await client.insert(INSERTS, {"id": row_id, "process": process})
                    failure = None
                except RaftletError as e:
                    failure = e
                process = self._record(started, process, OpKind.INSERT, row_id, process, failure)
        finally:
            await client.close()

    def _write(
        self, process: int, kind: OpKind, key: int, value: int, write: Callable[[], object]
    ) -> int:
        """Run and record one write; the process number to go on with (a new one after an
        INFO: the old operation may still take effect, so that process is still busy)."""
        started = self.history.call()
        try:
            write()
            failure = None
        except RaftletError as e:
            failure = e
        return self._record(started, process, kind, key, value, failure)

    def _record(
        self,
        started: tuple[int, int],
        process: int,
        kind: OpKind,
        key: int,
        value: int,
        failure: RaftletError | None,
    ) -> int:
        if failure is None:
            outcome, error = Outcome.OK, ""
        else:
            # A RowError is certain (may_have_applied False): KEY_EXISTS on an id no one else
            # inserts means our own retry applied twice, which the insert check then finds.
            outcome = Outcome.INFO if failure.may_have_applied else Outcome.FAIL
            error = f"{failure.cause}: {failure}"
        self.history.done(started, process, kind, key, value, outcome, error)
        return self._next(self._processes) if outcome is Outcome.INFO else process


def _row_error(error: tablet_pb2.RowErrorPB) -> str:
    """A row error as the history records it: its code first, as every other cause is."""
    return f"{code_name(error.code)}: {error.message}"
