"""Waiting on a condition in tests: poll a predicate until it holds, with a deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# Generous: a loaded CI machine must not turn a slow wait into a failure.
WAIT_S = 30.0


def wait_for(
    predicate: Callable[[], bool], timeout: float = WAIT_S, what: str = "", poll_s: float = 0.005
) -> None:
    """Return once ``predicate()`` is true; fail after ``timeout`` seconds.  Between polls
    the thread waits on an Event, which nobody sets: a timed pause, not a sleep standing in
    for synchronisation (the predicate is the synchronisation)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        pause.wait(poll_s)
