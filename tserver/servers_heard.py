"""The peers a server has heard from, kept durably in its data directory: ``ServersHeard``.

Raft assumes that a replica's vote and the entries it acknowledged survive it.  A data
directory wiped whole (a replaced disk) breaks that, and the server cannot tell by itself:
an empty data directory is also what a server's first start looks like, and a server that
starts late in a new cluster must make its replicas then.  Its peers can tell.  Every
server writes down each peer whose consensus request or answer reached one of its replicas
-- before the replica steps it, so no vote or acknowledgement is counted from a peer not
yet written down -- in ``servers_heard.json``, and lists them in ``ListTablets``
(``servers_heard_from``).  A server that starts with an empty data directory asks its
peers (``TabletServer._ask_peers``); if one has heard from it, it ran before, and its
replicas open FAILED and are repaired by tablet copy (which gives them the leader's term
and a vote in it) instead of being made afresh as voters that forgot their votes.

A follower hears only from leaders and candidates, so one server's record may lack a peer
that only ever followed: when the leader that heard it is down, the others could not tell.
So every ``SHARE_INTERVAL_S`` each server also takes in its peers' records
(``TabletServer._share_servers_heard``): the record says which servers ran, heard from
directly or through a peer.

The set only grows, and is written once per peer over the data directory's life, so what a
message costs is one set lookup; that one write (an fsync) happens on whichever thread
received the message, the gRPC stream's event loop among them.  A write that fails is
logged, and the peer counts as recorded (in memory, and in ``ListTablets``) until the next
start, which writes it again: the record is a safeguard for the peers' sake, and a disk
that cannot write it fails the replicas' logs as well.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from pathlib import Path

from raftlet.consensus.log.segment import replace_durably

__all__ = ["SERVERS_HEARD_FILE", "SHARE_INTERVAL_S", "ServersHeard"]

logger = logging.getLogger(__name__)

SERVERS_HEARD_FILE = "servers_heard.json"
# How often a server takes in its peers' records.
SHARE_INTERVAL_S = 10.0


class ServersHeard:
    """The record of one data directory: empty until ``load``; ``note`` is safe from any
    thread."""

    def __init__(self, data_dir: Path, peers: Iterable[str]) -> None:
        """``peers``: the other servers of the cluster config (a message claiming to be
        from any other name is not recorded)."""
        self._path = data_dir / SERVERS_HEARD_FILE
        self._peers = frozenset(peers)
        self._lock = threading.Lock()
        # Replaced whole under _lock, read without it.
        self._heard: frozenset[str] = frozenset()

    @property
    def heard(self) -> frozenset[str]:
        return self._heard

    def note(self, server_id: str) -> None:
        """``server_id`` spoke to a replica here: on disk before this returns, the first
        time (unless the write fails: see the module docstring)."""
        if server_id not in self._heard and server_id in self._peers:
            self.note_all((server_id,))

    def note_all(self, servers: Iterable[str]) -> None:
        """Add ``servers`` (a peer's record, say): on disk before this returns (unless the
        write fails)."""
        with self._lock:
            new = (set(servers) & self._peers) - self._heard
            if not new:
                return
            heard = self._heard | new
            doc = {"servers": sorted(heard)}
            try:
                replace_durably(self._path, json.dumps(doc) + "\n")
            except OSError as exc:
                names = ", ".join(sorted(new))
                logger.warning(
                    "%s: not recorded that %s ran (%s); a wiped data directory there is not "
                    "recognised by this server until it is",
                    self._path,
                    names,
                    exc,
                )
            self._heard = heard

    def load(self) -> None:
        """Read the record (once the data directory is this server's)."""
        with self._lock:
            self._heard = self._read()

    def _read(self) -> frozenset[str]:
        try:
            doc = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return frozenset()
        except (OSError, ValueError) as exc:
            logger.warning(
                "%s cannot be read (%s): written again as peers are heard", self._path, exc
            )
            return frozenset()
        servers = doc.get("servers") if isinstance(doc, dict) else None
        if not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
            logger.warning(
                "%s is not a list of servers: written again as peers are heard", self._path
            )
            return frozenset()
        return frozenset(servers)
