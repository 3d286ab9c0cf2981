"""Threads per server, not per replica: one pool of workers drives every replica's mailboxes.

A ``Mailbox`` is a serial queue of inputs with one handler: what is posted to it is handled
in order, a batch at a time, never by two threads at once -- the replica's worker, prepare
and apply stages each own one.  A mailbox with inputs is *ready*; the ``WorkerPool``'s
threads take ready mailboxes in turn and run one batch each, so a busy server hands work
from one replica to the next without a thread per replica waking for it (Kudu's thread
pool tokens in serial mode).

Handlers may block: a prepare batch can wait for room in its WAL's queue while it holds the
consensus lock, and that replica's other stages then wait for the lock (KUDU-2727).  So a
blocked replica must not starve the others: the pool starts another thread when work is
ready and no thread is idle, up to ``max_threads``, and threads beyond ``min_threads`` end
after ``idle_timeout_s`` without work.  An idle server keeps ``min_threads`` threads, asleep.

But threads that merely run take nothing from each other's work: they share one GIL and,
here, one CPU.  Waking one for every ready mailbox made each pass of many tablets a thread
hand-off of its own -- with 16 or 64 tablets a server had dozens awake, taking turns on the
GIL (docs/benchmarks.md, "Awake workers").  So at most ``running_target`` threads are woken
for ready work; while that many are awake, a ready mailbox waits for one of them to finish
its handler -- unless none does for ``STALL_S``, when they are taken for blocked and one more
thread is woken (or started), and again each ``STALL_S`` while the stall lasts.

Waking a thread is most of what a hand-off costs (on this project's 2-core machines a
write's context switches were half its CPU), so work avoids it where it safely can:
- what a handler posts goes to its own thread, run right after the handler returns, when
  that thread has nothing else lined up (the Raft worker's committed entries go straight
  on to the apply stage on the same thread).  Handlers post last, after their blocking
  work, so this never parks a post behind a wait;
- ``run_or_post`` lets a thread that is not a pool thread run an idle mailbox's handler
  itself, when the handler agrees without blocking (the WAL's appender steps its own
  durability report when the consensus lock is free).
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from raftlet.consensus.timers import Timers

__all__ = ["STALL_S", "Mailbox", "Sleepers", "WorkerPool"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# With ``running_target`` threads awake, how long none of them may go without finishing a
# handler before they are taken for blocked and another thread is woken: above what a pass
# takes (a round of 64 writes applies in ~2 ms here), far below an election timeout.
STALL_S = 0.01


class _Here(threading.local):
    """What the current thread is to the pools: a pool's worker, and what it runs next."""

    pool: WorkerPool | None = None
    next: Mailbox[object] | None = None


_here = _Here()


class Sleepers:
    """A pool's idle threads, each asleep on a lock of its own, which whoever gives it work
    (or stops the pool) releases.  Lighter than a ``threading.Condition``, whose wait and
    notify run Python code -- a lock allocated per wait -- on every hand-off of every write.

    Not locked itself: the pool's mutex guards ``park``, ``take_one``, ``take_all`` and
    ``withdraw``; releasing a taken lock, and sleeping on one's own, happen outside it."""

    def __init__(self) -> None:
        self._locks: list[threading.Lock] = []

    @staticmethod
    def new_waker() -> threading.Lock:
        """A thread's own wake-up lock, held already: the thread sleeps acquiring it."""
        waker = threading.Lock()
        waker.acquire()
        return waker

    def park(self, waker: threading.Lock) -> None:
        self._locks.append(waker)

    def take_one(self) -> threading.Lock | None:
        """The thread that slept least (its caches warmest), or None if none sleeps."""
        return self._locks.pop() if self._locks else None

    def take_all(self) -> list[threading.Lock]:
        locks, self._locks = self._locks, []
        return locks

    def withdraw(self, waker: threading.Lock) -> bool:
        """Off the list, for a thread whose sleep timed out; False if someone took it
        first -- its release is then on the way."""
        if waker not in self._locks:
            return False
        self._locks.remove(waker)
        return True


class WorkerPool:
    """The server's replica workers.  ``stop()`` ends them once every mailbox is closed."""

    def __init__(
        self,
        name: str = "replica-worker",
        *,
        min_threads: int = 2,
        max_threads: int = 32,
        running_target: int = 0,
        idle_timeout_s: float = 30.0,
        thread_start: Callable[[], None] | None = None,
    ) -> None:
        """``running_target``: at most this many threads woken for ready work (see the
        module docstring); 0, a thread for every ready mailbox while ``max_threads`` allows."""
        if min_threads < 1 or max_threads < min_threads:
            raise ValueError(
                f"need 1 <= min_threads <= max_threads, got {min_threads}, {max_threads}"
            )
        if running_target < 0:
            raise ValueError(f"need running_target >= 0, got {running_target}")
        self.name = name
        self.min_threads = min_threads
        self.max_threads = max_threads
        self.running_target = running_target
        self.idle_timeout_s = idle_timeout_s
        # Run first by each thread of the pool (the server sets its priority with it).
        self._thread_start = thread_start
        self._mutex = threading.Lock()
        self._ready: collections.deque[Mailbox[object]] = collections.deque()
        self._sleepers = Sleepers()
        self._threads = 0
        self._awake = 0  # threads not asleep: running a handler or looking for one
        self._finished = 0  # handlers run to the end (the stall watch's sign of progress)
        self._watching = False  # a stall watch is due
        self._stopping = False
        self._serial = 0
        self._live: set[threading.Thread] = set()
        # Deadlines for the pool's handlers (a thread of its own, started when first used).
        self.timers = Timers(f"{name}-timers", thread_start=thread_start)

    def mailbox(
        self, name: str, handler: Callable[[list[T]], None], *, max_batch: int = 1 << 30
    ) -> Mailbox[T]:
        """A new mailbox whose batches (at most ``max_batch`` inputs) go to ``handler``."""
        return Mailbox(self, name, handler, max_batch)

    def threads(self) -> int:
        """Threads alive now (started and not yet ended)."""
        with self._mutex:
            return self._threads

    def awake(self) -> int:
        """Threads not asleep now: running a handler, or on their way to one."""
        with self._mutex:
            return self._awake

    def stop(self, timeout: float = 10.0) -> None:
        """End the threads once the ready mailboxes are run (close the mailboxes first)."""
        self.timers.stop(timeout)
        with self._mutex:
            self._stopping = True
            sleepers = self._sleepers.take_all()
            self._awake += len(sleepers)  # each wakes to end
            live = list(self._live)
        for waker in sleepers:
            waker.release()
        for thread in live:
            if thread is not threading.current_thread():
                thread.join(timeout)

    def _schedule(self, box: Mailbox[object], requeue: bool = False) -> None:
        here = _here
        if here.pool is self and here.next is None and not (requeue and self._ready):
            here.next = box  # this thread runs it as soon as its handler returns
            return
        with self._mutex:
            self._ready.append(box)
            if self.running_target and self._awake >= self.running_target:
                # One of the threads awake takes it when its handler returns.
                if not self._watching and not self._stopping:
                    self._arm_watch()
                return
            waker = self._wake_one()
        if waker is not None:
            waker.release()

    def _wake_one(self) -> threading.Lock | None:
        """(Under ``_mutex``.) A sleeping thread to release for ready work, else a new one
        started, while ``max_threads`` allows (else the next to finish takes the work)."""
        waker = self._sleepers.take_one()
        if waker is not None:
            self._awake += 1
            return waker
        if self._threads < self.max_threads:
            self._threads += 1
            self._awake += 1
            self._serial += 1
            thread = threading.Thread(
                target=self._work, name=f"{self.name}-{self._serial}", daemon=True
            )
            self._live.add(thread)
            thread.start()  # under the lock: stop() never joins one not yet started
        return None

    def _watch(self, finished: int) -> None:
        """On the timer thread, ``STALL_S`` after ready work found the threads awake busy:
        if none of them has finished a handler since, they are blocked -- wake another."""
        waker = None
        with self._mutex:
            self._watching = False
            if not self._ready or self._stopping:
                return
            if self._finished == finished:
                waker = self._wake_one()
            self._arm_watch()
        if waker is not None:
            waker.release()

    def _arm_watch(self) -> None:
        """(Under ``_mutex``.) A stall watch ``STALL_S`` from now, against the handlers
        finished so far."""
        self._watching = True
        self.timers.call_later(STALL_S, functools.partial(self._watch, self._finished))

    def _work(self) -> None:
        if self._thread_start is not None:
            self._thread_start()
        me = threading.current_thread()
        here = _here
        here.pool = self
        waker = Sleepers.new_waker()
        while True:
            with self._mutex:
                if self._ready:
                    box = self._ready.popleft()
                elif self._stopping:
                    self._threads -= 1
                    self._awake -= 1
                    self._live.discard(me)
                    return
                else:
                    self._sleepers.park(waker)
                    self._awake -= 1
                    box = None
            if box is None:
                if not self._sleep(waker):
                    self._live.discard(me)
                    return
                continue
            box._run_once()
            # Outside the mutex: two threads may race and count one, which still tells the
            # stall watch that a handler finished -- all it asks.
            self._finished += 1
            while (after := here.next) is not None:
                here.next = None
                after._run_once()
                self._finished += 1

    def _sleep(self, waker: threading.Lock) -> bool:
        """Sleep on ``waker`` (listed in ``_sleepers``) until given work or stopped; False
        if a thread beyond the minimum found no work for ``idle_timeout_s`` and ended (its
        count already taken off)."""
        if self._threads <= self.min_threads:
            waker.acquire()
            return True
        if waker.acquire(timeout=self.idle_timeout_s):
            return True
        with self._mutex:
            claimed = not self._sleepers.withdraw(waker)
            # Others may have timed out and ended meanwhile: keep the minimum.
            if not claimed and not self._ready and self._threads > self.min_threads:
                self._threads -= 1
                return False
            if not claimed:
                self._awake += 1  # off the list by itself, and on its way to the ready work
        if claimed:
            waker.acquire()  # given work (or stopped) just now: its release is on the way
        return True


class Mailbox(Generic[T]):
    """A serial queue of inputs run on a ``WorkerPool``.  Make one with ``pool.mailbox``."""

    def __init__(
        self, pool: WorkerPool, name: str, handler: Callable[[list[T]], None], max_batch: int
    ) -> None:
        self.name = name
        self._pool = pool
        self._handler = handler
        self._max_batch = max_batch
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._items: collections.deque[T] = collections.deque()
        self._scheduled = False  # ready, or being run: the pool owns it
        self._closed = False
        self._runner: int | None = None

    def post(self, item: T) -> bool:
        """Queue ``item`` for the handler; False (and dropped) once the mailbox is closed."""
        with self._lock:
            if self._closed:
                return False
            self._items.append(item)
            if self._scheduled:
                return True
            self._scheduled = True
        self._pool._schedule(self)  # type: ignore[arg-type]
        return True

    def run_or_post(self, item: T, inline: Callable[[list[T]], bool]) -> bool:
        """Handle ``item`` on this thread with ``inline`` if the mailbox is idle, else post
        it.  ``inline`` returns False, without blocking, when it cannot handle the batch
        now; the item is then posted.  Items keep their order either way.  False (and
        dropped) once the mailbox is closed."""
        with self._lock:
            if self._closed:
                return False
            if self._scheduled:
                self._items.append(item)
                return True
            self._scheduled = True
            self._runner = threading.get_ident()
        handled = True
        try:
            handled = inline([item])
        except Exception:
            logger.exception("mailbox %s: the handler failed", self.name)
        finally:
            again = self._finish_run([] if handled else [item])
        if again:
            self._pool._schedule(self)  # type: ignore[arg-type]
        return True

    def pending(self) -> int:
        return len(self._items)

    def close(self, timeout: float | None = 30.0) -> bool:
        """Accept nothing more and wait until what was posted has been handled (False if
        that took longer than ``timeout``; None waits as long as it takes).  From the
        handler itself it does not wait."""
        with self._lock:
            self._closed = True
            if self._runner == threading.get_ident():
                return not self._items
            return self._drained.wait_for(lambda: not self._scheduled, timeout)

    def _finish_run(self, unhandled: list[T]) -> bool:
        """End a run (putting back ``unhandled`` first in line); True if inputs are waiting,
        so the mailbox must be run again."""
        with self._lock:
            self._runner = None
            self._items.extendleft(unhandled)
            if self._items:
                return True
            self._scheduled = False
            if self._closed:  # only close() waits for this
                self._drained.notify_all()
            return False

    def _run_once(self) -> None:
        with self._lock:
            items = self._items
            if len(items) <= self._max_batch:
                batch = list(items)  # the usual case: all of it, in one C call
                items.clear()
            else:
                batch = [items.popleft() for _ in range(self._max_batch)]
            self._runner = threading.get_ident()
        try:
            if batch:
                self._handler(batch)
        except Exception:
            logger.exception("mailbox %s: the handler failed", self.name)
        finally:
            again = self._finish_run([])
        if again:  # to the back of the line: the other replicas' turn first
            self._pool._schedule(self, requeue=True)  # type: ignore[arg-type]
