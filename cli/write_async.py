"""``raftlet write --in-flight N``: N single-row writes kept in flight by one event loop.

One ``AsyncClient`` (``raftlet.client.aio``: one ``grpc.aio`` channel per server, the
threaded client's routing, retries and exactly-once request ids), N worker tasks, each
inserting one row and, when it is acknowledged, the next: a closed loop with exactly N
writes outstanding until the rows or the time run out. Keys come from ``RowFactory`` with
writer slot 0 and one counter shared by the tasks, so they are unique as in thread mode.

Ctrl-C / SIGTERM stop the workers after the write each has in flight; the summary is printed
and marked interrupted. Figures come from ``AsyncClient.stats`` exactly as in thread mode
(``write_load.summarize``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from typing import TYPE_CHECKING

from raftlet.cli.common import CliError, Target
from raftlet.cli.write_load import LoadState, LoadSummary, OnTick, RowFactory, summarize
from raftlet.schema.schema import Schema

if TYPE_CHECKING:
    from raftlet.client.aio import AsyncClient

__all__ = ["run_load_async"]


def run_load_async(
    target: Target,
    table: str,
    schema: Schema,
    *,
    rows: int | None,
    duration_s: float | None,
    in_flight: int,
    row_bytes: int,
    timeout_s: float,
    keys: str = "rising",
    on_tick: OnTick | None = None,
    tick_s: float = 0.2,
) -> LoadSummary:
    """Run the load in a new event loop and return its summary."""
    return asyncio.run(
        _load(
            target,
            table,
            schema,
            rows=rows,
            duration_s=duration_s,
            in_flight=in_flight,
            row_bytes=row_bytes,
            timeout_s=timeout_s,
            keys=keys,
            on_tick=on_tick,
            tick_s=tick_s,
        )
    )


async def _connect(target: Target, timeout_s: float) -> AsyncClient:
    from raftlet.client import RaftletError
    from raftlet.client.aio import AsyncClient

    try:
        kwargs = target.creds.client_kwargs()
        return await AsyncClient.connect(target.client_seeds(), timeout_s=timeout_s, **kwargs)
    except RaftletError as e:
        raise CliError(f"cannot connect to the cluster: {e}") from None


async def _load(
    target: Target,
    table: str,
    schema: Schema,
    *,
    rows: int | None,
    duration_s: float | None,
    in_flight: int,
    row_bytes: int,
    timeout_s: float,
    keys: str,
    on_tick: OnTick | None,
    tick_s: float,
) -> LoadSummary:
    from raftlet.client import ClientClosed, RaftletError

    factory = RowFactory(schema, row_bytes, keys=keys)
    shared = LoadState()
    numbers = itertools.count()
    client = await _connect(target, timeout_s)
    interrupted = False

    def on_signal() -> None:
        nonlocal interrupted
        interrupted = True
        shared.stop.set()

    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal)
            handled.append(sig)

    async def worker() -> None:
        try:
            while not shared.stop.is_set():
                n = next(numbers)
                if rows is not None and n >= rows:
                    return
                try:
                    await client.insert(table, factory.row(0, n))
                except ClientClosed:
                    return
                except RaftletError as e:  # this row failed; the load goes on
                    shared.failed(e)
                shared.submitted += 1
        except Exception as e:  # a bug: stop everyone, report it once (as thread mode)
            shared.fatal = shared.fatal or f"writer: {type(e).__name__}: {e}"
            shared.stop.set()

    try:
        before = client.stats
        start = time.monotonic()
        cpu_start = time.process_time()
        tasks = [asyncio.create_task(worker()) for _ in range(in_flight)]
        pending = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=tick_s)
            elapsed = time.monotonic() - start
            if duration_s is not None and elapsed >= duration_s:
                shared.stop.set()
            if on_tick is not None:
                on_tick(elapsed, client.stats, shared)
        elapsed = time.monotonic() - start
        cpu = time.process_time() - cpu_start
        after = client.stats
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        await client.close()
    if shared.fatal:
        raise CliError(shared.fatal)
    return summarize(
        before,
        after,
        shared,
        elapsed,
        table,
        None,
        "sync",
        row_bytes,
        interrupted,
        in_flight=in_flight,
        client_cpu_s=cpu,
    )
