"""Which tablets this server hosts, kept durably beside their directories: ``HostedTablets``.

A replica remembers its term, vote and log in its own directory.  A directory that is gone
-- wiped by hand, lost with a disk, deleted by mistake -- used to come back at the next
start as a new, empty replica of the placement's voters: a voter that had forgotten its
vote and the entries it acknowledged, which could elect a lagging replica and lose
acknowledged writes.  Raft assumes acknowledgements are durable; a server cannot tell an
empty directory it was meant to create from one it lost, unless it wrote down which
tablets it hosts.  So it does, in ``hosted_tablets.json`` at the top of its data directory:

- ``hosted``: the tablets with a replica here (opened, FAILED, or created by CreateReplica);
  one deleted from its group (a tombstone) leaves the list.
- ``creating``: replicas being made, not yet hosted.  A server records them before it makes
  them and moves them to ``hosted`` once made, before it serves anything: a server killed
  in between (its first ``cluster up``, say) has voted for nothing and acknowledged
  nothing, so at the next start a placed one without consensus metadata is made again,
  and one CreateReplica was making (whose caller saw no answer) is dropped.  Recorded
  as hosted before they were made, such replicas once opened FAILED "wiped" on two of
  three servers of a new cluster, which then never elected a leader.
- ``placed``: the tablets the cluster config placed here when the list was written, so a
  tablet added to the config later is told apart from one deleted here.

At start (``TabletServer._tablets_to_open``): without the file and without any replica
directory (a new server), every placed tablet is made; without the file beside replicas (a
server from before it, or a record moved aside), the replicas there are opened and nothing
is made afresh; with it, a hosted tablet whose directory holds no replica is FAILED ("wiped
or lost") and repaired by a tablet copy from its leader, never started afresh, and a placed
tablet that is neither hosted, being made, nor new to the config (deleted here) is not
opened.  The file is replaced atomically (a temporary file, fsync, rename, fsync of the
directory).  A data directory wiped whole loses this file too, and would be a new server as
far as it can tell; its peers can tell otherwise (``tserver.empty_start``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from raftlet.consensus.log.segment import fsync_dir, replace_durably

__all__ = ["HOSTED_TABLETS_FILE", "HostedTablets"]

HOSTED_TABLETS_FILE = "hosted_tablets.json"
_MOVE_ASIDE = (
    "Move it aside and restart: the server records the replica directories it finds (a "
    "placed tablet without one is then not made afresh: `raftlet tablet remove-replica "
    "TABLET SERVER --wait`, then `add-replica TABLET SERVER --wait`, makes it again)"
)


@dataclass(frozen=True)
class HostedTablets:
    """The record of one data directory; ``hosted`` and ``placed`` are None before the
    first save."""

    hosted: frozenset[str] | None
    placed: frozenset[str] | None
    creating: frozenset[str] = frozenset()

    @classmethod
    def load(cls, data_dir: Path) -> HostedTablets:
        path = data_dir / HOSTED_TABLETS_FILE
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(None, None)
        except (OSError, ValueError) as exc:
            # Guessing would risk the very restart this file is there to prevent.
            raise OSError(
                f"{path} cannot be read ({exc}); the server cannot tell which tablets it "
                f"hosts. {_MOVE_ASIDE}"
            ) from exc
        if not isinstance(doc, dict) or not all(
            isinstance(doc.get(k), list) and all(isinstance(t, str) for t in doc[k])
            for k in ("hosted", "placed")
        ):
            raise OSError(f"{path} is not a list of hosted and placed tablets. {_MOVE_ASIDE}")
        creating = doc.get("creating", [])
        if not isinstance(creating, list) or not all(isinstance(t, str) for t in creating):
            raise OSError(f"{path}: 'creating' is not a list of tablets. {_MOVE_ASIDE}")
        return cls(frozenset(doc["hosted"]), frozenset(doc["placed"]), frozenset(creating))

    @staticmethod
    def save(
        data_dir: Path,
        hosted: set[str] | frozenset[str],
        placed: set[str] | frozenset[str],
        creating: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        """Durably replace the record (returns once it is on disk); a record that says the
        same already is left as it is, so a server restarts on a full disk."""
        doc = {"hosted": sorted(hosted), "creating": sorted(creating), "placed": sorted(placed)}
        text = json.dumps(doc, indent=1) + "\n"
        path = data_dir / HOSTED_TABLETS_FILE
        try:
            same = path.read_text(encoding="utf-8") == text
        except (OSError, UnicodeDecodeError):
            same = False
        if same:
            fsync_dir(data_dir)  # in case its rename was not durable yet
            return
        replace_durably(path, text)
