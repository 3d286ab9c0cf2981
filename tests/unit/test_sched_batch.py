"""``--sched_batch``: every thread of a server runs under SCHED_BATCH (tserver.sched_batch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlet.tserver.sched_batch import sched_batch_supported
from tests.unit.thread_child import run_with_an_early_thread
from tests.unit.tserver_settings_helpers import parse, write_config

needs_sched_batch = pytest.mark.skipif(
    not (sched_batch_supported() and Path("/proc/self/task").exists()),
    reason="needs Linux's SCHED_BATCH and /proc",
)


def test_the_flag_is_on_by_default_and_can_be_turned_off(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    assert parse(config).sched_batch is True
    assert parse(config, "--sched_batch=false").sched_batch is False
    assert parse(config, "--sched-batch", "true").sched_batch is True


@needs_sched_batch
def test_threads_started_before_and_after_run_under_sched_batch() -> None:
    out = run_with_an_early_thread(
        """
        from raftlet.tserver.sched_batch import apply_sched_batch
        print(os.sched_getscheduler(early.native_id) == os.SCHED_BATCH)
        print(apply_sched_batch() >= 2)
        print(in_new_thread(lambda: os.sched_getscheduler(0)) == os.SCHED_BATCH)
        print(os.sched_getscheduler(early.native_id) == os.SCHED_BATCH)
        print(os.sched_getscheduler(0) == os.SCHED_BATCH)
        """
    )
    # The early thread was not under the policy until apply_sched_batch set it.
    assert out == ["False", "True", "True", "True", "True"], out
