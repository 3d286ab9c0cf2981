"""``--worker_nice``: the replica worker pool's and WAL appenders' threads run at a lower
priority than the rest of the server (tserver.worker_nice)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlet.tserver.worker_nice import nicer_thread_start, worker_nice_supported
from tests.unit.thread_child import run_with_an_early_thread
from tests.unit.tserver_settings_helpers import parse, write_config

needs_thread_nice = pytest.mark.skipif(
    not worker_nice_supported(), reason="needs Linux's per-thread nice levels"
)


def test_the_flag_defaults_to_ten_and_is_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path)
    assert parse(config).worker_nice == 10
    assert parse(config, "--worker_nice", "0").worker_nice == 0
    assert parse(config, "--worker-nice=19").worker_nice == 19
    for bad in ("20", "-1", "ten"):
        with pytest.raises(SystemExit):
            parse(config, "--worker_nice", bad)
        assert "argument --worker_nice:" in capsys.readouterr().err, bad


def test_no_hook_for_zero_and_none_to_raise_priority() -> None:
    assert nicer_thread_start(0) is None
    with pytest.raises(ValueError, match="only go up"):
        nicer_thread_start(-1)


@needs_thread_nice
def test_a_pools_threads_run_lower_and_no_other_thread_does() -> None:
    # In a child process: a thread's nice level cannot be lowered back without privilege.
    out = run_with_an_early_thread(
        """
        import queue
        from raftlet.consensus.workers import WorkerPool
        from raftlet.tserver.worker_nice import nicer_thread_start, thread_nice

        base = thread_nice()
        seen = queue.Queue()
        for by in (3, 40):
            pool = WorkerPool("p", min_threads=1, max_threads=2,
                              thread_start=nicer_thread_start(by))
            box = pool.mailbox("m", lambda batch: seen.put(thread_nice()))
            box.post(1)
            print(seen.get(timeout=30) - base, min(19, base + by) - base)
            box.close()
            pool.stop()
        print(thread_nice() - base, thread_nice(early.native_id) - base)
        print(in_new_thread(thread_nice) - base)
        """
    )
    lines = [line.split() for line in out]
    assert lines[0][0] == lines[0][1], out  # base + 3 (capped)
    assert lines[0][0] != "0", out
    assert lines[1][0] == lines[1][1], out  # capped at 19
    assert lines[2:] == [["0", "0"], ["0"]], out  # the threads outside the pool stay
