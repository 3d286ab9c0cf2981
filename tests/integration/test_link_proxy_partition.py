"""A real partition without root: three ``raftlet tserver`` processes on loopback dial each
other only through a ``ProxyNetwork`` (``--peer_addresses``), while the test, like any
client, reaches every server directly.

Isolating a tablet's leader must look to Raft like a partition: the other two elect a new
leader and accept writes; the isolated leader, alive and reachable by clients, loses its
quorum, steps down and applies none of them. After ``heal`` it follows the new leader and
every replica converges. Run for both consensus transports, which both take their peer
addresses from the flag.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlet.chaos.link_proxy import ProxyNetwork
from raftlet.proto import consensus_pb2
from tests.integration.tserver_cluster import (
    Server,
    TserverCluster,
    kv_op,
    wait_for,
    write_request,
    write_with_retry,
)

pytestmark = pytest.mark.integration

TABLET = "kv-p0"


@pytest.fixture(params=["tcp", "stream", "unary"])
def proxied(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[TserverCluster, ProxyNetwork]]:
    """A started 3-server cluster whose servers reach each other only through the proxies."""
    cluster = TserverCluster(tmp_path, partitions=1, flags=["--consensus_transport", request.param])
    with cluster.ports_held():
        net = ProxyNetwork.for_config(cluster.config)
    try:
        for sid in cluster.servers:
            cluster.server_flags[sid] = ["--peer_addresses", net.peer_addresses_flag(sid)]
        cluster.start()
        yield cluster, net
    finally:
        cluster.stop()
        net.close()


class Writer:
    """Writes rows of distinct keys, each acknowledged (retried with one request id), and
    remembers what the tablet must hold."""

    def __init__(self, cluster: TserverCluster) -> None:
        self.cluster = cluster
        self.expected: dict[int, str] = {}
        self._seq = itertools.count(1)

    def write(self, keys: range, first: str | None = None) -> None:
        for key in keys:
            seq = next(self._seq)
            value = f"v{key}"
            req = write_request(TABLET, [kv_op(key, value)], "partition-test", seq, seq)
            resp = write_with_retry(self.cluster, req, first=first, timeout=30).response
            assert not resp.row_errors, resp
            self.expected[key] = value


def view(server: Server) -> consensus_pb2.RaftRole.ValueType | None:
    try:
        return server.list_tablets()[TABLET].role
    except Exception:
        return None


def test_an_isolated_leader_is_replaced_and_rejoins_after_heal(
    proxied: tuple[TserverCluster, ProxyNetwork],
) -> None:
    cluster, net = proxied
    old = cluster.leader_of(TABLET)
    others = [sid for sid in cluster.servers if sid != old.id]
    writer = Writer(cluster)
    writer.write(range(5), first=old.id)
    cluster.wait_converged(TABLET, writer.expected)
    # The servers really talk through the proxies: the leader's appends went on its links.
    for sid in others:
        assert net.proxy(old.id, sid).bytes_forwarded > 0

    net.isolate(old.id)
    assert net.cut_links() == {(old.id, s) for s in others} | {(s, old.id) for s in others}
    new = cluster.new_leader_of(TABLET, old=old.id)
    assert new.id in others
    writer.write(range(5, 25), first=new.id)
    cluster.wait_converged(TABLET, writer.expected, servers=others)

    # The isolated leader, still running and reachable, lost its quorum: it steps down
    # (check-quorum) and has applied none of the rows written behind its back.
    wait_for(
        lambda: view(old) not in (consensus_pb2.LEADER, None),
        30,
        f"{old.id} stepping down while isolated",
    )
    assert set(old.scan_rows(TABLET)) == set(range(5))

    net.heal()
    assert net.cut_links() == set()

    def follows_new_leader() -> bool:
        st = old.list_tablets()[TABLET]
        return st.role == consensus_pb2.FOLLOWER and st.leader_uuid == new.id

    wait_for(follows_new_leader, 30, f"{old.id} following {new.id} after heal")
    cluster.wait_converged(TABLET, writer.expected)
    # And the healed cluster takes writes everywhere again.
    writer.write(range(25, 30), first=new.id)
    cluster.wait_converged(TABLET, writer.expected)
