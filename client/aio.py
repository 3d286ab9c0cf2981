"""``AsyncClient``: the client over ``grpc.aio``, for many writes in flight from one thread.

::

    import asyncio
    from raftlet.client import OpType
    from raftlet.client.aio import AsyncClient

    async def main() -> None:
        async with AsyncClient.connect(["127.0.0.1:7051"]) as c:   # or from_config(path)
            await c.insert("kv", {"key": 1, "value": "one"})      # one row, one write
            await asyncio.gather(*(c.insert("kv", {"key": k}) for k in range(2, 66)))
            errors = await c.write("kv", [(OpType.UPSERT, {"key": 1, "value": "uno"}),
                                          (OpType.DELETE, {"key": 2})])
            assert errors == []

    asyncio.run(main())

``AsyncClient.connect(...)`` can also be awaited (``c = await AsyncClient.connect(...)``;
then ``await c.close()``). The shape is the threaded ``Client`` with an
``AUTO_FLUSH_SYNC`` session folded in, because in asyncio concurrency is the caller's tasks,
not the session's threads:

- ``await insert/upsert/update/delete(table, row, timeout_s=None)`` (or ``apply(op_type,
  table, row)``): one row, one write (an item on the server's TCP write port or gRPC
  ``WriteStream``, a unary ``Write`` where neither is offered); returns when it is
  acknowledged, raises ``RowError`` (refused by the client before sending, or by the
  server), ``Timeout`` / ``ServerTooBusy`` / ``NotLeader`` when the deadline passed,
  ``InvalidArgument``, ``TabletNotFound``, ``RemoteError``, ``ClientClosed`` — the
  exceptions of ``raftlet.client``.
  ``RowError.row_index`` is 0.
- ``await write(table, ops)`` (``ops``: ``(OpType, row)`` pairs): ``MANUAL_FLUSH`` in one
  call — rows grouped by tablet in batches of ``max_batch_rows`` rows and at most
  ``max_batch_bytes`` packed bytes (4 MiB, as a session's), the tablets concurrently,
  each tablet's batches in order; returns the errors (``[]`` when every row was applied),
  each with ``row_index`` = the operation's position in ``ops``.
- For ``AUTO_FLUSH_BACKGROUND``-style throughput keep many ``insert`` calls in flight
  (``asyncio.gather``, a pool of worker tasks); ``raftlet write --in-flight N`` does.
- There are no reads: scan with the threaded ``Client`` (in a thread,
  ``asyncio.to_thread``), ``min_index={result.tablet_id: result.op_index}`` to see a write.
  ``to_thread``'s default pool has ``min(32, cpus + 4)`` threads, so as many scans run at
  once: more need an executor of their own (``loop.run_in_executor``).
- Nor the threaded client's admin and checking methods (``checksum``, ``scan_tablet``,
  ``on_leader``, ``admin_stub``, ``leader_step_down``): use a threaded ``Client`` for them.

Cancelling a write (``task.cancel()``, ``asyncio.wait_for``, ``asyncio.timeout``, a
cancelled ``gather``) does not withdraw it: once sent, it is applied or not whatever
becomes of the task, and the ``CancelledError`` / ``TimeoutError`` carries no
``may_have_applied``. Treat a cancelled write as indeterminate -- read it back, or write it
again with ``upsert`` -- and bound a write with ``timeout_s=`` rather than ``wait_for``: its
``Timeout`` says whether the write may have been applied. The client stays usable after a
cancellation (the request id is released, the connection kept).

What the threaded client guarantees holds here, with the same code where it is pure: the
meta cache (``meta_cache.MetaState`` in ``aio_meta.AsyncMetaCache``: config from any seed,
leaders from NOT_LEADER hints and ``ListTablets`` claims), the routing and retry policy
(``rpc.Router``, ``retry.classify``, ``retry.run_with_retries_async``: NOT_LEADER → the hint
or a leader look-up, RESOURCE_EXHAUSTED / LEADER_NOT_READY → backoff on the same server,
UNAVAILABLE → the next replica, all within the operation's deadline), exactly-once request
ids (one ``RequestTracker`` per client: a batch keeps its ``client_id``/``seq_no`` on every
retry, ``first_incomplete_seq_no`` never passes an outstanding one, so a retried write is
applied once), row encoding and errors (``write_batch``), and ``stats`` (``ClientStats``).

Use a client from the event loop it was connected in (its channels are bound to it).
``close()`` closes the channels; writes still in flight then fail. Modules:
``aio_channels`` (one ``grpc.aio`` channel per server, and how a write reaches it:
``aio_tcp_writes``, ``aio_write_stream``), ``aio_meta``, ``aio_rpc``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import (
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, Concatenate, Self

from tenacity.wait import wait_base

from raftlet.client.aio_channels import AsyncChannelPool, AsyncServerStub, AsyncStubProvider
from raftlet.client.aio_meta import AsyncMetaCache
from raftlet.client.aio_rpc import AsyncRpcContext, call_tablet_async
from raftlet.client.arguments import check_timeout, op_type_of, row_of
from raftlet.client.channels import CHANNEL_OPTIONS
from raftlet.client.client import P, parse_seeds, seeds_from_config
from raftlet.client.client_base import ClientBase
from raftlet.client.errors import InvalidArgument, RaftletError, RowError
from raftlet.client.meta_cache import ServerInfo
from raftlet.client.request_tracker import RequestTracker
from raftlet.client.retry import DEFAULT_POLICIES, Cause, RpcFailure
from raftlet.client.session import DEFAULT_MAX_BATCH_BYTES
from raftlet.client.stats import StatsRecorder
from raftlet.client.tls import (
    TlsOptions,
    channel_credentials,
    client_ssl_context,
    uses_token_ports,
)
from raftlet.client.write_batch import (
    Operation,
    WriteResult,
    batch_errors,
    describe_write,
    encode_operation,
    write_failure,
    write_request,
)
from raftlet.proto import admin_pb2, tablet_pb2
from raftlet.schema.rows import OpType

__all__ = ["AsyncClient"]


class _Connecting:
    """What ``AsyncClient.connect`` returns: await it for a connected client, or use it as
    ``async with`` (the client is closed on the way out)."""

    def __init__(self, make: Callable[[], AsyncClient]) -> None:
        self._make = make
        self._client: AsyncClient | None = None

    async def _open(self) -> AsyncClient:
        client = self._make()
        try:
            await client.load()
        except BaseException:
            await client.close()
            raise
        return client

    def __await__(self) -> Generator[Any, None, AsyncClient]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncClient:
        self._client = await self._open()
        return self._client

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.close()

    if not TYPE_CHECKING:  # a type checker must still flag `connect(...).insert`

        def __getattr__(self, name: str) -> Any:
            if hasattr(AsyncClient, name):
                # `c = AsyncClient.connect(...)` without await: c is this, not a client.
                raise AttributeError(
                    f"{name!r}: AsyncClient.connect() and from_config() give the client once "
                    "awaited -- `client = await AsyncClient.connect(...)`, or `async with "
                    "AsyncClient.connect(...) as client:`"
                )
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class AsyncClient(ClientBase[AsyncMetaCache]):
    """A connection to a raftlet cluster for asyncio code, made with ``await
    AsyncClient.connect(...)`` and used from that event loop only; many writes may be in
    flight at once. The module docstring says how errors and retries work."""

    def __init__(
        self,
        seeds: str | Sequence[str],
        *,
        timeout_s: float = 30.0,
        rpc_timeout_s: float = 10.0,
        max_batch_rows: int = 1000,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        retry_policies: Mapping[Cause, wait_base] | None = None,
        channel_options: Sequence[tuple[str, int]] | None = None,
        stubs: AsyncStubProvider | None = None,
        tls: TlsOptions | None = None,
        token: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        tcp_writes: bool = True,
    ) -> None:
        """Not connected yet: use ``AsyncClient.connect(...)`` (or ``await load()``).
        ``timeout_s`` is the default deadline of every operation, retries included, and of
        the config fetch; ``rpc_timeout_s`` caps one attempt. ``tls`` and ``token``: as
        for ``Client`` (``client.tls``). ``tcp_writes``: send writes on each server's tcp
        write port when it has one (``client.aio_tcp_writes``; TLS with the client's
        certificate when ``tls`` is given), else on its gRPC WriteStream; a client with a
        ``token`` (which the tcp port does not take), or False, keeps to the WriteStream.
        ``stubs``, ``clock`` and ``sleep`` are for tests (fake servers, a fake clock)."""
        check_timeout(timeout_s)
        check_timeout(rpc_timeout_s, "rpc_timeout_s")
        if max_batch_rows < 1:
            raise InvalidArgument(f"max_batch_rows must be at least 1, got {max_batch_rows}")
        if max_batch_bytes < 1:
            raise InvalidArgument(f"max_batch_bytes must be at least 1, got {max_batch_bytes}")
        self.timeout_s = float(timeout_s)
        self.max_batch_rows = max_batch_rows
        self.max_batch_bytes = max_batch_bytes
        self._seeds = parse_seeds(seeds)
        self._stats = StatsRecorder()
        self._pool: AsyncChannelPool | None = None
        if stubs is None:
            self._pool = AsyncChannelPool(
                options=list(channel_options) if channel_options is not None else CHANNEL_OPTIONS,
                on_created=lambda _addr: self._stats.channel_created(),
                credentials=channel_credentials(tls, token),
                tcp_writes=tcp_writes and token is None,
                tcp_ssl=client_ssl_context(tls) if tls is not None and token is None else None,
            )
            stubs = self._pool
        self._meta = AsyncMetaCache(
            self._seeds,
            stubs,
            self._stats,
            rpc_timeout_s=rpc_timeout_s,
            clock=clock,
            sleep=sleep,
            token_ports=uses_token_ports(tls),
        )
        self._rpc = AsyncRpcContext(
            meta=self._meta,
            stubs=stubs,
            stats=self._stats,
            attempt_timeout_s=rpc_timeout_s,
            policies=dict(retry_policies if retry_policies is not None else DEFAULT_POLICIES),
            clock=clock,
            sleep=sleep,
        )
        self._tracker = RequestTracker()
        self._closed = False
        # The event loop it connected in: its connections and tasks live there.
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def connect(
        cls: Callable[Concatenate[str | Sequence[str], P], AsyncClient],
        seeds: str | Sequence[str],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> _Connecting:
        """A client of the cluster reachable through ``seeds`` ("host:port" strings, or one
        comma-separated string), its config fetched (``Timeout`` after ``timeout_s``):
        ``async with AsyncClient.connect(...) as c`` or ``c = await AsyncClient.connect(...)``.
        The keywords are the constructor's (typed as them)."""
        return _Connecting(lambda: cls(seeds, *args, **kwargs))

    @classmethod
    def from_config(
        cls: Callable[Concatenate[str | Sequence[str], P], AsyncClient],
        path: str | os.PathLike[str],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> _Connecting:
        """``connect`` to the servers of a ``cluster.toml``."""
        seeds = seeds_from_config(path, token_ports=uses_token_ports(kwargs.get("tls")))
        return _Connecting(lambda: cls(seeds, *args, **kwargs))

    async def load(self) -> Self:
        """Fetch the cluster config (``connect`` does this)."""
        self._check_open()
        self._loop = asyncio.get_running_loop()
        await self._meta.load(self._rpc.clock() + self.timeout_s, self.timeout_s)
        return self

    def _check_open(self) -> None:
        super()._check_open()
        if self._loop is not None and _running_loop() is not self._loop:
            # Its connections belong to that loop: a write sent from here was applied, and
            # its answer waited for a reader that never ran (a Timeout, after the deadline).
            if self._loop.is_closed():
                raise InvalidArgument(
                    "this AsyncClient connected in an event loop that has ended: close it "
                    "(from any loop) and connect a new one in this loop"
                )
            raise InvalidArgument(
                "this AsyncClient connected in another event loop: use it only from that "
                "one (make one client per event loop)"
            )

    # --- the cluster (client_id, seeds, tables, schema, tablets, tablet_for: client_base) --

    def replicas(self, tablet_id: str) -> tuple[str, ...]:
        return self._meta.tablet(tablet_id).replicas

    def servers(self) -> dict[str, ServerInfo]:
        return dict(self._meta.view.servers)

    async def leader_of(self, tablet_id: str, *, refresh: bool = False) -> str | None:
        """The cached leader of ``tablet_id`` (after asking every server if ``refresh`` or
        none is cached); None if no replica claims it, or no server answered
        (``list_tablets`` says which answer)."""
        self._check_open()
        self._meta.tablet(tablet_id)
        if refresh or self._meta.leader(tablet_id) is None:
            await self._meta.refresh_leaders(
                self._rpc.clock() + self.timeout_s, force=True, tablet_id=tablet_id
            )
        return self._meta.leader(tablet_id)

    async def list_tablets(
        self, timeout_s: float | None = None
    ) -> dict[str, tablet_pb2.ListTabletsResponse]:
        """Every reachable server's ``ListTablets`` answer, by server uuid."""
        self._check_open()
        answers = await self._meta.list_tablets(self._timeout(timeout_s))
        return {u: a for u, a in answers.items() if not isinstance(a, RpcFailure)}

    # --- writing ---------------------------------------------------------------------------

    async def insert(
        self, table: str, row: Mapping[str, object], *, timeout_s: float | None = None
    ) -> WriteResult:
        return await self.apply(OpType.INSERT, table, row, timeout_s=timeout_s)

    async def upsert(
        self, table: str, row: Mapping[str, object], *, timeout_s: float | None = None
    ) -> WriteResult:
        """Insert ``row``, or, if its key exists, set the columns ``row`` gives (the others
        keep their values: give a column as None to clear it)."""
        return await self.apply(OpType.UPSERT, table, row, timeout_s=timeout_s)

    async def update(
        self, table: str, row: Mapping[str, object], *, timeout_s: float | None = None
    ) -> WriteResult:
        return await self.apply(OpType.UPDATE, table, row, timeout_s=timeout_s)

    async def delete(
        self, table: str, row: Mapping[str, object], *, timeout_s: float | None = None
    ) -> WriteResult:
        return await self.apply(OpType.DELETE, table, row, timeout_s=timeout_s)

    async def apply(
        self,
        op_type: OpType,
        table: str,
        row: Mapping[str, object],
        *,
        timeout_s: float | None = None,
    ) -> WriteResult:
        """Write one row and wait for its acknowledgement; raises its error (see the module
        docstring). ``timeout_s`` (default the client's) bounds it, retries included.
        Returns where the write is in its tablet's log (``WriteResult``)."""
        self._check_open()
        if timeout_s is not None:
            check_timeout(timeout_s)
        if self._meta.table_view_stale(table):  # checked here: no coroutine for each write
            await self._meta.reload_if_stale(table)
        op_type, row = op_type_of(op_type), row_of(row)
        try:
            op = encode_operation(self._meta, self._stats, 0, op_type, table, row)
        except RowError:
            if not await self._meta.table_changed(table):
                raise
            op = encode_operation(self._meta, self._stats, 0, op_type, table, row)
        result, errors = await self._write(op.tablet_id, [op], timeout_s)
        if errors:
            raise errors[0]
        assert result is not None  # no errors: acknowledged
        return result

    async def write(
        self,
        table: str,
        ops: Iterable[tuple[OpType, Mapping[str, object]]],
        *,
        timeout_s: float | None = None,
    ) -> list[RaftletError]:
        """Write many rows of ``table`` (``(OpType, row)`` pairs) and wait until each has an
        outcome; returns the errors, one per failed operation, by position in ``ops``."""
        self._check_open()
        if timeout_s is not None:
            check_timeout(timeout_s)
        if self._meta.table_view_stale(table):
            await self._meta.reload_if_stale(table)
        self._meta.table(table)  # an unknown table fails the call, not each row
        errors: list[RaftletError] = []
        groups: dict[str, list[Operation]] = {}
        try:
            if isinstance(ops, str | bytes | Mapping):  # iterable, but of no pairs
                raise TypeError
            items = iter(ops)
        except TypeError:
            raise InvalidArgument(
                f"ops must be an iterable of (OpType, row) pairs, not {type(ops).__name__}"
            ) from None
        for index, item in enumerate(items):
            row: dict[str, object] = {}  # what the error reports of a row that is none
            try:
                op_type, given = item
            except (TypeError, ValueError):
                bad = InvalidArgument(f"an operation is an (OpType, row) pair, not {item!r:.80}")
                self._stats.error(bad.cause)
                errors.append(bad.for_operation(index, table, row))
                continue
            try:
                row = row_of(given)
                op = encode_operation(
                    self._meta, self._stats, index, op_type_of(op_type), table, row
                )
            except RowError as e:
                errors.append(e)
                continue
            except InvalidArgument as e:  # a key that cannot be routed
                self._stats.error(e.cause)
                errors.append(e.for_operation(index, table, row))
                continue
            groups.setdefault(op.tablet_id, []).append(op)

        async def send_group(tablet_id: str, group: list[Operation]) -> list[RaftletError]:
            out: list[RaftletError] = []
            for batch in _batches(group, self.max_batch_rows, self.max_batch_bytes):
                out.extend(await self._send_batch(tablet_id, batch, timeout_s))
            return out

        results = await asyncio.gather(*(send_group(t, g) for t, g in groups.items()))
        for result in results:
            errors.extend(result)
        errors.sort(key=lambda e: e.row_index if e.row_index is not None else -1)
        return errors

    async def _send_batch(
        self, tablet_id: str, ops: list[Operation], timeout_s: float | None
    ) -> list[RaftletError]:
        """One Write RPC of ``ops`` (all of ``tablet_id``), retried with one request id."""
        return (await self._write(tablet_id, ops, timeout_s))[1]

    async def _write(
        self, tablet_id: str, ops: list[Operation], timeout_s: float | None
    ) -> tuple[WriteResult | None, list[RaftletError]]:
        """``_send_batch``, with where the write landed when it was acknowledged."""
        rpc = self._rpc
        tracker = self._tracker
        timeout = self._timeout(timeout_s)
        seq_no = tracker.new_seq_no()
        request = write_request(tablet_id, ops, tracker.client_id, seq_no)

        async def write(
            stub: AsyncServerStub, attempt_timeout: float, attempt_no: int
        ) -> tablet_pb2.WriteResponse:
            request.request_id.attempt_no = attempt_no
            request.request_id.first_incomplete_seq_no = tracker.first_incomplete_seq_no()
            return await stub.write(request, attempt_timeout)

        start = rpc.clock()
        try:
            response, _server = await call_tablet_async(
                rpc,
                tablet_id,
                write,
                what=describe_write(len(ops), tablet_id),
                deadline=start + timeout,
                timeout_s=timeout,
            )
        except RaftletError as e:
            rpc.stats.error(e.cause, len(ops))
            failure = write_failure(e)
            return None, [failure.for_operation(op.index, op.table, op.row) for op in ops]
        finally:
            tracker.complete(seq_no)
        rpc.stats.write_acked(len(ops), rpc.clock() - start)
        result = WriteResult(response.op_index, response.op_term, tablet_id)
        return result, batch_errors(response, ops, tablet_id, rpc.stats)

    # --- admin -----------------------------------------------------------------------------

    async def leader_step_down(
        self, tablet_id: str, new_leader: str = "", *, timeout_s: float | None = None
    ) -> str:
        """Ask the leader of ``tablet_id`` to hand leadership to ``new_leader`` (or its most
        caught-up follower), if that one answers the leader (retried until the timeout while
        it does not); returns the uuid of the server that stepped down."""
        self._check_open()
        if new_leader and new_leader not in self._meta.tablet(tablet_id).replicas:
            raise InvalidArgument(f"{new_leader!r} hosts no replica of tablet {tablet_id}")
        timeout = self._timeout(timeout_s)
        request = admin_pb2.LeaderStepDownRequest(tablet_id=tablet_id, new_leader_uuid=new_leader)

        async def step_down(
            stub: AsyncServerStub, attempt_timeout: float, _attempt: int
        ) -> admin_pb2.LeaderStepDownResponse:
            return await stub.leader_step_down(request, attempt_timeout)

        _, server = await call_tablet_async(
            self._rpc,
            tablet_id,
            step_down,
            what=f"leader step-down of tablet {tablet_id}",
            deadline=self._rpc.clock() + timeout,
            timeout_s=timeout,
        )
        self._meta.forget_leader(tablet_id)
        return server

    # --- lifecycle -------------------------------------------------------------------------

    # stats, closed and _check_open: inherited (client_base)

    async def close(self) -> None:
        """Close the channels (idempotent); later calls raise ``ClientClosed``. In the event
        loop it connected in, as every other call: its connections belong to that loop --
        unless that loop has ended (``asyncio.run`` returned with the client open), when
        nothing can race the close any more, and any loop may close it."""
        if self._closed:
            return
        if (
            self._loop is not None
            and _running_loop() is not self._loop
            and not self._loop.is_closed()
        ):
            # Closed here, its sockets were left open and the client could not be closed
            # again; raised before anything changes, the caller can still close it there.
            raise InvalidArgument(
                "this AsyncClient connected in another event loop: close it in that one, "
                "before that loop ends"
            )
        self._closed = True
        if self._pool is not None:
            await self._pool.close()

    async def __aenter__(self) -> Self:
        if self._loop is None:  # `async with AsyncClient(...)`: not connected yet
            await self.load()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<raftlet AsyncClient {self.client_id[:8]} seeds={','.join(self._seeds)} {state}>"


def _batches(ops: list[Operation], max_rows: int, max_bytes: int) -> Iterator[list[Operation]]:
    """``ops`` in order, cut at ``max_rows`` rows or before a row that would take a batch
    past ``max_bytes`` (a row larger than that goes alone), as a session cuts them: forty
    1 MiB rows in one request had failed whole as MessageTooLarge."""
    batch: list[Operation] = []
    size = 0
    for op in ops:
        if batch and (len(batch) >= max_rows or size + op.nbytes > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(op)
        size += op.nbytes
    if batch:
        yield batch


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
