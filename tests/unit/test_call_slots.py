"""Slots for a process's calls to one server, handed out first come, first served: a thread
that gives a slot back cannot take it straight back ahead of the threads waiting."""

from __future__ import annotations

import threading

import pytest

from raftlet.client.call_slots import FairSlots
from tests.waiting import wait_for


def _waiting(slots: FairSlots) -> int:
    return len(slots._waiters)


def test_a_released_slot_goes_to_the_longest_waiting_thread_not_back_to_its_releaser() -> None:
    slots = FairSlots(1)
    assert slots.acquire(timeout=0)
    served: list[str] = []
    done = {name: threading.Event() for name in ("first", "second")}

    def wait_in_line(name: str) -> None:
        assert slots.acquire(timeout=30)
        served.append(name)
        done[name].wait(30)
        slots.release()

    threads = []
    for n, name in enumerate(("first", "second"), start=1):
        thread = threading.Thread(target=wait_in_line, args=(name,))
        thread.start()
        threads.append(thread)
        wait_for(lambda n=n: _waiting(slots) == n, 10, f"{name} waiting")
    slots.release()
    # Handed over already: the releaser (a thread going round a loop of calls) cannot barge.
    assert not slots.acquire(timeout=0)
    wait_for(lambda: served == ["first"], 10, "the first waiter served")
    done["first"].set()
    wait_for(lambda: served == ["first", "second"], 10, "the second waiter served")
    done["second"].set()
    for thread in threads:
        thread.join(10)
    assert slots.in_use() == 0
    assert slots.acquire(timeout=0)


def test_a_wait_that_times_out_leaves_the_line_and_takes_no_slot() -> None:
    slots = FairSlots(1)
    assert slots.acquire(timeout=0)
    assert not slots.acquire(timeout=0.05)
    assert _waiting(slots) == 0
    slots.release()
    assert slots.in_use() == 0  # not handed to the thread that gave up
    assert slots.acquire(timeout=0)


def test_more_releases_than_acquires_and_no_slots_are_refused() -> None:
    slots = FairSlots(2)
    with pytest.raises(ValueError, match="released more often than acquired"):
        slots.release()
    with pytest.raises(ValueError, match="at least 1"):
        FairSlots(0)


def test_a_wait_interrupted_leaves_the_line_and_loses_no_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread interrupted while it waited (Ctrl-C) stayed in line, and the next slot given
    back was handed to it, never to be given back again."""
    slots = FairSlots(1)
    assert slots.acquire(timeout=0)
    real_lock = threading.Lock

    class Interrupted:
        def __init__(self) -> None:
            self._lock = real_lock()

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            if timeout > 0:
                raise KeyboardInterrupt
            return self._lock.acquire(blocking)

        def release(self) -> None:
            self._lock.release()

    monkeypatch.setattr("raftlet.client.call_slots.threading.Lock", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        slots.acquire(timeout=5)
    assert _waiting(slots) == 0
    slots.release()
    assert slots.in_use() == 0
    assert slots.acquire(timeout=0)
