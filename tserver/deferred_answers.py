"""Answers a stage posts during one pass, sent together when the pass ends: one frame per
client connection instead of one per write.

The apply stage answers every write of a round in one loop.  Alone, each answer costs its
connection a frame -- a message to build and serialize, the link's lock, a send(2) -- and
the client a read and a parse.  Inside ``together()``, a connection's answer is queued
instead (``defer``), and what the pass queued leaves as the block ends: one ``flush`` per
connection, with its answers in the order they were posted.  Outside such a block,
``defer`` declines and the caller sends at once.  The queue is the thread's own: a pass
on another thread is neither held up nor mixed in.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["defer", "together"]

logger = logging.getLogger(__name__)

_local = threading.local()


@contextmanager
def together() -> Iterator[None]:
    """Hold the answers this thread defers in the block; flush them as it ends (also when
    it raises: an answer is owed either way).  Nested blocks are part of the outermost."""
    if getattr(_local, "queued", None) is not None:
        yield
        return
    queued: dict[object, tuple[list[Any], Callable[[list[Any]], None]]] = {}
    _local.queued = queued
    try:
        yield
    finally:
        _local.queued = None
        for items, flush in queued.values():
            try:
                flush(items)
            except Exception:  # a flush must not raise; if one does, the others still go
                logger.exception("sending %d deferred answers failed", len(items))


def defer(key: object, item: Any, flush: Callable[[list[Any]], None]) -> bool:
    """Queue ``item`` for ``flush`` (one call per ``key``, with every item queued under it)
    when the thread's ``together()`` block ends; False, queuing nothing, outside one."""
    queued: dict[object, tuple[list[Any], Callable[[list[Any]], None]]] | None = getattr(
        _local, "queued", None
    )
    if queued is None:
        return False
    held = queued.get(key)
    if held is None:
        queued[key] = ([item], flush)
    else:
        held[0].append(item)
    return True
