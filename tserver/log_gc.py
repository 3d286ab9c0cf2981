"""Discarding a replica's WAL below what nobody needs any more (log GC).

An entry may go once two things hold:
- **every voter holds it** -- it is at or below ``all_replicated``, the leader's minimum
  match, which the leader sends with every append and heartbeat (``consensus.core``). No
  follower, and no future leader, will ever ask this replica for it;
- **the store will not need it to recover**: the store is flushed (``TabletStore.flush``:
  its WAL and file fsynced) at or past it, so a restart replays only entries after it.

So the replica keeps every entry from ``min(all_replicated, flushed applied index)`` on,
and the log deletes whole segments below that (``Log.gc``; never the active one). The
entry at the point itself is kept: a leader that must probe a follower needs its term.

Bounded, then, by what the slowest voter holds -- but not for ever: a voter that is down
would pin the log of every replica of its tablet until it returns, so past
``max_segments`` segments (``--log_max_segments_retained``) GC goes on without it, and when
it returns the leader finds what it needs gone and has it copy the tablet instead
(``tserver.tablet_copier``), as Kudu does.

Runs in the replica's apply worker, every ``interval_s``, and also as soon as the log has
rolled over into more than ``max_segments`` segments since the last pass: with only the
interval, a log taking a segment every few seconds held the cap plus whatever it wrote in
one interval (16-20 segments with a cap of 16). A pass is a flush (a checkpoint and a few
fsyncs) and a few unlinks: cheap at either rate -- past the cap, one pass per segment
written -- and in that thread no apply races the flush. After a batch is applied, or -- so
an idle tablet GCs too, e.g. once a returning follower caught up -- when the ticker finds it
due and posts an empty batch to the apply mailbox.

The cap holds, then, but for a moment after each roll-over (one segment more until the next
batch is applied), and for as long as the store has not applied the entries of the newest
``max_segments`` segments (a follower catching up, an apply failing): a restart replays
those from the log, so they stay.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from raftlet.consensus.log import Log
from raftlet.tserver.store import TabletStore

__all__ = ["LogGc"]

logger = logging.getLogger(__name__)


class LogGc:
    def __init__(
        self,
        name: str,
        log: Log,
        store: TabletStore,
        all_replicated: Callable[[], int],
        *,
        interval_s: float,
        max_segments: int = 0,
        on_collected: Callable[[int], None] | None = None,
        voters_behind: Callable[[int], list[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``voters_behind(index)``: the voters known to hold less than ``index`` (a
        leader knows; [] elsewhere), named when GC goes past what they hold."""
        self._name = name
        self._log = log
        self._store = store
        self._all_replicated = all_replicated
        self._interval_s = interval_s
        self._max_segments = max_segments
        self._on_collected = on_collected
        self._voters_behind = voters_behind
        self._clock = clock
        self._next = clock() + interval_s
        # GC has gone past what a voter holds, and that voter has not caught up since: said
        # once, not at every pass.
        self._past_voter = False
        # Segments the log had after the last pass. A pass the cap calls for is due only when
        # the log grew past this: one that could delete nothing (the store behind) is not
        # tried again, at a flush each, until another segment comes.
        self._segments_after = 0

    def _over_cap(self) -> bool:
        if self._max_segments <= 0:
            return False
        n = self._log.segment_count()
        return n > self._max_segments and n > self._segments_after

    def due(self) -> bool:
        """Whether ``interval_s`` passed since the last ``collect``, or the log rolled over
        past ``max_segments`` segments since."""
        return self._clock() >= self._next or self._over_cap()

    def maybe_collect(self) -> int:
        """``collect`` if it is ``due``; segments deleted."""
        now = self._clock()
        if now >= self._next:
            self._next = now + self._interval_s
        elif not self._over_cap():
            return 0
        return self.collect()

    def collect(self) -> int:
        """Discard what may go now (the module docstring); returns segments deleted.

        First checks that the log's and the store's files are still there (``LogFailedError``,
        ``StoreFilesGone``) and that the store can checkpoint (``StoreError``): a tablet
        directory deleted under a running replica, or a store file made read-only, went
        unnoticed while the replica acknowledged writes into files no restart finds."""
        # Before anything can fail: a pass that fails is not retried at every applied batch.
        self._segments_after = self._log.segment_count()
        self._log.check_present()
        deleted = self._collect(self._store.flush())
        if deleted:
            self._segments_after = self._log.segment_count()
            logger.debug(
                "%s: log GC deleted %d segment(s); the log now starts at %d",
                self._name,
                deleted,
                self._log.first_index(),
            )
            if self._on_collected is not None:
                self._on_collected(deleted)
        return deleted

    def _collect(self, flushed: int) -> int:
        all_replicated = self._all_replicated()
        if self._past_voter and all_replicated + 1 >= self._log.first_index():
            self._past_voter = False  # caught up (by a tablet copy, most likely)
        target = max(all_replicated, self._log.retention_cap_index(self._max_segments))
        if target <= self._log.first_index():
            return 0
        point = min(target, flushed)
        if point <= self._log.first_index():
            return 0
        deleted = self._log.gc(point - 1)
        if deleted and point - 1 > all_replicated and not self._past_voter:
            self._past_voter = True
            first = self._log.first_index()
            behind = self._voters_behind(first) if self._voters_behind is not None else []
            logger.warning(
                "%s: log GC discarded entries %s (every voter held up to %d; the log now "
                "starts at %d), to keep at most %d segments (--log_max_segments_retained): "
                "%s, down or far behind, will need a tablet copy to catch up",
                self._name,
                f"{', '.join(behind)} lack{'s' if len(behind) == 1 else ''}"
                if behind
                else "a voter lacks",
                all_replicated,
                first,
                self._max_segments,
                # Only a leader knows who holds what: a follower says where to look.
                ", ".join(behind) if behind else "that voter (the leader's log names it)",
            )
        return deleted
