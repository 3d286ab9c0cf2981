"""Tablet copy on a server: asking for copies, making them, and repairing FAILED replicas.

Three jobs, one object per server:

- **As a leader** (``request_copy``, from a replica's consensus when its core emits
  SNAPSHOT): ask the follower, with ``StartTabletCopy``, to copy the tablet from us. One
  request per (tablet, follower) is outstanding; a follower that refuses or cannot be
  reached is reported to the core as a failed copy at once, one that never begins its
  session is when the session janitor gives up on it (``tablet_copy_source``).
- **As the copying replica** (``start``, the ``StartTabletCopy`` handler; and the repair
  loop): download the source's snapshot (``tablet_copy_client``), then install it
  (``tablet_copy_install``): stop the replica, check once more that it may take the copy,
  build and swap in the new directory, open the replica again -- the old directory if
  anything failed before the swap -- and end the session with the outcome. A replica that
  knows a newer term than the source's, or has committed as far as the copy reaches,
  refuses it (``CopyRefused``): a copy never takes back what a replica holds committed.
- **Resuming**: a copy this server's crash cut short is begun again as the server starts
  (its note, ``tablet_copy_install.note_copy_under_way``), from the source it came from: no
  leader asks again before the abandoned session times out at the source (60 s), since
  the replica looks healthy; the new session replaces the old one there.
- **Repair**: every ``repair_interval_s`` (rounded up to whole seconds: the loop turns once
  a second; the flag takes 0 or >= 1), a tablet that is FAILED here (it failed to open,
  or its store was found damaged, or its log failed) copies itself from the leader among its
  voters -- found by asking them: a non-leader answers with the leader it believes in. The
  server's other tablets serve throughout.

One copy per tablet at a time; copies run on a small pool of their own threads, so a slow
one never holds a service or Raft thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from raftlet.client.retry import classify
from raftlet.consensus.log import ConsensusMetadata, LogError, PersistentState
from raftlet.metrics import catalogue as cat
from raftlet.proto import tablet_copy_pb2 as pb
from raftlet.proto import tablet_copy_pb2_grpc
from raftlet.tserver.errors import UnknownTablet
from raftlet.tserver.failed_tablet import FailedTablet
from raftlet.tserver.tablet_copy_client import (
    CopyFailed,
    CopySourceNotLeader,
    download,
    end_session,
)
from raftlet.tserver.tablet_copy_install import (
    CopiedState,
    CopyNotNeeded,
    CopyRefused,
    build_replica_dir,
    clear_replaced,
    copy_ended,
    installed_term_and_vote,
    interrupted_copies,
    note_copy_under_way,
    replaced_dir,
    staging_dir,
    swap_in,
)
from raftlet.tserver.tablet_replica import TabletReplica

if TYPE_CHECKING:
    from raftlet.tserver.server import TabletServer

__all__ = ["TabletCopier"]

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 10.0


class TabletCopier:
    def __init__(
        self,
        server: TabletServer,
        *,
        chunk_bytes: int,
        repair_interval_s: float,
        janitor_interval_s: float = 1.0,
    ) -> None:
        self._s = server
        self._chunk_bytes = chunk_bytes
        self._repair_interval_s = repair_interval_s
        self._janitor_interval_s = janitor_interval_s
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tablet-copy")
        self._lock = threading.Lock()
        self._copying: set[str] = set()
        # Tablets a reopen holds (``holding``): no copy begins for them meanwhile.
        self._held: set[str] = set()
        # Leaders that asked for a copy of a tablet while one was under way from another
        # source: tried next if that one fails (its source died, say), not a session
        # timeout later.
        self._next_sources: dict[str, list[str]] = {}
        # Why the last copy of a tablet failed on this server's side (its disk, a leftover
        # in the way), until one succeeds: the status of the FAILED replica it would repair
        # says so (``failure_note``), not only the log.
        self._copy_failures: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tablet-copy-janitor", daemon=True)
        self._installed = server.entity.counter(cat.TABLET_COPIES_INSTALLED_TOTAL)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def copying(self, tablet_id: str) -> bool:
        with self._lock:
            return tablet_id in self._copying

    def copies_under_way(self) -> list[str]:
        """The tablets this server is copying now (``ListTablets.copying_tablets``)."""
        with self._lock:
            return sorted(self._copying)

    # --- the leader asks ---------------------------------------------------------------------

    def request_copy(self, tablet_id: str, peer: str, term: int) -> None:
        """Under the replica's consensus lock: hand the request to a copy thread."""
        if self._stop.is_set() or not self._s.copy_sessions.await_begin(tablet_id, peer):
            return
        try:
            self._pool.submit(self._ask, tablet_id, peer, term)
        except RuntimeError:  # shutting down
            self._s.copy_sessions.not_started(tablet_id, peer)

    def _ask(self, tablet_id: str, peer: str, term: int) -> None:
        request = pb.StartTabletCopyRequest(
            tablet_id=tablet_id, source_uuid=self._s.server_id, source_term=term
        )
        why = ""
        try:
            resp = self._stub(peer).StartTabletCopy(request, timeout=_START_TIMEOUT_S)
            started = resp.started
            why = resp.error.message
        except grpc.RpcError as e:
            started, why = False, str(classify(e))
        if started:
            logger.info("tablet %s: %s is copying it from here (term %d)", tablet_id, peer, term)
            return
        logger.info("tablet %s: %s did not start a copy from here: %s", tablet_id, peer, why)
        self._s.copy_sessions.not_started(tablet_id, peer)
        replica = self._s.replicas.get(tablet_id)
        if replica is not None:
            replica.report_copy(peer, False, 0)

    # --- the follower copies -----------------------------------------------------------------

    def copy_from(self, tablet_id: str, source: str, source_term: int) -> tuple[bool, str]:
        """``StartTabletCopy``: begin copying ``tablet_id`` from ``source``, the leader of
        ``source_term``. (False, why) when this replica will not."""
        hosted = self._s.hosted(tablet_id)
        if hosted is None:
            raise UnknownTablet(tablet_id)
        if isinstance(hosted, TabletReplica):
            term = hosted.consensus.snapshot.term
            if term > source_term:
                return False, f"this replica is at term {term}, past {source} at {source_term}"
        elif not hosted.repairable:
            # Files a newer release wrote: only the repair loop left them alone, and a
            # leader's request replaced them (review r29v).
            return False, f"this replica's files are not this release's to replace: {hosted.reason}"
        if not self._begin_copy(tablet_id, [source]):
            with self._lock:
                if tablet_id in self._copying:
                    self._next_sources.setdefault(tablet_id, []).append(source)
            return True, "a copy of this tablet is already under way; tried from here next"
        return True, ""

    @contextlib.contextmanager
    def holding(self, tablet_id: str) -> Iterator[bool]:
        """Whether ``tablet_id`` is free of copies (none under way, none beginning, the
        copier not stopping); while the block runs, none begins. For a replica reopened in
        place, which a copy's install must not race."""
        with self._lock:
            free = not (tablet_id in self._copying or tablet_id in self._held)
            free = free and not self._stop.is_set()
            if free:
                self._held.add(tablet_id)
        try:
            yield free
        finally:
            if free:
                with self._lock:
                    self._held.discard(tablet_id)

    def _begin_copy(self, tablet_id: str, sources: list[str]) -> bool:
        hosted = self._s.hosted(tablet_id)
        if isinstance(hosted, FailedTablet) and not hosted.repairable:
            return False  # files a newer release wrote (``NewerFormat``): never copied over
        with self._lock:
            if tablet_id in self._copying or tablet_id in self._held or self._stop.is_set():
                return False
            self._copying.add(tablet_id)
        try:
            self._pool.submit(self._copy, tablet_id, sources)
        except RuntimeError:  # shutting down
            with self._lock:
                self._copying.discard(tablet_id)
            return False
        return True

    def _copy(self, tablet_id: str, sources: list[str]) -> bool:
        data_dir = self._s.settings.data_dir
        staging = staging_dir(data_dir, tablet_id)
        try:
            clear_replaced(replaced_dir(data_dir, tablet_id))
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            note_copy_under_way(data_dir, tablet_id, sources)
            done = self._copy_into(tablet_id, sources, staging)
            if done:
                self._copy_failures.pop(tablet_id, None)
            return done
        except OSError as e:
            # A full or failing disk here: one line, and the repair loop tries again.
            logger.warning("tablet %s: tablet copy failed: %s", tablet_id, e)
            self._copy_failures[tablet_id] = str(e)
            return False
        except Exception:
            logger.exception("tablet %s: tablet copy failed", tablet_id)
            return False
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            with contextlib.suppress(OSError):
                copy_ended(data_dir, tablet_id)
            with self._lock:
                self._copying.discard(tablet_id)
                self._next_sources.pop(tablet_id, None)

    def forget_failure(self, tablet_id: str) -> None:
        """The replica was mended otherwise (reopened once its disk had room): why its last
        copy failed is no news any more."""
        self._copy_failures.pop(tablet_id, None)

    def failure_note(self, tablet_id: str, reason: str) -> str:
        """``reason`` (a FAILED replica's), and why the copy that would repair it failed
        here, if the last one did."""
        failed = self._copy_failures.get(tablet_id)
        return f"{reason}; its repair by tablet copy fails: {failed}" if failed else reason

    def _copy_into(self, tablet_id: str, sources: list[str], staging: Path) -> bool:
        me = self._s.server_id
        queue, tried = list(sources), set()
        while not self._stop.is_set():
            if not queue:
                with self._lock:  # a leader that asked meanwhile
                    queue = [s for s in self._next_sources.pop(tablet_id, []) if s not in tried]
                if not queue:
                    break
            source = queue.pop(0)
            if source in tried or source == me:
                continue
            tried.add(source)
            stub = self._stub(source)
            try:
                got = download(stub, tablet_id, me, staging, chunk_bytes=self._chunk_bytes)
            except CopySourceNotLeader as e:
                logger.info(
                    "tablet %s: %s serves no copy: %s%s",
                    tablet_id,
                    source,
                    e,
                    f"; trying {e.leader}" if e.leader else "",
                )
                if e.leader:
                    queue.insert(0, e.leader)
                continue
            except CopyFailed as e:
                logger.warning("tablet %s: copy from %s failed: %s", tablet_id, source, e)
                continue
            state = dataclasses.replace(got.state, source_uuid=source)
            ok, held = False, state.index
            try:
                self._install(tablet_id, staging, state)
                ok = True
            except CopyNotNeeded as e:
                # Nothing to install, but the leader must learn where this replica is, or
                # it would ask for the same copy again and again.
                ok, held = True, e.index
                logger.info("tablet %s: the copy from %s is not needed: %s", tablet_id, source, e)
                return False
            except CopyRefused as e:
                logger.info("tablet %s: not installing the copy from %s: %s", tablet_id, source, e)
            finally:
                end_session(stub, got.session_id, me, ok, held)
            if ok:
                self._installed.increment()
                logger.info(
                    "tablet %s: installed a copy from %s at index %d (%d chunks, %d retries, "
                    "%d sessions)",
                    tablet_id,
                    source,
                    state.index,
                    got.chunks,
                    got.retries,
                    got.sessions,
                )
            return ok
        return False

    def _install(self, tablet_id: str, staging: Path, state: CopiedState) -> None:
        """Swap the verified copy in for this server's replica (module docstring)."""
        hosted = self._s.hosted(tablet_id)
        own, held = _own_state(hosted, state)
        damaged = _damaged(hosted)
        _check_installable(own, held, state, damaged)
        try:
            # Inside: a replica whose stop fails is listed again (FAILED, say), not dropped.
            old = self._s.take_replica(tablet_id)
            own, held = _own_state(old, state)  # what the stopped replica made durable
            _check_installable(own, held, state, damaged or _damaged(old))
            build_replica_dir(staging, state, own, self._s.log_options)
            data_dir = self._s.settings.data_dir
            swap_in(data_dir / tablet_id, staging, replaced_dir(data_dir, tablet_id))
        finally:
            self._s.reopen_replica(tablet_id)

    def _stub(self, server_id: str) -> tablet_copy_pb2_grpc.TabletCopyServiceStub:
        channel = self._s.channels.channel(self._s.settings.peer_addr(server_id))
        return tablet_copy_pb2_grpc.TabletCopyServiceStub(channel)

    # --- the janitor and repair loop ----------------------------------------------------------

    def _run(self) -> None:
        try:
            self.resume_interrupted()
        except Exception:
            logger.exception("tablet copy: resuming interrupted copies failed")
        # The first repair pass comes one janitor turn after start, not a whole repair
        # interval: a replica found FAILED as the server opened it (a wiped directory, a
        # damaged file) is copied back at once; later passes retry every interval.
        waited = float(self._repair_interval_s)
        while not self._stop.wait(self._janitor_interval_s):
            try:
                self._s.copy_sessions.expire()
            except Exception:
                logger.exception("tablet copy: expiring sessions failed")
            waited += self._janitor_interval_s
            if self._repair_interval_s > 0 and waited >= self._repair_interval_s:
                waited = 0.0
                try:
                    self._s.reopen_logs_failed_for_space()
                except Exception:
                    logger.exception("reopening logs that failed for want of space failed")
                self.repair_failed()

    def resume_interrupted(self) -> list[str]:
        """Begin again every copy a crash of this server cut short (the note it left); the
        ids of the tablets whose copy started. Its sources first, then the tablet's voters
        (a non-leader names the leader), so a leader that changed meanwhile is found."""
        known = set(self._s.settings.config.server_ids)
        started = []
        for tablet_id, noted in interrupted_copies(self._s.settings.data_dir).items():
            hosted = self._s.hosted(tablet_id)
            if hosted is None:
                continue  # deleted here since: nothing to copy into
            if isinstance(hosted, TabletReplica):
                voters = tuple(hosted.consensus.membership.voters)
            else:
                voters = hosted.voters
            sources = list(dict.fromkeys(s for s in (*noted, *voters) if s in known))
            sources = [s for s in sources if s != self._s.server_id]
            if sources and self._begin_copy(tablet_id, sources):
                logger.info(
                    "tablet %s: a copy from %s was cut short by a crash; beginning it again",
                    tablet_id,
                    ", ".join(noted) or "?",
                )
                started.append(tablet_id)
        return started

    def repair_failed(self) -> list[str]:
        """Start a copy for every tablet FAILED here that is not copying yet; their ids."""
        started = []
        for tablet_id, voters in self._s.tablets_needing_repair():
            sources = [v for v in voters if v != self._s.server_id]
            if sources and self._begin_copy(tablet_id, sources):
                started.append(tablet_id)
        return started


def _own_state(
    hosted: TabletReplica | FailedTablet | None, state: CopiedState
) -> tuple[PersistentState | None, int]:
    """A replica's durable term and vote, and how far it is known to hold the tablet: its
    commit index, or the copy's index if its log holds the copy's entry; None and 0 for a
    FAILED one whose metadata cannot be read."""
    if isinstance(hosted, TabletReplica):
        persisted = hosted.persistent_state()
        held = max(persisted.commit_index, hosted.store.applied_index())
        if _log_holds(hosted, state.index, state.term):
            held = max(held, state.index)
        return persisted, held
    if isinstance(hosted, FailedTablet):
        try:
            meta = ConsensusMetadata.load(hosted.directory)
        except (LogError, OSError):
            return None, 0
        if meta.fresh:
            return None, 0
        return meta.state, meta.state.commit_index
    return None, 0


def _log_holds(replica: TabletReplica, index: int, term: int) -> bool:
    log = replica.consensus_log()
    try:
        return log.first_index() <= index <= log.last_index() and log.term(index) == term
    except (IndexError, LogError):
        return False  # GC or a truncation moved the log meanwhile: it does not, for sure


def _damaged(hosted: TabletReplica | FailedTablet | None) -> bool:
    """Whether ``hosted`` is FAILED: it failed to open, or its store or log failed since."""
    if isinstance(hosted, FailedTablet):
        return True
    return hosted is not None and hosted.needs_repair()


def _check_installable(
    own: PersistentState | None, held: int, state: CopiedState, damaged: bool = False
) -> None:
    """Raises unless the copy may replace the replica. A healthy replica needs a copy only
    past what it holds. A damaged one holds nothing it can serve (its log may end before its
    saved commit index): any copy that keeps what it knew committed will do -- on an idle
    tablet, the one at that very index."""
    installed_term_and_vote(own, state)  # raises if we know a newer term
    if damaged and held > state.index:
        raise CopyRefused(
            f"the copy ({state.index}) is behind what this replica knew committed ({held}): "
            "waiting for a newer one"
        )
    if not damaged and held >= state.index:
        raise CopyNotNeeded(
            f"this replica holds the tablet up to {held}, as far as the copy ({state.index})",
            held,
        )
