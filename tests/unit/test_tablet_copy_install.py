"""Installing a tablet copy: the term and vote it starts with, a replica directory that
opens at the copy's index and takes the leader's next append, and a swap that a crash at
any point leaves either all old or all new."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from raftlet.consensus.core import Entry, EntryType
from raftlet.consensus.log import LogOptions, PersistentState
from raftlet.consensus.log.raft_storage import WAL_DIR
from raftlet.tserver.bootstrap import STORE_FILE, open_replica, to_apply_entries
from raftlet.tserver.store import TabletStore
from raftlet.tserver.tablet_copy_install import (
    CopiedState,
    CopyRefused,
    build_replica_dir,
    clear_replaced,
    copy_ended,
    installed_term_and_vote,
    interrupted_copies,
    note_copy_under_way,
    recover_interrupted_copies,
    replaced_dir,
    staging_dir,
    swap_in,
)
from tests.unit.client_fakes import KV_SCHEMA

VOTERS = ("a", "b", "c")
COPY = CopiedState(index=40, term=3, source_uuid="a", source_term=5, voters=VOTERS)


def test_a_replica_at_the_sources_term_keeps_its_vote() -> None:
    own = PersistentState(current_term=5, voted_for="c", voters=VOTERS, commit_index=10)
    assert installed_term_and_vote(own, COPY) == (5, "c")


def test_a_replica_behind_or_without_metadata_votes_for_the_source_in_its_term() -> None:
    # So it cannot vote again in the term it learns: the source already won it.
    own = PersistentState(current_term=2, voted_for="b", voters=VOTERS)
    assert installed_term_and_vote(own, COPY) == (5, "a")
    assert installed_term_and_vote(None, COPY) == (5, "a")


def test_a_replica_at_a_newer_term_refuses_the_copy() -> None:
    own = PersistentState(current_term=6, voters=VOTERS)
    with pytest.raises(CopyRefused, match="term 6"):
        installed_term_and_vote(own, COPY)


def _store_at(path: Path, index: int, term: int) -> None:
    """A store file whose applied entry is (index, term), as a source's snapshot is."""
    store = TabletStore.open(path, KV_SCHEMA)
    try:
        store.apply_batch(to_apply_entries([Entry(term, index, EntryType.NO_OP)], KV_SCHEMA))
    finally:
        store.close()


def test_a_built_directory_opens_at_the_copys_index(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    _store_at(staging / STORE_FILE, COPY.index, COPY.term)
    build_replica_dir(staging, COPY, None, LogOptions())
    opened = open_replica(staging, KV_SCHEMA, VOTERS)
    try:
        storage = opened.storage
        assert storage.log.first_index() == COPY.index
        assert storage.last_index() == COPY.index
        assert storage.term(COPY.index) == COPY.term
        assert opened.store.applied_index() == COPY.index
        assert opened.replayed == 0
        hard = storage.initial_state()
        assert (hard.term, hard.vote, hard.commit) == (5, "a", COPY.index)
        # The leader's next append follows the stand-in entry.
        storage.append([Entry(5, COPY.index + 1, EntryType.NORMAL, b"x")])
        assert storage.last_index() == COPY.index + 1
    finally:
        opened.close()


def _dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    live = tmp_path / "t1"
    staging = staging_dir(tmp_path, "t1")
    replaced = replaced_dir(tmp_path, "t1")
    live.mkdir()
    (live / "old").write_text("old")
    staging.mkdir(parents=True)
    (staging / "new").write_text("new")
    return live, staging, replaced


def test_swap_in_replaces_the_live_directory_whole(tmp_path: Path) -> None:
    live, staging, replaced = _dirs(tmp_path)
    swap_in(live, staging, replaced)
    assert sorted(p.name for p in live.iterdir()) == ["new"]
    assert not staging.exists()
    assert not replaced.exists()


def test_the_bytes_the_old_log_cut_stay_with_the_new_replica(tmp_path: Path) -> None:
    """The bytes a log cut at open are kept as evidence of damage a disk may have done --
    the damage that ends in a tablet copy, which removed them with the replaced replica."""
    live, staging, replaced = _dirs(tmp_path)
    (live / WAL_DIR).mkdir()
    (staging / WAL_DIR).mkdir()
    cut = "wal-0000000000000001.seg.cut-at-251468"
    (live / WAL_DIR / cut).write_bytes(b"damaged")
    (staging / WAL_DIR / cut).write_bytes(b"the new log's own")  # a name taken: not lost
    swap_in(live, staging, replaced)
    assert (live / WAL_DIR / cut).read_bytes() == b"the new log's own"
    assert (live / WAL_DIR / f"{cut}.1").read_bytes() == b"damaged"
    assert not replaced.exists()


def test_a_leftover_that_will_not_go_is_named_with_what_to_do_before_any_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replaced replica an earlier copy could not remove (an immutable file) failed every
    later copy at its swap, after the whole download, as "Operation not permitted:
    'wal-0000000000000001.seg'": no path, no way out."""
    live, staging, replaced = _dirs(tmp_path)
    (replaced / "wal").mkdir(parents=True)
    stuck = replaced / "wal" / "wal-0000000000000001.seg"
    stuck.write_bytes(b"x")
    real_unlink = os.unlink

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path).name == stuck.name:  # what chattr +i does, for root too
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    for attempt in (lambda: clear_replaced(replaced), lambda: swap_in(live, staging, replaced)):
        with pytest.raises(OSError, match="Operation not permitted") as caught:
            attempt()
        said = str(caught.value)
        assert str(stuck) in said
        assert f"remove {replaced} by hand" in said
    assert sorted(p.name for p in live.iterdir()) == ["old"]  # nothing swapped
    monkeypatch.setattr(os, "unlink", real_unlink)
    clear_replaced(replaced)
    assert not replaced.exists()
    clear_replaced(replaced)  # nothing there: nothing to do


def test_a_crash_between_the_renames_puts_the_old_replica_back(tmp_path: Path) -> None:
    live, staging, replaced = _dirs(tmp_path)
    live.rename(replaced)  # the first rename happened, the second did not
    assert recover_interrupted_copies(tmp_path) == ["t1"]
    assert sorted(p.name for p in live.iterdir()) == ["old"]
    assert not staging.exists()


def test_a_crash_after_the_swap_keeps_the_new_replica(tmp_path: Path) -> None:
    live, staging, replaced = _dirs(tmp_path)
    live.rename(replaced)
    staging.rename(live)  # both renames happened; the old copy was not removed yet
    assert recover_interrupted_copies(tmp_path) == []
    assert sorted(p.name for p in live.iterdir()) == ["new"]
    assert not replaced.exists()


def test_a_crash_during_the_download_leaves_the_old_replica_alone(tmp_path: Path) -> None:
    live, staging, _ = _dirs(tmp_path)
    (tmp_path / ".tablet-copy" / "out-abc.sqlite").write_bytes(b"a source's snapshot")
    assert recover_interrupted_copies(tmp_path) == []
    assert sorted(p.name for p in live.iterdir()) == ["old"]
    assert not staging.exists()
    assert list((tmp_path / ".tablet-copy").iterdir()) == []


def test_a_copy_a_crash_cut_short_is_found_at_start_with_its_sources(tmp_path: Path) -> None:
    """A learner killed mid-copy looked healthy when back: nobody began its copy again until
    the source's session timed out (60 s). Its note survives the start's cleanup."""
    _, staging, _ = _dirs(tmp_path)
    note_copy_under_way(tmp_path, "t1", ["a", "b"])
    note_copy_under_way(tmp_path, "t2", ["c"])
    copy_ended(tmp_path, "t2")  # that one finished
    assert recover_interrupted_copies(tmp_path) == []
    assert not staging.exists()
    assert interrupted_copies(tmp_path) == {"t1": ["a", "b"]}
    assert interrupted_copies(tmp_path) == {}  # begun again once, not at every start
    assert list((tmp_path / ".tablet-copy").iterdir()) == []
