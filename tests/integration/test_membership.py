"""Membership changes on real servers: a replica moved to a fourth server under a write load
(``raftlet tablet move-replica``), and every replica of a permanently killed server replaced
(``raftlet cluster replace-server``).  Afterwards every replica of the new groups holds
exactly the acknowledged rows (no row lost, none twice: every write inserts a key of its
own, so a write applied twice would have failed with KEY_EXISTS), the replicas' checksums
agree (``raftlet cluster ksck --checksum``), and the moves survive restarts.

Each test runs twice: with log GC off (``--log_gc_interval_s=3600``), where a new replica
catches up by ordinary appends from a log that still starts at index 1; and with log GC
forced small, where the log it would need is gone and it catches up by a tablet copy."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftlet.cli.main import main as cli
from raftlet.client import Client, FlushMode, RaftletError, ReadMode
from raftlet.client.membership import add_replica, leader_membership, remove_replica
from raftlet.proto import admin_pb2
from raftlet.tserver.bootstrap import TOMBSTONE_FILE
from tests.integration.tserver_cluster import TserverCluster, running_cluster, wait_for

FLAGS = {
    "log": ["--log_gc_interval_s=3600"],
    "copy": [
        "--log_segment_size_bytes=32768",
        "--log_gc_interval_s=0.2",
        "--log_max_segments_retained=2",
        "--tablet_copy_chunk_bytes=4096",
    ],
}


class ClientLoad:
    """Writer threads inserting keys of their own through the client library (which must
    follow the tablet's replicas as they move); every acknowledged key is recorded."""

    def __init__(self, cluster: TserverCluster, writers: int = 3, key_base: int = 0) -> None:
        self.key_base = key_base
        self.client = Client.from_config(str(cluster.path), timeout_s=60.0)
        self.acked: dict[int, str] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(w,), daemon=True) for w in range(writers)
        ]

    def _run(self, writer: int) -> None:
        session = self.client.new_session(FlushMode.AUTO_FLUSH_SYNC, timeout_s=60.0)
        key = self.key_base + writer * 1_000_000
        while not self._stop.is_set():
            key += 1
            value = f"w{writer}-{key}"
            try:
                session.insert("kv", {"key": key, "value": value})
            except RaftletError as e:  # a write never acknowledged: the test fails
                with self._lock:
                    self.errors.append(f"key {key}: {e}")
                return
            with self._lock:
                self.acked[key] = value

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def wait_more(self, n: int, timeout: float = 60.0) -> None:
        start = self.count()
        wait_for(lambda: self.count() >= start + n or bool(self.errors), timeout, f"{n} writes")
        assert not self.errors, self.errors

    def __enter__(self) -> ClientLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)
        self.client.close()


@pytest.fixture(params=sorted(FLAGS))
def four(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[TserverCluster]:
    """Four servers, table kv of two tablets of three replicas each: every tablet has a
    server that holds no replica of it. ``four.catch_up`` says how new replicas catch up."""
    with running_cluster(tmp_path, n_servers=4, partitions=2, flags=FLAGS[request.param]) as c:
        c.wait_leaders()
        c.catch_up = request.param  # type: ignore[attr-defined]
        yield c


def _gc_past_the_start(cluster: TserverCluster, tid: str, load: ClientLoad) -> None:
    """In "copy" mode, write until the logs no longer start at 1: a new replica cannot be
    caught up from them."""
    if cluster.catch_up != "copy":  # type: ignore[attr-defined]
        return
    for sid in cluster.config.placement(tid).replicas:
        if not cluster.servers[sid].alive:
            continue
        wait_for(
            lambda sid=sid: (
                any(
                    t["tablet_id"] == tid and int(t["first_index"]) > 1
                    for t in cluster.servers[sid].tablets_json()
                )
                or bool(load.errors)
            ),
            120,
            f"log GC of {tid} on {sid}",
        )


def _copies(cluster: TserverCluster, sid: str) -> float:
    return cluster.servers[sid].metric("tablet_copies_installed_total")


def _expected(load: ClientLoad, cluster: TserverCluster, tablet_id: str) -> dict[int, str]:
    return {k: v for k, v in load.acked.items() if cluster.tablet_for_key(k) == tablet_id}


def _check_groups(
    cluster: TserverCluster,
    load: ClientLoad,
    client: Client,
    capsys: pytest.CaptureFixture[str],
    servers_down: int = 0,
) -> None:
    """Every tablet: three voters, each holding exactly the acknowledged rows, checksums
    equal, and ksck --checksum content (but for the servers down: a WARN, exit 1)."""
    for tid in cluster.tablet_ids():
        m = leader_membership(client, tid, 30.0)
        assert len(m.voters) == 3, m
        assert not m.learners, m
        cluster.wait_converged(tid, _expected(load, cluster, tid), timeout=60, servers=m.voters)
        checksum = client.checksum(tid, timeout_s=30.0)
        assert {r.server for r in checksum.replicas} == set(m.voters), checksum
        assert checksum.ok, checksum
    capsys.readouterr()
    code = cli(["cluster", "ksck", "--cluster", str(cluster.path), "--checksum"])
    out = capsys.readouterr().out
    assert "CHECKSUMS OK" in out, out
    n = len(cluster.tablet_ids())
    assert f"{n}/{n} tablets with a ready leader" in out, out
    up = len(cluster.servers) - servers_down
    assert f"{up}/{len(cluster.servers)} servers up" in out, out
    assert code == (1 if servers_down else 0), out


def test_move_a_replica_to_a_fourth_server_under_write_load(
    four: TserverCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    tid = "kv-p0"
    placed = four.config.placement(tid).replicas
    (spare,) = sorted(set(four.servers) - set(placed))
    source = four.leader_of(tid).id  # the leader leaves: leadership moves first
    target = ["--cluster", str(four.path)]

    # Clear refusals, nothing changed.
    # A replica created as a voter could start a group of its own (it once elected itself
    # leader of a one-voter kv-p0 beside the real one): it joins as a learner, or not at all.
    for voters, learners in (([spare], []), ([*placed, spare], [spare]), ([], [spare])):
        with pytest.raises(grpc.RpcError) as refused:
            four.servers[spare].admin.CreateReplica(
                admin_pb2.CreateReplicaRequest(tablet_id=tid, voters=voters, learners=learners),
                timeout=10,
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        words = "at least one voter" if not voters else "joins as a learner"
        assert words in (refused.value.details() or "")
    assert tid not in {t["tablet_id"] for t in four.servers[spare].tablets_json()}
    # Refused before anything was written: a refusal once left the files and the hosted
    # record of a replica the server then could not open at its next start.
    assert not (four.servers[spare].config.data_dir / tid).exists()
    assert cli(["tablet", "add-replica", tid, placed[0], *target, "--wait"]) == 1
    assert "already holds a replica" in capsys.readouterr().err
    # Names no config knows are usage errors, as with leader-step-down (review r33a: 1).
    assert cli(["tablet", "add-replica", tid, "ts9", *target]) == 2
    assert "unknown server 'ts9'" in capsys.readouterr().err
    assert cli(["cluster", "replace-server", "ts9", *target]) == 2
    assert "unknown server 'ts9'" in capsys.readouterr().err
    assert cli(["tablet", "remove-replica", "kv-p7", placed[0], *target]) == 2
    assert "no tablet 'kv-p7' (tablets: kv-p0, " in capsys.readouterr().err
    assert cli(["tablet", "remove-replica", tid, spare, *target]) == 1
    assert f"{spare} holds no replica" in capsys.readouterr().err

    with ClientLoad(four) as load, Client.from_config(str(four.path)) as client:
        load.wait_more(50)
        _gc_past_the_start(four, tid, load)
        # Still the leader's replica that leaves, whatever an election did in the meantime.
        four.move_leader(tid, source)
        # Without --wait, too, a move ends with its source's replica deleted (review r33a).
        assert cli(["tablet", "move-replica", tid, source, spare, *target]) == 0
        out = capsys.readouterr().out
        assert f"leadership moved from {source}" in out
        assert f"{spare} caught up and promoted to voter" in out
        assert f"{tid}: the replica on {source} was deleted" in out
        # Checksums compare the replicas the group has now, even where the client's view is
        # from before the move -- as a look-up cut short left ksck's (review r30a: it asked
        # the old replica, NOT_FOUND, and never the new one).
        client.leader_of(tid, refresh=True)
        client._meta.set_replicas(tid, placed)
        sums = client.checksum(tid, refresh=False)
        assert sorted(r.server for r in sums.replicas) == sorted({*placed, spare} - {source})
        assert sums.ok, sums
        load.wait_more(50)  # the client found the tablet where it is now
    assert not load.errors, load.errors
    if four.catch_up == "copy":  # type: ignore[attr-defined]
        assert _copies(four, spare) >= 1

    with Client.from_config(str(four.path)) as client:
        m = leader_membership(client, tid, 30.0)
        assert sorted(m.voters) == sorted({*placed, spare} - {source})
        assert m.leader != source
        _check_groups(four, load, client, capsys)
    # A client that only knows an address finds the config there, the moved tablet too.
    via = ["--servers", four.servers[spare].config.rpc_addr]
    assert cli(["tablet", "remove-replica", tid, source, *via]) == 1
    assert f"{source} holds no replica of {tid}" in capsys.readouterr().err
    # Leadership goes to the voters the group has now, not to those the config placed.
    assert cli(["leader-step-down", tid, *target, "--to", source]) == 1
    assert f"--to {source}: no member of {tid}, and only a voter" in capsys.readouterr().err
    to = next(v for v in m.voters if v != four.leader_of(tid).id)  # a voter, not leading
    assert cli(["leader-step-down", tid, *target, "--to", to]) == 0
    assert f"-> {to} (term" in capsys.readouterr().out
    # The removed replica is deleted, leaving a tombstone; its server serves it no more.
    assert (four.servers[source].config.data_dir / tid / TOMBSTONE_FILE).exists()
    assert tid not in four.servers[source].list_tablets()

    # Restarts keep it so: the new replica reopens from its directory (it is in no placement
    # of the config), and the old server does not recreate the placement's replica.
    for sid in (source, spare):
        four.servers[sid].terminate()
        four.servers[sid].start()
    wait_for(lambda: tid in four.servers[spare].list_tablets(), 30, "the moved replica")
    assert tid not in four.servers[source].list_tablets()
    with ClientLoad(four, writers=1, key_base=10_000_000) as more:
        more.wait_more(20)
    assert not more.errors, more.errors
    everything = {**load.acked, **more.acked}
    four.wait_converged(tid, _expected_of(four, everything, tid), timeout=60, servers=m.voters)


def _expected_of(cluster: TserverCluster, rows: dict[int, str], tid: str) -> dict[int, str]:
    return {k: v for k, v in rows.items() if cluster.tablet_for_key(k) == tid}


def test_replace_a_permanently_killed_server(
    four: TserverCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    hosting = {
        sid: [p.tablet_id for p in four.config.placements() if sid in p.replicas]
        for sid in four.servers
    }
    dead = max(sorted(hosting), key=lambda sid: len(hosting[sid]))
    # One of its tablets has a fourth voter: every live server holds it, so its replica on
    # the dead server is removed, not moved (that tablet once stopped the whole command).
    extra = hosting[dead][0]
    (spare,) = set(four.servers) - set(four.config.placement(extra).replicas)
    with ClientLoad(four) as load, Client.from_config(str(four.path)) as client:
        add_replica(client, extra, spare, wait=True, timeout_s=60.0)
        assert len(leader_membership(client, extra, 30.0).voters) == 4
        load.wait_more(50)
        four.servers[dead].kill()  # for good: its data is never used again
        load.wait_more(50)
        for tid in hosting[dead]:
            _gc_past_the_start(four, tid, load)
        assert cli(["cluster", "replace-server", dead, "--cluster", str(four.path)]) == 0
        out = capsys.readouterr().out
        assert f"{len(hosting[dead]) - 1} replica(s) moved, 1 removed" in out
        load.wait_more(50)
    assert not load.errors, load.errors
    if four.catch_up == "copy":  # type: ignore[attr-defined]
        assert sum(_copies(four, sid) for sid in four.servers if sid != dead) >= 1
    with Client.from_config(str(four.path)) as client:
        for tid in four.tablet_ids():
            assert dead not in leader_membership(client, tid, 30.0).members()
        assert len(leader_membership(client, extra, 30.0).voters) == 3
        # The dead server is still in the config, down: ksck warns about it, and only it.
        _check_groups(four, load, client, capsys, servers_down=1)
    # A new disk under its old name: its peers heard from it before, but it is a member of
    # no group now, so it hosts nothing -- no replica made afresh, none FAILED.
    back = four.servers[dead]
    shutil.rmtree(back.config.data_dir)
    back.start(["--empty_dir_wait_s=30"])  # ends as soon as the peers answer
    assert back.list_tablets() == {}
    assert "is a member of no tablet group now" in back.log_path.read_text(errors="replace")


def test_a_replica_removed_while_its_server_was_down_serves_no_stale_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Removed while down, a replica comes back never having heard of it: it campaigns, and
    nobody answers.  It once served its stale rows to follower reads for good, and no status
    listed it.  Knowing no leader it serves none now, `cluster status` names it (and the
    group one voter short), and `tablet remove-replica` deletes it."""
    with running_cluster(tmp_path, partitions=1) as cluster:
        (tid,) = cluster.tablet_ids()
        leader = cluster.leader_of(tid)
        victim = next(s for s in cluster.servers.values() if s.id != leader.id)
        target = ["--cluster", str(cluster.path)]
        with Client.from_config(str(cluster.path)) as client:
            session = client.new_session(FlushMode.AUTO_FLUSH_SYNC)
            for key in range(20):
                session.insert("kv", {"key": key, "value": "before"})
            # The other follower too has answered the leader: a change that left the group
            # with one it never heard from would be refused (strict reconfiguration).
            cluster.wait_caught_up()
            victim.kill()
            remove_replica(client, tid, victim.id, wait=True, timeout_s=60.0)
            for key in range(100, 120):
                session.insert("kv", {"key": key, "value": "after"})
            session.close()
            victim.start()
            capsys.readouterr()
            assert cli(["cluster", "status", *target]) == 1
            out = capsys.readouterr().out
            assert f"{victim.id} runs a replica that is no member of the group" in out, out
            assert "under-replicated: 2 voters, the table asks for 3" in out, out
            rows = client.scan_tablet(tid, read_mode=ReadMode.FOLLOWER_APPLIED, replica=victim.id)
            assert sorted(r["key"] for r in rows) == [*range(20), *range(100, 120)]
            capsys.readouterr()
            assert cli(["tablet", "add-replica", tid, victim.id, *target]) == 1
            assert f"`raftlet tablet remove-replica {tid} {victim.id}` deletes it" in (
                capsys.readouterr().err
            )
            assert cli(["tablet", "remove-replica", tid, victim.id, *target]) == 0
            assert "the leftover replica" in capsys.readouterr().out
        wait_for(
            lambda: tid not in {t["tablet_id"] for t in victim.tablets_json()},
            30,
            f"the leftover replica gone from {victim.id}",
        )


def test_removing_a_healthy_voter_while_another_is_down_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With one voter of three down, removing a healthy one would leave one of two voters
    answering: no leader, and no change could ever undo it while the other stays down (a
    reviewer's `tablet remove-replica` did just that).  It is refused with the reason, the
    tablet keeps its leader and takes writes, and removing the voter that is down works."""
    with running_cluster(tmp_path, partitions=1) as cluster:
        (tid,) = cluster.tablet_ids()
        down = cluster.leader_of(tid)
        down.kill()
        # A new leader has heard nothing from the voter that is down: no wait on a clock.
        leader = cluster.new_leader_of(tid, down.id)
        healthy = next(s for s in cluster.servers.values() if s.id not in (down.id, leader.id))
        target = ["--cluster", str(cluster.path)]
        capsys.readouterr()
        assert cli(["tablet", "remove-replica", tid, healthy.id, *target, "--timeout", "30"]) == 1
        err = capsys.readouterr().err
        assert f"({down.id} not heard from within an election timeout)" in err, err
        assert f"bring {down.id} back first, or remove a voter that is down" in err, err
        # Removing the leader itself: refused before its leadership is handed over.
        assert cli(["tablet", "remove-replica", tid, leader.id, *target, "--timeout", "30"]) == 1
        out, err = capsys.readouterr()
        assert f"({down.id} not heard from within an election timeout)" in err, err
        assert "leadership moved" not in out, out
        with Client.from_config(str(cluster.path)) as client:
            m = leader_membership(client, tid, 30.0)
            assert sorted(m.voters) == sorted(cluster.servers)
            assert m.leader == leader.id
            client.new_session(FlushMode.AUTO_FLUSH_SYNC).insert("kv", {"key": 1, "value": "x"})
            assert cli(["tablet", "remove-replica", tid, down.id, *target, "--timeout", "30"]) == 0
            assert sorted(leader_membership(client, tid, 30.0).voters) == sorted(
                (leader.id, healthy.id)
            )
            # A change decided on the membership from before that removal is not made (two
            # operators' moves at once each removed a voter: review r30a).
            stale = admin_pb2.ChangeConfigRequest(
                tablet_id=tid,
                type=admin_pb2.CONFIG_CHANGE_REMOVE,
                server_uuid=healthy.id,
                cas_config_index=m.config_index,
            )
            with pytest.raises(RaftletError, match=r"the group changed since \(its membership"):
                client.on_leader(
                    tid,
                    lambda stub, timeout: stub.ChangeConfig(stale, timeout=timeout),
                    what="a stale change",
                )
            assert sorted(leader_membership(client, tid, 30.0).voters) == sorted(
                (leader.id, healthy.id)
            )
