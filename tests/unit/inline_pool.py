"""A service pool for unit tests of the write front doors: runs each call at once, on the
thread that offers it (a stream's loop, a link's reader), so every answer is ready before
that thread looks for the next frame."""

from __future__ import annotations

from raftlet.tserver.service_pool import InboundCall, ServicePoolMetrics


class InlinePool:
    stopped = False

    def __init__(self) -> None:
        self.metrics = ServicePoolMetrics.standalone("tablet")

    def offer(self, call: InboundCall, requests: int = 1) -> bool:
        call.run(call)
        return True
