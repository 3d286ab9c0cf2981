"""One schema per table across a cluster's servers and clients.

A row travels packed, and is read by whoever holds it with the schema *it* has: rows packed
for another schema of the same width decode without an error into other values. A reviewer
found two ways to get there: a rolling restart that adds a table, with the table's schema
edited before the last server restarted (that server's replicas stored every write as
other values, a leader read from it returned none of 50 acknowledged rows, and the config
that would have fixed it was then refused); and a client kept across a cluster made again
with a column's type changed (its write was acknowledged and stored as another number).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlet.client import Client, InvalidArgument, TlsOptions
from raftlet.deploy.local import LocalCluster, NoClusterError, local_tls_files
from tests.integration.cli_run import ok, raftlet, rpc_addresses
from tests.integration.tserver_cluster import free_ports

pytestmark = pytest.mark.integration


def table_t(v_type: str) -> str:
    return (
        '\n[[tables]]\nname = "t"\npartitions = 1\nreplication_factor = 3\n'
        'columns = [{ name = "id", type = "INT64", key = true },'
        f' {{ name = "v", type = "{v_type}" }}]\n'
    )


@contextlib.contextmanager
def stopped_in_the_end(root: Path) -> Iterator[None]:
    try:
        yield
    finally:
        with contextlib.suppress(NoClusterError):
            LocalCluster.load(root).down(timeout=10)


# With TLS too: a server asks its peers for their configs with its server certificate,
# which they refused, so under TLS the check saw no peer and let any schema through
# (review r27c).
@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_a_server_that_would_give_a_table_another_schema_than_its_peers_refuses_to_start(
    tmp_path: Path, tls: bool
) -> None:
    root = tmp_path / "c"
    ok(raftlet("cluster", "up", "--data-dir", str(root), "--tablets", "1", *(["--tls"] * tls)))
    files = local_tls_files(root)
    # A client from before the table was added: it fetches the config again for it (it
    # once said "unknown table" until the process was started again).
    creds = TlsOptions(*files) if files else None
    with stopped_in_the_end(root), Client(rpc_addresses(root), tls=creds) as early:
        config = root / "cluster.toml"
        base = config.read_text()
        # A rolling restart that adds table t: ts1 first, which alone cannot elect a leader
        # for t (`up` waited its whole timeout for one and failed, the server running).
        config.write_text(base + table_t("INT64"))
        ok(raftlet("cluster", "down", "--data-dir", str(root), "--server", "ts1"))
        first = ok(raftlet("cluster", "up", "--data-dir", str(root)))
        assert "table t: 1 of 3 replicas of its tablets exist so far" in first
        ok(raftlet("cluster", "down", "--data-dir", str(root), "--server", "ts2"))
        assert "table t:" not in ok(raftlet("cluster", "up", "--data-dir", str(root)))
        with early.new_session() as session:
            for i in range(20):
                session.insert("t", {"id": i, "v": 1000 + i})
        # Before ts3 restarts, the table is edited: ts3 would read INT64 rows as DOUBLEs.
        ok(raftlet("cluster", "down", "--data-dir", str(root), "--server", "ts3"))
        config.write_text(base + table_t("DOUBLE"))
        up = raftlet("cluster", "up", "--data-dir", str(root))
        assert up.returncode == 1, up.stdout
        assert "table 't' is new to this server" in up.stderr, up.stderr
        assert "ts1 has schema (id INT64 KEY, v INT64 NOT NULL)" in up.stderr
        assert "Traceback" not in up.stderr
        # It recorded nothing: the config that agrees with its peers starts it.
        config.write_text(base + table_t("INT64"))
        ok(raftlet("cluster", "up", "--data-dir", str(root)))
        ok(raftlet("cluster", "ksck", "--data-dir", str(root), "--checksum"))
        rows = json.loads(ok(raftlet("scan", "t", "--data-dir", str(root), "--format", "json")))
        assert sorted(r["v"] for r in rows) == [1000 + i for i in range(20)]


def _one_server_config(rpc: int, http: int, v_type: str) -> str:
    return (
        f'[cluster]\nname = "again"\n\n[[servers]]\nid = "ts1"\nrpc_addr = "127.0.0.1:{rpc}"\n'
        f'http_addr = "127.0.0.1:{http}"\n'
        + table_t(v_type).replace("replication_factor = 3", "replication_factor = 1")
    )


def test_a_client_kept_across_a_cluster_made_again_with_another_schema_is_refused(
    tmp_path: Path,
) -> None:
    root = tmp_path / "again"
    root.mkdir()
    rpc, http = free_ports(2)
    config = root / "cluster.toml"
    config.write_text(_one_server_config(rpc, http, "INT64"))
    ok(raftlet("cluster", "up", "--data-dir", str(root)))
    with (
        stopped_in_the_end(root),
        Client([f"127.0.0.1:{rpc}"]) as writer,
        Client([f"127.0.0.1:{rpc}"]) as reader,
        Client([f"127.0.0.1:{rpc}"]) as fitting,
    ):
        with writer.new_session() as session:
            session.insert("t", {"id": 1, "v": 7})
        assert list(reader.scan("t")) == [{"id": 1, "v": 7}]
        # Made again at the same address, with v a DOUBLE.
        ok(raftlet("cluster", "down", "--data-dir", str(root)))
        for made in root.iterdir():
            if made != config:
                shutil.rmtree(made) if made.is_dir() else made.unlink()
        config.write_text(_one_server_config(rpc, http, "DOUBLE"))
        ok(raftlet("cluster", "up", "--data-dir", str(root)))
        with writer.new_session() as session:
            with pytest.raises(InvalidArgument) as refused:
                session.insert("t", {"id": 2, "v": 42})
            assert "made for another schema of table 't' than this replica's" in str(refused.value)
            assert refused.value.may_have_applied is False
            assert refused.value.cause == "SCHEMA_MISMATCH"
            # Refused, the client fetched the config again: its next write is the table's.
            session.insert("t", {"id": 3, "v": 42.5})
        with pytest.raises(InvalidArgument, match="made for another schema of table 't'"):
            list(reader.scan("t"))
        assert list(reader.scan("t")) == [{"id": 3, "v": 42.5}]
        # A row that fits only the new schema: the client refused it by its old one, on
        # every write, and never learned of the change. It fetches the config and writes.
        with fitting.new_session() as session:
            session.insert("t", {"id": 4, "v": 0.5})
        assert sorted(r["id"] for r in reader.scan("t")) == [3, 4]
