"""A server down for a while is named in its peers' logs, and so is its return
(``tserver.peer_contact``): before, a survivor logged nothing about it at all."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.tserver_cluster import Server, running_cluster, wait_for

pytestmark = pytest.mark.integration


def _says(server: Server, pattern: str) -> bool:
    return re.search(pattern, server.log_path.read_text(errors="replace")) is not None


def test_survivors_log_a_killed_peer_and_its_return(tmp_path: Path) -> None:
    with running_cluster(tmp_path, partitions=2) as cluster:
        cluster.wait_leaders()
        victim, *survivors = cluster.servers.values()
        # Each survivor leads a tablet, so each keeps sending the victim heartbeats (a
        # server that only follows sends a peer nothing, and holds no silence against it).
        for tablet_id, survivor in zip(cluster.tablet_ids(), survivors, strict=True):
            cluster.move_leader(tablet_id, survivor.id)
        victim.kill()
        silent = (
            rf"WARNING .*peer {victim.id} \({re.escape(victim.config.rpc_addr)}\) has not "
            r"answered for \d+ s"
        )
        for s in survivors:
            wait_for(lambda s=s: _says(s, silent), 45, f"{s.id} names {victim.id}")
        victim.start()
        back = rf"INFO .*peer {victim.id} \(.*\) answers again, after \d+ s without an answer"
        for s in survivors:
            wait_for(lambda s=s: _says(s, back), 30, f"{s.id} says {victim.id} is back")
        # The survivors answered one another throughout.
        for s in survivors:
            for other in survivors:
                assert not _says(s, rf"peer {other.id} \(.*\) has not answered"), s.log_tail()
