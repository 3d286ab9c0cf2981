"""The cluster config: parsing, validation messages, the TOML writer, placement, wire form."""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlet.cluster import (
    MAX_PARTITIONS,
    ClusterConfig,
    ClusterConfigError,
    NotInConfigError,
    RaftTimings,
    ServerConfig,
    TableConfig,
    TabletPlacement,
    dump_cluster_config,
    host_port,
    load_cluster_config,
    parse_cluster_config,
    parse_host_port,
    tablet_id,
    write_cluster_config,
)
from raftlet.proto import tablet_pb2
from raftlet.schema.schema import ColumnSchema, Schema
from raftlet.schema.types import DataType
from tests.unit.fsync_recorder import record_fsyncs
from tests.unit.schema_strategies import key_schemas

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "examples" / "cluster.toml"

BASE = """\
[cluster]
name = "t"

[[servers]]
id = "a"
rpc_addr = "127.0.0.1:7001"
http_addr = "127.0.0.1:8001"

[[servers]]
id = "b"
rpc_addr = "127.0.0.1:7002"
http_addr = "127.0.0.1:8002"

[[servers]]
id = "c"
rpc_addr = "127.0.0.1:7003"
http_addr = "127.0.0.1:8003"

[[tables]]
name = "kv"
partitions = 2
replication_factor = 3
columns = [
  { name = "key", type = "INT64", key = true },
  { name = "value", type = "STRING", nullable = true },
]
"""

KEY_ONLY = Schema([ColumnSchema("k", DataType.INT64, is_key=True)])


def servers(n: int, base: Path = Path("/data")) -> tuple[ServerConfig, ...]:
    return tuple(
        ServerConfig(f"ts{i}", f"127.0.0.1:{7050 + i}", f"127.0.0.1:{8050 + i}", base / f"ts{i}")
        for i in range(1, n + 1)
    )


def cluster(n_servers: int, *tables: tuple[str, int, int]) -> ClusterConfig:
    return ClusterConfig(
        "c",
        servers(n_servers),
        tuple(TableConfig(name, KEY_ONLY, p, rf) for name, p, rf in tables),
    )


# --- parsing -------------------------------------------------------------------------------


def test_parse_base(tmp_path: Path) -> None:
    config = parse_cluster_config(BASE, tmp_path)
    assert config.name == "t"
    assert config.server_ids == ("a", "b", "c")
    assert config.raft == RaftTimings(100, 10, 3)  # the defaults, [raft] being optional
    a = config.server("a")
    assert (a.rpc_addr, a.http_addr) == ("127.0.0.1:7001", "127.0.0.1:8001")
    assert a.data_dir == tmp_path / "a"  # default data_dir = the server id
    (kv,) = config.tables
    assert (kv.name, kv.partitions, kv.replication_factor) == ("kv", 2, 3)
    assert kv.schema == Schema(
        [
            ColumnSchema("key", DataType.INT64, is_key=True),
            ColumnSchema("value", DataType.STRING, nullable=True),
        ]
    )
    assert config.path is None


def test_load_resolves_data_dirs_against_the_files_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf").mkdir()
    text = BASE.replace(
        'http_addr = "127.0.0.1:8001"\n', 'http_addr = "127.0.0.1:8001"\ndata_dir = "../disk/a"\n'
    )
    text = text.replace(
        'http_addr = "127.0.0.1:8002"\n', 'http_addr = "127.0.0.1:8002"\ndata_dir = "/srv/b"\n'
    )
    (tmp_path / "conf" / "cluster.toml").write_text(text)
    monkeypatch.chdir(tmp_path)  # a relative --config must still give absolute data dirs
    config = load_cluster_config("conf/cluster.toml")
    assert config.path == tmp_path / "conf" / "cluster.toml"
    assert config.server("a").data_dir == tmp_path / "conf" / "../disk/a"
    assert config.server("b").data_dir == Path("/srv/b")
    assert config.server("c").data_dir == tmp_path / "conf" / "c"


def test_raft_section_and_case_insensitive_types(tmp_path: Path) -> None:
    text = BASE.replace(
        "[[servers]]",
        "[raft]\ntick_interval_ms = 12.5\nelection_ticks = 4\nheartbeat_ticks = 2\n\n[[servers]]",
        1,
    ).replace('"INT64"', '"int64"')
    config = parse_cluster_config(text, tmp_path)
    assert config.raft == RaftTimings(12.5, 4, 2)
    assert config.raft.tick_interval_s == pytest.approx(0.0125)
    assert config.tables[0].schema.columns[0].type is DataType.INT64


def test_no_tables_is_allowed(tmp_path: Path) -> None:
    config = parse_cluster_config(BASE[: BASE.index("[[tables]]")], tmp_path)
    assert config.tables == ()
    assert config.placements() == []


def test_example_cluster_toml_loads() -> None:
    config = load_cluster_config(EXAMPLE)
    assert len(config.servers) == 3
    for s in config.servers:
        assert parse_host_port(s.rpc_addr)[0] == "127.0.0.1"
        assert s.data_dir == EXAMPLE.parent / "data" / s.id
    assert {t.name for t in config.tables} == {"kv", "events"}
    for s in config.servers:
        assert config.placements_for(s.id), f"{s.id} hosts nothing"
    assert parse_cluster_config(dump_cluster_config(config), EXAMPLE.parent) == config


# --- validation: one clear error naming the field and the line ---------------------------

# (test id, text to replace in BASE, replacement, expected message part, the text whose line
# the error must name (None: the line is not checked)).
BAD: list[tuple[str, str, str, str, str | None]] = [
    # unknown keys, with a hint when one is close
    ("unknown top-level key", '[cluster]\n', 'colour = "red"\n[cluster]\n',
     "colour: unknown key 'colour'", "colour"),
    ("unknown table", "[[tables]]", "[[tabels]]\nname='x'\n[[tables]]",
     "tabels: unknown key 'tabels' (did you mean 'tables'?", "[[tabels]]"),
    ("unknown cluster key", 'name = "t"', 'name = "t"\nnmae = "u"',
     "cluster.nmae: unknown key 'nmae' (did you mean 'name'?", "nmae"),
    ("unknown raft key", "[[servers]]", "[raft]\nelection_tick = 3\n[[servers]]",
     "raft.election_tick: unknown key 'election_tick' (did you mean 'election_ticks'?",
     "election_tick ="),
    ("unknown server key", 'id = "b"', 'id = "b"\nrpc_port = 7',
     "servers[1].rpc_port: unknown key 'rpc_port'", "rpc_port"),
    ("unknown table key", "partitions = 2", "partitions = 2\nreplicas = 3",
     "tables[0].replicas: unknown key 'replicas'", "replicas"),
    ("unknown column key", '"value", type = "STRING"', '"value", default = 1, type = "STRING"',
     "tables[0].columns[1].default: unknown key 'default'", "default = 1"),
    # missing fields (reported on the line of the table they are missing from)
    ("missing cluster", '[cluster]\nname = "t"\n', "", "cluster: missing (expected a [cluster]",
     None),
    ("missing cluster name", 'name = "t"\n', "", "cluster.name: missing", "[cluster]"),
    ("missing server id", 'id = "a"\n', "", "servers[0].id: missing", "[[servers]]"),
    ("missing rpc_addr", 'rpc_addr = "127.0.0.1:7003"\n', "", "servers[2].rpc_addr: missing",
     None),
    ("missing http_addr", 'http_addr = "127.0.0.1:8001"\n', "", "servers[0].http_addr: missing",
     "[[servers]]"),
    ("missing partitions", "partitions = 2\n", "", "tables[0].partitions: missing", "[[tables]]"),
    ("missing replication_factor", "replication_factor = 3\n", "",
     "tables[0].replication_factor: missing", "[[tables]]"),
    ("missing column type", '"value", type = "STRING", ', '"value", ',
     "tables[0].columns[1].type: missing", '{ name = "value"'),
    ("missing table name", 'name = "kv"\n', "", "tables[0].name: missing", "[[tables]]"),
    # wrong TOML types
    ("partitions as string", "partitions = 2", 'partitions = "2"',
     "tables[0].partitions: must be an integer, got a string '2'", 'partitions = "2"'),
    ("partitions as bool", "partitions = 2", "partitions = true",
     "tables[0].partitions: must be an integer, got a boolean True", "partitions = true"),
    ("key as string", "key = true", 'key = "yes"',
     "tables[0].columns[0].key: must be true or false", 'key = "yes"'),
    ("rpc_addr as a number", 'rpc_addr = "127.0.0.1:7003"', "rpc_addr = 7003",
     "servers[2].rpc_addr: must be a string 'host:port', got an integer 7003", "rpc_addr = 7003"),
    ("election_ticks as a string", "[[servers]]", '[raft]\nelection_ticks = "10"\n[[servers]]',
     "raft.election_ticks: must be an integer, got a string '10'", "election_ticks ="),
    ("servers as a table", BASE[BASE.index("[[servers]]") : BASE.index("[[tables]]")],
     '[servers]\nid = "a"\n\n', "servers: must be an array of tables ([[servers]]), got a table",
     "[servers]"),
    # duplicates
    ("duplicate server id", 'id = "c"', 'id = "a"  # was c',
     "servers[2].id: duplicate server id 'a' (also servers[0])", "# was c"),
    ("duplicate rpc_addr", 'rpc_addr = "127.0.0.1:7002"', 'rpc_addr = "127.0.0.1:7001"  # dup',
     "servers[1].rpc_addr: address '127.0.0.1:7001' is already servers[0].rpc_addr", "# dup"),
    ("http_addr reuses another's rpc_addr", 'http_addr = "127.0.0.1:8003"',
     'http_addr = "127.0.0.1:7001"',
     "servers[2].http_addr: address '127.0.0.1:7001' is already servers[0].rpc_addr",
     'http_addr = "127.0.0.1:7001"'),
    ("http_addr = own rpc_addr", 'http_addr = "127.0.0.1:8002"', 'http_addr = "127.0.0.1:7002"',
     "servers[1].http_addr: '127.0.0.1:7002' is also this server's rpc_addr",
     'http_addr = "127.0.0.1:7002"'),
    ("token port = own rpc_addr", 'http_addr = "127.0.0.1:8002"',
     'http_addr = "127.0.0.1:8002"\ntoken_rpc_addr = "127.0.0.1:7002"',
     "servers[1].token_rpc_addr: '127.0.0.1:7002' is also another of this server's addresses",
     'token_rpc_addr = "127.0.0.1:7002"'),
    ("token port reuses another's", 'http_addr = "127.0.0.1:8002"',
     'http_addr = "127.0.0.1:8002"\ntoken_rpc_addr = "127.0.0.1:8001"',
     "servers[1].token_rpc_addr: address '127.0.0.1:8001' is already servers[0].http_addr",
     'token_rpc_addr = "127.0.0.1:8001"'),
    ("token port not host:port", 'http_addr = "127.0.0.1:8002"',
     'http_addr = "127.0.0.1:8002"\ntoken_rpc_addr = "nowhere"',
     "servers[1].token_rpc_addr: 'nowhere' is not host:port", 'token_rpc_addr = "nowhere"'),
    ("duplicate data_dir", 'http_addr = "127.0.0.1:8002"',
     'http_addr = "127.0.0.1:8002"\ndata_dir = "a"',
     "servers[1].data_dir: data_dir", 'data_dir = "a"'),
    ("duplicate table name ignoring case", "[[tables]]\n",
     '[[tables]]\nname = "KV"\npartitions = 1\nreplication_factor = 1\n'
     'columns = [{ name = "k", type = "INT8", key = true }]\n\n[[tables]]\n',
     "tables[1].name: duplicate table name 'kv' (also tables[0]; names are compared ignoring",
     None),
    # addresses
    ("no port", '"127.0.0.1:7002"', '"localhost"',
     "servers[1].rpc_addr: 'localhost' is not host:port", '"localhost"'),
    ("port 0", '"127.0.0.1:7002"', '"127.0.0.1:0"',
     "servers[1].rpc_addr: '127.0.0.1:0': port must be a number in 1..65535", '"127.0.0.1:0"'),
    ("port too big", '"127.0.0.1:8002"', '"127.0.0.1:65536"',
     "servers[1].http_addr: '127.0.0.1:65536': port must be a number", '"127.0.0.1:65536"'),
    ("port not a number", '"127.0.0.1:8002"', '"127.0.0.1:http"',
     "servers[1].http_addr: '127.0.0.1:http': port must be a number", '"127.0.0.1:http"'),
    ("unbracketed ipv6", '"127.0.0.1:7002"', '"::1:7002"',
     "servers[1].rpc_addr: '::1:7002': an IPv6 address needs brackets, e.g. [::1]:7002",
     '"::1:7002"'),
    ("bad host", '"127.0.0.1:7002"', '"my host:7002"',
     "servers[1].rpc_addr: 'my host:7002': 'my host' is not a valid host name", "my host"),
    ("empty host", '"127.0.0.1:7002"', '":7002"', "servers[1].rpc_addr: ':7002' is not host:port",
     '":7002"'),
    # names
    ("bad server id", 'id = "b"', 'id = "../b"', "servers[1].id: '../b' is not a valid server id",
     'id = "../b"'),
    ("bad table name", 'name = "kv"', 'name = "k/v"',
     "tables[0].name: 'k/v' is not a valid table", 'name = "k/v"'),
    ("empty cluster name", 'name = "t"', 'name = ""', "cluster.name: must be a non-empty",
     'name = ""'),
    # counts
    ("replication_factor > servers", "replication_factor = 3", "replication_factor = 4",
     "tables[0].replication_factor: 4 is more than the 3 servers", "replication_factor = 4"),
    ("replication_factor 0", "replication_factor = 3", "replication_factor = 0",
     "tables[0].replication_factor: must be an integer >= 1, got 0", "replication_factor = 0"),
    ("partitions 0", "partitions = 2", "partitions = 0",
     f"tables[0].partitions: must be an integer in 1..{MAX_PARTITIONS}, got 0", "partitions = 0"),
    ("partitions too many", "partitions = 2", f"partitions = {MAX_PARTITIONS + 1}",
     "tables[0].partitions: must be an integer in 1..", "partitions = "),
    ("no servers", BASE[: BASE.index("[[tables]]")], 'servers = []\n[cluster]\nname = "t"\n\n',

     "servers: at least one [[servers]] entry is needed", "servers = []"),
    # raft
    ("election <= heartbeat", "[[servers]]", "[raft]\nelection_ticks = 1\n[[servers]]",
     "raft.election_ticks: must be an integer greater than heartbeat_ticks (3), got 1",
     "election_ticks = 1"),
    ("zero tick", "[[servers]]", "[raft]\ntick_interval_ms = 0\n[[servers]]",
     "raft.tick_interval_ms: must be a number of milliseconds in 1..60000, got 0",
     "tick_interval_ms = 0"),
    # schemas: the schema module's own words, on the line of `columns`
    ("unknown column type", '"value", type = "STRING"', '"value", type = "VARCHAR"',
     "tables[0].columns[1].type: unknown column type 'VARCHAR' (expected one of: INT8,",
     "VARCHAR"),
    ("no key column", "key = true", "key = false",
     "tables[0].columns: a schema needs at least one key column", "columns = ["),
    ("nullable key", "key = true", "key = true, nullable = true",
     "tables[0].columns: key column 'key' cannot be nullable", "columns = ["),
    ("key column not first", "columns = [\n", 'columns = [\n  { name = "first", type = "INT8" },\n',
     "tables[0].columns: key columns must come first", "columns = ["),
    ("duplicate column", '"value", type', '"KEY", type',
     "tables[0].columns: duplicate column name 'KEY' (clashes with 'key'", "columns = ["),
    ("bad column name", '"value", type', '"my value", type',
     "tables[0].columns: column 1: name 'my value' is not an identifier", "columns = ["),
    ("no columns", BASE[BASE.index("columns = [") :], "columns = []\n",
     "tables[0].columns: a schema needs at least one column", "columns = []"),
    # syntax: tomllib's own position
    ("invalid toml", 'name = "t"', "name = t", "invalid TOML: Invalid value (at line 2", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "message", "at"), [case[1:] for case in BAD], ids=[c[0] for c in BAD]
)
def test_invalid_config_is_one_clear_error(
    tmp_path: Path, old: str, new: str, message: str, at: str | None
) -> None:
    assert old in BASE, "the test case no longer matches BASE"
    text = BASE.replace(old, new, 1)
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    with pytest.raises(ClusterConfigError) as exc:
        load_cluster_config(path)
    rendered = str(exc.value)
    assert "\n" not in rendered
    assert message in rendered
    assert rendered.startswith(f"{path}:")
    if at is not None:
        expected = text[: text.index(at)].count("\n") + 1
        assert exc.value.line == expected, rendered
        assert rendered.startswith(f"{path}:{expected}: ")
    # Parsing the text without a file gives the same error, without the file name.
    with pytest.raises(ClusterConfigError) as exc2:
        parse_cluster_config(text, tmp_path)
    assert exc2.value.reason == exc.value.reason
    assert exc2.value.field == exc.value.field
    assert not str(exc2.value).startswith(str(path))


def test_error_on_an_inline_column_names_its_line(tmp_path: Path) -> None:
    text = BASE.replace('"value", type = "STRING"', '"value", type = "TEXT"')
    with pytest.raises(ClusterConfigError) as exc:
        parse_cluster_config(text, tmp_path)
    assert exc.value.field == "tables[0].columns[1].type"
    assert (
        exc.value.line
        == text.splitlines().index('  { name = "value", type = "TEXT", nullable = true },') + 1
    )


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(ClusterConfigError, match="cannot read the cluster config"):
        load_cluster_config(tmp_path / "missing.toml")
    (tmp_path / "latin1.toml").write_bytes('[cluster]\nname = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ClusterConfigError, match="not UTF-8"):
        load_cluster_config(tmp_path / "latin1.toml")


def test_constructors_validate_too() -> None:
    with pytest.raises(ClusterConfigError, match=r"^rpc_addr: 'x' is not host:port"):
        ServerConfig("a", "x", "127.0.0.1:1", Path("a"))
    with pytest.raises(ClusterConfigError, match=r"^partitions: must be an integer"):
        TableConfig("t", KEY_ONLY, 0, 1)
    with pytest.raises(ClusterConfigError, match=r"^servers\[1\]\.id: duplicate server id"):
        ClusterConfig("c", servers(1) + servers(1), ())
    with pytest.raises(
        ClusterConfigError, match=r"tables\[0\]\.replication_factor: 3 is more than"
    ):
        cluster(2, ("t", 1, 3))
    # Lists are accepted and frozen into tuples.
    c = ClusterConfig("c", list(servers(1)), [])  # type: ignore[arg-type]
    assert isinstance(c.servers, tuple)
    assert isinstance(c.tables, tuple)


@pytest.mark.parametrize(
    ("addr", "expected"),
    [("127.0.0.1:7051", ("127.0.0.1", 7051)), ("[::1]:1", ("[::1]", 1)),
     ("ts-1.svc.cluster.local:65535", ("ts-1.svc.cluster.local", 65535)),
     ("raftlet_ts1:7051", ("raftlet_ts1", 7051)), ("0.0.0.0:80", ("0.0.0.0", 80))],
)  # fmt: skip
def test_parse_host_port_accepts(addr: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(addr) == expected
    # And back: an address the sockets API gives (IPv6 without brackets) reads the same.
    assert host_port(expected[0].strip("[]"), expected[1]) == addr
    assert host_port(*expected) == addr


@pytest.mark.parametrize(
    "addr", ["", "7051", "host:", ":1", "[::1:1", "[nothex]:1", "h:+1", "h:٣", "-h:1", "h h:1"]
)
def test_parse_host_port_rejects(addr: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(addr))):
        parse_host_port(addr)


# --- writing -------------------------------------------------------------------------------


def test_dump_round_trips_and_writes_data_dirs_relative(tmp_path: Path) -> None:
    config = parse_cluster_config(
        BASE.replace('name = "t"', 'name = "quote \\" backslash \\\\ é"'), tmp_path
    )
    text = dump_cluster_config(config, tmp_path)
    assert 'data_dir = "a"' in text
    assert parse_cluster_config(text, tmp_path) == config
    assert config.name == 'quote " backslash \\ é'


def test_write_then_load_and_move_the_directory(tmp_path: Path) -> None:
    base = tmp_path / "cluster1"
    base.mkdir()
    config = ClusterConfig(
        "moved",
        servers(3, base),
        (TableConfig("kv", KEY_ONLY, 3, 2),),
        RaftTimings(25.5, 7, 2),
    )
    written = write_cluster_config(config, base / "cluster.toml")
    assert written == config
    assert written.path == base / "cluster.toml"
    assert load_cluster_config(base / "cluster.toml") == config
    assert not [p for p in base.iterdir() if p.name != "cluster.toml"]  # no temp file left
    # Data dirs were written relative, so the whole directory can move.
    shutil.move(base, tmp_path / "cluster2")
    moved = load_cluster_config(tmp_path / "cluster2" / "cluster.toml")
    assert moved.server("ts1").data_dir == tmp_path / "cluster2" / "ts1"
    # A data dir outside the file's directory stays absolute.
    outside = dataclasses.replace(
        config,
        servers=(
            dataclasses.replace(config.servers[0], data_dir=Path("/elsewhere/x")),
            *config.servers[1:],
        ),
    )
    assert 'data_dir = "/elsewhere/x"' in dump_cluster_config(outside, tmp_path)


def test_dump_escapes_control_characters_and_refuses_surrogates(tmp_path: Path) -> None:
    s = servers(1, tmp_path)[0]
    weird = dataclasses.replace(s, data_dir=tmp_path / 'a"\\\x01\x7f\n b')
    config = ClusterConfig("c", (weird,), ())
    assert parse_cluster_config(dump_cluster_config(config, tmp_path), tmp_path) == config
    bad = dataclasses.replace(s, data_dir=Path("/x\udc80"))
    with pytest.raises(ClusterConfigError, match="surrogate"):
        dump_cluster_config(ClusterConfig("c", (bad,), ()))


def test_dump_keeps_the_documented_layout(tmp_path: Path) -> None:
    # tomli-w alone would put short servers inline in one `servers = [...]` array.
    text = dump_cluster_config(parse_cluster_config(BASE, tmp_path), tmp_path)
    assert text.count("\n[[servers]]\nid = ") == 3
    assert text.count("\n[[tables]]\n") == 1
    assert '\n  { name = "key", type = "INT64", key = true },\n' in text
    assert text.endswith('  { name = "value", type = "STRING", nullable = true },\n]\n')


def test_a_column_too_long_for_one_line_still_round_trips(tmp_path: Path) -> None:
    long_key = ColumnSchema("k" * 120, DataType.INT64, is_key=True)
    config = ClusterConfig("c", servers(1, tmp_path), (TableConfig("t", Schema([long_key]), 1, 1),))
    text = dump_cluster_config(config, tmp_path)
    assert "[[tables.columns]]" in text  # tomli-w's form when an inline table would not fit
    assert parse_cluster_config(text, tmp_path) == config


def test_dump_without_tomli_w_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # The base install (the client) reads configs without tomli-w; writing one needs the extra.
    monkeypatch.setitem(sys.modules, "tomli_w", None)
    with pytest.raises(
        ModuleNotFoundError, match=r"needs tomli-w \(pip install 'raftlet\[cli\]'\)"
    ):
        dump_cluster_config(cluster(1))


_names = st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True)


@st.composite
def cluster_configs(draw: st.DrawFn) -> ClusterConfig:
    n = draw(st.integers(1, 6))
    ids = draw(st.lists(_names, min_size=n, max_size=n, unique=True))
    nodes = tuple(
        ServerConfig(sid, f"10.0.0.{i}:7051", f"10.0.0.{i}:8051", Path("/d") / sid)
        for i, sid in enumerate(ids)
    )
    table_names = draw(st.lists(_names, max_size=3, unique_by=str.lower))
    tables = tuple(
        TableConfig(name, draw(key_schemas()), draw(st.integers(1, 8)), draw(st.integers(1, n)))
        for name in table_names
    )
    heartbeat = draw(st.integers(1, 5))
    raft = RaftTimings(
        # Within the bounds: 50 election ticks of at most 36 s is the 30 minutes allowed.
        draw(st.integers(1, 1000) | st.floats(1.0, 36_000.0)),
        draw(st.integers(heartbeat + 1, 50)),
        heartbeat,
    )
    name = draw(st.text(st.characters(exclude_categories=("Cs", "Cc")), min_size=1, max_size=20)
                .filter(str.isprintable))  # fmt: skip
    return ClusterConfig(name, nodes, tables, raft)


@settings(max_examples=60, deadline=None)
@given(cluster_configs())
def test_dump_load_round_trip_property(config: ClusterConfig) -> None:
    again = parse_cluster_config(dump_cluster_config(config), "/")
    assert again == config
    assert again.placements() == config.placements()


# --- placement -----------------------------------------------------------------------------

# If this changes, every tablet of every existing cluster moves to other servers (whose data
# dirs do not hold it). Do not "fix" the table: fix the code.
GOLDEN_CONFIG = cluster(5, ("kv", 4, 3), ("events", 3, 2), ("metrics", 2, 1))
GOLDEN_PLACEMENT = [
    ("kv-p0", ("ts1", "ts4", "ts5")),
    ("kv-p1", ("ts1", "ts2", "ts5")),
    ("kv-p2", ("ts1", "ts2", "ts3")),
    ("kv-p3", ("ts2", "ts3", "ts4")),
    ("events-p0", ("ts1", "ts5")),
    ("events-p1", ("ts1", "ts2")),
    ("events-p2", ("ts2", "ts3")),
    ("metrics-p0", ("ts4",)),
    ("metrics-p1", ("ts5",)),
]


def test_golden_placement() -> None:
    got = [(p.tablet_id, p.replicas) for p in GOLDEN_CONFIG.placements()]
    assert got == GOLDEN_PLACEMENT


def test_golden_placement_in_another_interpreter() -> None:
    # hash() is salted per process; placement must not depend on it.
    code = (
        "from tests.unit.test_cluster_config import GOLDEN_CONFIG\n"
        "print([(p.tablet_id, p.replicas) for p in GOLDEN_CONFIG.placements()])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "4242"},
        cwd=REPO,
    ).stdout
    assert out.strip() == str(GOLDEN_PLACEMENT)


def test_placement_ignores_server_order_in_the_file() -> None:
    shuffled = dataclasses.replace(GOLDEN_CONFIG, servers=tuple(reversed(GOLDEN_CONFIG.servers)))
    assert shuffled.placements() == GOLDEN_CONFIG.placements()


def test_placement_fields_and_ids() -> None:
    placements = cluster(3, ("kv", 2, 3)).placements()
    assert placements[1] == TabletPlacement("kv-p1", "kv", 1, ("ts1", "ts2", "ts3"))
    assert tablet_id("a-p1", 0) == "a-p1-p0"


def test_three_servers_six_partitions_rf3() -> None:
    config = cluster(3, ("kv", 6, 3))
    placements = config.placements()
    assert [p.tablet_id for p in placements] == [f"kv-p{i}" for i in range(6)]
    for p in placements:
        assert len(set(p.replicas)) == 3
        assert list(p.replicas) == sorted(p.replicas)
    for s in config.server_ids:
        assert len(config.placements_for(s)) == 6


@pytest.mark.parametrize(
    ("n_servers", "partitions", "rf"), [(3, 6, 1), (3, 6, 2), (5, 10, 3), (4, 8, 3), (7, 7, 3)]
)
def test_replicas_spread_evenly(n_servers: int, partitions: int, rf: int) -> None:
    # With partitions a multiple of the server count, every server hosts exactly its share.
    config = cluster(n_servers, ("kv", partitions, rf))
    load = collections.Counter(s for p in config.placements() for s in p.replicas)
    assert set(load) == set(config.server_ids)
    assert set(load.values()) == {partitions * rf // n_servers}
    for p in config.placements():
        assert len(set(p.replicas)) == rf


def test_tables_start_at_different_servers() -> None:
    # Partition 0 of many single-replica tables must not all land on one server.
    config = cluster(3, *[(f"t{i}", 1, 1) for i in range(12)])
    first = collections.Counter(p.replicas[0] for p in config.placements())
    assert len(first) == 3


@settings(max_examples=50, deadline=None)
@given(cluster_configs())
def test_placement_invariants(config: ClusterConfig) -> None:
    placements = config.placements()
    assert placements == config.placements()
    assert len({p.tablet_id for p in placements}) == len(placements)
    for t in config.tables:
        mine = [p for p in placements if p.table == t.name]
        assert [p.partition for p in mine] == list(range(t.partitions))
        for p in mine:
            assert len(set(p.replicas)) == t.replication_factor
            assert set(p.replicas) <= set(config.server_ids)
    for s in config.server_ids:
        assert config.placements_for(s) == [p for p in placements if s in p.replicas]


def test_lookups() -> None:
    config = cluster(3, ("kv", 2, 1))
    assert config.server("ts2").rpc_addr == "127.0.0.1:7052"
    assert config.table("kv").partitions == 2
    assert config.placement("kv-p1").partition == 1
    with pytest.raises(NotInConfigError, match=r"unknown server id 'ts9' \(known: ts1, ts2, ts3\)"):
        config.server("ts9")
    with pytest.raises(NotInConfigError, match="unknown server id"):
        config.placements_for("ts9")
    with pytest.raises(NotInConfigError, match=r"unknown table 'x' \(known: kv\)"):
        config.table("x")
    with pytest.raises(LookupError, match="unknown tablet 'kv-p2'"):
        config.placement("kv-p2")


# --- wire form -----------------------------------------------------------------------------


def test_pb_round_trip() -> None:
    config = GOLDEN_CONFIG
    pb = config.to_pb()
    assert [s.uuid for s in pb.servers] == ["ts1", "ts2", "ts3", "ts4", "ts5"]
    assert pb.tables[0].num_partitions == 4
    assert pb.tablets[0].replica_uuids == ["ts1", "ts4", "ts5"]
    # Over the wire, as a client receives it.
    wire = tablet_pb2.GetClusterConfigResponse.FromString(pb.SerializeToString())
    client_view = ClusterConfig.from_pb(wire, name="c")
    assert client_view.servers == tuple(
        dataclasses.replace(s, data_dir=Path(s.id)) for s in config.servers
    )
    assert client_view.tables == config.tables
    assert client_view.placements() == config.placements()


def test_token_ports_survive_the_file_and_the_wire(tmp_path: Path) -> None:
    with_token = tuple(
        dataclasses.replace(s, token_rpc_addr=f"127.0.0.1:{9050 + i}")
        for i, s in enumerate(servers(3, tmp_path), start=1)
    )
    config = dataclasses.replace(cluster(3, ("kv", 2, 3)), servers=with_token)
    written = write_cluster_config(config, tmp_path / "cluster.toml")
    assert 'token_rpc_addr = "127.0.0.1:9051"' in (tmp_path / "cluster.toml").read_text()
    assert load_cluster_config(tmp_path / "cluster.toml").servers == written.servers
    wire = tablet_pb2.GetClusterConfigResponse.FromString(config.to_pb().SerializeToString())
    assert [s.token_rpc_addr for s in wire.servers] == [s.token_rpc_addr for s in with_token]
    assert [s.token_rpc_addr for s in ClusterConfig.from_pb(wire).servers] == [
        s.token_rpc_addr for s in with_token
    ]
    # Without one, the key is not written at all.
    write_cluster_config(cluster(3, ("kv", 2, 3)), tmp_path / "plain.toml")
    assert "token_rpc_addr" not in (tmp_path / "plain.toml").read_text()


def test_from_pb_rejects_a_placement_it_would_not_compute() -> None:
    pb = GOLDEN_CONFIG.to_pb()
    pb.tablets[1].replica_uuids[0] = "ts3"
    with pytest.raises(
        ClusterConfigError, match=r"^tablets: the server's placement differs .*kv-p1"
    ):
        ClusterConfig.from_pb(pb)
    del pb.tablets[1:]
    with pytest.raises(ClusterConfigError, match="1 tablets vs 9"):
        ClusterConfig.from_pb(pb)


def test_from_pb_validates_like_a_file() -> None:
    pb = GOLDEN_CONFIG.to_pb()
    pb.servers[2].rpc_addr = "nowhere"
    with pytest.raises(
        ClusterConfigError, match=r"^servers\[2\]\.rpc_addr: 'nowhere' is not host:port"
    ):
        ClusterConfig.from_pb(pb)
    pb = GOLDEN_CONFIG.to_pb()
    pb.tables[0].schema.columns[0].type = tablet_pb2.TYPE_UNKNOWN
    with pytest.raises(
        ClusterConfigError, match=r"^tables\[0\]\.columns: column 'k': unknown data type"
    ):
        ClusterConfig.from_pb(pb)


def test_a_table_wider_than_the_store_is_refused_by_validation(tmp_path: Path) -> None:
    """A table of 2001 columns loaded, then every replica of it FAILED at creation."""
    from raftlet.schema.schema import MAX_COLUMNS

    def with_columns(n: int) -> str:
        extra = "".join(
            f'  {{ name = "c{i}", type = "INT8", nullable = true }},\n' for i in range(n - 2)
        )
        last = '  { name = "value", type = "STRING", nullable = true },\n'
        return BASE.replace(last, last + extra, 1)

    assert len(parse_cluster_config(with_columns(MAX_COLUMNS), tmp_path).tables[0].schema) == 2000
    with pytest.raises(ClusterConfigError) as exc:
        parse_cluster_config(with_columns(MAX_COLUMNS + 1), tmp_path)
    assert exc.value.field == "tables[0].columns"
    assert f"at most {MAX_COLUMNS} columns" in exc.value.reason


def test_a_written_config_and_its_directory_entry_are_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renamed into place with no fsync of the directory, a power cut could bring back the
    old cluster.toml beside data made for the new one."""
    synced = record_fsyncs(monkeypatch)
    write_cluster_config(cluster(3, ("kv", 2, 3)), tmp_path / "cluster.toml")
    assert tmp_path in synced, synced
