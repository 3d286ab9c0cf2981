"""Group commit: one appender thread, many batches per fdatasync, a byte-bounded queue."""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path

import pytest

from raftlet.consensus.log import Log, LogClosedError, LogFailedError, LogOptions
from raftlet.consensus.log import log as log_module
from tests.unit.wal_helpers import RecordingObserver, entries, entry

WAIT = 30.0  # generous: a loaded CI box must not turn a slow wait into a failure


def test_concurrent_producers_share_fsyncs(tmp_path: Path) -> None:
    obs = RecordingObserver()
    producers, per_producer = 16, 12
    options = LogOptions(inject_latency_ms=5.0, inject_latency_jitter_ms=2.0)
    next_index = [1]
    order_lock = threading.Lock()
    results: list[BaseException | None] = []
    with Log.open(tmp_path, options, obs) as log:

        def produce() -> None:
            for _ in range(per_producer):
                done = threading.Event()

                def callback(err: BaseException | None, done: threading.Event = done) -> None:
                    results.append(err)
                    done.set()

                with order_lock:  # indexes are assigned in the order batches are queued
                    i = next_index[0]
                    next_index[0] += 1
                    log.append_async([entry(i)], callback)
                assert done.wait(WAIT)

        threads = [threading.Thread(target=produce) for _ in range(producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
            assert not t.is_alive()
        total = producers * per_producer
        assert results == [None] * total
        assert log.last_index() == total
        assert obs.batches == total
        assert sum(e for _, e, _ in obs.groups) == total
        # The point of group commit: far fewer syncs than appends.
        assert len(obs.groups) < total / 2, obs.groups
        assert max(b for b, _, _ in obs.groups) > 1
    with Log.open(tmp_path) as log:
        assert [e.index for e in log.entries(1, total + 1)] == list(range(1, total + 1))


def test_callbacks_run_in_queue_order_on_the_appender_thread(tmp_path: Path) -> None:
    seen: list[tuple[int, str]] = []
    with Log.open(tmp_path, LogOptions(inject_latency_ms=1.0)) as log:
        for i in range(1, 101):

            def callback(err: BaseException | None, i: int = i) -> None:
                seen.append((i, threading.current_thread().name))

            log.append_async([entry(i)], callback)
        log.append([])  # a barrier: returns once everything before it is durable
    assert [i for i, _ in seen] == list(range(1, 101))
    (thread,) = {name for _, name in seen}  # the log's one appender thread
    assert thread.startswith(f"log-appender:{tmp_path.name}")


def test_a_producer_blocks_while_the_queue_is_full_and_resumes(tmp_path: Path) -> None:
    obs = RecordingObserver()
    queue_bytes = 2000
    options = LogOptions(group_commit_queue_size_bytes=queue_bytes)
    with Log.open(tmp_path, options, obs) as log:
        obs.stall()
        log.append_async([entry(1)], lambda err: None)
        assert obs.stalled.wait(WAIT)  # the appender holds group 1 and takes nothing more
        # Fill the queue: each record is ~ 200 bytes.
        n = 2
        for _ in range(queue_bytes // 250):
            log.append_async([entry(n, data=b"q" * 180)], lambda err: None)
            n += 1
        returned = threading.Event()

        def producer() -> None:
            log.append_async([entry(n, data=b"q" * 600)], lambda err: None)
            returned.set()

        t = threading.Thread(target=producer)
        t.start()
        with obs.cond:
            assert obs.cond.wait_for(lambda: obs.blocked == 1, WAIT)
        assert not returned.is_set()
        assert log.last_index() == n - 1  # the blocked batch is not accepted yet
        obs.release()
        assert returned.wait(WAIT)
        t.join(WAIT)
        log.append([])
        assert log.last_index() == n


def test_a_batch_bigger_than_the_queue_is_admitted_when_the_queue_is_empty(
    tmp_path: Path,
) -> None:
    with Log.open(tmp_path, LogOptions(group_commit_queue_size_bytes=100)) as log:
        log.append(entries(1, 50, size=100))
        assert log.last_index() == 49


def test_a_callback_may_queue_more_but_not_wait(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    chained = threading.Event()
    with Log.open(tmp_path, LogOptions(group_commit_queue_size_bytes=100)) as log:

        def first_done(err: BaseException | None) -> None:
            try:
                log.append([entry(2)])
            except RuntimeError as exc:
                errors.append(exc)
            # The queue is "full" (limit 100 bytes), yet a callback is never made to wait.
            log.append_async([entry(2, data=b"c" * 300)], lambda err: chained.set())

        log.append_async([entry(1)], first_done)
        assert chained.wait(WAIT)
    assert len(errors) == 1
    assert "wait for itself" in str(errors[0])


def test_a_raising_callback_does_not_stop_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(err: BaseException | None) -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="raftlet.consensus.log"), Log.open(tmp_path) as log:
        log.append_async([entry(1)], boom)
        log.append([entry(2)])
    assert "append callback raised" in caplog.text


def test_close_completes_what_was_queued(tmp_path: Path) -> None:
    done: list[BaseException | None] = []
    log = Log.open(tmp_path, LogOptions(inject_latency_ms=2.0))
    for i in range(1, 21):
        log.append_async([entry(i)], done.append)
    log.close()
    assert done == [None] * 20
    with pytest.raises(LogClosedError):
        log.append_async([entry(21)], done.append)
    with Log.open(tmp_path) as log:
        assert log.last_index() == 20


def test_an_io_error_fails_the_group_and_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    obs = RecordingObserver()
    with Log.open(tmp_path, LogOptions(), obs) as log:
        log.append(entries(1, 3))
        real = os.fdatasync

        def failing(fd: int) -> None:
            raise OSError(errno.EIO, "injected I/O error")

        outcomes: list[BaseException | None] = []
        obs.stall()
        log.append_async(entries(3, 4), outcomes.append)
        assert obs.stalled.wait(WAIT)  # batch 3 is durable; the appender is held after it
        monkeypatch.setattr(os, "fdatasync", failing)
        log.append_async(entries(4, 5), outcomes.append)  # the next group: its sync fails
        log.append_async(entries(5, 6), outcomes.append)
        with caplog.at_level(logging.ERROR, logger="raftlet.consensus.log"):
            obs.release()
            with pytest.raises(LogFailedError) as exc:
                log.append([])
        assert isinstance(exc.value.__cause__, OSError)
        assert outcomes[0] is None
        assert [type(o) for o in outcomes[1:]] == [LogFailedError, LogFailedError]
        assert isinstance(log.failure, OSError)
        assert "injected I/O error" in caplog.text
        with pytest.raises(LogFailedError):
            log.append_async(entries(6, 7), outcomes.append)
        monkeypatch.setattr(os, "fdatasync", real)
    # Reopening verifies what reached the disk; the failed batches were never acknowledged,
    # so whether they are there does not matter, but what was acknowledged must be.
    with Log.open(tmp_path) as log:
        assert log.last_index() >= 3


def test_injected_latency_slows_each_sync(tmp_path: Path) -> None:
    timings: list[float] = []

    class Timer(RecordingObserver):
        def group_synced(
            self, batches: int, entries: int, nbytes: int, write_us: float, sync_us: float
        ) -> None:
            timings.append(sync_us)

    with Log.open(tmp_path, LogOptions(inject_latency_ms=20.0, fsync=False), Timer()) as log:
        log.append([entry(1)])
        log.append([entry(2)])
    assert len(timings) == 2
    assert min(timings) >= 20_000


def test_a_raising_observer_does_not_stop_the_appender(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(RecordingObserver):
        def batch_durable(self, entries: int, latency_us: float) -> None:
            raise RuntimeError("observer bug")

    with (
        caplog.at_level(logging.ERROR, logger="raftlet.consensus.log"),
        Log.open(tmp_path, LogOptions(), Broken()) as log,
    ):
        log.append([entry(1)])
        log.append([entry(2)])
        assert log.last_index() == 2
    assert "observer raised" in caplog.text


def test_an_unexpected_error_in_the_appender_fails_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(entries: object, synced_end: int = 0) -> tuple[bytes, bytes]:
        raise RuntimeError("encoder bug")

    with caplog.at_level(logging.ERROR, logger="raftlet.consensus.log"), Log.open(tmp_path) as log:
        log.append([entry(1)])
        monkeypatch.setattr(log_module, "encode_record", broken)
        with pytest.raises(LogFailedError) as exc:
            log.append([entry(2)])
        assert isinstance(exc.value.__cause__, RuntimeError)
        with pytest.raises(LogFailedError):
            log.append_async([entry(3)], lambda err: None)
    assert "encoder bug" in caplog.text
