"""Tablet copy in the simulated driver: what carries out the core's SNAPSHOT messages.

A leader's core that cannot catch a follower up from its log (log GC discarded what it
needs) emits ``Message(SNAPSHOT, index=first_index)``; no core steps it.  The leader's
driver starts a copy *session*: it serializes its state machine at its applied index into
an image, cuts it into chunks and sends each as a ``CopyMsg`` through the simulated
network, so chunks are lost, duplicated, delayed, reordered and cut off like any message.

The follower's driver reassembles by chunk number (a duplicate changes nothing), asks for
the chunks it lacks again when none arrived for a while (``NEED``; it keeps what it has),
verifies the image's checksum, and installs only a complete, verified image:
``storage.apply_snapshot``, then ``RawNode.restore``.  If the core refuses (the copy is not
past its commit index, or it leads), the storage change is undone and the copy discarded.
It answers ``DONE``, which can be lost too: the leader's session then times out.  ``DONE``
is ok also for a copy refused because the follower's commit index covers it: it holds that
state, and a failure report would make the leader ask for the same copy again and again.

The leader reports the outcome to its core (``report_snapshot``): ok with the copy's index
on ``DONE ok``; failure on ``DONE`` not ok, on a timeout, or when the follower crashes (a
real copy's connection would break).  A leader that stops leading abandons its sessions (its
core would ignore the report).  Everything here is volatile: a crash ends a node's sessions
and discards its partial copies.
"""

from __future__ import annotations

import copy
import enum
import struct
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raftlet.consensus.core import Membership, Role

if TYPE_CHECKING:
    from tests.sim.cluster import SimCluster, SimNode

__all__ = ["CopyKind", "CopyMsg", "TabletCopy", "decode_state", "encode_state"]

# One applied entry of the simulated state machine: (index, term, data).
Applied = tuple[int, int, bytes]
_HEADER = struct.Struct(">QQI")


def encode_state(applied: Sequence[Applied]) -> bytes:
    """The state machine as bytes: each entry's index, term, data length and data."""
    return b"".join(_HEADER.pack(i, t, len(d)) + d for i, t, d in applied)


def decode_state(image: bytes) -> list[Applied]:
    out: list[Applied] = []
    pos = 0
    while pos < len(image):
        i, t, n = _HEADER.unpack_from(image, pos)
        pos += _HEADER.size
        out.append((i, t, image[pos : pos + n]))
        pos += n
    return out


class CopyKind(enum.Enum):
    CHUNK = "COPY_CHUNK"  # leader -> follower: one piece of the image
    NEED = "COPY_NEED"  # follower -> leader: send these chunks (again)
    DONE = "COPY_DONE"  # follower -> leader: installed (ok) or discarded the copy


@dataclass(frozen=True, slots=True)
class CopyMsg:
    type: CopyKind
    src: str
    dst: str
    session: int
    # The copy's point: the leader's applied index and that entry's term.
    index: int = 0
    term: int = 0
    # CHUNK: the leader's committed membership and its entry's index, which the copy
    # installs with it (it replaces the log that carried the changes).
    config: tuple[int, Membership] | None = None
    # CHUNK: chunk ``seq`` of ``count``, and the whole image's crc32, so any chunk, in any
    # order, tells the follower everything it needs to collect the rest.
    seq: int = 0
    count: int = 0
    crc: int = 0
    data: bytes = b""
    missing: tuple[int, ...] = ()  # NEED
    # DONE: the follower holds the state at ``index`` (installed it, or had it already).
    ok: bool = False


@dataclass(slots=True)
class _Sending:
    """The leader's side of a session."""

    id: int
    follower: str
    term: int  # the leader's term: a session never outlives its leadership
    index: int
    index_term: int
    config: tuple[int, Membership]
    crc: int
    chunks: list[bytes]
    deadline: int  # tick after which, without news, the copy counts as failed


@dataclass(slots=True)
class _Receiving:
    """The follower's side: what arrived of one session's image."""

    id: int
    leader: str
    index: int
    term: int
    config: tuple[int, Membership] | None
    count: int
    crc: int
    got: dict[int, bytes] = field(default_factory=dict)
    heard: int = 0  # tick of the last chunk
    retry_at: int = 0  # tick to ask for the missing chunks again
    image: bytes | None = None  # complete and verified, waiting for the disk to be free


class TabletCopy:
    def __init__(self, cluster: SimCluster) -> None:
        self.c = cluster
        self._next_id = 0
        # leader -> follower -> session; follower -> session id -> partial copy.
        self.sending: dict[str, dict[str, _Sending]] = {}
        self.receiving: dict[str, dict[int, _Receiving]] = {}
        # Sessions a follower is done with: late duplicates of their chunks are ignored.
        self._finished: dict[str, set[int]] = {}
        # What happened, for the statistics (``installs`` per follower too).
        self.stats: Counter[str] = Counter()
        self.installs_by: Counter[str] = Counter()
        self.installed: list[tuple[str, str, int]] = []  # (leader, follower, index)

    # --- the leader's side ------------------------------------------------------------

    def start(self, leader: SimNode, follower: str) -> None:
        """Carry out a SNAPSHOT message of ``leader``'s core: copy its state to ``follower``."""
        cfg = self.c.config
        raft = leader.node().raft
        index = raft.log.applied
        # The state machine is exactly the applied prefix; log GC keeps the entry at
        # ``applied`` (it compacts below it), so its term is at hand.
        assert leader.applied, leader.id
        assert leader.applied[-1][0] == index, (leader.id, index)
        image = encode_state(leader.applied)
        conf = raft.conf_state()
        size = cfg.chunk_bytes
        chunks = [image[o : o + size] for o in range(0, len(image), size)]
        self._next_id += 1
        s = _Sending(
            self._next_id,
            follower,
            raft.term,
            index,
            raft.log.term(index),
            (conf.committed_index, conf.committed),
            zlib.crc32(image),
            chunks,
            self.c.ticks + cfg.copy_timeout,
        )
        sessions = self.sending.setdefault(leader.id, {})
        if follower in sessions:
            self.stats["replaced"] += 1  # the core asked again: the older one is moot
        sessions[follower] = s
        self.stats["sessions"] += 1
        self.stats["image_bytes"] += len(image)
        self._send_chunks(leader.id, s, range(len(chunks)))

    def _send_chunks(self, leader: str, s: _Sending, seqs: Sequence[int] | range) -> None:
        for seq in seqs:
            self.stats["chunks_sent"] += 1
            self._send(
                CopyMsg(
                    CopyKind.CHUNK,
                    leader,
                    s.follower,
                    s.id,
                    index=s.index,
                    term=s.index_term,
                    config=s.config,
                    seq=seq,
                    count=len(s.chunks),
                    crc=s.crc,
                    data=s.chunks[seq],
                )
            )

    def _report(self, leader: SimNode, follower: str, ok: bool, index: int = 0) -> None:
        self.stats["reported_ok" if ok else "reported_failed"] += 1
        leader.node().report_snapshot(follower, ok, index)
        self.c._after(leader)

    def check_leader(self, leader: SimNode) -> None:
        """After every event at ``leader``: sessions of a leadership that ended are dropped."""
        sessions = self.sending.get(leader.id)
        if not sessions:
            return
        raft = leader.node().raft
        for follower, s in list(sessions.items()):
            if raft.role is not Role.LEADER or raft.term != s.term:
                del sessions[follower]
                self.stats["abandoned"] += 1

    # --- delivery ------------------------------------------------------------------------

    def deliver(self, m: CopyMsg) -> None:
        """``m`` reached ``m.dst``, which is up."""
        if m.type is CopyKind.CHUNK:
            self._on_chunk(m)
            return
        leader = self.c.nodes[m.dst]
        s = self.sending.get(m.dst, {}).get(m.src)
        if s is None or s.id != m.session:
            self.stats["stale_answers"] += 1  # a session that ended (or a duplicate DONE)
            return
        if m.type is CopyKind.NEED:
            self.stats["chunks_resent"] += len(m.missing)
            s.deadline = self.c.ticks + self.c.config.copy_timeout
            self._send_chunks(m.dst, s, m.missing)
            return
        del self.sending[m.dst][m.src]
        self._report(leader, m.src, m.ok, m.index)

    def _on_chunk(self, m: CopyMsg) -> None:
        node = m.dst
        if m.session in self._finished.get(node, ()):
            self.stats["chunks_late"] += 1
            return
        partials = self.receiving.setdefault(node, {})
        p = partials.get(m.session)
        if p is None:
            p = partials[m.session] = _Receiving(
                m.session, m.src, m.index, m.term, m.config, m.count, m.crc
            )
            p.retry_at = self.c.ticks + self.c.config.copy_retry
        p.heard = self.c.ticks
        if m.seq in p.got or p.image is not None:
            self.stats["chunks_duplicate"] += 1  # idempotent: nothing changes
            return
        p.got[m.seq] = m.data
        if len(p.got) < p.count:
            return
        image = b"".join(p.got[i] for i in range(p.count))
        if zlib.crc32(image) != p.crc:
            self.stats["checksum_failures"] += 1
            self._finish(node, p, ok=False)
            return
        p.image = image
        self._try_install(node, p)

    # --- the follower's side -------------------------------------------------------------

    def _try_install(self, node: str, p: _Receiving) -> None:
        sn = self.c.nodes[node]
        assert p.image is not None
        if sn.pending:
            # The install is a disk write like any other: it queues behind the writes in
            # flight (completing one after the log was replaced would mix the two logs).
            return
        state = decode_state(p.image)
        raw = sn.node()
        log = raw.raft.log
        # (Past the commit index, so past the log's start: log GC keeps the applied entry.)
        if p.index > log.committed and log.match_term(p.index, p.term):
            # Its log already holds the copy's entry (etcd's restore refuses such a copy):
            # installing would cut off the entries after it, which it may have acknowledged
            # to a leader that counted them to commit.  Raft.restore cannot tell, as it sees
            # the storage only once replaced; so the driver does not install.
            self.stats["skipped_log_holds"] += 1
            self._finish(node, p, ok=True)
            return
        # Its commit index covers the copy: it holds that state already (it installed this
        # copy before and the DONE was lost, say).  Refused, but the leader must hear "ok":
        # its core learns nothing else that would stop it from asking for copies forever
        # (it probes from its match, below its log's start, so it asks again).
        held = p.index <= log.committed
        # Staged: the core accepts or refuses a copy only once the storage holds it, and a
        # refused one must leave no trace.  MemoryStorage's apply_snapshot rebinds its
        # fields, so a shallow copy is the old storage.
        before = copy.copy(sn.storage)
        sn.storage.apply_snapshot(p.index, p.term)
        ok = raw.restore(p.index, p.term, p.config)
        if ok:
            sn.applied = state
            sn.flushed = tuple(state)  # installed durably: a restart resumes from the copy
            # ... and from the copy's membership: persisted with it, not with a later ready (a
            # crash before that ready was durable restarted the node, its log starting at the
            # copy, in the membership it had before -- perhaps missing a committed change).
            sn.conf = raw.conf_state()
            self.c.checker.observe_state(node, sn.incarnation, state)
            if p.config is not None:
                self.c.checker.observe_config(node, sn.incarnation, p.config)
            self.stats["installs"] += 1
            self.installs_by[node] += 1
            self.installed.append((p.leader, node, p.index))
        else:
            vars(sn.storage).update(vars(before))
            self.stats["refused"] += 1
            self.stats["refused_held"] += held
        self._finish(node, p, ok or held)
        self.c._after(sn)

    def _finish(self, node: str, p: _Receiving, ok: bool) -> None:
        del self.receiving[node][p.id]
        self._finished.setdefault(node, set()).add(p.id)
        self._send(CopyMsg(CopyKind.DONE, node, p.leader, p.id, index=p.index, ok=ok))

    # --- time and crashes -------------------------------------------------------------------

    def tick(self) -> None:
        """Once per tick: timeouts and retries of every session and partial copy."""
        now = self.c.ticks
        cfg = self.c.config
        # Snapshots of the dicts: a report can make a core ask for a new copy at once.
        for leader, sessions in list(self.sending.items()):
            for follower, s in list(sessions.items()):
                if now >= s.deadline:
                    # No DONE (lost, or the follower gave up): try again later.
                    del sessions[follower]
                    self.stats["timeouts"] += 1
                    self._report(self.c.nodes[leader], follower, ok=False)
        for node, partials in list(self.receiving.items()):
            for p in list(partials.values()):
                if p.image is not None:
                    self._try_install(node, p)
                elif now - p.heard >= cfg.copy_timeout:
                    del partials[p.id]  # the leader went away: give the partial copy up
                    self.stats["given_up"] += 1
                elif now >= p.retry_at:
                    missing = tuple(i for i in range(p.count) if i not in p.got)
                    self.stats["needs"] += 1
                    p.retry_at = now + cfg.copy_retry
                    self._send(CopyMsg(CopyKind.NEED, node, p.leader, p.id, missing=missing))

    def on_crash(self, node: str) -> None:
        """``node`` crashed: its sessions and partial copies are gone, and its leaders see
        their copies to it fail."""
        self.sending.pop(node, None)
        self.receiving.pop(node, None)
        self._finished.pop(node, None)
        for leader, sessions in list(self.sending.items()):
            if sessions.pop(node, None) is not None:
                self.stats["aborted_by_crash"] += 1
                self._report(self.c.nodes[leader], node, ok=False)

    def active(self, leader: str, follower: str) -> bool:
        return follower in self.sending.get(leader, {})

    def _send(self, m: CopyMsg) -> None:
        self.c.net.send(m, self.c.now)
