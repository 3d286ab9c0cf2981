"""``raftlet tserver``: run one tablet server in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import sys
import time

from raftlet.cluster import bare_host, parse_host_port
from raftlet.metrics.status_server import StatusServer
from raftlet.tserver.cert_check import FilesRefused
from raftlet.tserver.cpu_affinity import apply_cpu_affinity
from raftlet.tserver.data_dir_lock import ForeignDataDir
from raftlet.tserver.file_modes import apply_umask
from raftlet.tserver.open_files import raise_open_files_limit
from raftlet.tserver.sched_batch import apply_sched_batch, sched_batch_supported
from raftlet.tserver.server import TabletServer
from raftlet.tserver.settings import ServerSettings
from raftlet.tserver.table_layout import LayoutMismatch

__all__ = ["LOG_FORMAT", "UtcFormatter", "run", "status_url"]

logger = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"


class UtcFormatter(logging.Formatter):
    """Times in UTC, ISO 8601 with the zone said (``2026-12-08T00:30:24.291Z``): local time
    without an offset had to be guessed at on a host in another zone, next to the
    launcher's ISO lines and Prometheus's UTC (review r34b)."""

    def converter(self, seconds: float | None) -> time.struct_time:
        return time.gmtime(seconds)

    default_time_format = "%Y-%m-%dT%H:%M:%S"
    default_msec_format = "%s.%03dZ"


def run(settings: ServerSettings) -> int:
    """Serve until asked to stop; 0 after a graceful shutdown, 1 if the server failed, 2 if
    its settings cannot work on this machine or with its data directory."""
    # Before any file is made: rows, logs and metadata are the server's user's alone --
    # those made before the mask was set too (tserver.file_modes).
    umask = int(settings.umask, 8)
    os.umask(umask)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(UtcFormatter(LOG_FORMAT))
    logging.basicConfig(level=settings.log_level, handlers=[handler])
    try:
        open_files = raise_open_files_limit()
    except OSError as e:
        print(f"raftlet tserver: error: {e}", file=sys.stderr)
        return 1
    logger.debug("open-file limit %d", open_files)
    apply_umask(settings.data_dir, umask)
    position = settings.config.server_ids.index(settings.server_id)
    try:
        cpus = apply_cpu_affinity(settings.cpu_affinity, position)
    except (ValueError, OSError) as e:
        flag = f"--cpu_affinity {settings.cpu_affinity}"
        print(f"raftlet tserver: error: {flag}: {e}", file=sys.stderr)
        # ValueError: the flag names CPUs this process may not use (its mask changed since
        # the flag was checked) -- a usage error, 2, which a supervisor does not restart
        # on; OSError: the kernel refused, 1.
        return 2 if isinstance(e, ValueError) else 1
    if cpus is not None:
        logger.info("threads bound to CPU %s", ",".join(str(c) for c in sorted(cpus)))
    if settings.sched_batch:
        _apply_sched_batch()
    try:
        asyncio.run(_serve(settings))
    except (LayoutMismatch, ForeignDataDir, FilesRefused) as e:
        # The config or its files are wrong, not the machine: 2, which a supervisor does
        # not restart on.
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


def status_url(settings: ServerSettings, status: StatusServer) -> str:
    """Where the ready line says the status pages are: https under TLS (the status server's
    own scheme), on the port it is bound to. A server bound to all interfaces (0.0.0.0, [::])
    is named by the host of its config entry's http_addr, which others can dial; one bound
    to a given address (``--http_addr``, perhaps not the config's) by that address."""
    bound = parse_host_port(settings.http_addr)[0]
    if _unspecified(bound):
        return status.url(host=parse_host_port(settings.server.http_addr)[0])
    return status.url(host=bound)


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(bare_host(host)).is_unspecified
    except ValueError:
        return False  # a host name


async def _serve(settings: ServerSettings) -> None:
    server = TabletServer(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        stop.set()
        server.request_stop()  # a start waiting for its peers returns at once

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await server.start()
        if not server.stop_requested:  # else stopped while it waited for its peers
            # One line on stdout that launchers and tests wait for.
            print(
                f"raftlet tserver {settings.server_id} ready: rpc {settings.rpc_addr} "
                f"(port {server.rpc_port}), status {status_url(settings, server.status)}",
                flush=True,
            )
            await stop.wait()
        logger.info("shutting down")
    finally:
        await server.stop()
    logger.info("stopped cleanly")
