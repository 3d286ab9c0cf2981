"""Which peer servers have stopped answering this one, said in the log.

Raft carries on without a peer that is down -- its tablets elect leaders elsewhere, the
leaders here keep sending it heartbeats -- so nothing else in the log would tell the operator
that a peer has been unreachable for minutes, until a replica needs a tablet copy or a quorum
is lost.  This watch does: its replicas mark every peer they send a message to (``asked``) and
every peer a message came from (``heard``, the same hook as ``tserver.servers_heard``); every
``check`` (the server's loop, every ``CHECK_INTERVAL_S``), a peer that was sent messages and
sent none back in every interval for ``quiet_s`` gets one WARNING, repeated every
``repeat_s`` while that lasts, and an INFO line once it is heard again.

A peer is judged on what reached this server from it at all, over every tablet: a follower
hears its leaders' requests, a leader its followers' answers.  Silence while nothing was sent
to a peer (a follower's fellow followers) is not held against it, and an interval in which
nothing was sent to it starts its count again.  The two marks are set adds, cheap enough for
every message; a mark that lands on the set ``check`` just swapped out is lost, which costs
at most one interval of a verdict that needs several.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["CHECK_INTERVAL_S", "PeerContact"]

logger = logging.getLogger(__name__)

CHECK_INTERVAL_S = 2.0


@dataclass(slots=True)
class _Silence:
    since: float  # when the first interval without an answer began
    warned_at: float | None = None


class PeerContact:
    """Thread-safe marks (``asked``, ``heard``), and ``check`` on one thread at a time."""

    def __init__(
        self,
        addresses: Mapping[str, str],
        *,
        quiet_s: float = 10.0,
        repeat_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``addresses``: each peer's id to its RPC address, for the messages."""
        self._addresses = dict(addresses)
        self._quiet_s = quiet_s
        self._repeat_s = repeat_s
        self._clock = clock
        self._asked: set[str] = set()
        self._heard: set[str] = set()
        self._silent: dict[str, _Silence] = {}
        self._last_check = clock()

    def asked(self, server_id: str) -> None:
        """A message left for ``server_id`` (any thread)."""
        self._asked.add(server_id)

    def heard(self, server_id: str) -> None:
        """A message came from ``server_id`` (any thread)."""
        self._heard.add(server_id)

    def silent_for(self, server_id: str) -> float | None:
        """Seconds ``server_id`` has been sent messages without answering, as of the last
        ``check``; None if it answers."""
        silence = self._silent.get(server_id)
        return None if silence is None else self._last_check - silence.since

    def check(self) -> None:
        """Take in the marks since the last check, and log what changed."""
        now = self._clock()
        began, self._last_check = self._last_check, now
        asked_set, self._asked = self._asked, set()
        heard_set, self._heard = self._heard, set()
        # Copies, since a mark may still land on a set just swapped out (and is lost then).
        asked, heard = frozenset(asked_set), frozenset(heard_set)
        for server_id in heard:
            silence = self._silent.pop(server_id, None)
            if silence is not None and silence.warned_at is not None:
                logger.info(
                    "peer %s (%s) answers again, after %s without an answer",
                    server_id,
                    self._address(server_id),
                    _duration(now - silence.since),
                )
        for server_id in set(self._silent) - asked - heard:
            # Nothing sent to it in this interval, so nothing it failed to answer: a peer
            # asked again much later is judged afresh.
            silence = self._silent.pop(server_id)
            if silence.warned_at is not None:
                # Its replicas here left their groups, or those moved elsewhere: no word
                # from it would come now, so the warning gets its end here.
                logger.info(
                    "peer %s (%s): this server has stopped sending it anything (no group "
                    "here needs it now), after %s without an answer; its silence is no "
                    "longer watched",
                    server_id,
                    self._address(server_id),
                    _duration(now - silence.since),
                )
        for server_id in asked - heard:
            silence = self._silent.setdefault(server_id, _Silence(since=began))
            silent_s = now - silence.since
            if silent_s < self._quiet_s:
                continue
            if silence.warned_at is not None and now - silence.warned_at < self._repeat_s:
                continue
            silence.warned_at = now
            logger.warning(
                "peer %s (%s) has not answered for %s though this server keeps sending to "
                "it (down, paused, unreachable from here, or without the replicas expected "
                "there): its replicas fall behind; `raftlet cluster status` shows which. "
                "Said again every %s while it lasts",
                server_id,
                self._address(server_id),
                _duration(silent_s),
                _duration(self._repeat_s),
            )

    def _address(self, server_id: str) -> str:
        return self._addresses.get(server_id, "address unknown")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
