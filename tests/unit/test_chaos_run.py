"""``run_chaos`` on a fake cluster, client, workload and nemesis: what a run keeps when it
fails or is interrupted (the temporary directory, the history with its start and fault log),
and that a used work directory or a cluster that does not start is one clear error."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

import raftlet.chaos.run as run_mod
from raftlet.chaos.history import History, OpKind, Outcome
from raftlet.chaos.nemesis import FaultEvent
from raftlet.chaos.options import ChaosOptions
from raftlet.chaos.run import ChaosStartError, run_chaos
from raftlet.cli.main import main
from raftlet.deploy.netns import NetnsError

SERVERS = ["ts1", "ts2", "ts3"]
TLS_FAILURE = (
    "ts1 exited with 2 before ready:\n"
    "starting ts1\n"
    "raftlet tserver: error: --tls_ca: TLS needs --tls_cert, --tls_key and --tls_ca together"
)


class FakeCluster:
    """Whole and healthy; ``open_cluster`` hands it out and remembers the run's directory."""

    backend = "fake"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.closed = False
        servers = [SimpleNamespace(id=s, rpc_addr=f"{s}:1") for s in SERVERS]
        self.config = SimpleNamespace(servers=servers)
        self.probe = SimpleNamespace(read_counters=dict)

    @property
    def config_path(self) -> Path:
        return self.root / "cluster.toml"

    def server_ids(self) -> list[str]:
        return list(SERVERS)

    def alive(self, sid: str) -> bool:
        return True

    def resume(self, sid: str) -> None:
        pass

    def start(self, sid: str) -> None:
        pass

    def heal_network(self) -> None:
        pass

    def set_flag(self, sid: str, name: str, value: str) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeClient:
    def __init__(self, *_args: object, **_kwargs: object) -> None:
        pass

    def tablet_for(self, table: str, row: dict[str, Any]) -> str:
        return f"{table}-p0"

    def scan(self, table: str, **_kwargs: object) -> list[dict[str, Any]]:
        return [{"id": i} for i in sorted(Fakes.present)]

    def close(self) -> None:
        pass


class FakeWorkload:
    """Records two register ops and two acknowledged inserts (ids 1 and 2) when started."""

    def __init__(self, _client: object, _options: object, history: History, _probe: object) -> None:
        self.history = history

    def start(self) -> None:
        for kind, value in ((OpKind.WRITE, 5), (OpKind.READ, 5)):
            self.history.done(self.history.call(), 0, kind, 0, value, Outcome.OK)
        for row_id in (1, 2):
            self.history.done(self.history.call(), 1, OpKind.INSERT, row_id, 1, Outcome.OK)
        if Fakes.interrupt:
            raise KeyboardInterrupt

    def stop(self) -> None:
        pass

    def read(self, process: int, key: int) -> Outcome:
        return Outcome.OK


class FakeNemesis:
    def __init__(self, _cluster: object, _options: object) -> None:
        self.events = [FaultEvent("pause", ["ts2"], 0.5, 1.75)]

    def start(self, t0: float) -> None:
        pass

    def stop(self) -> None:
        pass


@dataclass
class Fakes:
    """What the fakes do in this test, and what the run did with them."""

    # Read by the fake client and workload, which the run makes: class attributes.
    present: ClassVar[frozenset[int]] = frozenset({1, 2})  # the inserts found after healing
    interrupt: ClassVar[bool] = False  # the workload's start is a Ctrl-C
    roots: list[Path] = field(default_factory=list)  # each run's directory
    warnings: list[str] = field(default_factory=list)

    def warn(self, line: str) -> None:
        self.warnings.append(line)


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Fakes]:
    state = Fakes()

    def open_cluster(options: ChaosOptions, root: Path) -> FakeCluster:
        state.roots.append(root)
        return FakeCluster(root)

    monkeypatch.setattr(Fakes, "present", frozenset({1, 2}))
    monkeypatch.setattr(Fakes, "interrupt", False)
    monkeypatch.setattr(run_mod, "open_cluster", open_cluster)
    monkeypatch.setattr(run_mod, "Client", FakeClient)
    monkeypatch.setattr(run_mod, "Workload", FakeWorkload)
    monkeypatch.setattr(run_mod, "Nemesis", FakeNemesis)
    monkeypatch.setattr(run_mod, "_wait_leaders", lambda _c, _t: True)
    monkeypatch.setattr(run_mod, "_terms", lambda _c: {})
    monkeypatch.setattr(run_mod, "_compare_replicas", lambda _c, _t: {"t-p0": (True, "equal")})
    yield state
    for root in state.roots:
        if root.name.startswith("raftlet-chaos-"):
            shutil.rmtree(root, ignore_errors=True)


def _options(**kwargs: Any) -> ChaosOptions:
    return ChaosOptions(duration_s=0.001, **kwargs)


def test_a_passing_run_removes_its_temporary_directory(fakes: Fakes) -> None:
    report = run_chaos(_options(), warn=fakes.warn)
    assert report.ok, report.format()
    assert report.kept_dir is None
    assert not fakes.roots[0].exists()


def test_a_failed_run_keeps_its_temporary_directory_and_names_it(
    fakes: Fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Fakes, "present", frozenset({1}))
    report = run_chaos(_options(), warn=fakes.warn)
    assert not report.ok
    root = fakes.roots[0]
    assert report.kept_dir == root
    assert root.is_dir()
    text = report.format()
    assert f"the servers' logs are kept in {root}" in text
    assert "lost (acknowledged, missing): 1: 2" in text


def test_the_history_starts_with_the_run_and_its_fault_log(fakes: Fakes, tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    report = run_chaos(_options(history_path=path, seed=7), warn=fakes.warn)
    assert f"history: 4 operations and 1 faults saved to {path}" in report.format()
    run, fault = History.load_header(path)
    assert run["record"] == "run"
    assert run["complete"] is True
    assert run["seed"] == 7
    assert datetime.fromisoformat(run["started"]).tzinfo is not None
    assert isinstance(run["start_monotonic_ns"], int)
    assert fault["record"] == "fault"
    assert fault["describe"] == "[   0.50 -    1.75] pause ts2"
    assert [op.kind for op in History.load(path)] == [OpKind.WRITE, OpKind.READ] + [
        OpKind.INSERT
    ] * 2


def test_a_history_saved_without_a_header_still_loads(tmp_path: Path) -> None:
    history = History()
    history.done(history.call(), 0, OpKind.WRITE, 3, 9, Outcome.OK)
    path = tmp_path / "old.jsonl"
    history.save(path)
    assert History.load_header(path) == []
    assert [(op.key, op.value) for op in History.load(path)] == [(3, 9)]


def test_an_interrupted_run_still_saves_what_it_recorded_and_says_where(
    fakes: Fakes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Fakes, "interrupt", True)
    path = tmp_path / "h.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run_chaos(_options(history_path=path), warn=fakes.warn)
    assert fakes.warnings == [f"the history so far: 4 operations and 1 faults saved to {path}"]
    assert len(History.load(path)) == 4
    assert History.load_header(path)[0]["complete"] is False
    assert not fakes.roots[0].exists()  # abandoned, not failed: nothing to investigate


def test_a_history_that_cannot_be_saved_is_said_and_the_report_still_made(
    fakes: Fakes, tmp_path: Path
) -> None:
    path = tmp_path / "gone" / "h.jsonl"
    report = run_chaos(_options(history_path=path), warn=fakes.warn)
    assert report.ok
    assert f"history: could not be saved to {path}: " in report.format()


def test_a_used_work_dir_is_refused_before_the_cluster_starts(fakes: Fakes, tmp_path: Path) -> None:
    (tmp_path / "ts1").mkdir()
    with pytest.raises(ChaosStartError, match="is not empty"):
        run_chaos(_options(work_dir=tmp_path), warn=fakes.warn)
    assert fakes.roots == []


def test_a_new_or_an_empty_work_dir_is_used_and_kept(fakes: Fakes, tmp_path: Path) -> None:
    new, empty = tmp_path / "new" / "w", tmp_path / "empty"
    empty.mkdir()
    for work in (new, empty):
        assert run_chaos(_options(work_dir=work), warn=fakes.warn).ok
        assert work.is_dir()
    assert fakes.roots == [new, empty]


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (NetnsError(TLS_FAILURE), "ts1 exited with 2 before ready: starting ts1 / raftlet "),
        (OSError(24, "Too many open files"), "[Errno 24] Too many open files"),
    ],
)
def test_a_cluster_that_does_not_start_is_one_line_with_the_servers_words(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    error: Exception,
    expected: str,
) -> None:
    def open_cluster(options: ChaosOptions, root: Path) -> FakeCluster:
        raise error

    monkeypatch.setattr(run_mod, "open_cluster", open_cluster)
    work = tmp_path / "w"
    assert main(["chaos", "--quiet", "--work-dir", str(work)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("raftlet chaos: error: the cluster did not start: ")
    assert expected in err
    assert f"(its files and logs are in {work})" in err
    if isinstance(error, NetnsError):
        assert "TLS needs --tls_cert" in err
