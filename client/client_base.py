"""What the threaded ``Client`` and the asyncio ``AsyncClient`` share without I/O: what they
answer about the cluster from their meta cache, their counters and their open/closed state.
One implementation, inherited by both."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Generic, TypeVar

from raftlet.client.arguments import check_timeout
from raftlet.client.errors import ClientClosed
from raftlet.client.meta_cache import MetaState
from raftlet.client.request_tracker import RequestTracker
from raftlet.client.stats import ClientStats, StatsRecorder
from raftlet.schema import Schema

__all__ = ["ClientBase"]

Meta = TypeVar("Meta", bound=MetaState)


class ClientBase(Generic[Meta]):
    _tracker: RequestTracker
    _seeds: list[str]
    _meta: Meta
    _stats: StatsRecorder
    _closed: bool
    timeout_s: float

    @property
    def client_id(self) -> str:
        """Scopes this client's write request ids (a fresh uuid per client)."""
        return self._tracker.client_id

    @property
    def seeds(self) -> list[str]:
        return list(self._seeds)

    def tables(self) -> list[str]:
        return list(self._meta.view.tables)

    def schema(self, table: str) -> Schema:
        return self._meta.table(table).schema

    def tablets(self, table: str) -> list[str]:
        """The table's tablet ids, by partition."""
        return list(self._meta.table(table).tablet_ids)

    def table_of(self, tablet_id: str) -> str:
        """The table ``tablet_id`` is a tablet of."""
        return self._meta.tablet(tablet_id).table

    def replication_factor(self, table: str) -> int:
        """How many voters each of the table's tablets is meant to have."""
        return self._meta.table(table).replication_factor

    def tablet_for(self, table: str, row: Mapping[str, object]) -> str:
        """The tablet holding ``row`` (needs its key columns): the server's own hash
        partitioning (``schema.partition_for_key``)."""
        return self._meta.tablet_for(table, row)

    @property
    def stats(self) -> ClientStats:
        """A snapshot of the client's counters (see ``client.stats``)."""
        return self._stats.snapshot()

    @property
    def closed(self) -> bool:
        return self._closed

    def _timeout(self, timeout_s: float | None) -> float:
        """A call's ``timeout_s``: the client's when None, else checked (a NaN deadline
        once kept a call's retries going for ever)."""
        return self.timeout_s if timeout_s is None else check_timeout(timeout_s)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("the client is closed")
