"""Checking every replica's store file while the server runs (SQLite's ``quick_check``).

A store is checked when its replica opens (``bootstrap``); damage that appears later -- a
failing disk, a stray write -- would otherwise show only when a read or an apply lands on
the broken page, or never. So one thread per server walks its replicas every
``interval_s`` and runs ``TabletStore.quick_check`` on each, one at a time, on a reader
connection (it does not block the writer; ~0.25 s per 100 MiB), and waits at least as
long as its last pass took before the next, so that however short the interval it takes at
most half of a CPU (passes back to back at 1 ms once kept every CPU busy on an idle server
and slowed writes 6x; ``--store_verify_interval_s`` is also 0 or >= 1 s). A replica whose store
reports damage is failed for good (``TabletReplica.store_damaged``): it hands its
leadership over and answers "tablet failed"; unlike a full disk it does not come back by
itself, as nothing it could retry would mend the file.

What it cannot see: a changed value in an intact page (SQLite keeps no checksums of
values), nor a key index that no longer matches its table (``quick_check`` does not compare
them; stores keep rows in a rowid table beside the key's index, ``store.sql``);
``raftlet cluster ksck --checksum`` compares the replicas' rows for that.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

__all__ = ["StoreVerifier", "VerifiedReplica"]

logger = logging.getLogger(__name__)


class _Store(Protocol):
    def quick_check(self, max_problems: int = 5) -> list[str]: ...


class VerifiedReplica(Protocol):
    @property
    def tablet_id(self) -> str: ...

    @property
    def store(self) -> _Store: ...

    def store_damaged(self, reason: str) -> None: ...


class StoreVerifier:
    def __init__(
        self,
        replicas: Callable[[], Iterable[VerifiedReplica]],
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._replicas = replicas
        self._interval_s = interval_s
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-verifier", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def verify_all(self) -> int:
        """One pass over the replicas; how many were found damaged."""
        damaged = 0
        for replica in list(self._replicas()):
            if self._stop.is_set():
                break
            try:
                problems = replica.store.quick_check()
            except Exception as exc:  # a closed store (the replica stopped meanwhile)
                logger.debug("%s: store check skipped: %r", replica.tablet_id, exc)
                continue
            if problems:
                damaged += 1
                reason = "PRAGMA quick_check: " + "; ".join(problems)
                logger.error("%s: the store file is damaged (%s)", replica.tablet_id, reason)
                replica.store_damaged(reason)
        return damaged

    def _run(self) -> None:
        # The first pass after one interval: the stores were checked as they opened.
        wait = self._interval_s
        while not self._stop.wait(wait):
            started = self._clock()
            self.verify_all()
            wait = max(self._interval_s, self._clock() - started)
