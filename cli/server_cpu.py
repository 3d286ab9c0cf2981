"""Server CPU time, read from each server's ``/metrics`` before and after a load.

Every tablet server's status page exports ``process_cpu_seconds_total`` (user + system CPU of
the whole process, read when the page is built: ``metrics.process``). ``raftlet write`` reads
it (that metric alone: ``/metrics?name[]=process_cpu_seconds_total``) from every server of
the cluster just before and just after its run; the difference, summed over the servers,
divided by the writes acknowledged, is the **server CPU per acknowledged write** --
replication, fsync bookkeeping and apply on every replica included, the client's own CPU
not. A server that does not answer (down, or an older server without the metric) is
reported as ``None`` and left out of the sum, and the summary says so. So is a server that
restarted during the run: its ``process_start_time_seconds`` (read with the CPU time)
changed, and the CPU of its first process is gone with it -- the difference of the two
processes' counters passed for its CPU, 30% of the cluster's short (review r31a). A server
too old to say when it started is taken for restarted only if its counter went down.
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

__all__ = [
    "CPU_SAMPLE",
    "CpuReading",
    "ServerCpu",
    "parse_cpu_reading",
    "parse_cpu_seconds",
    "read_cpu_seconds",
]

CPU_SAMPLE = "process_cpu_seconds_total"
START_SAMPLE = "process_start_time_seconds"


@dataclass(frozen=True)
class CpuReading:
    """A server's CPU seconds so far, and when its process started (None: not said)."""

    seconds: float
    started: float | None = None


def parse_cpu_seconds(text: str) -> float | None:
    """The value of ``process_cpu_seconds_total`` in Prometheus text (any labels), or None."""
    return _sample(text, CPU_SAMPLE)


def parse_cpu_reading(text: str) -> CpuReading | None:
    """The CPU seconds and start time in Prometheus text; None without the CPU seconds."""
    seconds = _sample(text, CPU_SAMPLE)
    return None if seconds is None else CpuReading(seconds, _sample(text, START_SAMPLE))


def _sample(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name) :]
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
_CPU_PAGE = "/metrics?" + urllib.parse.urlencode([("name[]", CPU_SAMPLE), ("name[]", START_SAMPLE)])


def _fetch(server: ServerConfig, timeout: float, creds: Credentials) -> CpuReading | None:
    opener = creds.http_opener()  # no proxy; TLS and token for a TLS cluster
    try:
        with opener.open(creds.status_url(server.http_addr, _CPU_PAGE), timeout=timeout) as r:
            return parse_cpu_reading(r.read().decode("utf-8", "replace"))
    except (OSError, ValueError, urllib.error.URLError):
        return None


def read_cpu_seconds(
    servers: Sequence[ServerConfig], timeout_s: float = 2.0, creds: Credentials | None = None
) -> dict[str, CpuReading | None]:
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
    """CPU seconds each server used during a run (None: not known for that server), and
    which servers restarted during it (theirs are None)."""

    by_server: Mapping[str, float | None]
    restarted: tuple[str, ...] = ()

    @classmethod
    def between(
        cls, before: Mapping[str, CpuReading | None], after: Mapping[str, CpuReading | None]
    ) -> ServerCpu:
        out: dict[str, float | None] = {}
        restarted: list[str] = []
        for sid in sorted(set(before) | set(after)):
            b, a = before.get(sid), after.get(sid)
            if a is None or b is None:
                out[sid] = None
            elif _restarted(b, a):
                out[sid] = None
                restarted.append(sid)
            else:
                out[sid] = a.seconds - b.seconds
        return cls(out, tuple(restarted))

    @property
    def total_s(self) -> float | None:
        """The sum over the servers that told (None if none did)."""
        known = [v for v in self.by_server.values() if v is not None]
        return sum(known) if known else None

    @property
    def missing(self) -> list[str]:
        """The servers without a figure: restarted, or without a reading."""
        return [sid for sid, v in self.by_server.items() if v is None]

    @property
    def unread(self) -> list[str]:
        """The servers without a figure that missed a reading (before or after the run)."""
        return [sid for sid in self.missing if sid not in self.restarted]

    def ms_per_write(self, writes: int) -> float | None:
        total = self.total_s
        if total is None or writes <= 0:
            return None
        return total * 1000.0 / writes


def _restarted(before: CpuReading, after: CpuReading) -> bool:
    if before.started is not None and after.started is not None:
        return before.started != after.started
    return after.seconds < before.seconds  # a server too old to say when it started
