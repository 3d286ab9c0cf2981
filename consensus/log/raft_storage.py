"""``LogStorage``: a Log plus ConsensusMetadata seen as a ``consensus.core.Storage``.

The core reads through the Storage half; the driver writes through ``save_hard_state`` and
``append_async`` (or the blocking ``append``), carrying out each ``Ready`` in order.

The log's ``last_index`` counts batches accepted but not yet durable.  That is safe for the
core: it only asks storage about entries it has been told are durable (``on_persisted``),
and below that point accepted and durable agree.  On open they are the same.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

from raftlet.consensus.core.membership import ConfState
from raftlet.consensus.core.storage import EntriesUnreadable
from raftlet.consensus.core.types import Entry, HardState
from raftlet.consensus.log.errors import LogCorruptionError
from raftlet.consensus.log.log import AppendCallback, Log
from raftlet.consensus.log.metadata import ConsensusMetadata, PersistentState
from raftlet.consensus.log.options import LogObserver, LogOptions
from raftlet.consensus.workers import WorkerPool

__all__ = ["WAL_DIR", "LogStorage"]

WAL_DIR = "wal"


class LogStorage:
    def __init__(self, log: Log, metadata: ConsensusMetadata) -> None:
        self.log = log
        self.metadata = metadata

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        options: LogOptions | None = None,
        observer: LogObserver | None = None,
        appenders: WorkerPool | None = None,
    ) -> LogStorage:
        """The replica layout: metadata in ``directory``, segments in ``directory/wal``."""
        path = os.fspath(directory)
        opts = options or LogOptions()
        metadata = ConsensusMetadata.load(path, sync=opts.fsync)
        return cls(Log.open(os.path.join(path, WAL_DIR), opts, observer, appenders), metadata)

    # --- consensus.core.Storage -------------------------------------------------------

    def initial_state(self) -> HardState:
        return self.metadata.hard_state()

    def first_index(self) -> int:
        return self.log.first_index()

    def last_index(self) -> int:
        return self.log.last_index()

    def term(self, index: int) -> int:
        if index == 0:
            return 0  # the empty log's sentinel, whatever was compacted
        try:
            return self.log.term(index)
        except (LogCorruptionError, OSError) as e:
            raise _unreadable(f"the term of entry {index}", e) from e

    def entries(self, lo: int, hi: int, max_size: int | None = None) -> list[Entry]:
        try:
            return self.log.entries(lo, hi, max_size)
        except (LogCorruptionError, OSError) as e:
            # A segment damaged or removed since the log was opened (a bad sector, an
            # operator's rm): the core stops sending them, the driver fails the replica.
            raise _unreadable(f"entries {lo}..{hi - 1}", e) from e

    # --- the driver's side ------------------------------------------------------------

    def voters(self) -> tuple[str, ...]:
        return self.metadata.state.voters

    def save_conf_state(self, conf: ConfState, hard_state: HardState | None = None) -> None:
        """Durable on return; do it before the Ready's entries go to the log."""
        self.metadata.save_conf_state(conf, hard_state)

    def save_hard_state(self, hard_state: HardState) -> None:
        """Durable on return; do it before the Ready's entries are reported persisted."""
        self.metadata.save_hard_state(hard_state)

    def save_metadata(self, state: PersistentState) -> None:
        self.metadata.save(state)

    def append_async(self, entries: Sequence[Entry], callback: AppendCallback) -> None:
        self.log.append_async(entries, callback)

    def append(self, entries: Sequence[Entry]) -> None:
        self.log.append(entries)

    def close(self) -> None:
        self.log.close()

    def __enter__(self) -> LogStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Errors of a read that say nothing of the log's files: no descriptor or memory to be had
# now. The read is tried again later; the log is not taken for damaged.
_TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR, errno.EAGAIN})


def _unreadable(what: str, error: BaseException) -> EntriesUnreadable:
    transient = isinstance(error, OSError) and error.errno in _TRANSIENT
    return EntriesUnreadable(f"{what} of the log cannot be read: {error!r}", transient=transient)
