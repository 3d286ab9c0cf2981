"""The copying server's side of a copy a crash cut short: the note it leaves while it
copies, and the copy begun again from it at the next start."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from raftlet.tserver.failed_tablet import FailedTablet
from raftlet.tserver.tablet_copier import TabletCopier
from raftlet.tserver.tablet_copy_install import (
    interrupted_copies,
    note_copy_under_way,
    recover_interrupted_copies,
)
from tests.waiting import wait_for


class _Entity:
    def counter(self, *_args: Any, **_labels: Any) -> Any:
        return SimpleNamespace(increment=lambda: None)


def _server(tmp_path: Path, hosted: dict[str, Any]) -> Any:
    config = SimpleNamespace(server_ids=("ts1", "ts2", "ts3"))
    return SimpleNamespace(
        entity=_Entity(),
        server_id="ts2",
        settings=SimpleNamespace(data_dir=tmp_path, config=config),
        hosted=hosted.get,
    )


def test_a_copy_leaves_a_note_while_it_runs_and_removes_it_when_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copier = TabletCopier(_server(tmp_path, {}), chunk_bytes=4096, repair_interval_s=0)
    seen: list[dict[str, list[str]]] = []

    def copy_into(tablet_id: str, sources: list[str], staging: Path) -> bool:
        # What a kill -9 here leaves behind, as the next start finds it.
        recover_interrupted_copies(tmp_path)
        seen.append(interrupted_copies(tmp_path))
        note_copy_under_way(tmp_path, tablet_id, sources)  # as it was
        return True

    monkeypatch.setattr(copier, "_copy_into", copy_into)
    assert copier._copy("t1", ["ts1"])
    assert seen == [{"t1": ["ts1"]}]
    assert interrupted_copies(tmp_path) == {}  # ended: nothing to begin again


def test_a_copy_cut_short_by_a_crash_begins_again_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A learner killed mid-copy was back in 18 s but healthy-looking: no leader asked it
    again until its abandoned session timed out at the source, 60 s after."""
    # A FAILED replica's voters, as the copier reads them.
    hosted: dict[str, Any] = {"t1": SimpleNamespace(voters=("ts1", "ts2", "ts3"))}
    copier = TabletCopier(_server(tmp_path, hosted), chunk_bytes=4096, repair_interval_s=0)
    begun: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(copier, "_begin_copy", lambda t, s: begun.append((t, s)) or True)
    note_copy_under_way(tmp_path, "t1", ["ts3"])
    note_copy_under_way(tmp_path, "gone", ["ts1"])  # deleted here since
    recover_interrupted_copies(tmp_path)
    assert copier.resume_interrupted() == ["t1"]
    # Its source first, then the voters (the leader may have moved); never itself.
    assert begun == [("t1", ["ts3", "ts1"])]
    assert copier.resume_interrupted() == []


def test_a_replica_a_newer_release_wrote_is_copied_over_by_no_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review r29v: the repair loop left such a replica alone, but a leader's
    StartTabletCopy replaced its files (consensus-meta, store and WAL), keeping nothing."""
    newer = FailedTablet(
        "t1", "kv", 0, ("ts1", "ts2", "ts3"), tmp_path / "t1",
        "MetadataNewerFormat: ...: written by a newer release", repairable=False,
    )  # fmt: skip
    damaged = FailedTablet("t2", "kv", 1, ("ts1", "ts2", "ts3"), tmp_path / "t2", "damaged")
    copier = TabletCopier(
        _server(tmp_path, {"t1": newer, "t2": damaged}), chunk_bytes=4096, repair_interval_s=0
    )
    copied: list[str] = []
    monkeypatch.setattr(copier, "_copy", lambda t, _s: copied.append(t) or True)
    started, why = copier.copy_from("t1", "ts1", 1)
    assert not started
    assert "not this release's to replace" in why
    assert "written by a newer release" in why
    assert not copier._begin_copy("t1", ["ts1"])  # nor by a resumed copy or the loop
    assert copier.copy_from("t2", "ts1", 1) == (True, "")  # damage is still repaired
    copier.stop()
    assert copied == ["t2"]


def test_the_copies_under_way_are_named_while_they_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ListTablets.copying_tablets``: a replica on its way by tablet copy read MISSING in
    `cluster status`, with the advice to remove and add it again (review r33a)."""
    copier = TabletCopier(_server(tmp_path, {}), chunk_bytes=4096, repair_interval_s=0)
    release = threading.Event()
    running = threading.Event()

    def copy_into(_tablet_id: str, _sources: list[str], _staging: Path) -> bool:
        running.set()
        return release.wait(30)

    monkeypatch.setattr(copier, "_copy_into", copy_into)
    try:
        assert copier.copies_under_way() == []
        assert copier._begin_copy("t1", ["ts1"])
        assert running.wait(30)
        assert copier.copies_under_way() == ["t1"]
        release.set()
        wait_for(lambda: copier.copies_under_way() == [], 30, "the copy ended")
    finally:
        release.set()
        copier.stop()
