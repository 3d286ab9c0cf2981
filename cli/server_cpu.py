"""Server CPU time, read from each server's ``/metrics`` before and after a load.

Every tablet server's status page exports ``process_cpu_seconds_total`` (user + system CPU of
the whole process, read when the page is built: ``metrics.process``). ``raftlet write`` reads
it (that metric alone: ``/metrics?name[]=process_cpu_seconds_total``) from every server of
the cluster just before and just after its run; the difference, summed over the servers,
divided by the writes acknowledged, is the **server CPU per acknowledged write** --
replication, fsync bookkeeping and apply on every replica included, the client's own CPU
not. A server that does not answer (down, or an older server without the metric) is
reported as ``None`` and left out of the sum, and the summary says so.
"""

from __future__ import annotations

import concurrent.futures
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from raftlet.cli.common import Credentials
from raftlet.cluster import ServerConfig

__all__ = ["CPU_SAMPLE", "ServerCpu", "parse_cpu_seconds", "read_cpu_seconds"]

CPU_SAMPLE = "process_cpu_seconds_total"


def parse_cpu_seconds(text: str) -> float | None:
    """The value of ``process_cpu_seconds_total`` in Prometheus text (any labels), or None."""
    for line in text.splitlines():
        if not line.startswith(CPU_SAMPLE):
            continue
        rest = line[len(CPU_SAMPLE) :]
        if rest[:1] not in ("{", " "):
            continue  # another metric whose name starts the same
        if rest.startswith("{"):
            rest = rest[rest.index("}") + 1 :]
        try:
            return float(rest.split()[0])
        except (IndexError, ValueError):
            return None
    return None


# Only the one figure: the whole page costs a server tens of ms of CPU with many tablets,
# which the reading after a run would count as the run's.  A server that does not know
# ``name[]`` sends the whole page, which parses the same.
_CPU_PAGE = f"/metrics?{urllib.parse.urlencode({'name[]': CPU_SAMPLE})}"


def _fetch(server: ServerConfig, timeout: float, creds: Credentials) -> float | None:
    opener = creds.http_opener()  # no proxy; TLS and token for a TLS cluster
    try:
        with opener.open(creds.status_url(server.http_addr, _CPU_PAGE), timeout=timeout) as r:
            return parse_cpu_seconds(r.read().decode("utf-8", "replace"))
    except (OSError, ValueError, urllib.error.URLError):
        return None


def read_cpu_seconds(
    servers: Sequence[ServerConfig], timeout_s: float = 2.0, creds: Credentials | None = None
) -> dict[str, float | None]:
    """Each server's CPU seconds so far (None if it did not tell), read in parallel. A
    server that accepts the connection and never answers (paused, hung) costs the timeout
    twice, before and after the run: 5 s added ten seconds to a `write --duration 5`."""
    if not servers:
        return {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(servers))) as pool:
        futures = {s.id: pool.submit(_fetch, s, timeout_s, creds or Credentials()) for s in servers}
    return {sid: f.result() for sid, f in futures.items()}


@dataclass(frozen=True)
class ServerCpu:
    """CPU seconds each server used during a run (None: not known for that server)."""

    by_server: Mapping[str, float | None]

    @classmethod
    def between(
        cls, before: Mapping[str, float | None], after: Mapping[str, float | None]
    ) -> ServerCpu:
        out: dict[str, float | None] = {}
        for sid in sorted(set(before) | set(after)):
            b, a = before.get(sid), after.get(sid)
            # A restarted server's counter starts again: its difference means nothing.
            out[sid] = a - b if a is not None and b is not None and a >= b else None
        return cls(out)

    @property
    def total_s(self) -> float | None:
        """The sum over the servers that told (None if none did)."""
        known = [v for v in self.by_server.values() if v is not None]
        return sum(known) if known else None

    @property
    def missing(self) -> list[str]:
        return [sid for sid, v in self.by_server.items() if v is None]

    def ms_per_write(self, writes: int) -> float | None:
        total = self.total_s
        if total is None or writes <= 0:
            return None
        return total * 1000.0 / writes
