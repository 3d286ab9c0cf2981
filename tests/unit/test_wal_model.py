"""The Log against a model: random appends (queued or waited for), suffix overwrites,
reads, GC and reopens, with the appender stalled at random so that groups mix batches,
overwrites land on batches not yet durable, and reads and GC run while they are pending."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from raftlet.consensus.core.types import Entry, EntryType
from raftlet.consensus.log import Log, LogOptions
from tests.unit.wal_helpers import RecordingObserver

# Tiny segments and cache so that rolls, GC and reads from disk happen within a few steps;
# a queue big enough that a producer never blocks while the test holds the appender.
OPTIONS = LogOptions(
    segment_size_bytes=2048,
    cache_size_bytes=256,
    group_commit_queue_size_bytes=64 << 20,
    fsync=False,
)
WAIT_S = 30.0


def pick(lo: int, hi: int, where: float) -> int:
    """The integer ``where`` of the way from ``lo`` to ``hi`` (both included)."""
    return lo + round(where * (hi - lo))


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="walmodel-")
        self.observer = RecordingObserver()
        self.log = Log.open(self.directory, OPTIONS, self.observer)
        self.model: dict[int, Entry] = {}  # every live entry, first_index .. last
        self.last = 0
        self.term = 1
        self.stalled = False
        self.outcomes: list[BaseException | None] = []

    def _callback(self, error: BaseException | None) -> None:
        self.outcomes.append(error)

    # Positions are drawn as fractions of whatever range the log has at that moment: where
    # GC can cut depends on how the appender happened to group batches into records, and
    # hypothesis needs the drawing itself not to depend on timing.
    @rule(
        where=st.floats(0, 1),
        count=st.integers(1, 6),
        overwrite=st.booleans(),
        wait=st.booleans(),
        sizes=st.lists(st.sampled_from([0, 3, 40, 200, 30_000]), min_size=6, max_size=6),
        kinds=st.lists(st.sampled_from(EntryType), min_size=6, max_size=6),
    )
    def append(
        self,
        where: float,
        count: int,
        overwrite: bool,
        wait: bool,
        sizes: list[int],
        kinds: list[EntryType],
    ) -> None:
        first = self.log.first_index()
        if overwrite and self.last >= first:
            start = pick(first, self.last, where)
            self.term += 1  # a new leader's entries replace the old tail
        else:
            start = self.last + 1
        batch = [
            Entry(
                term=self.term,
                index=start + k,
                type=kinds[k],
                data=b"" if kinds[k] is EntryType.NO_OP else (b"%d." % (start + k)) * sizes[k],
            )
            for k in range(count)
        ]
        for i in range(start, self.last + 1):
            del self.model[i]
        self.model.update((e.index, e) for e in batch)
        self.last = start + count - 1
        if wait and not self.stalled:
            self.log.append(batch, timeout=WAIT_S)
        else:
            self.log.append_async(batch, self._callback)

    @rule(a=st.floats(0, 1), b=st.floats(0, 1))
    def read(self, a: float, b: float) -> None:
        first = self.log.first_index()
        lo = pick(first, self.last + 1, a)
        hi = pick(lo, self.last + 1, b)
        assert self.log.entries(lo, hi) == [self.model[i] for i in range(lo, hi)]
        if lo < hi:
            assert self.log.term(lo) == self.model[lo].term

    @rule(where=st.floats(0, 1))
    def gc(self, where: float) -> None:
        before = self.log.first_index()
        up_to = pick(before - 1, self.last, where)
        deleted = self.log.gc(up_to)
        after = self.log.first_index()
        assert before <= after <= max(before, up_to + 1)
        # (A segment may also go without moving the start: one holding only replaced entries.)
        assert after == before or deleted > 0
        for i in range(before, after):
            del self.model[i]

    @precondition(lambda self: not self.stalled)
    @rule()
    def stall_the_appender(self) -> None:
        """Hold the appender in its next completion: later batches pile up in the queue
        (and one group may be written but not yet synced)."""
        self.observer.stall()
        index = self.last + 1
        self.model[index] = Entry(term=self.term, index=index, data=b"stall")
        self.last = index
        self.log.append_async([self.model[index]], self._callback)
        assert self.observer.stalled.wait(WAIT_S)
        self.stalled = True

    @precondition(lambda self: self.stalled)
    @rule()
    def release_the_appender(self) -> None:
        self.observer.release()
        self.stalled = False

    @precondition(lambda self: not self.stalled)
    @rule()
    def reopen(self) -> None:
        self.log.append([], timeout=WAIT_S)
        first = self.log.first_index()
        self.log.close()
        self.log = Log.open(self.directory, OPTIONS, self.observer)
        assert self.log.first_index() == first

    @invariant()
    def the_log_is_the_model(self) -> None:
        first = self.log.first_index()
        assert self.log.last_index() == self.last
        assert min(self.model, default=first) == first
        assert self.log.entries(first, self.last + 1) == [
            self.model[i] for i in range(first, self.last + 1)
        ]
        assert all(error is None for error in self.outcomes)

    def teardown(self) -> None:
        self.observer.release()
        try:
            self.log.close()
            assert all(error is None for error in self.outcomes)
        finally:
            shutil.rmtree(self.directory)


TestLogModel = LogMachine.TestCase
TestLogModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
