"""``ReplicaMap``: the server's tablets by id, read by many threads, changed by a few.

Replicas come and go while the server runs (an operator creates one to join a group, or
deletes one that left it), and everything else -- RPC handlers, status pages, gauges, the
store verifier -- reads the map without a lock.  So it is copy-on-write: a change builds a
new dict and swaps it in with one assignment, and a reader iterating the old dict never sees
it change under it (a plain dict would raise "changed size during iteration").
"""

from __future__ import annotations

import threading
from collections.abc import ItemsView, Iterator, Mapping, ValuesView
from typing import TypeVar

__all__ = ["ReplicaMap"]

T = TypeVar("T")


class ReplicaMap(Mapping[str, T]):
    def __init__(self) -> None:
        self._items: dict[str, T] = {}
        self._write_lock = threading.Lock()

    def __getitem__(self, key: str) -> T:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def values(self) -> ValuesView[T]:
        return self._items.values()

    def items(self) -> ItemsView[str, T]:
        return self._items.items()

    def put(self, key: str, value: T) -> None:
        with self._write_lock:
            items = dict(self._items)
            items[key] = value
            self._items = items

    def pop(self, key: str) -> T | None:
        with self._write_lock:
            if key not in self._items:
                return None
            items = dict(self._items)
            value = items.pop(key)
            self._items = items
            return value
