"""The durable log as the core sees it: read-only, behind a small Protocol.

The driver owns writes (it persists what a ``Ready`` says, then tells the core);
the core only reads what is already durable.  ``MemoryStorage`` is the in-memory
implementation used by tests and the simulator, where "durable" means "survives a
simulated crash".
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

from raftlet.consensus.core.types import Entry, EntryType, HardState

__all__ = ["EntriesUnreadable", "MemoryStorage", "Storage"]


class EntriesUnreadable(Exception):
    """``Storage.entries`` or ``term`` could not read entries the storage holds: a file of
    the log damaged or gone under it. A leader does not send a peer what it cannot read:
    it stops sending to that peer and keeps the first such error for its driver
    (``RawNode.take_read_failure``), which fails the replica -- its log is damaged, as one
    found damaged at open is. Raised through a step, it had failed the step's proposals
    though they were committed (review r34a). ``transient``: the read may work when tried
    again (no file descriptor to be had, say): nothing is recorded, the peer is sent to
    again at its next chance."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class Storage(Protocol):
    def initial_state(self) -> HardState:
        """The hard state last persisted."""
        ...

    def first_index(self) -> int:
        """Index of the first entry still held: 1 unless log GC discarded a prefix. Entries
        below it are gone, and so is their term (except index 0's, which is 0)."""
        ...

    def last_index(self) -> int:
        """Index of the last durable entry (0 when empty)."""
        ...

    def term(self, index: int) -> int:
        """Term of the durable entry at ``index`` (0 for index 0).

        Raises IndexError when ``index`` is beyond ``last_index()``.
        """
        ...

    def entries(self, lo: int, hi: int, max_size: int | None = None) -> list[Entry]:
        """Entries with lo <= index < hi, at least one if any, at most ``max_size``
        bytes (by ``Entry.size``) after the first. ``EntriesUnreadable`` when they are held
        but cannot be read."""
        ...


def limit_size(entries: Sequence[Entry], max_size: int | None) -> list[Entry]:
    """The longest prefix within ``max_size`` bytes, but never empty if ``entries`` is not."""
    if max_size is None:
        return list(entries)
    out: list[Entry] = []
    total = 0
    for e in entries:
        total += e.size()
        if out and total > max_size:
            break
        out.append(e)
    return out


class MemoryStorage:
    """A Storage kept in memory; ``append``/``set_hard_state`` are the "writes"."""

    def __init__(self) -> None:
        self._entries: list[Entry] = []  # _entries[i].index == i + self._first
        self._first = 1
        self._hard_state = HardState()

    def initial_state(self) -> HardState:
        return self._hard_state

    def first_index(self) -> int:
        return self._first

    def last_index(self) -> int:
        return self._first - 1 + len(self._entries)

    def term(self, index: int) -> int:
        if index == 0:
            return 0
        if index < self._first or index > self.last_index():
            raise IndexError(f"index {index} out of range [{self._first}, {self.last_index()}]")
        return self._entries[index - self._first].term

    def entries(self, lo: int, hi: int, max_size: int | None = None) -> list[Entry]:
        if lo < self._first or hi > self.last_index() + 1 or lo > hi:
            raise IndexError(
                f"entries [{lo}, {hi}) out of range [{self._first}, {self.last_index()}]"
            )
        return limit_size(self._entries[lo - self._first : hi - self._first], max_size)

    def compact(self, up_to: int) -> None:
        """Discard the entries at or below ``up_to`` (log GC), keeping at least the last."""
        up_to = min(up_to, self.last_index() - 1)
        if up_to >= self._first:
            del self._entries[: up_to - self._first + 1]
            self._first = up_to + 1

    def apply_snapshot(self, index: int, term: int) -> None:
        """Replace the whole log by a stand-in entry at (``index``, ``term``): the log of a
        replica that installed a copy of the state at ``index`` (``Raft.restore``)."""
        self._entries = [Entry(term, index, EntryType.NO_OP)]
        self._first = index
        self._hard_state = HardState(
            self._hard_state.term, self._hard_state.vote, max(self._hard_state.commit, index)
        )

    # --- writes (the driver's side) -----------------------------------------

    def set_hard_state(self, hard_state: HardState) -> None:
        self._hard_state = hard_state

    def append(self, entries: Sequence[Entry]) -> None:
        """Append, replacing any existing suffix from ``entries[0].index`` on."""
        if not entries:
            return
        first = entries[0].index
        if first < self._first or first > self.last_index() + 1:
            raise IndexError(f"append at {first} outside [{self._first}, {self.last_index() + 1}]")
        for a, b in itertools.pairwise(entries):
            if b.index != a.index + 1:
                raise ValueError(f"entries not contiguous: {a.index} then {b.index}")
        del self._entries[first - self._first :]
        self._entries.extend(entries)

    def all_entries(self) -> list[Entry]:
        return list(self._entries)
