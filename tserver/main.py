"""``raftlet tserver``: run one tablet server in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from raftlet.tserver.cpu_affinity import apply_cpu_affinity
from raftlet.tserver.data_dir_lock import ForeignDataDir
from raftlet.tserver.open_files import raise_open_files_limit
from raftlet.tserver.sched_batch import apply_sched_batch, sched_batch_supported
from raftlet.tserver.server import TabletServer
from raftlet.tserver.settings import ServerSettings
from raftlet.tserver.table_layout import LayoutMismatch

__all__ = ["run"]

logger = logging.getLogger(__name__)


def run(settings: ServerSettings) -> int:
    """Serve until asked to stop; 0 after a graceful shutdown, 1 if the server failed."""
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        open_files = raise_open_files_limit()
    except OSError as e:
        print(f"raftlet tserver: error: {e}", file=sys.stderr)
        return 1
    logger.debug("open-file limit %d", open_files)
    position = settings.config.server_ids.index(settings.server_id)
    try:
        cpus = apply_cpu_affinity(settings.cpu_affinity, position)
    except (ValueError, OSError) as e:
        flag = f"--cpu_affinity {settings.cpu_affinity}"
        print(f"raftlet tserver: error: {flag}: {e}", file=sys.stderr)
        return 1
    if cpus is not None:
        logger.info("threads bound to CPU %s", ",".join(str(c) for c in sorted(cpus)))
    if settings.sched_batch:
        _apply_sched_batch()
    try:
        asyncio.run(_serve(settings))
    except (LayoutMismatch, ForeignDataDir) as e:
        # The config is wrong, not the machine: 2, which a supervisor does not restart on.
        print(f"raftlet tserver: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"raftlet tserver: error: {e}", file=sys.stderr)
        return 1
    return 0


def _apply_sched_batch() -> None:
    # Only a scheduling hint: a server that cannot have it runs as before, and says so.
    if not sched_batch_supported():
        logger.info("--sched_batch: this platform has no SCHED_BATCH; default policy kept")
        return
    try:
        apply_sched_batch()
    except OSError as e:
        logger.warning("--sched_batch: the kernel refused SCHED_BATCH (%s); default policy kept", e)
        return
    logger.info("threads run under SCHED_BATCH")


async def _serve(settings: ServerSettings) -> None:
    server = TabletServer(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        # One line on stdout that launchers and tests wait for.
        print(
            f"raftlet tserver {settings.server_id} ready: rpc {settings.rpc_addr} "
            f"(port {server.rpc_port}), status http://{settings.http_addr}/",
            flush=True,
        )
        await stop.wait()
        logger.info("shutting down")
    finally:
        await server.stop()
    logger.info("stopped cleanly")
