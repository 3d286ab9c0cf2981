"""``cluster status`` given an operator's stale copy of cluster.toml (a table the servers do
not run): it says the copy differs, rather than ERROR with replica repairs that fail."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest

from raftlet.cli.main import main
from raftlet.cluster import TableConfig, write_cluster_config
from tests.integration.tserver_cluster import KV_SCHEMA, TserverCluster, running_cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TserverCluster]:
    with running_cluster(tmp_path_factory.mktemp("stale"), n_servers=1, partitions=1) as c:
        c.wait_leaders()
        yield c


def test_a_copy_with_a_table_the_servers_lack_is_named_as_the_difference(
    cluster: TserverCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = TableConfig("extra", KV_SCHEMA, 1, 1)
    stale = dataclasses.replace(cluster.config, tables=(*cluster.config.tables, extra))
    path = write_cluster_config(stale, cluster.root / "stale.toml").path
    assert main(["cluster", "status", "--cluster", str(path), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "WARN", doc["issues"]
    assert doc["issues"][0].startswith(
        "this cluster.toml differs from what the servers run: its tables differ"
    ), doc["issues"]
    assert not any("remove-replica" in i for i in doc["issues"]), doc["issues"]
    by_id = {t["tablet_id"]: t for t in doc["tablets"]}
    assert by_id["kv-p0"]["status"] == "OK"
    assert by_id["extra-p0"]["status"] == "WARN"
    # The servers' own copy: nothing differs.
    assert main(["cluster", "status", "--cluster", str(cluster.path), "--format", "json"]) == 0
