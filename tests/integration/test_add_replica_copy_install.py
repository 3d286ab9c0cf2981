"""``raftlet tablet add-replica --wait`` onto a server whose new replica must be filled by a
tablet copy (the leader's log no longer starts at 1). While the copy is installed, the
replica is out of its server's maps for a moment; the wait, polling the learner, once took
that for a deleted replica, asked to create it again and failed ("holds a replica's files
already"), leaving a learner for good. Here the new server runs in this process with its
install held open until the wait has polled it a few times, so the window is hit every
time: its server must answer "being installed" (retriable), and the add must finish."""

from __future__ import annotations

import argparse
import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from raftlet.client import Client, RaftletError
from raftlet.client.membership import add_replica, leader_membership
from raftlet.cluster import ClusterConfig
from raftlet.tserver import tablet_copier
from raftlet.tserver.server import TabletServer
from raftlet.tserver.settings import ServerSettings
from tests.integration.tserver_cluster import WriteLoad, running_cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FLAGS = [
    "--log_segment_size_bytes=32768",
    "--log_gc_interval_s=0.2",
    "--log_max_segments_retained=2",
    "--tablet_copy_chunk_bytes=4096",
]


class _InProcessServer:
    """``server_id`` of ``config`` as a ``TabletServer`` on an event loop of its own thread
    (default flags), so a test can hold its tablet copy's install open."""

    def __init__(self, config: ClusterConfig, server_id: str) -> None:
        settings = ServerSettings.from_args(argparse.Namespace(server_id=server_id), config)
        self.server = TabletServer(settings)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"{server_id}-loop")
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(60)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(1.0), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


def test_add_replica_wait_rides_through_the_install_of_its_tablet_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_cluster(tmp_path, n_servers=4, partitions=1, flags=FLAGS) as cluster:
        (tid,) = cluster.tablet_ids()
        placed = cluster.config.placement(tid).replicas
        (spare,) = sorted(set(cluster.servers) - set(placed))
        cluster.wait_leaders()
        cluster.servers[spare].terminate()  # it comes back in this process
        with WriteLoad(cluster, n_writers=2) as load:
            load.wait_acked(200, timeout=120)
            for sid in placed:  # a new replica cannot be caught up from these logs
                wait_for(
                    lambda sid=sid: any(
                        t["tablet_id"] == tid and int(t["first_index"]) > 1
                        for t in cluster.servers[sid].tablets_json()
                    ),
                    120,
                    f"log GC of {tid} on {sid}",
                )
        assert not load.errors, load.errors

        installing, release = threading.Event(), threading.Event()
        real_swap_in = tablet_copier.swap_in

        def held_swap_in(live: Path, staging: Path, replaced: Path) -> None:
            installing.set()
            release.wait(120)
            real_swap_in(live, staging, replaced)

        monkeypatch.setattr(tablet_copier, "swap_in", held_swap_in)
        spare_server = _InProcessServer(cluster.config, spare)
        try:
            # What the spare answered about the tablet while its install was held.
            during: list[str] = []
            handler = spare_server.server.consensus_handler
            real_state = handler.get_consensus_state

            def state(request: Any) -> Any:
                try:
                    return real_state(request)
                except Exception as e:
                    if installing.is_set() and not release.is_set():
                        during.append(str(e))
                    raise

            monkeypatch.setattr(handler, "get_consensus_state", state)
            # What `raftlet tablet add-replica TABLET SERVER --wait` runs (the CLI itself
            # sets signal handlers, which only the main thread may).
            said: list[str] = []
            outcome: list[object] = []

            def run_add() -> None:
                try:
                    with Client.from_config(str(cluster.path)) as client:
                        add_replica(client, tid, spare, wait=True, timeout_s=90, say=said.append)
                    outcome.append("done")
                except RaftletError as e:
                    outcome.append(e)

            add = threading.Thread(target=run_add, name="add-replica")
            add.start()
            try:
                wait_for(installing.is_set, 90, f"a tablet copy of {tid} installing on {spare}")
                # Several polls of the learner meet the install (or the add gave up at once).
                wait_for(lambda: len(during) >= 3 or bool(outcome), 60, "the wait to poll")
            finally:
                release.set()
                add.join(120)
            assert outcome == ["done"], outcome
            assert any(f"{spare} caught up and promoted to voter" in line for line in said), said
            assert during
            assert all("a tablet copy is being installed" in d for d in during), during
            assert spare_server.server.copier._installed.value() >= 1
            with Client.from_config(str(cluster.path)) as client:
                m = leader_membership(client, tid, 30.0)
            assert spare in m.voters, m
            assert not m.learners, m
            cluster.wait_converged(tid, load.expected(tid), timeout=60, servers=placed)
        finally:
            spare_server.close()
