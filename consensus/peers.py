"""One replication sender per peer (Kudu's Peer): a thread that sends what the core
addressed to that peer and steps the peer's answers back into consensus.

Sending never waits for an answer: the transport calls back, and the answer is queued to
this same thread, so answers are stepped in the order they arrive and no transport thread
ever waits for the consensus lock.  How many APPENDs are in flight is the core's business
(its per-follower window); the sender just keeps the pipe full.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from raftlet.consensus.core.types import Message
from raftlet.consensus.transport import Transport

__all__ = ["PeerSender"]

logger = logging.getLogger(__name__)

_STOP = object()


class PeerSender:
    def __init__(
        self,
        peer_id: str,
        transport: Transport,
        step: Callable[[Message], None],
        name: str,
    ) -> None:
        self.peer_id = peer_id
        self._transport = transport
        self._step = step
        # Items: ("send", Message) | ("answer", Message); unbounded, because the core bounds
        # what it sends (its in-flight window) and every answer matches one send.
        self._queue: queue.SimpleQueue[tuple[str, Message] | object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def send(self, message: Message) -> None:
        """Queue ``message`` for the peer; never blocks (safe under the consensus lock)."""
        self._queue.put(("send", message))

    def _on_answer(self, answer: Message | None) -> None:
        if answer is not None:
            self._queue.put(("answer", answer))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            assert isinstance(item, tuple)
            kind, message = item
            try:
                if kind == "send":
                    self._transport.send(message, self._on_answer)
                else:
                    self._step(message)
            except Exception:
                logger.exception("peer %s: %s of %s failed", self.peer_id, kind, message.type)

    def stop(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout=10)
