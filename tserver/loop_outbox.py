"""Items from any thread, written in batches by one coroutine on the event loop.

The shape every long-lived stream of the server shares: answers become ready on worker
threads (a durability callback, an apply thread) and must be written by the loop that owns
the gRPC call. ``post`` appends under a small lock and wakes the loop only if it is not
already due to look, so answers that are ready together leave as one message and a busy
stream costs one wake-up per message, not per answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["LoopOutbox"]

T = TypeVar("T")


class LoopOutbox(Generic[T]):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[T] = []
        self._due = False  # the loop has been asked to look
        self._wake = asyncio.Event()
        self._closed = False

    def post(self, item: T) -> None:
        """Any thread: queue ``item``; dropped once the outbox is closed."""
        with self._lock:
            if self._closed:
                return
            self._items.append(item)
            wake, self._due = not self._due, True
        if wake:
            # RuntimeError: the loop is closed, the server is going away.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._wake.set)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._items = []

    async def drain_to(self, write: Callable[[list[T]], Awaitable[None]]) -> None:
        """The loop: hand everything queued, as one list, to ``write``; forever."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.flush_to(write)

    async def flush_to(self, write: Callable[[list[T]], Awaitable[None]]) -> None:
        """The loop: hand what is queued now, if anything, to ``write``."""
        with self._lock:
            items, self._items = self._items, []
            self._due = False
        if items:
            await write(items)
